//! One blocking connection to one broker: framing, correlation ids, timeouts,
//! ApiVersions negotiation, and the listener's security: TLS (rustls over the socket)
//! and a SASL login (SaslHandshake v1, then SaslAuthenticate rounds driven by
//! `security::client::SaslClient`) right after ApiVersions. One request in flight at a
//! time; no threads.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, ResponseHeader, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, HeaderVersion, Request, StrBytes};

use super::Error;
use crate::security::client::{ClientSecurity, SaslClient};

/// A SASL login takes at most this many SaslAuthenticate rounds (SCRAM takes two).
const sasl_rounds_max: usize = 4;

/// Largest response frame accepted; a bigger length prefix means a broken stream.
pub const response_bytes_max: usize = 256 * 1024 * 1024;

/// The newest version of each API this client speaks. Caps stop where a version
/// changes the shape this client fills in (Fetch v13 and Produce v13 address topics by
/// id, FindCoordinator v4 batches keys, OffsetFetch v8 batches groups).
const version_caps: &[(ApiKey, i16)] = &[
    (ApiKey::Produce, 9),
    (ApiKey::Fetch, 12),
    (ApiKey::AlterPartition, 3),
    (ApiKey::OffsetForLeaderEpoch, 4),
    (ApiKey::ListOffsets, 7),
    (ApiKey::Metadata, 12),
    (ApiKey::CreateTopics, 7),
    (ApiKey::DeleteTopics, 5),
    (ApiKey::DescribeConfigs, 4),
    (ApiKey::IncrementalAlterConfigs, 1),
    (ApiKey::FindCoordinator, 3),
    (ApiKey::JoinGroup, 7),
    (ApiKey::SyncGroup, 5),
    (ApiKey::Heartbeat, 4),
    (ApiKey::LeaveGroup, 5),
    (ApiKey::OffsetCommit, 8),
    (ApiKey::OffsetFetch, 7),
    (ApiKey::ListGroups, 4),
    (ApiKey::DescribeGroups, 5),
    (ApiKey::DeleteGroups, 2),
    (ApiKey::InitProducerId, 4),
    (ApiKey::AddPartitionsToTxn, 3),
    (ApiKey::AddOffsetsToTxn, 3),
    (ApiKey::EndTxn, 3),
    (ApiKey::ListTransactions, 1),
    (ApiKey::CreateAcls, 3),
    (ApiKey::DescribeAcls, 3),
    (ApiKey::DeleteAcls, 3),
    (ApiKey::DescribeUserScramCredentials, 0),
    (ApiKey::AlterUserScramCredentials, 0),
    (ApiKey::DescribeClientQuotas, 1),
    (ApiKey::AlterClientQuotas, 1),
    (ApiKey::SaslHandshake, 1),
    (ApiKey::SaslAuthenticate, 2),
];

/// The oldest version this client can fill in correctly, per API (fields it relies on
/// appear here). Brokers that only speak older versions are refused with a clear error.
const version_floors: &[(ApiKey, i16)] = &[
    (ApiKey::Produce, 3),
    (ApiKey::Fetch, 4),
    (ApiKey::ListOffsets, 1),
    (ApiKey::Metadata, 4),
    (ApiKey::CreateTopics, 2),
    (ApiKey::DeleteTopics, 1),
    (ApiKey::DescribeConfigs, 1),
    (ApiKey::IncrementalAlterConfigs, 0),
    (ApiKey::FindCoordinator, 1),
    (ApiKey::JoinGroup, 1),
    (ApiKey::SyncGroup, 0),
    (ApiKey::Heartbeat, 0),
    (ApiKey::LeaveGroup, 0),
    (ApiKey::OffsetCommit, 2),
    (ApiKey::OffsetFetch, 2),
    (ApiKey::ListGroups, 0),
    (ApiKey::DescribeGroups, 0),
    (ApiKey::DeleteGroups, 0),
    // v1 adds the resource pattern type (KIP-290: prefixed ACLs).
    (ApiKey::CreateAcls, 1),
    (ApiKey::DescribeAcls, 1),
    (ApiKey::DeleteAcls, 1),
    // v0 sends the tokens unframed; only the SaslAuthenticate framing is spoken here.
    (ApiKey::SaslHandshake, 1),
];

/// The socket, plain or inside TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

pub struct Connection {
    pub addr: String,
    stream: Stream,
    next_correlation_id: i32,
    /// api key -> (min, max) version the broker speaks.
    broker_versions: HashMap<i16, (i16, i16)>,
    client_id: String,
}

impl Connection {
    /// Connect to a PLAINTEXT listener (see `open_secure`).
    pub fn open(addr: &str, timeout: Duration, client_id: &str) -> Result<Connection, Error> {
        Self::open_secure(addr, timeout, client_id, &ClientSecurity::plaintext())
    }

    /// Connect, with `timeout` for the TCP handshake and for each later read and write;
    /// run the TLS handshake when `security` says so; negotiate versions with ApiVersions
    /// v0 (understood by every broker); then log in with SASL when `security` says so.
    /// A certificate or a login refused is `Error::Authentication`.
    pub fn open_secure(
        addr: &str,
        timeout: Duration,
        client_id: &str,
        security: &ClientSecurity,
    ) -> Result<Connection, Error> {
        let addrs: Vec<_> =
            addr.to_socket_addrs().map_err(|e| Error::Unreachable(format!("cannot resolve {addr}: {e}")))?.collect();
        let mut last = format!("cannot resolve {addr}: no address");
        for sa in addrs {
            match TcpStream::connect_timeout(&sa, timeout) {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    stream.set_read_timeout(Some(timeout)).map_err(|e| Error::Unreachable(e.to_string()))?;
                    stream.set_write_timeout(Some(timeout)).map_err(|e| Error::Unreachable(e.to_string()))?;
                    let stream = match &security.tls {
                        None => Stream::Plain(stream),
                        Some(tls) => Stream::Tls(Box::new(tls_handshake(addr, tls.clone(), stream)?)),
                    };
                    let mut conn = Connection {
                        addr: addr.to_string(),
                        stream,
                        next_correlation_id: 1,
                        broker_versions: HashMap::new(),
                        client_id: client_id.to_string(),
                    };
                    conn.negotiate()?;
                    if let Some(login) = &security.sasl {
                        conn.sasl_login(SaslClient::new(login.clone(), crate::security::client::client_nonce()))?;
                    }
                    return Ok(conn);
                }
                Err(e) => last = format!("cannot connect to {addr}: {e}"),
            }
        }
        Err(Error::Unreachable(last))
    }

    fn negotiate(&mut self) -> Result<(), Error> {
        let resp: ApiVersionsResponse = self.call_at(0, &ApiVersionsRequest::default())?;
        if resp.error_code != 0 {
            return Err(Error::Protocol(format!("{}: ApiVersions answered error code {}", self.addr, resp.error_code)));
        }
        for v in &resp.api_keys {
            self.broker_versions.insert(v.api_key, (v.min_version, v.max_version));
        }
        Ok(())
    }

    /// SaslHandshake for the login's mechanism, then SaslAuthenticate until the client
    /// machine is satisfied (for SCRAM: the server's signature checked).
    fn sasl_login(&mut self, mut client: SaslClient) -> Result<(), Error> {
        let mechanism = client.mechanism().name();
        let refused = |addr: &str, what: String| {
            Error::Authentication(format!("{addr}: SASL {mechanism} authentication failed: {what}"))
        };
        let (_, handshake) =
            self.call(&SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism)))?;
        if handshake.error_code != 0 {
            let enabled: Vec<&str> = handshake.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(refused(
                &self.addr,
                format!("{} (the broker enables {enabled:?})", super::error_name(handshake.error_code)),
            ));
        }
        let mut token = client.first();
        for _ in 0..sasl_rounds_max {
            let (_, resp) = self.call(&SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)))?;
            if resp.error_code != 0 {
                let message = resp.error_message.as_ref().map(|m| m.to_string()).unwrap_or_default();
                return Err(refused(&self.addr, format!("{} {message}", super::error_name(resp.error_code))));
            }
            match client.step(&resp.auth_bytes).map_err(|e| refused(&self.addr, e))? {
                None => return Ok(()),
                Some(next) => token = next,
            }
        }
        Err(refused(&self.addr, format!("no outcome after {sasl_rounds_max} rounds")))
    }

    /// The version to use for `key`: the newest both sides speak.
    pub fn version(&self, key: ApiKey) -> Result<i16, Error> {
        self.version_of(key as i16)
    }

    fn version_of(&self, key_code: i16) -> Result<i16, Error> {
        let key = ApiKey::try_from(key_code)
            .map_err(|_| Error::Unsupported(format!("API key {key_code} is unknown to this client")))?;
        let cap = version_caps.iter().find(|(k, _)| *k == key).map(|(_, v)| *v).unwrap_or(0);
        let floor = version_floors.iter().find(|(k, _)| *k == key).map(|(_, v)| *v).unwrap_or(0);
        let Some(&(lo, hi)) = self.broker_versions.get(&(key as i16)) else {
            return Err(Error::Unsupported(format!("{key:?} is not supported by the broker at {}", self.addr)));
        };
        let chosen = cap.min(hi);
        if chosen < lo.max(floor) {
            return Err(Error::Unsupported(format!(
                "no common version of {key:?} with the broker at {} (broker {lo}..={hi}, client {floor}..={cap})",
                self.addr
            )));
        }
        Ok(chosen)
    }

    /// Send one request at the negotiated version and wait for its response.
    pub fn call<R: Request>(&mut self, req: &R) -> Result<(i16, R::Response), Error> {
        let version = self.version_of(R::KEY)?;
        Ok((version, self.call_at(version, req)?))
    }

    /// `call` at a fixed `version`, for APIs Spate's brokers handle without advertising
    /// them (`protocol::PEER_APIS`).
    pub fn call_version<R: Request>(&mut self, version: i16, req: &R) -> Result<R::Response, Error> {
        self.call_at(version, req)
    }

    /// Send a request of API `key` at `version` whose body `body` writes (one of
    /// `protocol::newer`'s encoders, for a version the crate does not code) and return the
    /// answer's body, after its header, for `newer`'s decoders.
    pub fn call_raw(
        &mut self,
        key: ApiKey,
        version: i16,
        body: impl FnOnce(&mut bytes::BytesMut) -> anyhow::Result<()>,
    ) -> Result<Bytes, Error> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let buf = crate::protocol::encode_request_with(key as i16, version, correlation_id, &self.client_id, body)
            .map_err(|e| Error::Protocol(format!("encoding {key:?} v{version}: {e}")))?;
        self.stream.write_all(&buf).map_err(|e| self.io_error(e))?;
        let mut frame = self.read_frame()?;
        let header_version = crate::protocol::newer::response_header_version(key, version);
        let header = ResponseHeader::decode(&mut frame, header_version)
            .map_err(|e| Error::Protocol(format!("decoding {key:?} v{version} response header: {e}")))?;
        if header.correlation_id != correlation_id {
            return Err(Error::Protocol(format!("{}: correlation id mismatch", self.addr)));
        }
        Ok(frame)
    }

    /// Send a request the broker does not answer (Produce with acks=0).
    pub fn send_only<R: Request>(&mut self, req: &R) -> Result<(), Error> {
        let version = self.version_of(R::KEY)?;
        self.write_request(version, req)?;
        Ok(())
    }

    fn write_request<R: Request>(&mut self, version: i16, req: &R) -> Result<i32, Error> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let buf = crate::protocol::encode_request(version, correlation_id, &self.client_id, req)
            .map_err(|e| Error::Protocol(format!("encoding API {} v{version}: {e}", R::KEY)))?;
        self.stream.write_all(&buf).map_err(|e| self.io_error(e))?;
        Ok(correlation_id)
    }

    fn call_at<R: Request>(&mut self, version: i16, req: &R) -> Result<R::Response, Error> {
        let correlation_id = self.write_request(version, req)?;
        let mut frame = self.read_frame()?;
        let resp_header_version = R::Response::header_version(version);
        let decode_err =
            |e: anyhow::Error| Error::Protocol(format!("decoding API {} v{version} response: {e}", R::KEY));
        let resp_header = ResponseHeader::decode(&mut frame, resp_header_version).map_err(decode_err)?;
        if resp_header.correlation_id != correlation_id {
            return Err(Error::Protocol(format!(
                "{}: correlation id mismatch (sent {correlation_id}, got {})",
                self.addr, resp_header.correlation_id
            )));
        }
        crate::protocol::decode_response_body::<R::Response>(R::KEY, version, &mut frame).map_err(decode_err)
    }

    fn read_frame(&mut self) -> Result<Bytes, Error> {
        let mut len_buf = [0u8; 4];
        self.stream.read_exact(&mut len_buf).map_err(|e| self.io_error(e))?;
        let len = i32::from_be_bytes(len_buf);
        if len < 4 || len as usize > response_bytes_max {
            return Err(Error::Protocol(format!("{}: bad response frame length {len}", self.addr)));
        }
        let mut buf = vec![0u8; len as usize];
        self.stream.read_exact(&mut buf).map_err(|e| self.io_error(e))?;
        Ok(Bytes::from(buf))
    }

    fn io_error(&self, e: std::io::Error) -> Error {
        if let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
            return Error::Authentication(format!("{}: TLS: {tls}", self.addr));
        }
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                Error::Timeout(format!("{}: no answer within the request timeout", self.addr))
            }
            _ => Error::Disconnected(format!("{}: {e}", self.addr)),
        }
    }
}

/// Run the TLS handshake to its end, so that a certificate problem is reported as one.
fn tls_handshake(
    addr: &str,
    config: std::sync::Arc<rustls::ClientConfig>,
    mut sock: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, Error> {
    let name = ClientSecurity::server_name(addr).map_err(|e| Error::Usage(format!("{addr}: {e}")))?;
    let mut tls =
        rustls::ClientConnection::new(config, name).map_err(|e| Error::Authentication(format!("{addr}: TLS: {e}")))?;
    while tls.is_handshaking() {
        if let Err(e) = tls.complete_io(&mut sock) {
            return Err(match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
                Some(tls) => Error::Authentication(format!("{addr}: TLS handshake failed: {tls}")),
                None => Error::Disconnected(format!("{addr}: TLS handshake: {e}")),
            });
        }
    }
    Ok(rustls::StreamOwned::new(tls, sock))
}
