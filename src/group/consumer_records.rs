//! The `__consumer_offsets` records of consumer groups (KIP-848), in Kafka's own schemas
//! (group-coordinator/src/main/resources/common/message/ConsumerGroup*.json), written
//! by hand as `records.rs` is. Keys are not flexible: version i16, then strings as i16
//! length + UTF-8. Values are version i16 = 0, then Kafka's flexible encoding: compact
//! strings (unsigned varint length + 1; 0 = null), compact arrays (varint count + 1),
//! uuids as 16 bytes, and a tagged-field section (varint count, then tag, size, bytes)
//! after every struct. A null value (tombstone) deletes the key.
//!
//! | key version | key fields          | value (version 0)                                   |
//! |-------------|---------------------|-----------------------------------------------------|
//! | 3           | group               | Epoch i32 (the group epoch)                          |
//! | 4           | group               | partition metadata (Kafka 3.x; read and ignored)     |
//! | 5           | group, member       | InstanceId string?, RackId string?, ClientId string, |
//! |             |                     | ClientHost string, SubscribedTopicNames [string],    |
//! |             |                     | SubscribedTopicRegex string?, RebalanceTimeoutMs i32,|
//! |             |                     | ServerAssignor string?, (tag 0: ClassicMemberMetadata)|
//! | 6           | group               | AssignmentEpoch i32                                  |
//! | 7           | group, member       | TopicPartitions [{TopicId uuid, Partitions [i32]}]   |
//! | 8           | group, member       | MemberEpoch i32, PreviousMemberEpoch i32, State i8,  |
//! |             |                     | AssignedPartitions [..], PartitionsPendingRevocation [..] |
//!
//! The bytes come from disk: every length and count is checked against the bytes left
//! before anything is allocated.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::consumer::TopicPartitions;
use super::records::{get_i32, get_str, put_str, RecordError};

/// Key versions of the consumer group records.
pub const GROUP_EPOCH_KEY: i16 = 3;
pub const PARTITION_METADATA_KEY: i16 = 4;
pub const MEMBER_KEY: i16 = 5;
pub const TARGET_EPOCH_KEY: i16 = 6;
pub const TARGET_MEMBER_KEY: i16 = 7;
pub const CURRENT_ASSIGNMENT_KEY: i16 = 8;

/// A member's subscription as stored (ConsumerGroupMemberMetadataValue).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredConsumerMember {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub topic_names: Vec<String>,
    pub regex: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub server_assignor: Option<String>,
}

/// A member's reconciliation as stored (ConsumerGroupCurrentMemberAssignmentValue).
/// `state`: Kafka's MemberState ids (0 stable, 1 unrevoked, 2 unreleased partitions).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredAssignment {
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    pub state: i8,
    pub assigned: TopicPartitions,
    pub revoking: TopicPartitions,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerRecord {
    GroupEpoch {
        group: String,
        epoch: Option<i32>,
    },
    /// Written by Kafka 3.x; Spate neither writes nor needs it.
    PartitionMetadata {
        group: String,
    },
    Member {
        group: String,
        member: String,
        value: Option<StoredConsumerMember>,
    },
    TargetEpoch {
        group: String,
        epoch: Option<i32>,
    },
    TargetMember {
        group: String,
        member: String,
        partitions: Option<TopicPartitions>,
    },
    CurrentAssignment {
        group: String,
        member: String,
        value: Option<StoredAssignment>,
    },
}

impl ConsumerRecord {
    pub fn group(&self) -> &str {
        match self {
            ConsumerRecord::GroupEpoch { group, .. }
            | ConsumerRecord::PartitionMetadata { group }
            | ConsumerRecord::Member { group, .. }
            | ConsumerRecord::TargetEpoch { group, .. }
            | ConsumerRecord::TargetMember { group, .. }
            | ConsumerRecord::CurrentAssignment { group, .. } => group,
        }
    }

    /// The record's key and value bytes.
    pub fn encode(&self) -> (Bytes, Option<Bytes>) {
        let key = |version: i16, group: &str, member: Option<&str>| {
            let mut b = BytesMut::new();
            b.put_i16(version);
            put_str(&mut b, group);
            if let Some(m) = member {
                put_str(&mut b, m);
            }
            b.freeze()
        };
        let value = |f: &dyn Fn(&mut BytesMut)| {
            let mut b = BytesMut::new();
            b.put_i16(0);
            f(&mut b);
            b.put_u8(0); // no tagged fields
            b.freeze()
        };
        match self {
            ConsumerRecord::GroupEpoch { group, epoch } => {
                (key(GROUP_EPOCH_KEY, group, None), epoch.map(|e| value(&|b| b.put_i32(e))))
            }
            ConsumerRecord::PartitionMetadata { group } => (key(PARTITION_METADATA_KEY, group, None), None),
            ConsumerRecord::Member { group, member, value: v } => (
                key(MEMBER_KEY, group, Some(member)),
                v.as_ref().map(|m| {
                    value(&|b| {
                        put_compact_opt_str(b, m.instance_id.as_deref());
                        put_compact_opt_str(b, m.rack_id.as_deref());
                        put_compact_opt_str(b, Some(&m.client_id));
                        put_compact_opt_str(b, Some(&m.client_host));
                        put_uvarint(b, m.topic_names.len() as u64 + 1);
                        for t in &m.topic_names {
                            put_compact_opt_str(b, Some(t));
                        }
                        put_compact_opt_str(b, m.regex.as_deref());
                        b.put_i32(m.rebalance_timeout_ms);
                        put_compact_opt_str(b, m.server_assignor.as_deref());
                    })
                }),
            ),
            ConsumerRecord::TargetEpoch { group, epoch } => {
                (key(TARGET_EPOCH_KEY, group, None), epoch.map(|e| value(&|b| b.put_i32(e))))
            }
            ConsumerRecord::TargetMember { group, member, partitions } => (
                key(TARGET_MEMBER_KEY, group, Some(member)),
                partitions.as_ref().map(|p| value(&|b| put_partitions(b, p))),
            ),
            ConsumerRecord::CurrentAssignment { group, member, value: v } => (
                key(CURRENT_ASSIGNMENT_KEY, group, Some(member)),
                v.as_ref().map(|a| {
                    value(&|b| {
                        b.put_i32(a.member_epoch);
                        b.put_i32(a.previous_member_epoch);
                        b.put_i8(a.state);
                        put_partitions(b, &a.assigned);
                        put_partitions(b, &a.revoking);
                    })
                }),
            ),
        }
    }
}

/// Decode a consumer group record whose key version (3-8) was read from `key`.
pub fn decode(version: i16, mut key: Bytes, value: Option<&Bytes>) -> Result<ConsumerRecord, RecordError> {
    let group = get_str(&mut key)?;
    let member = if matches!(version, MEMBER_KEY | TARGET_MEMBER_KEY | CURRENT_ASSIGNMENT_KEY) {
        Some(get_str(&mut key)?)
    } else {
        None
    };
    let mut v = match value {
        None => None,
        Some(v) => {
            let mut v = v.clone();
            if v.remaining() < 2 {
                return Err(RecordError("value without a version".into()));
            }
            let vv = v.get_i16();
            if vv != 0 {
                return Err(RecordError(format!("consumer group value version {vv} of key version {version}")));
            }
            Some(v)
        }
    };
    let member = || member.clone().expect("read for this key version");
    let rec = match version {
        GROUP_EPOCH_KEY => ConsumerRecord::GroupEpoch { group, epoch: v.as_mut().map(get_i32).transpose()? },
        PARTITION_METADATA_KEY => return Ok(ConsumerRecord::PartitionMetadata { group }),
        MEMBER_KEY => {
            let value = match v.as_mut() {
                None => None,
                Some(b) => Some(StoredConsumerMember {
                    instance_id: get_compact_opt_str(b)?,
                    rack_id: get_compact_opt_str(b)?,
                    client_id: get_compact_str(b)?,
                    client_host: get_compact_str(b)?,
                    topic_names: {
                        let n = get_array_len(b, 1)?;
                        (0..n).map(|_| get_compact_str(b)).collect::<Result<_, _>>()?
                    },
                    regex: get_compact_opt_str(b)?,
                    rebalance_timeout_ms: get_i32(b)?,
                    server_assignor: get_compact_opt_str(b)?,
                }),
            };
            ConsumerRecord::Member { group, member: member(), value }
        }
        TARGET_EPOCH_KEY => ConsumerRecord::TargetEpoch { group, epoch: v.as_mut().map(get_i32).transpose()? },
        TARGET_MEMBER_KEY => ConsumerRecord::TargetMember {
            group,
            member: member(),
            partitions: v.as_mut().map(get_partitions).transpose()?,
        },
        CURRENT_ASSIGNMENT_KEY => {
            let value = match v.as_mut() {
                None => None,
                Some(b) => Some(StoredAssignment {
                    member_epoch: get_i32(b)?,
                    previous_member_epoch: get_i32(b)?,
                    state: {
                        if b.remaining() < 1 {
                            return Err(RecordError("truncated member state".into()));
                        }
                        b.get_i8()
                    },
                    assigned: get_partitions(b)?,
                    revoking: get_partitions(b)?,
                }),
            };
            ConsumerRecord::CurrentAssignment { group, member: member(), value }
        }
        other => return Err(RecordError(format!("not a consumer group key version: {other}"))),
    };
    if let Some(b) = v.as_mut() {
        skip_tags(b)?;
    }
    Ok(rec)
}

fn put_uvarint(b: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        b.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

fn put_compact_opt_str(b: &mut BytesMut, s: Option<&str>) {
    match s {
        None => put_uvarint(b, 0),
        Some(s) => {
            put_uvarint(b, s.len() as u64 + 1);
            b.put_slice(s.as_bytes());
        }
    }
}

fn put_partitions(b: &mut BytesMut, p: &TopicPartitions) {
    put_uvarint(b, p.len() as u64 + 1);
    for (topic, partitions) in p {
        b.put_slice(topic.as_bytes());
        put_uvarint(b, partitions.len() as u64 + 1);
        for x in partitions {
            b.put_i32(*x);
        }
        b.put_u8(0);
    }
}

fn get_uvarint(b: &mut Bytes) -> Result<u64, RecordError> {
    let mut v = 0u64;
    for i in 0..10 {
        if !b.has_remaining() {
            return Err(RecordError("truncated varint".into()));
        }
        let byte = b.get_u8();
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(RecordError("varint longer than 10 bytes".into()))
}

fn get_compact_opt_str(b: &mut Bytes) -> Result<Option<String>, RecordError> {
    let n = get_uvarint(b)?;
    if n == 0 {
        return Ok(None);
    }
    let len = (n - 1) as usize;
    if n - 1 > b.remaining() as u64 {
        return Err(RecordError(format!("string length {len} with {} bytes left", b.remaining())));
    }
    String::from_utf8(b.split_to(len).to_vec()).map(Some).map_err(|_| RecordError("string is not UTF-8".into()))
}

fn get_compact_str(b: &mut Bytes) -> Result<String, RecordError> {
    get_compact_opt_str(b)?.ok_or_else(|| RecordError("null string where one is required".into()))
}

/// A compact array's length, checked against the bytes left (each element takes at
/// least `element_bytes_min`); null arrays are refused (none of these schemas has one).
fn get_array_len(b: &mut Bytes, element_bytes_min: usize) -> Result<usize, RecordError> {
    let n = get_uvarint(b)?;
    if n == 0 {
        return Err(RecordError("null array".into()));
    }
    let len = n - 1;
    if len.saturating_mul(element_bytes_min as u64) > b.remaining() as u64 {
        return Err(RecordError(format!("array of {len} with {} bytes left", b.remaining())));
    }
    Ok(len as usize)
}

fn get_partitions(b: &mut Bytes) -> Result<TopicPartitions, RecordError> {
    let topics = get_array_len(b, 16 + 1 + 1)?;
    let mut out = TopicPartitions::new();
    for _ in 0..topics {
        if b.remaining() < 16 {
            return Err(RecordError("truncated topic id".into()));
        }
        let mut id = [0u8; 16];
        b.copy_to_slice(&mut id);
        let n = get_array_len(b, 4)?;
        let partitions = out.entry(Uuid::from_bytes(id)).or_default();
        for _ in 0..n {
            partitions.insert(b.get_i32());
        }
        skip_tags(b)?;
    }
    Ok(out)
}

fn skip_tags(b: &mut Bytes) -> Result<(), RecordError> {
    let count = get_uvarint(b)?;
    if count > b.remaining() as u64 {
        return Err(RecordError(format!("{count} tagged fields with {} bytes left", b.remaining())));
    }
    for _ in 0..count {
        let _tag = get_uvarint(b)?;
        let size = get_uvarint(b)?;
        if size > b.remaining() as u64 {
            return Err(RecordError(format!("tagged field of {size} bytes with {} left", b.remaining())));
        }
        b.advance(size as usize);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn round_trip(r: ConsumerRecord) {
        let (key, value) = r.encode();
        let mut k = key.clone();
        let version = k.get_i16();
        assert_eq!(decode(version, k, value.as_ref()).unwrap(), r);
        // Every cut of the value is an error, never a panic.
        if let Some(v) = value {
            for cut in 0..v.len() {
                let mut k = key.clone();
                let version = k.get_i16();
                assert!(decode(version, k, Some(&v.slice(..cut))).is_err(), "{r:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn records_round_trip() {
        let t = Uuid::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        let parts = TopicPartitions::from([(t, BTreeSet::from([0, 5]))]);
        round_trip(ConsumerRecord::GroupEpoch { group: "g".into(), epoch: Some(7) });
        round_trip(ConsumerRecord::GroupEpoch { group: "g".into(), epoch: None });
        round_trip(ConsumerRecord::TargetEpoch { group: "g".into(), epoch: Some(6) });
        round_trip(ConsumerRecord::Member {
            group: "g".into(),
            member: "m".into(),
            value: Some(StoredConsumerMember {
                instance_id: Some("i".into()),
                rack_id: None,
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                topic_names: vec!["a".into(), "b".into()],
                regex: Some("x.*".into()),
                rebalance_timeout_ms: 300_000,
                server_assignor: Some("uniform".into()),
            }),
        });
        round_trip(ConsumerRecord::TargetMember {
            group: "g".into(),
            member: "m".into(),
            partitions: Some(parts.clone()),
        });
        round_trip(ConsumerRecord::CurrentAssignment {
            group: "g".into(),
            member: "m".into(),
            value: Some(StoredAssignment {
                member_epoch: 4,
                previous_member_epoch: 3,
                state: 1,
                assigned: parts.clone(),
                revoking: TopicPartitions::new(),
            }),
        });
        round_trip(ConsumerRecord::CurrentAssignment { group: "g".into(), member: "m".into(), value: None });
    }

    /// The bytes Kafka's generated serializer writes for these values (checked by hand
    /// against the schema: version, fields, empty tag section).
    #[test]
    fn value_bytes_follow_kafka_schemas() {
        let (key, value) = ConsumerRecord::GroupEpoch { group: "g".into(), epoch: Some(7) }.encode();
        assert_eq!(&key[..], &[0, 3, 0, 1, b'g']);
        assert_eq!(&value.unwrap()[..], &[0, 0, 0, 0, 0, 7, 0]);
        let t = Uuid::from_u128(1);
        let (key, value) = ConsumerRecord::TargetMember {
            group: "g".into(),
            member: "m".into(),
            partitions: Some(TopicPartitions::from([(t, BTreeSet::from([2]))])),
        }
        .encode();
        assert_eq!(&key[..], &[0, 7, 0, 1, b'g', 0, 1, b'm']);
        let mut want = vec![0, 0, 2];
        want.extend_from_slice(t.as_bytes());
        want.extend_from_slice(&[2, 0, 0, 0, 2, 0, 0]);
        assert_eq!(&value.unwrap()[..], &want[..]);
    }

    #[test]
    fn hostile_counts_are_refused_before_allocating() {
        // A target member value claiming 2^60 topics in 3 bytes.
        let mut v = BytesMut::new();
        v.put_i16(0);
        put_uvarint(&mut v, 1 << 60);
        let key = Bytes::from_static(&[0, 1, b'g', 0, 1, b'm']);
        assert!(decode(TARGET_MEMBER_KEY, key, Some(&v.freeze())).is_err());
    }
}
