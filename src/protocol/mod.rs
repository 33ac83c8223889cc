//! Kafka wire protocol: framing, the request header, the ApiVersions table, response
//! encoding. The message codecs come from the `kafka-protocol` crate.
//!
//! A frame is an i32 big-endian length followed by that many bytes. The length is
//! checked against `socket.request.max.bytes` before anything is allocated.

pub mod shape;
mod shapes;
pub mod zero_copy;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::model::limits;

/// The APIs Spate implements, with the version ranges it advertises. These ranges are
/// chosen so that librdkafka 2.x (Debian's kcat runs 2.0.2), kafka-python 2.x, kafkajs
/// 2.x and the Java client 3.x each find a common version; every version listed is
/// handled. Versions that need topic ids on the request side (Fetch 13+, Produce 13,
/// DeleteTopics 6 by id) are left out until topic ids are used on the record path.
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 6),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 8),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::CreatePartitions, 0, 3),
    // Between brokers: registration and liveness with the active coordinator.
    (ApiKey::BrokerRegistration, 0, 4),
    (ApiKey::BrokerHeartbeat, 0, 1),
    (ApiKey::AlterPartition, 2, 3),
    // Followers before fetching from a new leader; consumers detecting truncation.
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    // Idempotent producers (no transactional ids yet).
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::DescribeProducers, 0, 0),
];

pub fn supported_range(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED_APIS.iter().find(|(k, _, _)| *k == key).map(|(_, lo, hi)| (*lo, *hi))
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("frame length {0} is negative or above socket.request.max.bytes ({max})", max = limits::request_frame_bytes_max)]
    FrameTooLarge(i64),
    #[error("request header does not decode: {0}")]
    BadHeader(String),
    #[error("request body does not decode: {0}")]
    BadBody(String),
}

/// Check a frame's length prefix before allocating for it.
pub fn check_frame_len(len: i32) -> Result<usize, ProtocolError> {
    if len < 0 || len as usize > limits::request_frame_bytes_max {
        return Err(ProtocolError::FrameTooLarge(len as i64));
    }
    Ok(len as usize)
}

/// A request frame with its header decoded; the body is still raw.
pub struct RequestFrame {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    /// Set when the API key is known to the codec library.
    pub header: Option<RequestHeader>,
    pub body: Bytes,
    /// The client's address as Kafka shows it in group descriptions ("/127.0.0.1").
    pub client_host: String,
}

/// Decode the header of a request frame. Unknown API keys and versions still yield the
/// correlation id (from the fixed v0/v1 header prefix) so they can be answered.
pub fn decode_frame(mut frame: Bytes) -> Result<RequestFrame, ProtocolError> {
    if frame.len() < 8 {
        return Err(ProtocolError::BadHeader(format!("frame of {} bytes is shorter than a header", frame.len())));
    }
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let api_version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Ok(key) = ApiKey::try_from(api_key) else {
        return Ok(RequestFrame {
            api_key,
            api_version,
            correlation_id,
            header: None,
            body: Bytes::new(),
            client_host: String::new(),
        });
    };
    if !(key.valid_versions().min..=key.valid_versions().max).contains(&api_version) {
        return Ok(RequestFrame {
            api_key,
            api_version,
            correlation_id,
            header: None,
            body: Bytes::new(),
            client_host: String::new(),
        });
    }
    let header_version = key.request_header_version(api_version);
    let header =
        RequestHeader::decode(&mut frame, header_version).map_err(|e| ProtocolError::BadHeader(e.to_string()))?;
    Ok(RequestFrame {
        api_key,
        api_version,
        correlation_id,
        header: Some(header),
        body: frame,
        client_host: String::new(),
    })
}

/// Decode a request body. Its shape is checked first (`shape.rs`): the codec allocates
/// for array counts it reads, so only bodies whose every length fits the frame reach it.
pub fn decode_body<T: Decodable>(frame: &RequestFrame) -> Result<T, ProtocolError> {
    shape::check_request(frame.api_key, frame.api_version, &frame.body)
        .map_err(|e| ProtocolError::BadBody(e.to_string()))?;
    let mut body = frame.body.clone();
    T::decode(&mut body, frame.api_version).map_err(|e| ProtocolError::BadBody(e.to_string()))
}

/// Decode a response body from a peer (after its header), its shape checked first.
pub fn decode_response_body<T: Decodable>(api_key: i16, version: i16, body: &mut Bytes) -> anyhow::Result<T> {
    shape::check_response(api_key, version, body)?;
    T::decode(body, version)
}

/// Encode a whole response frame: length, header (v0 or v1 by the API's rules), body.
/// ApiVersions always answers with a v0 header, even for flexible versions (KIP-511).
pub fn encode_response<T: Encodable>(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &T,
) -> anyhow::Result<Bytes> {
    let header_version = key.response_header_version(version);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let size = header.compute_size(header_version)? + body.compute_size(version)?;
    let mut buf = BytesMut::with_capacity(4 + size);
    buf.put_i32(size as i32);
    header.encode(&mut buf, header_version)?;
    body.encode(&mut buf, version)?;
    debug_assert_eq!(buf.len(), 4 + size);
    Ok(buf.freeze())
}

/// Encode a whole request frame (length, header by the API's rules, body): what both
/// clients (the blocking one and the brokers' glommio peer) send.
pub fn encode_request<R: kafka_protocol::protocol::Request>(
    version: i16,
    correlation_id: i32,
    client_id: &str,
    req: &R,
) -> anyhow::Result<BytesMut> {
    let header = kafka_protocol::messages::RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(kafka_protocol::protocol::StrBytes::from_string(client_id.to_string())));
    let header_version = R::header_version(version);
    let size = header.compute_size(header_version)? + req.compute_size(version)?;
    let mut buf = BytesMut::with_capacity(4 + size);
    buf.put_i32(size as i32);
    header.encode(&mut buf, header_version)?;
    req.encode(&mut buf, version)?;
    Ok(buf)
}

/// A record for `RecordBatchEncoder` as a plain (non-idempotent, non-transactional)
/// producer writes it: CreateTime, no producer id, `offset_delta` within its batch.
pub fn plain_record(
    offset_delta: i64,
    partition_leader_epoch: i32,
    timestamp_ms: i64,
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: kafka_protocol::indexmap::IndexMap<kafka_protocol::protocol::StrBytes, Option<Bytes>>,
) -> kafka_protocol::records::Record {
    kafka_protocol::records::Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch,
        producer_id: kafka_protocol::records::NO_PRODUCER_ID,
        producer_epoch: kafka_protocol::records::NO_PRODUCER_EPOCH,
        timestamp_type: kafka_protocol::records::TimestampType::Creation,
        offset: offset_delta,
        sequence: kafka_protocol::records::NO_SEQUENCE,
        timestamp: timestamp_ms,
        key,
        value,
        headers,
    }
}

/// Kafka error codes Spate answers with (the `kafka-protocol` crate's `ResponseError`
/// carries the same numbers; named here so handlers read as Kafka's docs do).
pub mod error_code {
    pub const NONE: i16 = 0;
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const CORRUPT_MESSAGE: i16 = 2;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub const REQUEST_TIMED_OUT: i16 = 7;
    pub const MESSAGE_TOO_LARGE: i16 = 10;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const RECORD_LIST_TOO_LARGE: i16 = 18;
    pub const INVALID_REQUIRED_ACKS: i16 = 21;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_PARTITIONS: i16 = 37;
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub const INVALID_REQUEST: i16 = 42;
    pub const INVALID_CONFIG: i16 = 40;
    pub const POLICY_VIOLATION: i16 = 44;
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    pub const INVALID_RECORD: i16 = 87;
    pub const INVALID_TIMESTAMP: i16 = 32;
    pub const OFFSET_METADATA_TOO_LARGE: i16 = 12;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const NOT_CONTROLLER: i16 = 41;
    pub const NOT_ENOUGH_REPLICAS: i16 = 19;
    pub const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
    pub const FENCED_LEADER_EPOCH: i16 = 74;
    pub const UNKNOWN_LEADER_EPOCH: i16 = 76;
    pub const INELIGIBLE_REPLICA: i16 = 107;
    pub const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
    pub const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
    pub const INVALID_UPDATE_VERSION: i16 = 108;
    pub const STALE_BROKER_EPOCH: i16 = 77;
    pub const BROKER_ID_NOT_REGISTERED: i16 = 102;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    pub const INVALID_GROUP_ID: i16 = 24;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const NON_EMPTY_GROUP: i16 = 68;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
    pub const FENCED_INSTANCE_ID: i16 = 82;
    pub const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const UNKNOWN_PRODUCER_ID: i16 = 59;
    pub const PRODUCER_FENCED: i16 = 90;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::ApiVersionsResponse;

    #[test]
    fn frame_limits() {
        assert!(check_frame_len(-1).is_err());
        assert!(check_frame_len(i32::MAX).is_err());
        assert_eq!(check_frame_len(100).unwrap(), 100);
    }

    #[test]
    fn advertised_versions_are_ones_the_codec_knows() {
        for (key, lo, hi) in SUPPORTED_APIS {
            let v = key.valid_versions();
            assert!(v.min <= *lo && *hi <= v.max, "{key:?} {lo}..{hi} outside codec {v}");
        }
    }

    #[test]
    fn api_versions_v3_omits_default_tagged_fields() {
        // Old librdkafka rejects an ApiVersions answer carrying tagged fields at defaults.
        let body = ApiVersionsResponse::default();
        let frame = encode_response(ApiKey::ApiVersions, 3, 7, &body).unwrap();
        // length(4) correlation(4) error(2) api_keys compact len(1) throttle(4) tags(1)
        assert_eq!(frame.len(), 4 + 4 + 2 + 1 + 4 + 1);
        assert_eq!(*frame.last().unwrap(), 0, "no tagged fields written");
    }

    #[test]
    fn unknown_key_keeps_correlation_id() {
        let mut b = BytesMut::new();
        b.put_i16(9999);
        b.put_i16(0);
        b.put_i32(42);
        b.put_i16(-1);
        let f = decode_frame(b.freeze()).unwrap();
        assert_eq!((f.api_key, f.correlation_id), (9999, 42));
        assert!(f.header.is_none());
    }
}
