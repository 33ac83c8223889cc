//! SCRAM credentials (RFC 5802, RFC 7677): what the broker stores for a user and the key
//! derivations around it. The SASL exchange itself (client-first, server-first, ...)
//! lives with the connection; this module gives it the stored credential and the
//! arithmetic.
//!
//! A credential is Kafka's `ScramCredential`: salt, `StoredKey = H(HMAC(SaltedPassword,
//! "Client Key"))`, `ServerKey = HMAC(SaltedPassword, "Server Key")` and the iteration
//! count. The salted password itself is never stored. Stored as Kafka does
//! (`ScramCredentialUtils`), as one value of the user's entity config
//! (`/config/users/<user>`, key `SCRAM-SHA-256` or `SCRAM-SHA-512`):
//! `salt=<base64>,stored_key=<base64>,server_key=<base64>,iterations=<n>` (standard
//! base64 with padding).
//!
//! Nothing here logs or prints keys: `ScramCredential`'s `Debug` shows the iteration
//! count only.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};

use crate::coordinator::store::{base64_decode, base64_encode};

/// The SCRAM mechanisms Kafka supports, with their wire ids (AlterUserScramCredentials'
/// `Mechanism`: 1 and 2; 0 is UNKNOWN).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum ScramMechanism {
    Sha256,
    Sha512,
}

/// Kafka's bounds on the iteration count (`ScramMechanism.minIterations`, and the 16384
/// AlterUserScramCredentials accepts at most).
pub const scram_iterations_min: u32 = 4096;
pub const scram_iterations_max: u32 = 16384;
/// Longest salt accepted from a client or a stored document (Kafka's CLI makes 32
/// bytes via `ScramFormatter.secureRandomBytes`; there is no protocol bound).
pub const scram_salt_bytes_max: usize = 1024;

impl ScramMechanism {
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    /// The SASL mechanism name, also the config key it is stored under.
    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The wire id (`ScramMechanism.type()` in Kafka).
    pub fn wire_id(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    pub fn from_wire_id(id: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.wire_id() == id)
    }

    /// The hash's output length in bytes (the length of every key).
    pub fn key_bytes(self) -> usize {
        match self {
            ScramMechanism::Sha256 => 32,
            ScramMechanism::Sha512 => 64,
        }
    }

    /// `H(data)`.
    pub fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
            ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// `HMAC(key, data)`.
    pub fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => {
                let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
            ScramMechanism::Sha512 => {
                let mut mac = Hmac::<Sha512>::new_from_slice(key).expect("HMAC takes keys of any length");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
        }
    }

    /// `SaltedPassword = Hi(Normalize(password), salt, i)` (PBKDF2 with this HMAC). The
    /// password is taken as given (SASLprep is the client's; Kafka's formatter does not
    /// normalise either).
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.key_bytes()];
        match self {
            ScramMechanism::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out),
            ScramMechanism::Sha512 => pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out),
        }
        out
    }

    /// `ClientKey = HMAC(SaltedPassword, "Client Key")`.
    pub fn client_key(self, salted_password: &[u8]) -> Vec<u8> {
        self.hmac(salted_password, b"Client Key")
    }

    /// `StoredKey = H(ClientKey)`.
    pub fn stored_key(self, client_key: &[u8]) -> Vec<u8> {
        self.hash(client_key)
    }

    /// `ServerKey = HMAC(SaltedPassword, "Server Key")`.
    pub fn server_key(self, salted_password: &[u8]) -> Vec<u8> {
        self.hmac(salted_password, b"Server Key")
    }
}

impl fmt::Display for ScramMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the broker keeps for one user and mechanism (Kafka's `ScramCredential`).
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: u32,
}

impl fmt::Debug for ScramCredential {
    /// Keys and salt are left out, so a credential never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramCredential").field("iterations", &self.iterations).finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    #[error("SCRAM credential is not valid: {0}")]
    Invalid(&'static str),
}

impl ScramCredential {
    /// The credential for a salted password (what AlterUserScramCredentials receives).
    pub fn from_salted_password(
        mechanism: ScramMechanism,
        salt: &[u8],
        salted_password: &[u8],
        iterations: u32,
    ) -> Self {
        ScramCredential {
            salt: salt.to_vec(),
            stored_key: mechanism.stored_key(&mechanism.client_key(salted_password)),
            server_key: mechanism.server_key(salted_password),
            iterations,
        }
    }

    /// The credential for a password (the CLI's way: Kafka's `ScramFormatter.generateCredential`).
    pub fn from_password(mechanism: ScramMechanism, password: &[u8], salt: &[u8], iterations: u32) -> Self {
        let salted = mechanism.salted_password(password, salt, iterations);
        Self::from_salted_password(mechanism, salt, &salted, iterations)
    }

    /// Kafka's `ScramCredentialUtils.credentialToString`.
    pub fn to_kafka_string(&self) -> String {
        format!(
            "salt={},stored_key={},server_key={},iterations={}",
            base64_encode(&self.salt),
            base64_encode(&self.stored_key),
            base64_encode(&self.server_key),
            self.iterations
        )
    }

    /// Kafka's `ScramCredentialUtils.credentialFromString`, bounded: exactly the four keys,
    /// keys of `mechanism`'s length, a salt of at most `scram_salt_bytes_max`, iterations
    /// within Kafka's bounds.
    pub fn from_kafka_string(mechanism: ScramMechanism, s: &str) -> Result<Self, ScramError> {
        let (mut salt, mut stored_key, mut server_key, mut iterations) = (None, None, None, None);
        for token in s.split(',') {
            let (key, value) = token.split_once('=').ok_or(ScramError::Invalid("a token without '='"))?;
            let slot = match key {
                "salt" => &mut salt,
                "stored_key" => &mut stored_key,
                "server_key" => &mut server_key,
                "iterations" => &mut iterations,
                _ => return Err(ScramError::Invalid("an unknown key")),
            };
            if slot.replace(value).is_some() {
                return Err(ScramError::Invalid("a key twice"));
            }
        }
        let bytes = |v: Option<&str>, what| -> Result<Vec<u8>, ScramError> {
            let v = v.ok_or(ScramError::Invalid(what))?;
            base64_decode(v).ok_or(ScramError::Invalid("bad base64"))
        };
        let salt = bytes(salt, "no salt")?;
        let stored_key = bytes(stored_key, "no stored_key")?;
        let server_key = bytes(server_key, "no server_key")?;
        let iterations: u32 = iterations
            .ok_or(ScramError::Invalid("no iterations"))?
            .parse()
            .map_err(|_| ScramError::Invalid("iterations is not a number"))?;
        if salt.is_empty() || salt.len() > scram_salt_bytes_max {
            return Err(ScramError::Invalid("salt length"));
        }
        if stored_key.len() != mechanism.key_bytes() || server_key.len() != mechanism.key_bytes() {
            return Err(ScramError::Invalid("key length does not match the mechanism"));
        }
        if !(scram_iterations_min..=scram_iterations_max).contains(&iterations) {
            return Err(ScramError::Invalid("iterations out of bounds"));
        }
        Ok(ScramCredential { salt, stored_key, server_key, iterations })
    }

    /// `ClientSignature = HMAC(StoredKey, AuthMessage)`.
    pub fn client_signature(&self, mechanism: ScramMechanism, auth_message: &[u8]) -> Vec<u8> {
        mechanism.hmac(&self.stored_key, auth_message)
    }

    /// `ServerSignature = HMAC(ServerKey, AuthMessage)` (the `v=` of server-final).
    pub fn server_signature(&self, mechanism: ScramMechanism, auth_message: &[u8]) -> Vec<u8> {
        mechanism.hmac(&self.server_key, auth_message)
    }

    /// The server's check of client-final's proof: `ClientKey = ClientProof XOR
    /// ClientSignature`, and `H(ClientKey)` must be `StoredKey` (compared in constant time).
    pub fn verify_client_proof(&self, mechanism: ScramMechanism, auth_message: &[u8], client_proof: &[u8]) -> bool {
        let signature = self.client_signature(mechanism, auth_message);
        if client_proof.len() != signature.len() {
            return false;
        }
        let client_key: Vec<u8> = client_proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        let stored = mechanism.stored_key(&client_key);
        stored.len() == self.stored_key.len()
            && stored.iter().zip(&self.stored_key).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 section 3: user "user", password "pencil".
    #[test]
    fn rfc7677_sha256_exchange_verifies() {
        let m = ScramMechanism::Sha256;
        let salt = base64_decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential = ScramCredential::from_password(m, b"pencil", &salt, 4096);
        let client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let client_final_without_proof = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let auth = format!("{client_first_bare},{server_first},{client_final_without_proof}");
        let proof = base64_decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=").unwrap();
        assert!(credential.verify_client_proof(m, auth.as_bytes(), &proof));
        let mut wrong = proof.clone();
        wrong[0] ^= 1;
        assert!(!credential.verify_client_proof(m, auth.as_bytes(), &wrong));
        assert_eq!(
            base64_encode(&credential.server_signature(m, auth.as_bytes())),
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    /// SCRAM-SHA-512 has no RFC vector; these keys come from Python's hashlib and hmac
    /// (an independent implementation): password "pencil", salt "QSXCR+Q6sek8bf92", 4096.
    #[test]
    fn sha512_keys_match_an_independent_implementation() {
        let m = ScramMechanism::Sha512;
        let salt = base64_decode("QSXCR+Q6sek8bf92").unwrap();
        let c = ScramCredential::from_password(m, b"pencil", &salt, 4096);
        assert_eq!(base64_encode(&c.stored_key), SHA512_STORED_KEY);
        assert_eq!(base64_encode(&c.server_key), SHA512_SERVER_KEY);
    }
    const SHA512_STORED_KEY: &str =
        "Lm7w6zPGAx+UoahlEm1whIN7PS1KGU+9+V5PyudK6c/mWVVtkXSCpVPmUKQLYDKR7v0uSkxrBzPm7HuSwZ/ytw==";
    const SHA512_SERVER_KEY: &str =
        "b/Ph5kGCpfdw2MyLh0C8l10iiFENloZLKPiJIHv57J3BRD9++4RvoYjTKhOehyHgJS/nsxnNB17UKgNU7nRy6g==";

    #[test]
    fn kafka_string_round_trips_and_is_bounded() {
        let m = ScramMechanism::Sha256;
        let c = ScramCredential::from_password(m, b"alice-secret", b"0123456789abcdef", 8192);
        let s = c.to_kafka_string();
        assert!(s.starts_with("salt=MDEyMzQ1Njc4OWFiY2RlZg==,stored_key="), "{s}");
        assert!(s.ends_with(",iterations=8192"), "{s}");
        assert_eq!(ScramCredential::from_kafka_string(m, &s).unwrap(), c);
        // A SHA-256 credential's keys are too short for SHA-512.
        assert!(ScramCredential::from_kafka_string(ScramMechanism::Sha512, &s).is_err());
        for bad in [
            "",
            "salt=",
            &s.replace("iterations=8192", "iterations=100"),
            &s.replace("iterations=8192", "iterations=99999999999"),
            &s.replace("iterations=8192", "iterations=8192,iterations=8192"),
            &s.replace("salt=", "pepper="),
            &format!("{s},extra=1"),
        ] {
            assert!(ScramCredential::from_kafka_string(m, bad).is_err(), "{bad}");
        }
        assert!(!format!("{c:?}").contains(&base64_encode(&c.stored_key)));
    }

    #[test]
    fn mechanism_names_and_wire_ids_are_kafkas() {
        assert_eq!(ScramMechanism::from_name("SCRAM-SHA-512"), Some(ScramMechanism::Sha512));
        assert_eq!(ScramMechanism::from_wire_id(1), Some(ScramMechanism::Sha256));
        assert_eq!(ScramMechanism::from_wire_id(0), None);
        assert_eq!(ScramMechanism::Sha512.wire_id(), 2);
    }
}
