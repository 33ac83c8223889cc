//! A Kafka client connection from one broker's shard to another broker, on glommio (a
//! follower's fetcher talks to its leader with it). Versions are fixed rather than
//! negotiated: every broker of a cluster runs Spate, which speaks the versions used here.
//!
//! The connection takes the inter-broker listener's security (`ClientSecurity`): TLS
//! through futures-rustls over the glommio socket, then a SASL login (SaslHandshake v1,
//! SaslAuthenticate v2) driven by the pure `security::client::SaslClient`. Its steps run
//! on the shard's blocking pool: a SCRAM step derives the key with PBKDF2 (milliseconds
//! at Kafka's 4096 iterations, longer at the server's choice up to
//! `scram_iterations_max`), which must not hold the data core. A failed login is an
//! `Err` like a refused connection: callers log it and retry.

use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::messages::{ResponseHeader, SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::{Decodable, Request, StrBytes};

use crate::model::limits;
use crate::security::client::{client_nonce, ClientSecurity, SaslClient};

/// Connecting may take this long.
const peer_connect_timeout_ms: u64 = 3_000;
/// The largest answer a peer may send: a full fetch response plus headroom for its
/// headers and per-partition fields.
const peer_response_bytes_max: usize = limits::fetch_response_bytes_max + 1024 * 1024;
/// The TLS handshake and the SASL login together may take this long.
const peer_login_timeout_ms: u64 = 10_000;
/// A SASL login takes at most this many SaslAuthenticate rounds (SCRAM takes two).
const sasl_rounds_max: usize = 4;
const sasl_handshake_version: i16 = 1;
const sasl_authenticate_version: i16 = 2;

/// The socket, plain or inside TLS.
trait PeerIo: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> PeerIo for T {}

pub struct Peer {
    stream: Box<dyn PeerIo>,
    next_correlation_id: i32,
    client_id: String,
    pub addr: String,
}

impl Peer {
    /// Connect to `addr` and secure the connection as `security` says. Err says what
    /// failed: the TCP connection, the TLS handshake or the login.
    pub async fn connect(addr: &str, client_id: &str, security: &ClientSecurity) -> Result<Peer, String> {
        let stream = TcpStream::connect_timeout(addr, Duration::from_millis(peer_connect_timeout_ms))
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let login = async {
            let stream: Box<dyn PeerIo> = match &security.tls {
                None => Box::new(stream),
                Some(tls) => {
                    let name = ClientSecurity::server_name(addr)?;
                    let tls_stream = futures_rustls::TlsConnector::from(tls.clone())
                        .connect(name, stream)
                        .await
                        .map_err(|e| format!("{addr}: TLS handshake failed: {e}"))?;
                    Box::new(tls_stream)
                }
            };
            let mut peer =
                Peer { stream, next_correlation_id: 1, client_id: client_id.to_string(), addr: addr.to_string() };
            if let Some(login) = &security.sasl {
                peer.sasl_login(SaslClient::new(login.clone(), client_nonce())).await?;
            }
            Ok::<Peer, String>(peer)
        };
        match glommio::timer::timeout(Duration::from_millis(peer_login_timeout_ms), async {
            Ok(login.await.map_err(std::io::Error::other))
        })
        .await
        {
            Ok(Ok(peer)) => Ok(peer),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("{addr}: no TLS handshake and login within {peer_login_timeout_ms} ms")),
        }
    }

    /// SaslHandshake for the login's mechanism, then SaslAuthenticate until the client
    /// machine is satisfied (for SCRAM: the server's signature checked).
    async fn sasl_login(&mut self, mut client: SaslClient) -> Result<(), String> {
        let mechanism = client.mechanism().name();
        let timeout = Duration::from_millis(peer_login_timeout_ms);
        let refused = |addr: &str, what: String| format!("{addr}: SASL {mechanism} authentication failed: {what}");
        let handshake = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism));
        let resp = self.call(sasl_handshake_version, &handshake, timeout).await?;
        if resp.error_code != 0 {
            let enabled: Vec<&str> = resp.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(refused(
                &self.addr,
                format!("{} (the broker enables {enabled:?})", crate::client::error_name(resp.error_code)),
            ));
        }
        let mut token = client.first();
        for _ in 0..sasl_rounds_max {
            let req = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token));
            let resp = self.call(sasl_authenticate_version, &req, timeout).await?;
            if resp.error_code != 0 {
                let message = resp.error_message.as_ref().map(|m| m.to_string()).unwrap_or_default();
                return Err(refused(&self.addr, format!("{} {message}", crate::client::error_name(resp.error_code))));
            }
            let server_token = resp.auth_bytes;
            let (back, step) = glommio::executor()
                .spawn_blocking(move || {
                    let step = client.step(&server_token);
                    (client, step)
                })
                .await;
            client = back;
            match step.map_err(|e| refused(&self.addr, e))? {
                None => return Ok(()),
                Some(next) => token = next,
            }
        }
        Err(refused(&self.addr, format!("no outcome after {sasl_rounds_max} rounds")))
    }

    /// Send `req` at `version`; wait at most `timeout` for the answer.
    pub async fn call<R: Request>(&mut self, version: i16, req: &R, timeout: Duration) -> Result<R::Response, String> {
        self.call_with::<R>(version, |buf| req.encode(buf, version), timeout).await
    }

    /// Send a request of `R`'s API at `version`, its body written by `body` (one of
    /// `protocol::newer`'s encoders, for a version the crate does not code); wait at most
    /// `timeout` for the answer.
    pub async fn call_with<R: Request>(
        &mut self,
        version: i16,
        body: impl FnOnce(&mut bytes::BytesMut) -> anyhow::Result<()>,
        timeout: Duration,
    ) -> Result<R::Response, String> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let buf = crate::protocol::encode_request_with(R::KEY, version, correlation_id, &self.client_id, body)
            .map_err(|e| format!("encoding API {} v{version}: {e}", R::KEY))?;
        let addr = self.addr.clone();
        let io = |e: std::io::Error| format!("{addr}: {e}");
        let exchange = async {
            self.stream.write_all(&buf).await?;
            // TLS holds written records until flushed.
            self.stream.flush().await?;
            let mut len = [0u8; 4];
            self.stream.read_exact(&mut len).await?;
            let len = i32::from_be_bytes(len);
            if len < 4 || len as usize > peer_response_bytes_max {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("response length {len}")));
            }
            let mut frame = vec![0u8; len as usize];
            self.stream.read_exact(&mut frame).await?;
            Ok(frame)
        };
        let frame = glommio::timer::timeout(timeout, async { exchange.await.map_err(glommio::GlommioError::IoError) })
            .await
            .map_err(|e| format!("{}: {e}", self.addr))?;
        let mut frame = Bytes::from(frame);
        let decode = |e: anyhow::Error| format!("decoding API {} v{version} answer: {e}", R::KEY);
        let key = kafka_protocol::messages::ApiKey::try_from(R::KEY).map_err(|_| format!("unknown API {}", R::KEY))?;
        let header_version = crate::protocol::newer::response_header_version(key, version);
        let resp_header = ResponseHeader::decode(&mut frame, header_version).map_err(decode)?;
        if resp_header.correlation_id != correlation_id {
            return Err(io(std::io::Error::other("correlation id mismatch")));
        }
        let resp = crate::protocol::decode_response_body::<R::Response>(R::KEY, version, &mut frame).map_err(decode)?;
        if frame.has_remaining() {
            tracing::debug!(api = R::KEY, left = frame.remaining(), "answer has trailing bytes");
        }
        Ok(resp)
    }
}
