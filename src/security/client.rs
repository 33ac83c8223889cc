//! The client side of TLS and SASL, shared by every connection Spate opens to a broker:
//! the blocking `client::conn::Connection` (the CLI, the coordinator link, forwarded
//! admin requests) and the broker's glommio `server::peer::Peer` (replica fetchers,
//! transaction markers, produce verification).
//!
//! `ClientSecurity` is what a connection needs: the security protocol of the listener
//! it dials, a rustls `ClientConfig` for SSL and SASL_SSL (the CA certificates of a PEM
//! truststore, and a client certificate from a PEM keystore when one is given), and a
//! SASL login for SASL_PLAINTEXT and SASL_SSL. The connections do the I/O; this module
//! decides nothing about sockets.
//!
//! `SaslClient` is the pure exchange, the mirror of `sasl::SaslServer`: PLAIN (RFC 4616)
//! and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677). A SCRAM login succeeds only
//! once the server's signature (`v=` of server-final) has been checked: a server that
//! does not know the password cannot pass as one that does. The server's tokens are
//! untrusted bytes: each is bounded by `sasl_token_bytes_max`, the salt by
//! `scram_salt_bytes_max` and the iteration count by Kafka's bounds before any work is
//! done, and a malformed token is an error, never a panic. The key arithmetic is
//! `scram.rs`'s.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::ServerName;
use subtle::ConstantTimeEq;

use super::sasl::{attributes, sasl_token_bytes_max, Mechanism};
use super::scram::{scram_iterations_max, scram_iterations_min, scram_salt_bytes_max, ScramCredential};
use crate::config::SecurityProtocol;

/// A SASL login: mechanism, user and password. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct SaslLogin {
    pub mechanism: Mechanism,
    pub username: String,
    pub password: String,
}

impl fmt::Debug for SaslLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SaslLogin({} as {:?})", self.mechanism.name(), self.username)
    }
}

/// The PEM files a TLS client is built from (Kafka's `ssl.truststore.location` and
/// `ssl.keystore.location` with `ssl.*.type=PEM`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// The CA certificates the server's certificate is checked against.
    pub truststore: PathBuf,
    /// A private key and certificate chain presented when the server asks for one.
    pub keystore: Option<PathBuf>,
    /// ssl.key.password: opens an encrypted private key in `keystore`.
    pub key_password: Option<String>,
}

/// How a client connection secures itself.
#[derive(Clone)]
pub struct ClientSecurity {
    pub protocol: SecurityProtocol,
    /// Set exactly when `protocol` uses TLS.
    pub tls: Option<Arc<ClientConfig>>,
    /// Set exactly when `protocol` uses SASL.
    pub sasl: Option<SaslLogin>,
}

impl fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientSecurity({}, {:?})", self.protocol.name(), self.sasl)
    }
}

impl Default for ClientSecurity {
    fn default() -> Self {
        Self::plaintext()
    }
}

impl ClientSecurity {
    pub fn plaintext() -> Self {
        ClientSecurity { protocol: SecurityProtocol::Plaintext, tls: None, sasl: None }
    }

    /// Build from settings; an error says which setting is missing or which file is bad.
    /// TLS settings and a login the protocol does not use are ignored.
    pub fn new(
        protocol: SecurityProtocol,
        tls: Option<&ClientTlsFiles>,
        sasl: Option<SaslLogin>,
    ) -> Result<Self, String> {
        let tls = if protocol.uses_tls() {
            let files = tls.ok_or_else(|| format!("{} needs ssl.truststore.location", protocol.name()))?;
            Some(Arc::new(tls_client_config(
                &files.truststore,
                files.keystore.as_deref(),
                files.key_password.as_deref(),
            )?))
        } else {
            None
        };
        let sasl = if protocol.uses_sasl() {
            let login = sasl.ok_or_else(|| format!("{} needs a SASL username and password", protocol.name()))?;
            if login.username.is_empty() {
                return Err("the SASL username is empty".into());
            }
            Some(login)
        } else {
            None
        };
        Ok(ClientSecurity { protocol, tls, sasl })
    }

    /// From Kafka client properties (the `--command-config` file of Kafka's tools):
    /// `security.protocol`, `sasl.mechanism` (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512),
    /// `sasl.jaas.config` (its `username="..."` and `password="..."`),
    /// `ssl.truststore.location` and `ssl.keystore.location` (PEM files;
    /// `ssl.*.type` must be PEM when given), `ssl.key.password`. Other keys are returned, so the caller can
    /// say it ignores them.
    pub fn from_properties(text: &str) -> Result<(Self, Vec<String>), String> {
        let mut protocol = SecurityProtocol::Plaintext;
        let mut mechanism = None;
        let (mut username, mut password) = (None, None);
        let (mut truststore, mut keystore, mut key_password) = (None, None, None);
        let mut ignored = Vec::new();
        for (key, value) in crate::config::properties::parse_pairs(text) {
            match key.as_str() {
                "security.protocol" => {
                    protocol = SecurityProtocol::parse(&value.to_ascii_uppercase()).ok_or_else(|| {
                        format!("security.protocol={value}: not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
                    })?
                }
                "sasl.mechanism" => {
                    mechanism = Some(Mechanism::from_name(&value).ok_or_else(|| {
                        format!("sasl.mechanism={value}: not supported (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
                    })?)
                }
                "sasl.jaas.config" => {
                    username = crate::config::properties::jaas_value(&value, "username");
                    password = crate::config::properties::jaas_value(&value, "password");
                }
                "ssl.truststore.location" => truststore = Some(PathBuf::from(value)),
                "ssl.keystore.location" => keystore = Some(PathBuf::from(value)),
                "ssl.key.password" => key_password = Some(value),
                "ssl.truststore.type" | "ssl.keystore.type" if !value.eq_ignore_ascii_case("PEM") => {
                    return Err(format!("{key}={value}: only PEM key and trust stores are read"))
                }
                "ssl.truststore.type" | "ssl.keystore.type" => {}
                _ => ignored.push(key),
            }
        }
        let sasl = match (username, password) {
            (Some(username), Some(password)) if protocol.uses_sasl() => {
                // Kafka's default mechanism is GSSAPI, which Spate does not speak.
                let mechanism =
                    mechanism.ok_or("sasl.mechanism is not set (GSSAPI, Kafka's default, is not supported)")?;
                Some(SaslLogin { mechanism, username, password })
            }
            _ => None,
        };
        let tls = truststore.map(|truststore| ClientTlsFiles { truststore, keystore, key_password });
        Ok((Self::new(protocol, tls.as_ref(), sasl)?, ignored))
    }

    /// The name TLS checks the server's certificate against: the host of `addr`
    /// (`host:port` or `[v6]:port`); an IP address is checked against the certificate's
    /// IP SANs.
    pub fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
        let host = match addr.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() => host,
            _ => addr,
        };
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        ServerName::try_from(host.to_string()).map_err(|e| format!("{host:?} is not a TLS server name: {e}"))
    }
}

/// A rustls client config trusting the CA certificates of `truststore`, presenting the
/// key and chain of `keystore` (its key opened with `key_password` when encrypted) when
/// the server asks for a client certificate.
pub fn tls_client_config(
    truststore: &Path,
    keystore: Option<&Path>,
    key_password: Option<&str>,
) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pem = super::tls::read_pem(truststore)?;
    let mut roots = RootCertStore::empty();
    for cert in super::tls::certificates(truststore, &pem)? {
        roots.add(cert).map_err(|e| format!("{}: {e}", truststore.display()))?;
    }
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    match keystore {
        None => Ok(builder.with_no_client_auth()),
        Some(path) => {
            let pem = super::tls::read_pem(path)?;
            let chain = super::tls::certificates(path, &pem)?;
            let key = super::tls::private_key(path, &pem, key_password)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("{}: the key does not fit the certificate: {e}", path.display()))
        }
    }
}

/// A fresh client nonce: 24 random bytes (the OS's generator, through uuid v4), base64.
pub fn client_nonce() -> String {
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(&uuid::Uuid::new_v4().as_bytes()[..8]);
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
}

enum State {
    /// The first token is not made yet.
    Start,
    /// PLAIN's only token is sent; the server's (empty) answer is awaited.
    PlainSent,
    /// SCRAM client-first is sent; server-first is awaited.
    ScramFirstSent { client_first_bare: String, client_nonce: String },
    /// SCRAM client-final is sent; server-final must carry this signature.
    ScramFinalSent { server_signature: Vec<u8> },
    /// Authenticated, or failed: no more tokens.
    Finished,
}

/// One SASL login on one connection, client side.
pub struct SaslClient {
    login: SaslLogin,
    client_nonce: String,
    state: State,
}

impl SaslClient {
    /// `client_nonce`: fresh random printable characters without ',' (SCRAM's client part
    /// of the nonce; `client_nonce()` makes one; ignored by PLAIN).
    pub fn new(login: SaslLogin, client_nonce: String) -> Self {
        SaslClient { login, client_nonce, state: State::Start }
    }

    pub fn mechanism(&self) -> Mechanism {
        self.login.mechanism
    }

    /// The first token (the `auth_bytes` of the first SaslAuthenticate).
    pub fn first(&mut self) -> Vec<u8> {
        assert!(matches!(self.state, State::Start), "the first token is made once");
        match self.login.mechanism.scram() {
            None => {
                self.state = State::PlainSent;
                let mut token = Vec::with_capacity(2 + self.login.username.len() + self.login.password.len());
                token.push(0);
                token.extend_from_slice(self.login.username.as_bytes());
                token.push(0);
                token.extend_from_slice(self.login.password.as_bytes());
                token
            }
            Some(_) => {
                let client_first_bare = format!("n={},r={}", encode_saslname(&self.login.username), self.client_nonce);
                let token = format!("n,,{client_first_bare}").into_bytes();
                self.state =
                    State::ScramFirstSent { client_first_bare, client_nonce: std::mem::take(&mut self.client_nonce) };
                token
            }
        }
    }

    /// Take the server's answer to the last token. Ok(Some(token)): send it and call
    /// again with the answer; Ok(None): authenticated (for SCRAM, the server proved it
    /// knows the password); Err: the login failed, the message says why.
    pub fn step(&mut self, server_token: &[u8]) -> Result<Option<Vec<u8>>, String> {
        if server_token.len() > sasl_token_bytes_max {
            self.state = State::Finished;
            return Err(format!("server SASL token of {} bytes exceeds {sasl_token_bytes_max}", server_token.len()));
        }
        match std::mem::replace(&mut self.state, State::Finished) {
            State::Start => Err("no SASL token was sent yet".into()),
            State::Finished => Err("the SASL exchange has ended".into()),
            // Kafka's PLAIN server answers an empty token.
            State::PlainSent => Ok(None),
            State::ScramFirstSent { client_first_bare, client_nonce } => {
                let (token, server_signature) = self.scram_final(server_token, &client_first_bare, &client_nonce)?;
                self.state = State::ScramFinalSent { server_signature };
                Ok(Some(token))
            }
            State::ScramFinalSent { server_signature } => {
                let msg = std::str::from_utf8(server_token)
                    .map_err(|_| "invalid SCRAM server final message: not UTF-8".to_string())?;
                let mut attrs = attributes(msg);
                match attrs.next() {
                    Some(("e", reason)) => Err(format!("the server refused the SCRAM proof: {reason}")),
                    Some(("v", v)) => {
                        let got = BASE64
                            .decode(v)
                            .map_err(|_| "invalid SCRAM server final message: bad signature".to_string())?;
                        if bool::from(got.ct_eq(&server_signature)) {
                            Ok(None)
                        } else {
                            Err("the server's SCRAM signature is wrong: it does not know the password".into())
                        }
                    }
                    _ => Err("invalid SCRAM server final message: no signature".into()),
                }
            }
        }
    }

    /// server-first = "r=nonce,s=salt,i=iterations" -> client-final "c=biws,r=nonce,p=proof"
    /// and the server signature server-final must carry.
    fn scram_final(
        &self,
        server_first: &[u8],
        client_first_bare: &str,
        client_nonce: &str,
    ) -> Result<(Vec<u8>, Vec<u8>), String> {
        let mechanism = self.login.mechanism.scram().expect("a SCRAM mechanism");
        let invalid = |what: &str| format!("invalid SCRAM server first message: {what}");
        let server_first = std::str::from_utf8(server_first).map_err(|_| invalid("not UTF-8"))?;
        let mut attrs = attributes(server_first);
        let nonce = match attrs.next() {
            Some(("r", r)) if r.len() > client_nonce.len() && r.starts_with(client_nonce) => r,
            Some(("e", reason)) => return Err(format!("the server refused the SCRAM login: {reason}")),
            _ => return Err(invalid("the nonce does not extend ours")),
        };
        let salt = match attrs.next() {
            Some(("s", s)) if s.len() <= scram_salt_bytes_max.div_ceil(3) * 4 => {
                BASE64.decode(s).map_err(|_| invalid("bad salt"))?
            }
            _ => return Err(invalid("no salt, or a salt too long")),
        };
        if salt.is_empty() {
            return Err(invalid("empty salt"));
        }
        let iterations = match attrs.next() {
            Some(("i", i)) => i.parse::<u32>().map_err(|_| invalid("bad iteration count"))?,
            _ => return Err(invalid("no iteration count")),
        };
        if !(scram_iterations_min..=scram_iterations_max).contains(&iterations) {
            return Err(invalid(&format!(
                "iteration count {iterations} outside {scram_iterations_min}..={scram_iterations_max}"
            )));
        }
        // Further attributes are extensions; RFC 5802 lets a client ignore them.
        let salted = mechanism.salted_password(self.login.password.as_bytes(), &salt, iterations);
        let credential = ScramCredential::from_salted_password(mechanism, &salt, &salted, iterations);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_key = mechanism.client_key(&salted);
        let signature = credential.client_signature(mechanism, auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(k, s)| k ^ s).collect();
        let token = format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes();
        Ok((token, credential.server_signature(mechanism, auth_message.as_bytes())))
    }
}

/// RFC 5802's saslname: ',' is "=2C" and '=' is "=3D".
fn encode_saslname(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

#[cfg(test)]
mod tests {
    use super::super::sasl::{Credentials, SaslServer, Step};
    use super::super::scram::ScramMechanism;
    use super::super::Principal;
    use super::*;

    fn login(mechanism: Mechanism, username: &str, password: &str) -> SaslLogin {
        SaslLogin { mechanism, username: username.into(), password: password.into() }
    }

    /// RFC 7677 section 3: user "user", password "pencil", the RFC's nonces. Every client
    /// message byte for byte, and the RFC's server-final is accepted.
    #[test]
    fn scram_sha_256_client_matches_rfc_7677() {
        let mut client =
            SaslClient::new(login(Mechanism::ScramSha256, "user", "pencil"), "rOprNGfwEbeRWgbNEkqO".into());
        assert_eq!(client.first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let client_final = client.step(server_first).unwrap().unwrap();
        assert_eq!(
            String::from_utf8(client_final).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert_eq!(client.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").unwrap(), None);
    }

    #[test]
    fn a_wrong_server_signature_fails_the_login() {
        let mut client =
            SaslClient::new(login(Mechanism::ScramSha256, "user", "pencil"), "rOprNGfwEbeRWgbNEkqO".into());
        client.first();
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        client.step(server_first).unwrap().unwrap();
        // One bit off in the signature: a server that does not know the password.
        let err = client.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G5=").unwrap_err();
        assert!(err.contains("signature"), "{err}");
        // And no more tokens afterwards.
        assert!(client.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").is_err());
    }

    #[test]
    fn malformed_server_first_messages_are_errors() {
        let too_many = format!("r=cnonceS,s=c2FsdA==,i={}", scram_iterations_max + 1);
        let long_salt = format!("r=cnonceS,s={},i=4096", "A".repeat(scram_salt_bytes_max * 2));
        let huge = vec![b'r'; sasl_token_bytes_max + 1];
        for bad in [
            &b""[..],
            b"\xff",
            b"r=othernonce,s=c2FsdA==,i=4096",
            b"r=cnonce,s=c2FsdA==,i=4096",
            b"r=cnonceS,s=!!,i=4096",
            b"r=cnonceS,s=,i=4096",
            b"r=cnonceS,s=c2FsdA==",
            b"r=cnonceS,s=c2FsdA==,i=x",
            b"r=cnonceS,s=c2FsdA==,i=1",
            too_many.as_bytes(),
            long_salt.as_bytes(),
            b"e=unknown-user",
            &huge,
        ] {
            let mut client = SaslClient::new(login(Mechanism::ScramSha512, "u", "p"), "cnonce".into());
            client.first();
            assert!(client.step(bad).is_err(), "{:?}", String::from_utf8_lossy(&bad[..bad.len().min(40)]));
        }
    }

    struct Users;
    impl Credentials for Users {
        fn plain_password(&self, user: &str) -> Option<String> {
            (user == "al,i=ce").then(|| "secret".to_string())
        }
        fn scram(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential> {
            (user == "al,i=ce").then(|| ScramCredential::from_password(mechanism, b"secret", b"0123456789abcdef", 4096))
        }
    }

    /// Run this client against the server machine of sasl.rs.
    fn exchange(mechanism: Mechanism, password: &str) -> Result<Principal, String> {
        let mut client = SaslClient::new(login(mechanism, "al,i=ce", password), client_nonce());
        let mut server = SaslServer::new(mechanism);
        let mut token = client.first();
        for _ in 0..4 {
            match server.step(&token, &Users, "servernonce") {
                Step::Continue(answer) => token = client.step(&answer)?.expect("the client has more to say"),
                Step::Done { principal, token } => {
                    assert_eq!(client.step(&token)?, None, "the client is satisfied");
                    return Ok(principal);
                }
                Step::Failed(e) => return Err(e),
            }
        }
        panic!("the exchange did not end")
    }

    #[test]
    fn the_client_logs_in_to_the_server_machine_with_every_mechanism() {
        for m in Mechanism::ALL {
            assert_eq!(exchange(m, "secret"), Ok(Principal::user("al,i=ce")), "{m:?}");
            assert!(exchange(m, "wrong").is_err(), "{m:?}");
        }
    }

    #[test]
    fn server_names_are_the_dialled_host() {
        assert_eq!(ClientSecurity::server_name("127.0.0.1:9093").unwrap(), ServerName::try_from("127.0.0.1").unwrap());
        assert_eq!(ClientSecurity::server_name("[::1]:9093").unwrap(), ServerName::try_from("::1").unwrap());
        assert_eq!(ClientSecurity::server_name("kafka1:9093").unwrap(), ServerName::try_from("kafka1").unwrap());
        assert!(ClientSecurity::server_name("bad host:1").is_err());
    }

    #[test]
    fn kafka_client_properties_are_read() {
        let text = "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n\
                    sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
                    username=\"alice\" password=\"alice-secret\";\nclient.id=x\n";
        let (s, ignored) = ClientSecurity::from_properties(text).unwrap();
        assert_eq!(s.protocol, SecurityProtocol::SaslPlaintext);
        assert_eq!(s.sasl, Some(login(Mechanism::ScramSha512, "alice", "alice-secret")));
        assert_eq!(ignored, ["client.id"]);
        assert_eq!(ClientSecurity::from_properties("").unwrap().0.protocol, SecurityProtocol::Plaintext);
        for bad in [
            "security.protocol=KERBEROS",
            "security.protocol=SASL_PLAINTEXT\nsasl.jaas.config=x username=\"a\" password=\"b\";",
            "security.protocol=SASL_PLAINTEXT",
            "security.protocol=SSL",
            "ssl.truststore.type=JKS",
            "sasl.mechanism=GSSAPI",
        ] {
            assert!(ClientSecurity::from_properties(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings_a_protocol_needs_are_required() {
        assert!(ClientSecurity::new(SecurityProtocol::SaslPlaintext, None, None).is_err());
        assert!(ClientSecurity::new(SecurityProtocol::Ssl, None, None).is_err());
        let s = ClientSecurity::new(SecurityProtocol::SaslPlaintext, None, Some(login(Mechanism::Plain, "a", "pw")))
            .unwrap();
        assert!(s.tls.is_none() && s.sasl.is_some());
        assert!(!format!("{s:?}").contains("pw"));
        let missing = ClientTlsFiles { truststore: "/nonexistent/ca.pem".into(), keystore: None, key_password: None };
        let err = ClientSecurity::new(SecurityProtocol::Ssl, Some(&missing), None).unwrap_err();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }
}
