//! SASL on a connection of a SASL_PLAINTEXT or SASL_SSL listener, as Kafka's
//! `SaslServerAuthenticator` runs it.
//!
//! Before authentication only ApiVersions, SaslHandshake and then SaslAuthenticate are
//! answered; any other request closes the connection. A failed login is answered with
//! SASL_AUTHENTICATION_FAILED after `connection.failed.authentication.delay.ms` and the
//! connection is closed, so passwords cannot be tried at line rate. Once authenticated,
//! requests carry the SASL user as their principal.
//!
//! SaslHandshake v0 (before KIP-152; kafka-python up to 2.0.2, Sarama up to 1.40 and
//! aiokafka send it) is followed by the SASL tokens themselves, each a size-prefixed
//! frame with no Kafka header, answered the same way (PLAIN's success is an empty
//! token). A failed login there has no error to carry: the connection is closed after
//! the same delay, as Kafka's authenticator does. Re-authentication needs v1.
//!
//! Re-authentication (KIP-368): with `connections.max.reauth.ms` set, SaslAuthenticate
//! answers the session's lifetime; the client runs SaslHandshake and SaslAuthenticate
//! again on the same connection before it ends (its other requests go on meanwhile, as
//! the old principal) and must come back as the same principal. A request other than
//! these after the session has ended closes the connection.
//!
//! The exchange itself is the pure `security::sasl::SaslServer`; this file decodes the
//! two requests, keeps the state and chooses the Kafka error codes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;

use crate::protocol::{decode_body, encode_response, error_code, handled_version, RequestFrame};
use crate::security::sasl::{Credentials, Mechanism, SaslServer, Step};
use crate::security::scram::{ScramCredential, ScramMechanism};
use crate::security::Principal;

use super::context::ShardContext;
use super::listener::SaslSettings;

/// What the connection does with a request.
pub enum Gate {
    /// Hand it to the handlers, as the connection's principal.
    Pass,
    /// Answer it with these bytes (after `delay_ms`), then go on or close.
    Answer { response: Bytes, then_close: bool, delay_ms: u64 },
    /// Close the connection without an answer.
    Close(String),
}

enum State {
    /// Waiting for SaslHandshake.
    Handshake,
    /// Mechanism chosen; SaslAuthenticate rounds (or, after SaslHandshake v0, bare
    /// tokens: `raw`) until it succeeds or fails.
    Authenticating {
        server: SaslServer,
        raw: bool,
    },
    Authenticated,
}

/// One connection's SASL state.
pub struct SaslGate {
    settings: Arc<SaslSettings>,
    state: State,
    /// ANONYMOUS until the first login succeeds.
    principal: Arc<Principal>,
    authenticated_once: bool,
    /// When the session ends (connections.max.reauth.ms).
    expires_at: Option<Instant>,
}

/// The credentials a connection checks logins against: PLAIN users from the broker's
/// config; SCRAM credentials from the cluster's user configs.
struct BrokerCredentials<'a> {
    settings: &'a SaslSettings,
    view: &'a crate::coordinator::view::ClusterView,
}

impl Credentials for BrokerCredentials<'_> {
    fn plain_password(&self, user: &str) -> Option<String> {
        self.settings.plain_users.get(user).cloned()
    }

    fn scram(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential> {
        self.view.scram_credential(user, mechanism).cloned()
    }
}

/// A fresh server nonce: 24 random bytes (the OS's generator, through uuid v4), base64.
fn server_nonce() -> String {
    use base64::Engine as _;
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(&uuid::Uuid::new_v4().as_bytes()[..8]);
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
}

impl SaslGate {
    pub fn new(settings: Arc<SaslSettings>, principal: Arc<Principal>) -> Self {
        SaslGate { settings, state: State::Handshake, principal, authenticated_once: false, expires_at: None }
    }

    pub fn authenticated(&self) -> bool {
        self.authenticated_once
    }

    pub fn principal(&self) -> Arc<Principal> {
        self.principal.clone()
    }

    /// Decide what happens to `frame`.
    pub fn admit(&mut self, ctx: &ShardContext, frame: &RequestFrame, peer: &str) -> Gate {
        let key = ApiKey::try_from(frame.api_key).ok();
        match key {
            Some(ApiKey::SaslHandshake) => self.handshake(frame),
            Some(ApiKey::SaslAuthenticate) => self.authenticate(ctx, frame, peer),
            Some(ApiKey::ApiVersions) if !self.authenticated_once => Gate::Pass,
            _ if self.authenticated_once => match self.expires_at {
                Some(at) if Instant::now() >= at && !matches!(self.state, State::Authenticating { .. }) => {
                    Gate::Close(format!("SASL session of {} expired (connections.max.reauth.ms)", self.principal))
                }
                _ => Gate::Pass,
            },
            _ => Gate::Close(format!("unexpected request (API key {}) before SASL authentication", frame.api_key)),
        }
    }

    fn handshake(&mut self, frame: &RequestFrame) -> Gate {
        if matches!(self.state, State::Authenticating { .. })
            || !handled_version(ApiKey::SaslHandshake, frame.api_version)
        {
            return Gate::Close(format!("SaslHandshake v{} out of order or unsupported", frame.api_version));
        }
        // v0's bare tokens cannot run beside the connection's requests (KIP-368).
        let raw = frame.api_version == 0;
        if raw && self.authenticated_once {
            return Gate::Close("re-authentication with SaslHandshake v0".into());
        }
        let req: SaslHandshakeRequest = match decode_body(frame) {
            Ok(r) => r,
            Err(e) => return Gate::Close(format!("bad SaslHandshake: {e}")),
        };
        let enabled: Vec<StrBytes> =
            self.settings.mechanisms.iter().map(|m| StrBytes::from_static_str(m.name())).collect();
        let mut body = SaslHandshakeResponse::default().with_mechanisms(enabled);
        let chosen = Mechanism::from_name(req.mechanism.as_str()).filter(|m| self.settings.mechanisms.contains(m));
        let then_close = match chosen {
            Some(m) => {
                self.state = State::Authenticating { server: SaslServer::new(m), raw };
                false
            }
            None => {
                body.error_code = error_code::UNSUPPORTED_SASL_MECHANISM;
                true
            }
        };
        answer(ApiKey::SaslHandshake, frame, &body, then_close, 0)
    }

    /// Whether the next frame is a bare SASL token (after SaslHandshake v0), not a request.
    pub fn expects_raw_token(&self) -> bool {
        matches!(self.state, State::Authenticating { raw: true, .. })
    }

    /// A bare token after SaslHandshake v0: the answer is the next token, size-prefixed;
    /// a failed login closes the connection after the delay, with nothing sent.
    pub fn admit_raw_token(&mut self, ctx: &ShardContext, token: &[u8], peer: &str) -> Gate {
        let framed = |token: Vec<u8>| {
            let mut out = Vec::with_capacity(4 + token.len());
            out.extend_from_slice(&(token.len() as i32).to_be_bytes());
            out.extend_from_slice(&token);
            Bytes::from(out)
        };
        match self.step(ctx, token, peer) {
            Outcome::Continue(token) | Outcome::Done(token) => {
                Gate::Answer { response: framed(token), then_close: false, delay_ms: 0 }
            }
            Outcome::Failed { .. } => Gate::Answer {
                response: Bytes::new(),
                then_close: true,
                delay_ms: self.settings.failed_authentication_delay_ms,
            },
        }
    }

    fn authenticate(&mut self, ctx: &ShardContext, frame: &RequestFrame, peer: &str) -> Gate {
        if !handled_version(ApiKey::SaslAuthenticate, frame.api_version) {
            return Gate::Close(format!("SaslAuthenticate v{} is not supported", frame.api_version));
        }
        if !matches!(self.state, State::Authenticating { raw: false, .. }) {
            return Gate::Close("SaslAuthenticate before SaslHandshake v1".into());
        }
        let req: SaslAuthenticateRequest = match decode_body(frame) {
            Ok(r) => r,
            Err(e) => return Gate::Close(format!("bad SaslAuthenticate: {e}")),
        };
        let (body, then_close, delay_ms) = match self.step(ctx, &req.auth_bytes, peer) {
            Outcome::Continue(token) => {
                (SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(token)), false, 0)
            }
            Outcome::Done(token) => {
                let body = SaslAuthenticateResponse::default()
                    .with_auth_bytes(Bytes::from(token))
                    .with_session_lifetime_ms(self.settings.reauth_ms as i64);
                (body, false, 0)
            }
            Outcome::Failed { message, token } => (
                failure(message).with_auth_bytes(Bytes::from(token)),
                true,
                self.settings.failed_authentication_delay_ms,
            ),
        };
        answer(ApiKey::SaslAuthenticate, frame, &body, then_close, delay_ms)
    }

    /// One round of the exchange, in either framing: counts and logs the outcome and
    /// moves the state (back to `Handshake` on a failure, whose connection closes).
    fn step(&mut self, ctx: &ShardContext, token: &[u8], peer: &str) -> Outcome {
        let State::Authenticating { server, .. } = &mut self.state else {
            // Callers check the state first; a round outside it refuses the login.
            return Outcome::Failed { message: "no SASL exchange in progress".into(), token: Vec::new() };
        };
        let mechanism = server.mechanism();
        let view = ctx.view();
        let credentials = BrokerCredentials { settings: &self.settings, view: &view };
        let step = server.step(token, &credentials, &server_nonce());
        let counters = ctx.metrics.shard(ctx.id);
        let outcome = match step {
            Step::Continue(token) => return Outcome::Continue(token),
            Step::Done { principal, token } if self.authenticated_once && principal != *self.principal => {
                counters.sasl_authentication_failures.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%peer, was = %self.principal, now = %principal, "re-authentication as another principal refused");
                Outcome::Failed { message: "Cannot change principals during re-authentication".into(), token }
            }
            Step::Done { principal, token } => {
                counters.sasl_authentications.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, %principal, mechanism = mechanism.name(), "SASL authentication succeeded");
                let lifetime_ms = self.settings.reauth_ms;
                self.expires_at =
                    (lifetime_ms > 0).then(|| Instant::now() + std::time::Duration::from_millis(lifetime_ms));
                self.principal = Arc::new(principal);
                self.authenticated_once = true;
                self.state = State::Authenticated;
                return Outcome::Done(token);
            }
            Step::Failed(message) => {
                counters.sasl_authentication_failures.fetch_add(1, Ordering::Relaxed);
                // Kafka's authenticator logs failed logins at INFO with the peer.
                tracing::info!(%peer, mechanism = mechanism.name(), "failed authentication: {message}");
                Outcome::Failed { message, token: Vec::new() }
            }
        };
        self.state = State::Handshake;
        outcome
    }
}

/// What one SASL round came to.
enum Outcome {
    /// The exchange goes on with this token.
    Continue(Vec<u8>),
    /// Authenticated; this token (may be empty) is the server's last.
    Done(Vec<u8>),
    /// Refused: the connection closes after the failed-login delay.
    Failed { message: String, token: Vec<u8> },
}

fn failure(message: String) -> SaslAuthenticateResponse {
    SaslAuthenticateResponse::default()
        .with_error_code(error_code::SASL_AUTHENTICATION_FAILED)
        .with_error_message(Some(StrBytes::from_string(message)))
}

fn answer<T: kafka_protocol::protocol::Encodable>(
    key: ApiKey,
    frame: &RequestFrame,
    body: &T,
    then_close: bool,
    delay_ms: u64,
) -> Gate {
    match encode_response(key, frame.api_version, frame.correlation_id, body) {
        Ok(response) => Gate::Answer { response, then_close, delay_ms },
        Err(e) => Gate::Close(format!("cannot encode the {key:?} answer: {e}")),
    }
}
