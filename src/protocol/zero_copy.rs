//! Responses made of bytes and file ranges, so Fetch can send record batches straight
//! from segment files to the socket (sendfile) without copying them through user space.
//!
//! The Fetch response is encoded by the `kafka-protocol` codec with a 16-byte marker
//! (`new_marker`: secret random bytes and a counter) in place of each file-backed partition's records; `splice_file_ranges` then
//! finds each marker (in encoding order), rewrites the length prefix in front of it to
//! the real length and puts the file range where the marker was. Records are the last
//! field of a partition before its tagged fields, and their length prefix is an i32
//! (non-flexible versions) or an unsigned varint of length + 1 (flexible versions).

use std::fs::File;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::ProtocolError;

pub const marker_bytes: usize = 16;

/// One piece of a response frame, in the order it goes on the wire.
#[derive(Debug, Clone)]
pub enum ResponsePart {
    Bytes(Bytes),
    File { file: Arc<File>, position: u64, length: u64 },
}

/// A whole response frame (its 4-byte length prefix included in the first part).
#[derive(Debug, Clone)]
pub struct Response {
    pub parts: Vec<ResponsePart>,
    /// Client quotas (KIP-219): after this response is sent, the connection reads no
    /// further request for this long (0: not throttled).
    pub throttle_ms: u64,
}

impl Response {
    pub fn len_bytes(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| match p {
                ResponsePart::Bytes(b) => b.len() as u64,
                ResponsePart::File { length, .. } => *length,
            })
            .sum()
    }
}

impl From<Bytes> for Response {
    fn from(b: Bytes) -> Self {
        Self { parts: vec![ResponsePart::Bytes(b)], throttle_ms: 0 }
    }
}

/// A file range to put where `marker` was encoded.
pub struct FileRange {
    pub marker: [u8; marker_bytes],
    pub file: Arc<File>,
    pub position: u64,
    pub length: u64,
}

/// A marker no other byte sequence of a response can be expected to equal: eight bytes
/// drawn from the OS's random source once per thread (never sent anywhere, so nobody can
/// put them in a record), then a per-thread counter. One `getrandom` per thread, not
/// one per file range.
pub fn new_marker() -> [u8; marker_bytes] {
    thread_local! {
        static KEY: [u8; 8] = {
            let random = uuid::Uuid::new_v4();
            random.as_bytes()[..8].try_into().expect("16 bytes")
        };
        static COUNTER: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    let n = COUNTER.with(|c| {
        let n = c.get();
        c.set(n.wrapping_add(1));
        n
    });
    let mut marker = [0u8; marker_bytes];
    KEY.with(|k| marker[..8].copy_from_slice(k));
    marker[8..].copy_from_slice(&n.to_be_bytes());
    marker
}

fn put_unsigned_varint(b: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        b.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

/// Replace each range's marker in `frame` (a complete encoded response frame, length
/// prefix first) by the file range, fixing the records length prefix and the frame
/// length.
pub fn splice_file_ranges(frame: Bytes, flexible: bool, ranges: Vec<FileRange>) -> Result<Response, ProtocolError> {
    if ranges.is_empty() {
        return Ok(frame.into());
    }
    let bad = |why: &str| ProtocolError::BadBody(format!("zero-copy splice: {why}"));
    // The marker's own prefix as the codec wrote it.
    let (prefix_len, marker_prefix): (usize, Vec<u8>) =
        if flexible { (1, vec![(marker_bytes + 1) as u8]) } else { (4, (marker_bytes as i32).to_be_bytes().to_vec()) };
    let mut parts = Vec::with_capacity(2 * ranges.len() + 1);
    let mut cursor = 4; // after the frame length
    let mut head = BytesMut::new();
    let mut total: u64 = 0;
    for r in &ranges {
        let at = memchr::memmem::find(&frame[cursor..], &r.marker).ok_or_else(|| bad("marker not found"))? + cursor;
        if at < cursor + prefix_len || frame[at - prefix_len..at] != marker_prefix[..] {
            return Err(bad("marker without its length prefix"));
        }
        head.extend_from_slice(&frame[cursor..at - prefix_len]);
        if flexible {
            put_unsigned_varint(&mut head, r.length + 1);
        } else {
            let len = i32::try_from(r.length).map_err(|_| bad("record set larger than i32"))?;
            head.put_i32(len);
        }
        let chunk = head.split().freeze();
        total += chunk.len() as u64 + r.length;
        parts.push(ResponsePart::Bytes(chunk));
        parts.push(ResponsePart::File { file: r.file.clone(), position: r.position, length: r.length });
        cursor = at + marker_bytes;
    }
    let tail = frame.slice(cursor..);
    total += tail.len() as u64;
    parts.push(ResponsePart::Bytes(tail));
    let size = i32::try_from(total).map_err(|_| bad("response larger than i32"))?;
    // Prepend the frame length to the first chunk.
    if let ResponsePart::Bytes(first) = &parts[0] {
        let mut b = BytesMut::with_capacity(4 + first.len());
        b.put_i32(size);
        b.extend_from_slice(first);
        parts[0] = ResponsePart::Bytes(b.freeze());
    }
    Ok(Response { parts, throttle_ms: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{ApiKey, FetchResponse, TopicName};
    use kafka_protocol::protocol::{Decodable, StrBytes};
    use std::io::Write;

    /// A response spliced with file ranges must read back, byte for byte, as the same
    /// response encoded with the records inline, for flexible and older versions.
    #[test]
    fn spliced_equals_inline_encoding() {
        let mut f = tempfile::tempfile().unwrap();
        let content: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&content).unwrap();
        let file = Arc::new(f);
        for version in [4i16, 11, 12, 15] {
            let ranges_spec = [(10u64, 200_000u64), (5u64, 130u64)];
            let mut ranges = Vec::new();
            let mut with_markers = Vec::new();
            let mut inline = Vec::new();
            for (i, (pos, len)) in ranges_spec.iter().enumerate() {
                let m = new_marker();
                ranges.push(FileRange { marker: m, file: file.clone(), position: *pos, length: *len });
                let pd = PartitionData::default().with_partition_index(i as i32).with_high_watermark(99);
                with_markers.push(pd.clone().with_records(Some(Bytes::copy_from_slice(&m))));
                inline.push(
                    pd.with_records(Some(Bytes::copy_from_slice(&content[*pos as usize..(*pos + *len) as usize]))),
                );
            }
            let topic = |ps| {
                // v13+ name the topic by id.
                FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
                    .with_topic(TopicName(StrBytes::from_static_str("t")))
                    .with_topic_id(uuid::Uuid::from_u128(7))
                    .with_partitions(ps)])
            };
            let framed = crate::protocol::encode_response(ApiKey::Fetch, version, 5, &topic(with_markers)).unwrap();
            let expected = crate::protocol::encode_response(ApiKey::Fetch, version, 5, &topic(inline)).unwrap();
            let resp = splice_file_ranges(framed, version >= 12, ranges).unwrap();
            let mut out = Vec::new();
            for p in &resp.parts {
                match p {
                    ResponsePart::Bytes(b) => out.extend_from_slice(b),
                    ResponsePart::File { position, length, .. } => {
                        out.extend_from_slice(&content[*position as usize..(*position + *length) as usize])
                    }
                }
            }
            assert_eq!(out.len() as u64, resp.len_bytes());
            assert_eq!(out, expected.to_vec(), "version {version}");
            // And the codec reads it back.
            let mut body = Bytes::from(out).slice(4..);
            let hv = ApiKey::Fetch.response_header_version(version);
            kafka_protocol::messages::ResponseHeader::decode(&mut body, hv).unwrap();
            let decoded = FetchResponse::decode(&mut body, version).unwrap();
            assert_eq!(decoded.responses[0].partitions[0].records.as_ref().unwrap().len(), 200_000);
        }
    }
}
