//! A Kafka client connection from one broker's shard to another broker, on glommio (a
//! follower's fetcher talks to its leader with it). Versions are fixed rather than
//! negotiated: every broker of a cluster runs Spate, which speaks the versions used here.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

use crate::model::limits;

/// Connecting, and each request, may take this long.
const peer_connect_timeout_ms: u64 = 3_000;

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
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_string(self.client_id.clone())));
        let header_version = R::header_version(version);
        let encode = |e: anyhow::Error| format!("encoding API {} v{version}: {e}", R::KEY);
        let size = header.compute_size(header_version).map_err(encode)? + req.compute_size(version).map_err(encode)?;
        let mut buf = BytesMut::with_capacity(4 + size);
        buf.put_i32(size as i32);
        header.encode(&mut buf, header_version).map_err(encode)?;
        req.encode(&mut buf, version).map_err(encode)?;
        let addr = self.addr.clone();
        let io = |e: std::io::Error| format!("{addr}: {e}");
        let exchange = async {
            self.stream.write_all(&buf).await?;
            let mut len = [0u8; 4];
            self.stream.read_exact(&mut len).await?;
            let len = i32::from_be_bytes(len);
            if len < 4 || len as usize > limits::fetch_response_bytes_max + 1024 * 1024 {
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
        let resp = R::Response::decode(&mut frame, version).map_err(decode)?;
        if frame.has_remaining() {
            tracing::debug!(api = R::KEY, left = frame.remaining(), "answer has trailing bytes");
        }
        Ok(resp)
    }
}
