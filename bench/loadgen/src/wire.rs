//! Kafka wire framing over a blocking `TcpStream`: request encoding, response
//! decoding, and version negotiation. No threads here; callers split a
//! connection into a writer half and a reader half with `try_clone`.

use std::io::{Read, Write};
use std::net::TcpStream;

use anyhow::{bail, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

/// Largest response frame we accept; a bigger length prefix means a broken stream.
pub const frame_bytes_max: usize = 256 * 1024 * 1024;

pub const client_id: &str = "spate-bench";

/// The versions this client speaks, per API: the newest version that still
/// addresses topics by name (Produce v13 and Fetch v13 switch to topic ids).
const version_caps: &[(ApiKey, i16)] = &[
    (ApiKey::Produce, 9),
    (ApiKey::Fetch, 12),
    (ApiKey::ListOffsets, 7),
    (ApiKey::Metadata, 12),
    (ApiKey::CreateTopics, 7),
];

/// Negotiated version per API for one broker.
#[derive(Clone, Debug, Default)]
pub struct Versions {
    pub produce: i16,
    pub fetch: i16,
    pub list_offsets: i16,
    pub metadata: i16,
    pub create_topics: i16,
}

/// Encode one request frame (length prefix, header, body) into `out`.
pub fn encode_request<R: Request>(out: &mut BytesMut, correlation_id: i32, version: i16, req: &R) -> Result<()> {
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str(client_id)));
    let header_version = R::header_version(version);
    let len = header.compute_size(header_version)? + req.compute_size(version)?;
    out.reserve(4 + len);
    out.put_i32(len as i32);
    header.encode(out, header_version)?;
    req.encode(out, version)?;
    Ok(())
}

/// Read one response frame; returns its correlation id and the remaining bytes
/// (response header still to be skipped by `decode_response`).
pub fn read_frame(stream: &mut TcpStream) -> Result<Bytes> {
    let mut len_buf = [0u8; 4];
    stream.read_exact(&mut len_buf).context("reading frame length")?;
    let len = i32::from_be_bytes(len_buf);
    if len < 4 || len as usize > frame_bytes_max {
        bail!("bad response frame length {len}");
    }
    let mut buf = vec![0u8; len as usize];
    stream.read_exact(&mut buf).context("reading frame body")?;
    Ok(Bytes::from(buf))
}

/// Peek the correlation id of a response frame (always the first 4 bytes).
pub fn frame_correlation_id(frame: &Bytes) -> i32 {
    i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]])
}

/// Decode a response frame for request type `R` at `version`.
pub fn decode_response<R: Request>(mut frame: Bytes, version: i16) -> Result<R::Response> {
    let header_version = R::Response::header_version(version);
    ResponseHeader::decode(&mut frame, header_version)?;
    let resp = R::Response::decode(&mut frame, version)?;
    Ok(resp)
}

/// A blocking, one-request-at-a-time connection for setup calls.
pub struct SyncConn {
    pub stream: TcpStream,
    next_correlation_id: i32,
}

impl SyncConn {
    pub fn connect(addr: &str) -> Result<SyncConn> {
        let stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(SyncConn { stream, next_correlation_id: 1 })
    }

    pub fn call<R: Request>(&mut self, version: i16, req: &R) -> Result<R::Response> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id += 1;
        let mut buf = BytesMut::new();
        encode_request(&mut buf, correlation_id, version, req)?;
        self.stream.write_all(&buf)?;
        let frame = read_frame(&mut self.stream)?;
        let got = frame_correlation_id(&frame);
        if got != correlation_id {
            bail!("correlation id mismatch: sent {correlation_id}, got {got}");
        }
        decode_response::<R>(frame, version)
    }

    /// ApiVersions v0 (understood by every broker), then pick per API the
    /// highest version both sides speak.
    pub fn negotiate(&mut self) -> Result<Versions> {
        let resp: ApiVersionsResponse = self.call(0, &ApiVersionsRequest::default())?;
        if resp.error_code != 0 {
            bail!("ApiVersions error code {}", resp.error_code);
        }
        let pick = |key: ApiKey| -> Result<i16> {
            let cap = version_caps.iter().find(|(k, _)| *k == key).unwrap().1;
            let Some(v) = resp.api_keys.iter().find(|v| v.api_key == key as i16) else {
                bail!("broker does not support {key:?}");
            };
            let chosen = cap.min(v.max_version);
            if chosen < v.min_version {
                bail!("no common version for {key:?}: broker {}..={}", v.min_version, v.max_version);
            }
            Ok(chosen)
        };
        Ok(Versions {
            produce: pick(ApiKey::Produce)?,
            fetch: pick(ApiKey::Fetch)?,
            list_offsets: pick(ApiKey::ListOffsets)?,
            metadata: pick(ApiKey::Metadata)?,
            create_topics: pick(ApiKey::CreateTopics)?,
        })
    }
}

/// Walk the complete record batches in a Fetch `records` blob without
/// decoding records: yields (base_offset, batch bytes). A trailing partial
/// batch (allowed by the protocol) is skipped.
pub fn split_batches(mut records: Bytes) -> Vec<(i64, Bytes)> {
    let mut out = Vec::new();
    while records.len() >= 12 {
        let base_offset = (&records[0..8]).get_i64();
        let batch_len = (&records[8..12]).get_i32();
        if batch_len < 0 {
            break;
        }
        let total = 12 + batch_len as usize;
        if records.len() < total {
            break;
        }
        out.push((base_offset, records.split_to(total)));
    }
    out
}

/// Offset of the last record in a v2 batch: base offset + last offset delta
/// (at byte 23 of the batch header).
pub fn batch_last_offset(batch: &Bytes) -> Option<i64> {
    if batch.len() < 27 {
        return None;
    }
    let base_offset = (&batch[0..8]).get_i64();
    let last_offset_delta = (&batch[23..27]).get_i32();
    Some(base_offset + last_offset_delta as i64)
}
