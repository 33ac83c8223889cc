//! Kafka's `__consumer_offsets` record schemas, written by hand: they live in Kafka's
//! group-coordinator module, not in the client message specs the `kafka-protocol` crate
//! generates. All integers big-endian; strings are i16 length + UTF-8 (-1 = null);
//! bytes are i32 length + data (-1 = null).
//!
//! Offset commit
//!   key   (version 1): version i16 = 1, group string, topic string, partition i32
//!   value (version 3): version i16 = 3, offset i64, leader_epoch i32, metadata string,
//!                      commit_timestamp i64
//! Group metadata
//!   key   (version 2): version i16 = 2, group string
//!   value (version 3): version i16 = 3, protocol_type string, generation i32,
//!                      protocol string?, leader string?, current_state_timestamp i64,
//!                      members [i32 count] { member_id string, group_instance_id string?,
//!                      client_id string, client_host string, rebalance_timeout i32,
//!                      session_timeout i32, subscription bytes, assignment bytes }
//! A null value (tombstone) deletes the key. Key versions 3-8 are consumer groups'
//! (KIP-848), in `consumer_records.rs`.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// One member as stored in a group metadata record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredGroup {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub current_state_timestamp_ms: i64,
    pub members: Vec<StoredMember>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOffset {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
}

/// A decoded `__consumer_offsets` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetsRecord {
    Offset {
        group: String,
        topic: String,
        partition: i32,
        value: Option<StoredOffset>,
    },
    Group {
        group: String,
        value: Option<StoredGroup>,
    },
    /// A consumer group's record (KIP-848; key versions 3-8, `consumer_records`).
    Consumer(super::consumer_records::ConsumerRecord),
}

#[derive(Debug, thiserror::Error)]
#[error("malformed __consumer_offsets record: {0}")]
pub struct RecordError(pub String);

pub(super) fn put_str(b: &mut BytesMut, s: &str) {
    b.put_i16(s.len() as i16);
    b.put_slice(s.as_bytes());
}

fn put_opt_str(b: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_str(b, s),
        None => b.put_i16(-1),
    }
}

fn put_bytes(b: &mut BytesMut, v: &[u8]) {
    b.put_i32(v.len() as i32);
    b.put_slice(v);
}

fn need(b: &Bytes, n: usize) -> Result<(), RecordError> {
    if b.remaining() < n {
        return Err(RecordError(format!("needs {n} more bytes, has {}", b.remaining())));
    }
    Ok(())
}

fn get_i16(b: &mut Bytes) -> Result<i16, RecordError> {
    need(b, 2)?;
    Ok(b.get_i16())
}

pub(super) fn get_i32(b: &mut Bytes) -> Result<i32, RecordError> {
    need(b, 4)?;
    Ok(b.get_i32())
}

fn get_i64(b: &mut Bytes) -> Result<i64, RecordError> {
    need(b, 8)?;
    Ok(b.get_i64())
}

fn get_opt_str(b: &mut Bytes) -> Result<Option<String>, RecordError> {
    let len = get_i16(b)?;
    if len < 0 {
        return Ok(None);
    }
    need(b, len as usize)?;
    let s = b.split_to(len as usize);
    String::from_utf8(s.to_vec()).map(Some).map_err(|_| RecordError("string is not UTF-8".into()))
}

pub(super) fn get_str(b: &mut Bytes) -> Result<String, RecordError> {
    get_opt_str(b)?.ok_or_else(|| RecordError("null string where one is required".into()))
}

fn get_bytes(b: &mut Bytes) -> Result<Bytes, RecordError> {
    let len = get_i32(b)?;
    if len < 0 {
        return Ok(Bytes::new());
    }
    need(b, len as usize)?;
    Ok(b.split_to(len as usize))
}

pub fn offset_key(group: &str, topic: &str, partition: i32) -> Bytes {
    let mut b = BytesMut::with_capacity(2 + 2 + group.len() + 2 + topic.len() + 4);
    b.put_i16(1);
    put_str(&mut b, group);
    put_str(&mut b, topic);
    b.put_i32(partition);
    b.freeze()
}

pub fn offset_value(v: &StoredOffset) -> Bytes {
    let mut b = BytesMut::with_capacity(2 + 8 + 4 + 2 + v.metadata.len() + 8);
    b.put_i16(3);
    b.put_i64(v.offset);
    b.put_i32(v.leader_epoch);
    put_str(&mut b, &v.metadata);
    b.put_i64(v.commit_timestamp_ms);
    b.freeze()
}

pub fn group_key(group: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + group.len());
    b.put_i16(2);
    put_str(&mut b, group);
    b.freeze()
}

pub fn group_value(g: &StoredGroup) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(3);
    put_str(&mut b, &g.protocol_type);
    b.put_i32(g.generation);
    put_opt_str(&mut b, g.protocol.as_deref());
    put_opt_str(&mut b, g.leader.as_deref());
    b.put_i64(g.current_state_timestamp_ms);
    b.put_i32(g.members.len() as i32);
    for m in &g.members {
        put_str(&mut b, &m.member_id);
        put_opt_str(&mut b, m.group_instance_id.as_deref());
        put_str(&mut b, &m.client_id);
        put_str(&mut b, &m.client_host);
        b.put_i32(m.rebalance_timeout_ms);
        b.put_i32(m.session_timeout_ms);
        put_bytes(&mut b, &m.subscription);
        put_bytes(&mut b, &m.assignment);
    }
    b.freeze()
}

/// Decode one record's key and value. Unknown key versions are errors (the caller
/// skips them with a log line: a newer Kafka's records are not ours to misread).
pub fn decode(key: &Bytes, value: Option<&Bytes>) -> Result<OffsetsRecord, RecordError> {
    let mut k = key.clone();
    let version = get_i16(&mut k)?;
    match version {
        0 | 1 => {
            let group = get_str(&mut k)?;
            let topic = get_str(&mut k)?;
            let partition = get_i32(&mut k)?;
            let value = match value {
                None => None,
                Some(v) => {
                    let mut v = v.clone();
                    let vv = get_i16(&mut v)?;
                    let offset = get_i64(&mut v)?;
                    let leader_epoch = if vv >= 3 { get_i32(&mut v)? } else { -1 };
                    let metadata = get_str(&mut v)?;
                    let commit_timestamp_ms = get_i64(&mut v)?;
                    Some(StoredOffset { offset, leader_epoch, metadata, commit_timestamp_ms })
                }
            };
            Ok(OffsetsRecord::Offset { group, topic, partition, value })
        }
        2 => {
            let group = get_str(&mut k)?;
            let value = match value {
                None => None,
                Some(v) => {
                    let mut v = v.clone();
                    let vv = get_i16(&mut v)?;
                    if vv != 3 {
                        return Err(RecordError(format!("group metadata value version {vv}")));
                    }
                    let protocol_type = get_str(&mut v)?;
                    let generation = get_i32(&mut v)?;
                    let protocol = get_opt_str(&mut v)?;
                    let leader = get_opt_str(&mut v)?;
                    let current_state_timestamp_ms = get_i64(&mut v)?;
                    let n = get_i32(&mut v)?;
                    if n < 0 || n as usize > v.remaining() {
                        return Err(RecordError(format!("member count {n}")));
                    }
                    let mut members = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        members.push(StoredMember {
                            member_id: get_str(&mut v)?,
                            group_instance_id: get_opt_str(&mut v)?,
                            client_id: get_str(&mut v)?,
                            client_host: get_str(&mut v)?,
                            rebalance_timeout_ms: get_i32(&mut v)?,
                            session_timeout_ms: get_i32(&mut v)?,
                            subscription: get_bytes(&mut v)?,
                            assignment: get_bytes(&mut v)?,
                        });
                    }
                    Some(StoredGroup {
                        protocol_type,
                        generation,
                        protocol,
                        leader,
                        current_state_timestamp_ms,
                        members,
                    })
                }
            };
            Ok(OffsetsRecord::Group { group, value })
        }
        3..=8 => super::consumer_records::decode(version, k, value).map(OffsetsRecord::Consumer),
        v => Err(RecordError(format!("unknown key version {v}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_record_round_trip_and_bytes() {
        let key = offset_key("g", "t", 3);
        assert_eq!(&key[..], &[0, 1, 0, 1, b'g', 0, 1, b't', 0, 0, 0, 3]);
        let v = StoredOffset { offset: 42, leader_epoch: 0, metadata: "m".into(), commit_timestamp_ms: 7 };
        let value = offset_value(&v);
        assert_eq!(
            decode(&key, Some(&value)).unwrap(),
            OffsetsRecord::Offset { group: "g".into(), topic: "t".into(), partition: 3, value: Some(v) }
        );
        assert!(matches!(decode(&key, None).unwrap(), OffsetsRecord::Offset { value: None, .. }));
    }

    #[test]
    fn group_record_round_trip() {
        let g = StoredGroup {
            protocol_type: "consumer".into(),
            generation: 5,
            protocol: Some("range".into()),
            leader: Some("m1".into()),
            current_state_timestamp_ms: 99,
            members: vec![StoredMember {
                member_id: "m1".into(),
                group_instance_id: Some("i1".into()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 300000,
                session_timeout_ms: 45000,
                subscription: Bytes::from_static(b"sub"),
                assignment: Bytes::from_static(b"asg"),
            }],
        };
        let r = decode(&group_key("grp"), Some(&group_value(&g))).unwrap();
        assert_eq!(r, OffsetsRecord::Group { group: "grp".into(), value: Some(g) });
    }

    #[test]
    fn truncated_records_are_errors_not_panics() {
        let key = offset_key("group", "topic", 1);
        for cut in 0..key.len() {
            let _ = decode(&key.slice(..cut), None);
        }
        let v =
            offset_value(&StoredOffset { offset: 1, leader_epoch: 0, metadata: String::new(), commit_timestamp_ms: 0 });
        for cut in 0..v.len() {
            assert!(decode(&key, Some(&v.slice(..cut))).is_err());
        }
    }
}
