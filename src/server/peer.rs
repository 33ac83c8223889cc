//! A Kafka client connection from one broker's shard to another broker, on glommio (a
//! follower's fetcher talks to its leader with it). Versions are fixed rather than
//! negotiated: every broker of a cluster runs Spate, which speaks the versions used here.

use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::messages::ResponseHeader;
use kafka_protocol::protocol::{Decodable, HeaderVersion, Request};

use crate::model::limits;

/// Connecting may take this long.
const peer_connect_timeout_ms: u64 = 3_000;
/// The largest answer a peer may send: a full fetch response plus headroom for its
/// headers and per-partition fields.
const peer_response_bytes_max: usize = limits::fetch_response_bytes_max + 1024 * 1024;

pub struct Peer {
    stream: TcpStream,
    next_correlation_id: i32,
    client_id: String,
    pub addr: String,
}

impl Peer {
    pub async fn connect(addr: &str, client_id: &str) -> Result<Peer, String> {
        let stream = TcpStream::connect_timeout(addr, Duration::from_millis(peer_connect_timeout_ms))
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        Ok(Peer { stream, next_correlation_id: 1, client_id: client_id.to_string(), addr: addr.to_string() })
    }

    /// Send `req` at `version`; wait at most `timeout` for the answer.
    pub async fn call<R: Request>(&mut self, version: i16, req: &R, timeout: Duration) -> Result<R::Response, String> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let buf = crate::protocol::encode_request(version, correlation_id, &self.client_id, req)
            .map_err(|e| format!("encoding API {} v{version}: {e}", R::KEY))?;
        let addr = self.addr.clone();
        let io = |e: std::io::Error| format!("{addr}: {e}");
        let exchange = async {
            self.stream.write_all(&buf).await?;
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
        let resp_header = ResponseHeader::decode(&mut frame, R::Response::header_version(version)).map_err(decode)?;
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
