//! Codecs for the versions Apache Kafka 4.4 speaks beyond the `kafka-protocol` crate
//! (0.18, the newest release, stops one version short of these):
//!
//! | message | version | what changed |
//! |---|---|---|
//! | ApiVersions request | 5 | ClusterId and NodeId of the broker the client means (KIP-1242) |
//! | ListOffsets | 11 | nothing on the wire: timestamp -6, earliest pending upload (KIP-1023) |
//! | OffsetCommit, OffsetFetch | 10 | topics by id instead of by name (KIP-848's follow-up) |
//! | TxnOffsetCommit | 6 | topics by id instead of by name |
//! | WriteTxnMarkers request | 2 | each marker's TransactionVersion (KIP-1228) |
//! | DeleteGroups response | 3 | each group's ErrorMessage |
//! | DescribeLogDirs response | 5 | each log dir's IsCordoned (KIP-1066) |
//!
//! Why by hand: no crate codes them, and a newer crate cannot be generated here without
//! copying. Each codec reads or writes only the level that changed; the structs below it
//! have the same schema as in the version before, and the crate's codec at that version
//! does them. Messages whose whole schema is the previous version's are coded by the
//! crate at that version (`codec_version`).
//!
//! Requests reach a decoder here only after their shape check (`shape.rs`, whose table
//! has these versions), so every length read below is known to fit the frame; the
//! decoders still return an error, never panic, on bytes that do not fit.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::delete_groups_response::DeleteGroupsResponse;
use kafka_protocol::messages::describe_log_dirs_response::DescribeLogDirsResponse;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequest, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponse, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponse, OffsetFetchResponseGroup, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::txn_offset_commit_request::{TxnOffsetCommitRequest, TxnOffsetCommitRequestTopic};
use kafka_protocol::messages::txn_offset_commit_response::{TxnOffsetCommitResponse, TxnOffsetCommitResponseTopic};
use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WriteTxnMarkersRequest};
use kafka_protocol::messages::{ApiKey, GroupId, ProducerId, TransactionalId};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use uuid::Uuid;

/// The version the crate codes `key`'s body at for `version`: the same version where
/// the crate knows it, else the last one whose body is identical. None: the body needs
/// a codec of this module.
pub fn codec_version(key: ApiKey, version: i16, request: bool) -> Option<i16> {
    let crate_max = crate_max(key);
    if version <= crate_max {
        return Some(version);
    }
    let same_as_previous = match key {
        ApiKey::ListOffsets => version == 11,
        ApiKey::ApiVersions => !request && version == 5,
        ApiKey::WriteTxnMarkers => !request && version == 2,
        ApiKey::DeleteGroups => request && version == 3,
        ApiKey::DescribeLogDirs => request && version == 5,
        _ => false,
    };
    same_as_previous.then_some(crate_max)
}

/// The newest version the crate's codecs of `key` know. Its `ApiKey` table says more
/// for three APIs (the unstable newest version of the specs it was generated from), but
/// their message codecs stop one short.
pub fn crate_max(key: ApiKey) -> i16 {
    use kafka_protocol::messages::InitProducerIdRequest;
    use kafka_protocol::protocol::Message;
    match key {
        ApiKey::OffsetCommit => OffsetCommitRequest::VERSIONS.max,
        ApiKey::OffsetFetch => OffsetFetchRequest::VERSIONS.max,
        ApiKey::InitProducerId => InitProducerIdRequest::VERSIONS.max,
        _ => key.valid_versions().max,
    }
}

/// The header version of `key` at `version`, also beyond the crate's versions (every
/// version here is flexible, as the crate's newest is).
pub fn request_header_version(key: ApiKey, version: i16) -> i16 {
    key.request_header_version(version.min(crate_max(key)))
}

pub fn response_header_version(key: ApiKey, version: i16) -> i16 {
    key.response_header_version(version.min(crate_max(key)))
}

/// Decode a request body of a version past the crate's with this module's decoder (the
/// fuzz targets' way in). Ok(false): no decoder here for that key and version.
pub fn decode_request(key: ApiKey, body: &mut Bytes, version: i16) -> anyhow::Result<bool> {
    match (key, version) {
        (ApiKey::ApiVersions, 5) => decode_api_versions_v5(body).map(drop),
        (ApiKey::OffsetCommit, 10) => decode_offset_commit_v10(body).map(drop),
        (ApiKey::OffsetFetch, 10) => decode_offset_fetch_v10(body).map(drop),
        (ApiKey::TxnOffsetCommit, 6) => decode_txn_offset_commit_v6(body).map(drop),
        (ApiKey::WriteTxnMarkers, 2) => decode_write_txn_markers_v2(body).map(drop),
        _ => return Ok(false),
    }
    .map(|()| true)
}

// ---- reading -------------------------------------------------------------------------

fn need(buf: &Bytes, n: usize) -> anyhow::Result<()> {
    anyhow::ensure!(buf.remaining() >= n, "body ends {n} bytes short");
    Ok(())
}

fn i8_(buf: &mut Bytes) -> anyhow::Result<i8> {
    need(buf, 1)?;
    Ok(buf.get_i8())
}

fn i16_(buf: &mut Bytes) -> anyhow::Result<i16> {
    need(buf, 2)?;
    Ok(buf.get_i16())
}

fn i32_(buf: &mut Bytes) -> anyhow::Result<i32> {
    need(buf, 4)?;
    Ok(buf.get_i32())
}

fn i64_(buf: &mut Bytes) -> anyhow::Result<i64> {
    need(buf, 8)?;
    Ok(buf.get_i64())
}

fn uuid_(buf: &mut Bytes) -> anyhow::Result<Uuid> {
    need(buf, 16)?;
    Ok(Uuid::from_u128(buf.get_u128()))
}

fn uvarint(buf: &mut Bytes) -> anyhow::Result<u32> {
    let mut value = 0u32;
    for shift in (0..35).step_by(7) {
        need(buf, 1)?;
        let b = buf.get_u8();
        value |= u32::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    anyhow::bail!("varint longer than 5 bytes")
}

/// A compact length: None for null (0 on the wire), else the length.
fn compact_len(buf: &mut Bytes) -> anyhow::Result<Option<usize>> {
    Ok(uvarint(buf)?.checked_sub(1).map(|n| n as usize))
}

fn nullable_string(buf: &mut Bytes) -> anyhow::Result<Option<StrBytes>> {
    let Some(n) = compact_len(buf)? else { return Ok(None) };
    need(buf, n)?;
    Ok(Some(StrBytes::from_utf8(buf.split_to(n))?))
}

fn string(buf: &mut Bytes) -> anyhow::Result<StrBytes> {
    nullable_string(buf)?.ok_or_else(|| anyhow::anyhow!("null where a string is due"))
}

/// A compact array, each element read by `element`; None when null.
fn nullable_array<T>(
    buf: &mut Bytes,
    mut element: impl FnMut(&mut Bytes) -> anyhow::Result<T>,
) -> anyhow::Result<Option<Vec<T>>> {
    let Some(n) = compact_len(buf)? else { return Ok(None) };
    // Every element takes at least one byte: the count cannot ask for more than is left.
    anyhow::ensure!(n <= buf.remaining(), "array of {n} in {} bytes", buf.remaining());
    (0..n).map(|_| element(buf)).collect::<anyhow::Result<Vec<T>>>().map(Some)
}

fn array<T>(buf: &mut Bytes, element: impl FnMut(&mut Bytes) -> anyhow::Result<T>) -> anyhow::Result<Vec<T>> {
    nullable_array(buf, element)?.ok_or_else(|| anyhow::anyhow!("null where an array is due"))
}

/// A compact array of crate structs coded at `version`.
fn structs<T: Decodable>(buf: &mut Bytes, version: i16) -> anyhow::Result<Vec<T>> {
    array(buf, |b| T::decode(b, version))
}

/// Skip a tagged-field buffer (no tags are defined at the levels read here).
fn skip_tags(buf: &mut Bytes) -> anyhow::Result<()> {
    for _ in 0..uvarint(buf)? {
        uvarint(buf)?;
        let size = uvarint(buf)? as usize;
        need(buf, size)?;
        buf.advance(size);
    }
    Ok(())
}

// ---- writing -------------------------------------------------------------------------

fn put_uvarint(buf: &mut BytesMut, mut v: u32) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

fn put_len(buf: &mut BytesMut, n: Option<usize>) -> anyhow::Result<()> {
    let n = match n {
        None => 0,
        Some(n) => {
            u32::try_from(n).ok().and_then(|n| n.checked_add(1)).ok_or_else(|| anyhow::anyhow!("{n} too long"))?
        }
    };
    put_uvarint(buf, n);
    Ok(())
}

fn put_string(buf: &mut BytesMut, s: Option<&str>) -> anyhow::Result<()> {
    put_len(buf, s.map(str::len))?;
    buf.put_slice(s.unwrap_or_default().as_bytes());
    Ok(())
}

fn put_structs<T: Encodable>(buf: &mut BytesMut, items: &[T], version: i16) -> anyhow::Result<()> {
    put_len(buf, Some(items.len()))?;
    items.iter().try_for_each(|i| i.encode(buf, version))
}

fn put_no_tags(buf: &mut BytesMut) {
    buf.put_u8(0);
}

fn put_uuid(buf: &mut BytesMut, id: Uuid) {
    buf.put_u128(id.as_u128());
}

// ---- ApiVersions v5 ------------------------------------------------------------------

/// ApiVersions v5's request: the v4 fields, and the cluster id and node id of the broker
/// the client means to talk to (null and -1 when it does not know them yet).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ApiVersionsV5 {
    pub request: ApiVersionsRequest,
    pub cluster_id: Option<StrBytes>,
    pub node_id: i32,
}

pub fn decode_api_versions_v5(buf: &mut Bytes) -> anyhow::Result<ApiVersionsV5> {
    let request = ApiVersionsRequest::default()
        .with_client_software_name(string(buf)?)
        .with_client_software_version(string(buf)?);
    let cluster_id = nullable_string(buf)?;
    let node_id = i32_(buf)?;
    skip_tags(buf)?;
    Ok(ApiVersionsV5 { request, cluster_id, node_id })
}

pub fn encode_api_versions_v5(r: &ApiVersionsV5, buf: &mut BytesMut) -> anyhow::Result<()> {
    put_string(buf, Some(&r.request.client_software_name))?;
    put_string(buf, Some(&r.request.client_software_version))?;
    put_string(buf, r.cluster_id.as_deref())?;
    buf.put_i32(r.node_id);
    put_no_tags(buf);
    Ok(())
}

// ---- OffsetCommit v10 ----------------------------------------------------------------

/// OffsetCommit v10's request into the crate's struct: each topic's `topic_id` is set
/// and its `name` left empty (the handler names it from the id).
pub fn decode_offset_commit_v10(buf: &mut Bytes) -> anyhow::Result<OffsetCommitRequest> {
    let r = OffsetCommitRequest::default()
        .with_group_id(GroupId(string(buf)?))
        .with_generation_id_or_member_epoch(i32_(buf)?)
        .with_member_id(string(buf)?)
        .with_group_instance_id(nullable_string(buf)?)
        .with_topics(array(buf, |b| {
            let topic = OffsetCommitRequestTopic::default().with_topic_id(uuid_(b)?).with_partitions(structs(b, 9)?);
            skip_tags(b)?;
            Ok(topic)
        })?);
    skip_tags(buf)?;
    Ok(r)
}

pub fn encode_offset_commit_v10(r: &OffsetCommitRequest, buf: &mut BytesMut) -> anyhow::Result<()> {
    put_string(buf, Some(&r.group_id))?;
    buf.put_i32(r.generation_id_or_member_epoch);
    put_string(buf, Some(&r.member_id))?;
    put_string(buf, r.group_instance_id.as_deref())?;
    put_len(buf, Some(r.topics.len()))?;
    for t in &r.topics {
        put_uuid(buf, t.topic_id);
        put_structs(buf, &t.partitions, 9)?;
        put_no_tags(buf);
    }
    put_no_tags(buf);
    Ok(())
}

/// OffsetCommit v10's response from the crate's struct: topics by `topic_id`.
pub fn encode_offset_commit_response_v10(r: &OffsetCommitResponse, buf: &mut BytesMut) -> anyhow::Result<()> {
    buf.put_i32(r.throttle_time_ms);
    put_len(buf, Some(r.topics.len()))?;
    for t in &r.topics {
        put_uuid(buf, t.topic_id);
        put_structs(buf, &t.partitions, 9)?;
        put_no_tags(buf);
    }
    put_no_tags(buf);
    Ok(())
}

pub fn decode_offset_commit_response_v10(buf: &mut Bytes) -> anyhow::Result<OffsetCommitResponse> {
    let throttle = i32_(buf)?;
    let topics = array(buf, |b| {
        let t = OffsetCommitResponseTopic::default().with_topic_id(uuid_(b)?).with_partitions(structs(b, 9)?);
        skip_tags(b)?;
        Ok(t)
    })?;
    skip_tags(buf)?;
    Ok(OffsetCommitResponse::default().with_throttle_time_ms(throttle).with_topics(topics))
}

// ---- OffsetFetch v10 -----------------------------------------------------------------

/// OffsetFetch v10's request into the crate's struct: each group's topics by `topic_id`,
/// names left empty.
pub fn decode_offset_fetch_v10(buf: &mut Bytes) -> anyhow::Result<OffsetFetchRequest> {
    let groups = array(buf, |b| {
        let group = OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(string(b)?))
            .with_member_id(nullable_string(b)?)
            .with_member_epoch(i32_(b)?)
            .with_topics(nullable_array(b, |b| {
                let topic = OffsetFetchRequestTopics::default()
                    .with_topic_id(uuid_(b)?)
                    .with_partition_indexes(array(b, i32_)?);
                skip_tags(b)?;
                Ok(topic)
            })?);
        skip_tags(b)?;
        Ok(group)
    })?;
    let require_stable = i8_(buf)? != 0;
    skip_tags(buf)?;
    Ok(OffsetFetchRequest::default().with_groups(groups).with_require_stable(require_stable))
}

pub fn encode_offset_fetch_v10(r: &OffsetFetchRequest, buf: &mut BytesMut) -> anyhow::Result<()> {
    put_len(buf, Some(r.groups.len()))?;
    for g in &r.groups {
        put_string(buf, Some(&g.group_id))?;
        put_string(buf, g.member_id.as_deref())?;
        buf.put_i32(g.member_epoch);
        put_len(buf, g.topics.as_ref().map(Vec::len))?;
        for t in g.topics.iter().flatten() {
            put_uuid(buf, t.topic_id);
            put_len(buf, Some(t.partition_indexes.len()))?;
            t.partition_indexes.iter().for_each(|p| buf.put_i32(*p));
            put_no_tags(buf);
        }
        put_no_tags(buf);
    }
    buf.put_i8(r.require_stable.into());
    put_no_tags(buf);
    Ok(())
}

/// OffsetFetch v10's response from the crate's struct: each group's topics by `topic_id`.
pub fn encode_offset_fetch_response_v10(r: &OffsetFetchResponse, buf: &mut BytesMut) -> anyhow::Result<()> {
    buf.put_i32(r.throttle_time_ms);
    put_len(buf, Some(r.groups.len()))?;
    for g in &r.groups {
        put_string(buf, Some(&g.group_id))?;
        put_len(buf, Some(g.topics.len()))?;
        for t in &g.topics {
            put_uuid(buf, t.topic_id);
            put_structs(buf, &t.partitions, 9)?;
            put_no_tags(buf);
        }
        buf.put_i16(g.error_code);
        put_no_tags(buf);
    }
    put_no_tags(buf);
    Ok(())
}

pub fn decode_offset_fetch_response_v10(buf: &mut Bytes) -> anyhow::Result<OffsetFetchResponse> {
    let throttle = i32_(buf)?;
    let groups = array(buf, |b| {
        let group_id = GroupId(string(b)?);
        let topics = array(b, |b| {
            let t = OffsetFetchResponseTopics::default().with_topic_id(uuid_(b)?).with_partitions(structs(b, 9)?);
            skip_tags(b)?;
            Ok(t)
        })?;
        let g =
            OffsetFetchResponseGroup::default().with_group_id(group_id).with_topics(topics).with_error_code(i16_(b)?);
        skip_tags(b)?;
        Ok(g)
    })?;
    skip_tags(buf)?;
    Ok(OffsetFetchResponse::default().with_throttle_time_ms(throttle).with_groups(groups))
}

// ---- TxnOffsetCommit v6 --------------------------------------------------------------

/// TxnOffsetCommit v6's request: the crate's struct (topic names left empty) and each
/// topic's id, in the same order (the crate's topic struct has no id field).
pub fn decode_txn_offset_commit_v6(buf: &mut Bytes) -> anyhow::Result<(TxnOffsetCommitRequest, Vec<Uuid>)> {
    let mut ids = Vec::new();
    let r = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(string(buf)?))
        .with_group_id(GroupId(string(buf)?))
        .with_producer_id(ProducerId(i64_(buf)?))
        .with_producer_epoch(i16_(buf)?)
        .with_generation_id(i32_(buf)?)
        .with_member_id(string(buf)?)
        .with_group_instance_id(nullable_string(buf)?)
        .with_topics(array(buf, |b| {
            ids.push(uuid_(b)?);
            let topic = TxnOffsetCommitRequestTopic::default().with_partitions(structs(b, 5)?);
            skip_tags(b)?;
            Ok(topic)
        })?);
    skip_tags(buf)?;
    Ok((r, ids))
}

pub fn encode_txn_offset_commit_v6(r: &TxnOffsetCommitRequest, ids: &[Uuid], buf: &mut BytesMut) -> anyhow::Result<()> {
    anyhow::ensure!(ids.len() == r.topics.len(), "{} topic ids for {} topics", ids.len(), r.topics.len());
    put_string(buf, Some(&r.transactional_id))?;
    put_string(buf, Some(&r.group_id))?;
    buf.put_i64(r.producer_id.0);
    buf.put_i16(r.producer_epoch);
    buf.put_i32(r.generation_id);
    put_string(buf, Some(&r.member_id))?;
    put_string(buf, r.group_instance_id.as_deref())?;
    put_len(buf, Some(r.topics.len()))?;
    for (t, id) in r.topics.iter().zip(ids) {
        put_uuid(buf, *id);
        put_structs(buf, &t.partitions, 5)?;
        put_no_tags(buf);
    }
    put_no_tags(buf);
    Ok(())
}

/// TxnOffsetCommit v6's response: topics by the ids given, one per topic in order.
pub fn encode_txn_offset_commit_response_v6(
    r: &TxnOffsetCommitResponse,
    ids: &[Uuid],
    buf: &mut BytesMut,
) -> anyhow::Result<()> {
    anyhow::ensure!(ids.len() == r.topics.len(), "{} topic ids for {} topics", ids.len(), r.topics.len());
    buf.put_i32(r.throttle_time_ms);
    put_len(buf, Some(r.topics.len()))?;
    for (t, id) in r.topics.iter().zip(ids) {
        put_uuid(buf, *id);
        put_structs(buf, &t.partitions, 5)?;
        put_no_tags(buf);
    }
    put_no_tags(buf);
    Ok(())
}

pub fn decode_txn_offset_commit_response_v6(buf: &mut Bytes) -> anyhow::Result<(TxnOffsetCommitResponse, Vec<Uuid>)> {
    let throttle = i32_(buf)?;
    let mut ids = Vec::new();
    let topics = array(buf, |b| {
        ids.push(uuid_(b)?);
        let t = TxnOffsetCommitResponseTopic::default().with_partitions(structs(b, 5)?);
        skip_tags(b)?;
        Ok(t)
    })?;
    skip_tags(buf)?;
    Ok((TxnOffsetCommitResponse::default().with_throttle_time_ms(throttle).with_topics(topics), ids))
}

// ---- WriteTxnMarkers v2 --------------------------------------------------------------

/// WriteTxnMarkers v2's request: the crate's struct and each marker's transaction
/// version, in the same order.
pub fn decode_write_txn_markers_v2(buf: &mut Bytes) -> anyhow::Result<(WriteTxnMarkersRequest, Vec<i8>)> {
    let mut versions = Vec::new();
    let markers = array(buf, |b| {
        let marker = WritableTxnMarker::default()
            .with_producer_id(ProducerId(i64_(b)?))
            .with_producer_epoch(i16_(b)?)
            .with_transaction_result(i8_(b)? != 0)
            .with_topics(structs(b, 1)?)
            .with_coordinator_epoch(i32_(b)?);
        versions.push(i8_(b)?);
        skip_tags(b)?;
        Ok(marker)
    })?;
    skip_tags(buf)?;
    Ok((WriteTxnMarkersRequest::default().with_markers(markers), versions))
}

pub fn encode_write_txn_markers_v2(
    r: &WriteTxnMarkersRequest,
    versions: &[i8],
    buf: &mut BytesMut,
) -> anyhow::Result<()> {
    anyhow::ensure!(versions.len() == r.markers.len(), "{} versions for {} markers", versions.len(), r.markers.len());
    put_len(buf, Some(r.markers.len()))?;
    for (m, v) in r.markers.iter().zip(versions) {
        buf.put_i64(m.producer_id.0);
        buf.put_i16(m.producer_epoch);
        buf.put_i8(m.transaction_result.into());
        put_structs(buf, &m.topics, 1)?;
        buf.put_i32(m.coordinator_epoch);
        buf.put_i8(*v);
        put_no_tags(buf);
    }
    put_no_tags(buf);
    Ok(())
}

// ---- DeleteGroups v3, DescribeLogDirs v5 (responses) ---------------------------------

/// DeleteGroups v3's response: each result with a null ErrorMessage, which is what
/// Apache Kafka 4.4 answers for every outcome it was asked here (deleted, unknown group,
/// group not empty).
pub fn encode_delete_groups_response_v3(r: &DeleteGroupsResponse, buf: &mut BytesMut) -> anyhow::Result<()> {
    buf.put_i32(r.throttle_time_ms);
    put_len(buf, Some(r.results.len()))?;
    for g in &r.results {
        put_string(buf, Some(&g.group_id))?;
        buf.put_i16(g.error_code);
        put_string(buf, None)?;
        put_no_tags(buf);
    }
    put_no_tags(buf);
    Ok(())
}

/// DescribeLogDirs v5's response: each log dir with IsCordoned false (Spate has no
/// `cordoned.log.dirs`: every log dir takes new replicas).
pub fn encode_describe_log_dirs_response_v5(r: &DescribeLogDirsResponse, buf: &mut BytesMut) -> anyhow::Result<()> {
    buf.put_i32(r.throttle_time_ms);
    buf.put_i16(r.error_code);
    put_len(buf, Some(r.results.len()))?;
    for d in &r.results {
        buf.put_i16(d.error_code);
        put_string(buf, Some(&d.log_dir))?;
        put_structs(buf, &d.topics, 4)?;
        buf.put_i64(d.total_bytes);
        buf.put_i64(d.usable_bytes);
        buf.put_i8(0);
        put_no_tags(buf);
    }
    put_no_tags(buf);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::shape;
    use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
    use kafka_protocol::messages::describe_log_dirs_response::{
        DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
    };
    use kafka_protocol::messages::offset_commit_request::OffsetCommitRequestPartition;
    use kafka_protocol::messages::offset_commit_response::OffsetCommitResponsePartition;
    use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponsePartitions;
    use kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequestPartition;
    use kafka_protocol::messages::txn_offset_commit_response::TxnOffsetCommitResponsePartition;
    use kafka_protocol::messages::write_txn_markers_request::WritableTxnMarkerTopic;
    use kafka_protocol::messages::TopicName;

    fn s(v: &str) -> StrBytes {
        StrBytes::from_string(v.to_string())
    }

    /// The bytes match the shape table at `version`, to the last byte.
    fn shaped(key: ApiKey, version: i16, request: bool, bytes: &[u8]) {
        let checked = if request {
            shape::check_request(key as i16, version, bytes)
        } else {
            shape::check_response(key as i16, version, bytes)
        };
        assert!(checked.is_ok(), "{key:?} v{version}: {checked:?}");
        let table = if request { shape::request_shape(key as i16) } else { shape::response_shape(key as i16) };
        assert_eq!(shape::check(table.unwrap(), version, bytes, u64::MAX).unwrap(), bytes.len());
    }

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn api_versions_v5_round_trips_and_matches_the_table() {
        for (cluster, node) in [(None, -1), (Some(s("MkU3OEVBNTcwNTJENDM2Qg")), 3)] {
            let r = ApiVersionsV5 {
                request: ApiVersionsRequest::default()
                    .with_client_software_name(s("apache-kafka-java"))
                    .with_client_software_version(s("4.4.0")),
                cluster_id: cluster,
                node_id: node,
            };
            let mut buf = BytesMut::new();
            encode_api_versions_v5(&r, &mut buf).unwrap();
            shaped(ApiKey::ApiVersions, 5, true, &buf);
            assert_eq!(decode_api_versions_v5(&mut buf.freeze()).unwrap(), r);
        }
    }

    #[test]
    fn offset_commit_v10_round_trips_and_matches_the_table() {
        let p = OffsetCommitRequestPartition::default()
            .with_partition_index(2)
            .with_committed_offset(42)
            .with_committed_leader_epoch(7)
            .with_committed_metadata(Some(s("m")));
        let r = OffsetCommitRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_generation_id_or_member_epoch(5)
            .with_member_id(s("member"))
            .with_group_instance_id(Some(s("i")))
            .with_topics(vec![
                OffsetCommitRequestTopic::default().with_topic_id(id(1)).with_partitions(vec![p.clone(), p]),
                OffsetCommitRequestTopic::default().with_topic_id(id(2)),
            ]);
        let mut buf = BytesMut::new();
        encode_offset_commit_v10(&r, &mut buf).unwrap();
        shaped(ApiKey::OffsetCommit, 10, true, &buf);
        assert_eq!(decode_offset_commit_v10(&mut buf.freeze()).unwrap(), r);

        let answer = OffsetCommitResponse::default().with_throttle_time_ms(3).with_topics(vec![
            OffsetCommitResponseTopic::default().with_topic_id(id(9)).with_partitions(vec![
                OffsetCommitResponsePartition::default().with_partition_index(1).with_error_code(100),
            ]),
        ]);
        let mut buf = BytesMut::new();
        encode_offset_commit_response_v10(&answer, &mut buf).unwrap();
        shaped(ApiKey::OffsetCommit, 10, false, &buf);
        assert_eq!(decode_offset_commit_response_v10(&mut buf.freeze()).unwrap(), answer);
    }

    #[test]
    fn offset_fetch_v10_round_trips_and_matches_the_table() {
        let r = OffsetFetchRequest::default().with_require_stable(true).with_groups(vec![
            OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(s("g")))
                .with_member_id(Some(s("m")))
                .with_member_epoch(4)
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_topic_id(id(5))
                    .with_partition_indexes(vec![0, 3])])),
            OffsetFetchRequestGroup::default().with_group_id(GroupId(s("all"))).with_member_epoch(-1).with_topics(None),
        ]);
        let mut buf = BytesMut::new();
        encode_offset_fetch_v10(&r, &mut buf).unwrap();
        shaped(ApiKey::OffsetFetch, 10, true, &buf);
        assert_eq!(decode_offset_fetch_v10(&mut buf.freeze()).unwrap(), r);

        let answer = OffsetFetchResponse::default().with_groups(vec![OffsetFetchResponseGroup::default()
            .with_group_id(GroupId(s("g")))
            .with_topics(vec![OffsetFetchResponseTopics::default().with_topic_id(id(5)).with_partitions(vec![
                OffsetFetchResponsePartitions::default()
                    .with_partition_index(3)
                    .with_committed_offset(10)
                    .with_committed_leader_epoch(-1)
                    .with_metadata(Some(s(""))),
            ])])
            .with_error_code(0)]);
        let mut buf = BytesMut::new();
        encode_offset_fetch_response_v10(&answer, &mut buf).unwrap();
        shaped(ApiKey::OffsetFetch, 10, false, &buf);
        assert_eq!(decode_offset_fetch_response_v10(&mut buf.freeze()).unwrap(), answer);
    }

    #[test]
    fn txn_offset_commit_v6_round_trips_and_matches_the_table() {
        let r = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(s("tx")))
            .with_group_id(GroupId(s("g")))
            .with_producer_id(ProducerId(77))
            .with_producer_epoch(3)
            .with_generation_id(2)
            .with_member_id(s("m"))
            .with_topics(vec![TxnOffsetCommitRequestTopic::default().with_partitions(vec![
                TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(1)
                    .with_committed_offset(9)
                    .with_committed_leader_epoch(-1),
            ])]);
        let mut buf = BytesMut::new();
        encode_txn_offset_commit_v6(&r, &[id(11)], &mut buf).unwrap();
        shaped(ApiKey::TxnOffsetCommit, 6, true, &buf);
        assert_eq!(decode_txn_offset_commit_v6(&mut buf.freeze()).unwrap(), (r, vec![id(11)]));

        let answer = TxnOffsetCommitResponse::default().with_topics(vec![TxnOffsetCommitResponseTopic::default()
            .with_partitions(vec![TxnOffsetCommitResponsePartition::default().with_partition_index(1)])]);
        let mut buf = BytesMut::new();
        encode_txn_offset_commit_response_v6(&answer, &[id(11)], &mut buf).unwrap();
        shaped(ApiKey::TxnOffsetCommit, 6, false, &buf);
        assert_eq!(decode_txn_offset_commit_response_v6(&mut buf.freeze()).unwrap(), (answer, vec![id(11)]));
    }

    #[test]
    fn write_txn_markers_v2_round_trips_and_matches_the_table() {
        let marker = WritableTxnMarker::default()
            .with_producer_id(ProducerId(5))
            .with_producer_epoch(2)
            .with_transaction_result(true)
            .with_coordinator_epoch(1)
            .with_topics(vec![WritableTxnMarkerTopic::default()
                .with_name(TopicName(s("t")))
                .with_partition_indexes(vec![0, 1])]);
        let r = WriteTxnMarkersRequest::default().with_markers(vec![marker.clone(), marker]);
        let mut buf = BytesMut::new();
        encode_write_txn_markers_v2(&r, &[2, 0], &mut buf).unwrap();
        shaped(ApiKey::WriteTxnMarkers, 2, true, &buf);
        assert_eq!(decode_write_txn_markers_v2(&mut buf.freeze()).unwrap(), (r, vec![2, 0]));
    }

    #[test]
    fn delete_groups_v3_and_describe_log_dirs_v5_answers_match_the_table() {
        let answer = DeleteGroupsResponse::default().with_results(vec![
            DeletableGroupResult::default().with_group_id(GroupId(s("g"))).with_error_code(69),
            DeletableGroupResult::default().with_group_id(GroupId(s("h"))),
        ]);
        let mut buf = BytesMut::new();
        encode_delete_groups_response_v3(&answer, &mut buf).unwrap();
        shaped(ApiKey::DeleteGroups, 3, false, &buf);

        let answer = DescribeLogDirsResponse::default().with_results(vec![DescribeLogDirsResult::default()
            .with_log_dir(s("/data"))
            .with_total_bytes(100)
            .with_usable_bytes(50)
            .with_topics(vec![DescribeLogDirsTopic::default()
                .with_name(TopicName(s("t")))
                .with_partitions(vec![DescribeLogDirsPartition::default().with_partition_size(12)])])]);
        let mut buf = BytesMut::new();
        encode_describe_log_dirs_response_v5(&answer, &mut buf).unwrap();
        shaped(ApiKey::DescribeLogDirs, 5, false, &buf);
    }

    #[test]
    fn truncated_bodies_are_errors_not_panics() {
        let r = OffsetCommitRequest::default().with_group_id(GroupId(s("g"))).with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_topic_id(id(1))
                .with_partitions(vec![OffsetCommitRequestPartition::default()]),
        ]);
        let mut buf = BytesMut::new();
        encode_offset_commit_v10(&r, &mut buf).unwrap();
        let whole = buf.freeze();
        for n in 0..whole.len() {
            assert!(decode_offset_commit_v10(&mut whole.slice(..n)).is_err(), "{n} bytes decoded");
        }
        // A count far beyond the bytes left.
        let mut b = BytesMut::new();
        put_uvarint(&mut b, u32::MAX);
        assert!(decode_offset_fetch_v10(&mut b.freeze()).is_err());
    }

    #[test]
    fn versions_coded_by_the_crate_at_the_previous_one() {
        assert_eq!(codec_version(ApiKey::ListOffsets, 11, true), Some(10));
        assert_eq!(codec_version(ApiKey::ListOffsets, 11, false), Some(10));
        assert_eq!(codec_version(ApiKey::DeleteGroups, 3, true), Some(2));
        assert_eq!(codec_version(ApiKey::DeleteGroups, 3, false), None);
        assert_eq!(codec_version(ApiKey::OffsetCommit, 10, true), None);
        assert_eq!(codec_version(ApiKey::OffsetCommit, 9, true), Some(9));
    }
}
