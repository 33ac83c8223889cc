//! SASL on a connection of a SASL_PLAINTEXT or SASL_SSL listener, as Kafka's
//! `SaslServerAuthenticator` runs it.
//!
//! Before authentication only ApiVersions, SaslHandshake (v1) and then SaslAuthenticate
//! are answered; any other request closes the connection. A failed login is answered
//! with SASL_AUTHENTICATION_FAILED after `connection.failed.authentication.delay.ms` and
//! the connection is closed, so passwords cannot be tried at line rate. Once
//! authenticated, requests carry the SASL user as their principal.
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
    /// Mechanism chosen; SaslAuthenticate rounds until it succeeds or fails.
    Authenticating(SaslServer),
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
                Some(at) if Instant::now() >= at && !matches!(self.state, State::Authenticating(_)) => {
                    Gate::Close(format!("SASL session of {} expired (connections.max.reauth.ms)", self.principal))
                }
                _ => Gate::Pass,
            },
            _ => Gate::Close(format!("unexpected request (API key {}) before SASL authentication", frame.api_key)),
        }
    }

    fn handshake(&mut self, frame: &RequestFrame) -> Gate {
        if matches!(self.state, State::Authenticating(_)) || !handled_sasl(ApiKey::SaslHandshake, frame.api_version) {
            return Gate::Close(format!("SaslHandshake v{} out of order or unsupported", frame.api_version));
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
                self.state = State::Authenticating(SaslServer::new(m));
                false
            }
            None => {
                body.error_code = error_code::UNSUPPORTED_SASL_MECHANISM;
                true
            }
        };
        answer(ApiKey::SaslHandshake, frame, &body, then_close, 0)
    }

    fn authenticate(&mut self, ctx: &ShardContext, frame: &RequestFrame, peer: &str) -> Gate {
        if !handled_sasl(ApiKey::SaslAuthenticate, frame.api_version) {
            return Gate::Close(format!("SaslAuthenticate v{} is not supported", frame.api_version));
        }
        let State::Authenticating(server) = &mut self.state else {
            return Gate::Close("SaslAuthenticate before SaslHandshake".into());
        };
        let req: SaslAuthenticateRequest = match decode_body(frame) {
            Ok(r) => r,
            Err(e) => return Gate::Close(format!("bad SaslAuthenticate: {e}")),
        };
        let mechanism = server.mechanism();
        let view = ctx.view();
        let credentials = BrokerCredentials { settings: &self.settings, view: &view };
        let step = server.step(&req.auth_bytes, &credentials, &server_nonce());
        let counters = ctx.metrics.shard(ctx.id);
        let (body, then_close, delay_ms) = match step {
            Step::Continue(token) => {
                (SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(token)), false, 0)
            }
            Step::Done { principal, token } if self.authenticated_once && principal != *self.principal => {
                counters.sasl_authentication_failures.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%peer, was = %self.principal, now = %principal, "re-authentication as another principal refused");
                (
                    failure("Cannot change principals during re-authentication".into())
                        .with_auth_bytes(Bytes::from(token)),
                    true,
                    self.settings.failed_authentication_delay_ms,
                )
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
                let body = SaslAuthenticateResponse::default()
                    .with_auth_bytes(Bytes::from(token))
                    .with_session_lifetime_ms(lifetime_ms as i64);
                (body, false, 0)
            }
            Step::Failed(message) => {
                counters.sasl_authentication_failures.fetch_add(1, Ordering::Relaxed);
                // Kafka's authenticator logs failed logins at INFO with the peer.
                tracing::info!(%peer, mechanism = mechanism.name(), "failed authentication: {message}");
                (failure(message), true, self.settings.failed_authentication_delay_ms)
            }
        };
        if then_close {
            self.state = State::Handshake;
        }
        answer(ApiKey::SaslAuthenticate, frame, &body, then_close, delay_ms)
    }
}

fn failure(message: String) -> SaslAuthenticateResponse {
    SaslAuthenticateResponse::default()
        .with_error_code(error_code::SASL_AUTHENTICATION_FAILED)
        .with_error_message(Some(StrBytes::from_string(message)))
}

/// SaslHandshake v1 (v0 is advertised for librdkafka's sake, but its unframed tokens
/// are not spoken) and SaslAuthenticate v0-2.
fn handled_sasl(key: ApiKey, version: i16) -> bool {
    match key {
        ApiKey::SaslHandshake => version == 1,
        _ => handled_version(key, version),
    }
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
