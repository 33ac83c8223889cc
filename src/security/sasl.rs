//! SASL on the server side: PLAIN (RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512
//! (RFC 5802, RFC 7677), as Kafka's `PlainSaslServer` and `ScramSaslServer` answer them.
//!
//! Pure: a `SaslServer` takes the client's tokens (the `auth_bytes` of SaslAuthenticate)
//! and answers the next server token, a principal once the exchange succeeds, or a
//! failure. It reads no clock and no store: credentials come through `Credentials`, and
//! the server nonce is an argument. The connection (src/server/connection.rs) owns one
//! per authentication and decides what a failure costs (its delay, the closed socket).
//!
//! Every token is untrusted bytes: each is bounded by `sasl_token_bytes_max` before it is
//! parsed, parsing never allocates more than the token holds, and a malformed token is a
//! failed authentication, never a panic. The `sasl` fuzz target drives both mechanisms.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use subtle::ConstantTimeEq;

use super::scram::{ScramCredential, ScramMechanism};
use super::Principal;

/// The longest SASL token a client may send (Kafka bounds SaslAuthenticate by
/// `sasl.server.max.receive.size`, 512 KiB by default; real tokens are under 1 KiB).
pub const sasl_token_bytes_max: usize = 512 * 1024;

/// A SASL mechanism Spate serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 3] = [Mechanism::Plain, Mechanism::ScramSha256, Mechanism::ScramSha512];

    /// Kafka's name (`sasl.enabled.mechanisms`, SaslHandshake).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The SCRAM variant, for the SCRAM mechanisms.
    pub fn scram(self) -> Option<ScramMechanism> {
        match self {
            Mechanism::Plain => None,
            Mechanism::ScramSha256 => Some(ScramMechanism::Sha256),
            Mechanism::ScramSha512 => Some(ScramMechanism::Sha512),
        }
    }
}

/// Where the server finds what it checks passwords against.
pub trait Credentials {
    /// The PLAIN password of `user`, if PLAIN knows the user.
    fn plain_password(&self, user: &str) -> Option<String>;
    /// The SCRAM credential of `user` for a SCRAM mechanism (`/config/users/<user>`).
    fn scram(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential>;
}

/// What one step of the exchange answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send this token and wait for the client's next one.
    Continue(Vec<u8>),
    /// Authenticated as `principal`; send `token` (empty for PLAIN).
    Done { principal: Principal, token: Vec<u8> },
    /// Authentication failed; the message is for the client and the log (it never
    /// names what was wrong with a password).
    Failed(String),
}

enum State {
    Start,
    /// SCRAM: the server-first message is sent; the client's final one is awaited.
    ScramSent {
        user: String,
        nonce: String,
        client_first_bare: String,
        server_first: String,
        credential: ScramCredential,
    },
    Finished,
}

/// One SASL exchange on one connection.
pub struct SaslServer {
    mechanism: Mechanism,
    state: State,
}

impl SaslServer {
    pub fn new(mechanism: Mechanism) -> Self {
        SaslServer { mechanism, state: State::Start }
    }

    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// Take the client's next token. `server_nonce`: fresh random printable characters
    /// (SCRAM's server part of the nonce; ignored by PLAIN).
    pub fn step(&mut self, token: &[u8], credentials: &dyn Credentials, server_nonce: &str) -> Step {
        if token.len() > sasl_token_bytes_max {
            self.state = State::Finished;
            return Step::Failed(format!("SASL token of {} bytes exceeds {sasl_token_bytes_max}", token.len()));
        }
        let state = std::mem::replace(&mut self.state, State::Finished);
        match (self.mechanism, state) {
            (_, State::Finished) => Step::Failed("unexpected SASL token after the exchange ended".into()),
            (Mechanism::Plain, State::Start) => plain(token, credentials),
            (Mechanism::Plain, State::ScramSent { .. }) => unreachable!("PLAIN never sends a SCRAM challenge"),
            (m, State::Start) => match scram_first(m, token, credentials, server_nonce) {
                Ok((state, server_first)) => {
                    self.state = state;
                    Step::Continue(server_first.into_bytes())
                }
                Err(e) => Step::Failed(e),
            },
            (m, State::ScramSent { user, nonce, client_first_bare, server_first, credential }) => {
                match scram_final(m, token, &nonce, &client_first_bare, &server_first, &credential) {
                    Ok(server_final) => {
                        Step::Done { principal: Principal::user(user), token: server_final.into_bytes() }
                    }
                    Err(e) => Step::Failed(e),
                }
            }
        }
    }
}

/// The failure message Kafka gives for any bad user or password (it says no more).
fn invalid_credentials(m: Mechanism) -> String {
    format!("Authentication failed: Invalid username or password (mechanism {})", m.name())
}

/// PLAIN: `[authzid] NUL authcid NUL passwd` (RFC 4616).
fn plain(token: &[u8], credentials: &dyn Credentials) -> Step {
    let mut parts = token.split(|b| *b == 0);
    let (Some(authzid), Some(user), Some(password), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Step::Failed("Invalid SASL/PLAIN response: expected 3 tokens".into());
    };
    let (Ok(authzid), Ok(user)) = (std::str::from_utf8(authzid), std::str::from_utf8(user)) else {
        return Step::Failed("Invalid SASL/PLAIN response: not UTF-8".into());
    };
    if user.is_empty() {
        return Step::Failed("Authentication failed: username not specified".into());
    }
    if !authzid.is_empty() && authzid != user {
        return Step::Failed(
            "Authentication failed: Client requested an authorization id that is different from username".into(),
        );
    }
    let Some(expected) = credentials.plain_password(user) else {
        return Step::Failed(invalid_credentials(Mechanism::Plain));
    };
    if bool::from(expected.as_bytes().ct_eq(password)) {
        Step::Done { principal: Principal::user(user), token: Vec::new() }
    } else {
        Step::Failed(invalid_credentials(Mechanism::Plain))
    }
}

/// The attributes of a SCRAM message: `k=v` pairs separated by commas.
pub(super) fn attributes(msg: &str) -> impl Iterator<Item = (&str, &str)> {
    msg.split(',').map(|a| a.split_once('=').unwrap_or((a, "")))
}

/// RFC 5802's saslname: "=2C" is ',' and "=3D" is '='; any other '=' is invalid.
fn decode_saslname(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i + 1..i + 3) {
            Some("2C") => out.push(','),
            Some("3D") => out.push('='),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// client-first-message = gs2-header client-first-message-bare, where the gs2 header is
/// "n,," or "y,," (no channel binding; Kafka supports none) and the bare part is
/// "n=user,r=nonce[,extensions]".
fn scram_first(
    m: Mechanism,
    token: &[u8],
    credentials: &dyn Credentials,
    server_nonce: &str,
) -> Result<(State, String), String> {
    let msg = std::str::from_utf8(token).map_err(|_| "Invalid SCRAM client first message: not UTF-8".to_string())?;
    let bare = msg
        .strip_prefix("n,,")
        .or_else(|| msg.strip_prefix("y,,"))
        .ok_or_else(|| "Invalid SCRAM client first message: channel binding or authzid not supported".to_string())?;
    let mut attrs = attributes(bare);
    let user = match attrs.next() {
        Some(("n", name)) => decode_saslname(name).filter(|u| !u.is_empty()),
        _ => None,
    }
    .ok_or_else(|| "Invalid SCRAM client first message: no username".to_string())?;
    let client_nonce = match attrs.next() {
        Some(("r", nonce)) if !nonce.is_empty() => nonce,
        _ => return Err("Invalid SCRAM client first message: no nonce".into()),
    };
    // Extensions (Kafka's `tokenauth=true` for delegation tokens) are not supported.
    if let Some((k, _)) = attrs.next() {
        return Err(format!("Invalid SCRAM client first message: unsupported extension {k:?}"));
    }
    let scram = m.scram().expect("a SCRAM mechanism");
    let credential = credentials.scram(&user, scram).ok_or_else(|| invalid_credentials(m))?;
    let nonce = format!("{client_nonce}{server_nonce}");
    let server_first = format!("r={nonce},s={},i={}", BASE64.encode(&credential.salt), credential.iterations);
    Ok((
        State::ScramSent {
            user,
            nonce,
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            credential,
        },
        server_first,
    ))
}

/// client-final-message = "c=biws,r=nonce,p=proof": checks the proof against the stored
/// key and answers "v=server-signature".
fn scram_final(
    m: Mechanism,
    token: &[u8],
    nonce: &str,
    client_first_bare: &str,
    server_first: &str,
    credential: &ScramCredential,
) -> Result<String, String> {
    let msg = std::str::from_utf8(token).map_err(|_| "Invalid SCRAM client final message: not UTF-8".to_string())?;
    let (without_proof, proof) =
        msg.rsplit_once(",p=").ok_or_else(|| "Invalid SCRAM client final message: no proof".to_string())?;
    let mut attrs = attributes(without_proof);
    match attrs.next() {
        // base64("n,,") or base64("y,,"): the gs2 header of the first message.
        Some(("c", "biws")) | Some(("c", "eSws")) => {}
        _ => return Err("Invalid SCRAM client final message: bad channel binding".into()),
    }
    match attrs.next() {
        Some(("r", r)) if r == nonce => {}
        _ => return Err("Invalid SCRAM client final message: nonce mismatch".into()),
    }
    let proof = BASE64.decode(proof).map_err(|_| "Invalid SCRAM client final message: bad proof".to_string())?;
    let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
    let scram = m.scram().expect("a SCRAM mechanism");
    if !credential.verify_client_proof(scram, auth_message.as_bytes(), &proof) {
        return Err(invalid_credentials(m));
    }
    Ok(format!("v={}", BASE64.encode(credential.server_signature(scram, auth_message.as_bytes()))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Users {
        plain: Vec<(&'static str, &'static str)>,
        scram: Vec<(&'static str, Mechanism, ScramCredential)>,
    }

    impl Credentials for Users {
        fn plain_password(&self, user: &str) -> Option<String> {
            self.plain.iter().find(|(u, _)| *u == user).map(|(_, p)| p.to_string())
        }
        fn scram(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential> {
            self.scram.iter().find(|(u, m, _)| *u == user && m.scram() == Some(mechanism)).map(|(_, _, c)| c.clone())
        }
    }

    fn plain_users() -> Users {
        Users { plain: vec![("alice", "alice-secret")], ..Default::default() }
    }

    #[test]
    fn plain_accepts_the_right_password_only() {
        let users = plain_users();
        let step = SaslServer::new(Mechanism::Plain).step(b"\0alice\0alice-secret", &users, "");
        assert_eq!(step, Step::Done { principal: Principal::user("alice"), token: vec![] });
        let step = SaslServer::new(Mechanism::Plain).step(b"alice\0alice\0alice-secret", &users, "");
        assert!(matches!(step, Step::Done { .. }), "an authzid equal to the user is fine");
        for bad in [
            &b"\0alice\0alice-secreT"[..],
            b"\0alice\0alice-secret\0",
            b"\0alice\0",
            b"\0bob\0alice-secret",
            b"bob\0alice\0alice-secret",
            b"\0\0alice-secret",
            b"",
            b"\0al\xffice\0x",
        ] {
            let step = SaslServer::new(Mechanism::Plain).step(bad, &users, "");
            assert!(matches!(step, Step::Failed(_)), "{bad:?} gave {step:?}");
        }
    }

    #[test]
    fn a_finished_exchange_takes_no_more_tokens() {
        let users = plain_users();
        let mut server = SaslServer::new(Mechanism::Plain);
        assert!(matches!(server.step(b"\0alice\0alice-secret", &users, ""), Step::Done { .. }));
        assert!(matches!(server.step(b"\0alice\0alice-secret", &users, ""), Step::Failed(_)));
    }

    /// RFC 7677 section 3's example exchange (user "user", password "pencil"), served
    /// with the RFC's server nonce: every server message byte for byte.
    #[test]
    fn scram_sha_256_matches_rfc_7677() {
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential = ScramCredential::from_password(ScramMechanism::Sha256, b"pencil", &salt, 4096);
        let users = Users { scram: vec![("user", Mechanism::ScramSha256, credential)], ..Default::default() };
        let mut server = SaslServer::new(Mechanism::ScramSha256);
        let first = server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO", &users, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0");
        assert_eq!(
            first,
            Step::Continue(
                b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".to_vec()
            )
        );
        let last = server.step(
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            &users,
            "unused",
        );
        assert_eq!(
            last,
            Step::Done {
                principal: Principal::user("user"),
                token: b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_vec()
            }
        );
    }

    /// The client side of an exchange, as a Kafka client computes it.
    fn client_final(m: Mechanism, password: &str, client_first_bare: &str, server_first: &str) -> String {
        let attrs: Vec<(&str, &str)> = attributes(server_first).collect();
        let nonce = attrs[0].1;
        let salt = BASE64.decode(attrs[1].1).unwrap();
        let iterations: u32 = attrs[2].1.parse().unwrap();
        let m = m.scram().unwrap();
        let client_key = m.client_key(&m.salted_password(password.as_bytes(), &salt, iterations));
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{client_first_bare},{server_first},{without_proof}");
        let signature = m.hmac(&m.stored_key(&client_key), auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        format!("{without_proof},p={}", BASE64.encode(proof))
    }

    fn scram_exchange(m: Mechanism, stored_password: &str, password: &str) -> Step {
        let salt = b"0123456789abcdef".to_vec();
        let credential = ScramCredential::from_password(m.scram().unwrap(), stored_password.as_bytes(), &salt, 4096);
        let users = Users { scram: vec![("al,ice", m, credential)], ..Default::default() };
        let mut server = SaslServer::new(m);
        let bare = "n=al=2Cice,r=clientnonce";
        let Step::Continue(server_first) = server.step(format!("n,,{bare}").as_bytes(), &users, "servernonce") else {
            panic!("no challenge");
        };
        let server_first = String::from_utf8(server_first).unwrap();
        server.step(client_final(m, password, bare, &server_first).as_bytes(), &users, "")
    }

    #[test]
    fn scram_sha_512_accepts_the_right_password_only() {
        let ok = scram_exchange(Mechanism::ScramSha512, "alice-secret", "alice-secret");
        assert!(matches!(ok, Step::Done { ref principal, .. } if principal.name == "al,ice"), "{ok:?}");
        let bad = scram_exchange(Mechanism::ScramSha512, "alice-secret", "alice-secreT");
        assert!(matches!(bad, Step::Failed(_)), "{bad:?}");
        let bad = scram_exchange(Mechanism::ScramSha256, "alice-secret", "wrong");
        assert!(matches!(bad, Step::Failed(_)), "{bad:?}");
    }

    #[test]
    fn scram_refuses_unknown_users_and_malformed_messages() {
        let users = Users::default();
        for first in
            [&b"n,,n=nobody,r=abc"[..], b"p=tls-unique,,n=u,r=a", b"n,,r=a", b"n,,n=u", b"n,,n=a=2,r=x", b"\xff"]
        {
            let step = SaslServer::new(Mechanism::ScramSha256).step(first, &users, "s");
            assert!(matches!(step, Step::Failed(_)), "{first:?} gave {step:?}");
        }
        let salt = b"salt".to_vec();
        let m = Mechanism::ScramSha256;
        let credential = ScramCredential::from_password(ScramMechanism::Sha256, b"pw", &salt, 4096);
        let users = Users { scram: vec![("u", m, credential)], ..Default::default() };
        for last in [
            &b"c=biws,r=cs,p=AAAA"[..],
            b"c=biws,r=other,p=AAAA",
            b"c=xx,r=cs,p=AAAA",
            b"c=biws,r=cs",
            b"c=biws,r=cs,p=!!",
        ] {
            let mut server = SaslServer::new(m);
            assert!(matches!(server.step(b"n,,n=u,r=c", &users, "s"), Step::Continue(_)));
            let step = server.step(last, &users, "");
            assert!(matches!(step, Step::Failed(_)), "{last:?} gave {step:?}");
        }
    }

    #[test]
    fn saslnames_decode_their_escapes() {
        assert_eq!(decode_saslname("a=2Cb=3Dc").as_deref(), Some("a,b=c"));
        assert_eq!(decode_saslname("plain").as_deref(), Some("plain"));
        assert_eq!(decode_saslname("bad=2"), None);
        assert_eq!(decode_saslname("bad=XY"), None);
    }
}
