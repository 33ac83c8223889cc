//! Kafka's `__transaction_state` record schemas (TransactionLogKey, TransactionLogValue),
//! written by hand: they live in Kafka's transaction-coordinator module, not in the
//! client message specs the `kafka-protocol` crate generates. Integers big-endian.
//!
//! Key (version 0): version i16 = 0, transactional_id string (i16 length + UTF-8).
//! Value, version 0: version i16 = 0, producer_id i64, producer_epoch i16,
//!   transaction_timeout_ms i32, transaction_status i8, transaction_partitions
//!   [i32 count, -1 = null] { topic string, partition_ids [i32 count] i32 },
//!   last_update_timestamp_ms i64, start_timestamp_ms i64.
//! Value, version 1 (flexible, KIP-890): the same fields with compact strings and arrays
//!   (unsigned varint length + 1, 0 = null), a tagged-field section after each partition
//!   entry and at the end, where tag 0 is previous_producer_id i64, tag 1
//!   next_producer_id i64, tag 2 client_transaction_version i16 (others are skipped).
//! A null value (tombstone) removes the transactional id.
//!
//! Spate writes version 1, as Kafka does from `transaction.version` level 1 (Spate's is 2,
//! `protocol::features`): tag 0 when there is a previous producer id, tag 1 when there is
//! a next one, tag 2 when the client's transaction version is not 0. It reads both
//! versions. The bytes come from disk: every count is checked against the bytes left
//! before anything is allocated.

use std::collections::BTreeSet;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::coordinator::{TxnRecord, TxnState, NO_PRODUCER_ID};
use crate::model::TopicPartition;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed __transaction_state record: {0}")]
pub struct TxnRecordError(pub String);

fn err(s: impl Into<String>) -> TxnRecordError {
    TxnRecordError(s.into())
}

pub fn key(txn_id: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + txn_id.len());
    b.put_i16(0);
    put_str(&mut b, txn_id);
    b.freeze()
}

/// The value of `r`, version 1 (flexible).
pub fn value(r: &TxnRecord) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(1);
    b.put_i64(r.producer_id);
    b.put_i16(r.producer_epoch);
    b.put_i32(r.timeout_ms);
    b.put_i8(r.state.id());
    let topics = by_topic(&r.partitions);
    put_uvarint(&mut b, topics.len() as u32 + 1);
    for (topic, ids) in topics {
        put_uvarint(&mut b, topic.len() as u32 + 1);
        b.put_slice(topic.as_bytes());
        put_uvarint(&mut b, ids.len() as u32 + 1);
        for id in ids {
            b.put_i32(id);
        }
        put_uvarint(&mut b, 0); // the entry's tagged fields
    }
    b.put_i64(r.last_update_ms);
    b.put_i64(r.start_ms);
    let mut tags: Vec<(u32, Vec<u8>)> = Vec::new();
    if r.previous_producer_id != NO_PRODUCER_ID {
        tags.push((0, r.previous_producer_id.to_be_bytes().to_vec()));
    }
    if r.next_producer_id != NO_PRODUCER_ID {
        tags.push((1, r.next_producer_id.to_be_bytes().to_vec()));
    }
    if r.client_version != 0 {
        tags.push((2, r.client_version.to_be_bytes().to_vec()));
    }
    put_uvarint(&mut b, tags.len() as u32);
    for (tag, bytes) in tags {
        put_uvarint(&mut b, tag);
        put_uvarint(&mut b, bytes.len() as u32);
        b.put_slice(&bytes);
    }
    b.freeze()
}

fn put_uvarint(b: &mut BytesMut, mut v: u32) {
    while v >= 0x80 {
        b.put_u8((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

/// The value of `r`, version 0 (what Kafka writes at `transaction.version` 0; Spate
/// reads it, and writes it only in tests).
#[cfg(test)]
pub fn value_v0(r: &TxnRecord) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i64(r.producer_id);
    b.put_i16(r.producer_epoch);
    b.put_i32(r.timeout_ms);
    b.put_i8(r.state.id());
    let topics = by_topic(&r.partitions);
    b.put_i32(topics.len() as i32);
    for (topic, ids) in topics {
        put_str(&mut b, topic);
        b.put_i32(ids.len() as i32);
        for id in ids {
            b.put_i32(id);
        }
    }
    b.put_i64(r.last_update_ms);
    b.put_i64(r.start_ms);
    b.freeze()
}

/// The transactional id of a key.
pub fn decode_key(key: &Bytes) -> Result<String, TxnRecordError> {
    let mut b = key.clone();
    let version = get_i16(&mut b)?;
    if version != 0 {
        return Err(err(format!("key version {version}")));
    }
    let id = get_str(&mut b)?;
    if b.has_remaining() {
        return Err(err("bytes after the key"));
    }
    Ok(id)
}

/// A value (None: a tombstone).
pub fn decode_value(value: Option<&Bytes>) -> Result<Option<TxnRecord>, TxnRecordError> {
    let Some(value) = value else { return Ok(None) };
    let mut b = value.clone();
    let version = get_i16(&mut b)?;
    let flexible = match version {
        0 => false,
        1 => true,
        v => return Err(err(format!("value version {v}"))),
    };
    let producer_id = get_i64(&mut b)?;
    let producer_epoch = get_i16(&mut b)?;
    let timeout_ms = get_i32(&mut b)?;
    let status = get_i8(&mut b)?;
    let state = TxnState::from_id(status).ok_or_else(|| err(format!("transaction status {status}")))?;
    let mut partitions = BTreeSet::new();
    // topic string (at least its length) + partition count: the least an entry takes.
    if let Some(topics) = get_count(&mut b, flexible, if flexible { 2 } else { 6 })? {
        for _ in 0..topics {
            let topic = if flexible { get_compact_str(&mut b)? } else { get_str(&mut b)? };
            let ids = get_count(&mut b, flexible, 4)?.ok_or_else(|| err("null partition ids"))?;
            for _ in 0..ids {
                partitions.insert(TopicPartition::new(topic.as_str(), get_i32(&mut b)?));
            }
            if flexible {
                skip_tagged_fields(&mut b, |_, _| Ok(()))?;
            }
        }
    }
    let last_update_ms = get_i64(&mut b)?;
    let start_ms = get_i64(&mut b)?;
    let (mut previous_producer_id, mut next_producer_id, mut client_version) = (NO_PRODUCER_ID, NO_PRODUCER_ID, 0);
    if flexible {
        skip_tagged_fields(&mut b, |tag, mut field| {
            match tag {
                0 => previous_producer_id = get_i64(&mut field)?,
                1 => next_producer_id = get_i64(&mut field)?,
                2 => client_version = get_i16(&mut field)?,
                _ => {}
            }
            Ok(())
        })?;
    }
    if b.has_remaining() {
        return Err(err("bytes after the value"));
    }
    Ok(Some(TxnRecord {
        producer_id,
        previous_producer_id,
        producer_epoch,
        timeout_ms,
        state,
        partitions,
        last_update_ms,
        start_ms,
        next_producer_id,
        client_version,
    }))
}

fn by_topic(partitions: &BTreeSet<TopicPartition>) -> Vec<(&str, Vec<i32>)> {
    let mut out: Vec<(&str, Vec<i32>)> = Vec::new();
    for tp in partitions {
        match out.last_mut() {
            Some((topic, ids)) if *topic == tp.topic.as_str() => ids.push(tp.partition),
            _ => out.push((tp.topic.as_str(), vec![tp.partition])),
        }
    }
    out
}

fn put_str(b: &mut BytesMut, s: &str) {
    b.put_i16(s.len() as i16);
    b.put_slice(s.as_bytes());
}

fn need(b: &Bytes, n: usize) -> Result<(), TxnRecordError> {
    if b.remaining() < n {
        return Err(err(format!("needs {n} more bytes, has {}", b.remaining())));
    }
    Ok(())
}

fn get_i8(b: &mut Bytes) -> Result<i8, TxnRecordError> {
    need(b, 1)?;
    Ok(b.get_i8())
}

fn get_i16(b: &mut Bytes) -> Result<i16, TxnRecordError> {
    need(b, 2)?;
    Ok(b.get_i16())
}

fn get_i32(b: &mut Bytes) -> Result<i32, TxnRecordError> {
    need(b, 4)?;
    Ok(b.get_i32())
}

fn get_i64(b: &mut Bytes) -> Result<i64, TxnRecordError> {
    need(b, 8)?;
    Ok(b.get_i64())
}

fn get_uvarint(b: &mut Bytes) -> Result<u32, TxnRecordError> {
    let mut v: u32 = 0;
    for shift in (0..35).step_by(7) {
        let byte = get_i8(b)? as u8;
        v |= u32::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(err("unsigned varint longer than 5 bytes"))
}

fn utf8(bytes: Bytes) -> Result<String, TxnRecordError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| err("string is not UTF-8"))
}

fn get_str(b: &mut Bytes) -> Result<String, TxnRecordError> {
    let len = get_i16(b)?;
    if len < 0 {
        return Err(err("null string where one is required"));
    }
    need(b, len as usize)?;
    utf8(b.split_to(len as usize))
}

fn get_compact_str(b: &mut Bytes) -> Result<String, TxnRecordError> {
    let len = get_uvarint(b)?.checked_sub(1).ok_or_else(|| err("null string where one is required"))? as usize;
    need(b, len)?;
    utf8(b.split_to(len))
}

/// An array's element count (None: null), each element taking at least `element_bytes`:
/// a count the bytes left cannot hold is refused before anything is read.
fn get_count(b: &mut Bytes, flexible: bool, element_bytes: usize) -> Result<Option<usize>, TxnRecordError> {
    let count = if flexible {
        match get_uvarint(b)? {
            0 => return Ok(None),
            n => (n - 1) as usize,
        }
    } else {
        match get_i32(b)? {
            n if n < 0 => return Ok(None),
            n => n as usize,
        }
    };
    if count.saturating_mul(element_bytes) > b.remaining() {
        return Err(err(format!("{count} elements in {} bytes", b.remaining())));
    }
    Ok(Some(count))
}

/// A tagged-field section: each (tag, its bytes) is handed to `field`.
fn skip_tagged_fields(
    b: &mut Bytes,
    mut field: impl FnMut(u32, Bytes) -> Result<(), TxnRecordError>,
) -> Result<(), TxnRecordError> {
    let count = get_uvarint(b)? as usize;
    if count.saturating_mul(2) > b.remaining() {
        return Err(err(format!("{count} tagged fields in {} bytes", b.remaining())));
    }
    for _ in 0..count {
        let tag = get_uvarint(b)?;
        let size = get_uvarint(b)? as usize;
        need(b, size)?;
        field(tag, b.split_to(size))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> TxnRecord {
        TxnRecord {
            producer_id: 4242,
            previous_producer_id: NO_PRODUCER_ID,
            producer_epoch: 7,
            timeout_ms: 60_000,
            state: TxnState::Ongoing,
            partitions: [("b", 1), ("a", 2), ("a", 0)].iter().map(|(t, p)| TopicPartition::new(*t, *p)).collect(),
            last_update_ms: 1_700_000_000_123,
            start_ms: 1_700_000_000_000,
            next_producer_id: NO_PRODUCER_ID,
            client_version: 0,
        }
    }

    #[test]
    fn version_0_bytes_are_kafkas() {
        let r = record();
        let mut want = vec![0, 0];
        want.extend(4242i64.to_be_bytes());
        want.extend(7i16.to_be_bytes());
        want.extend(60_000i32.to_be_bytes());
        want.push(1); // Ongoing
        want.extend(2i32.to_be_bytes());
        want.extend([0, 1, b'a']);
        want.extend(2i32.to_be_bytes());
        want.extend(0i32.to_be_bytes());
        want.extend(2i32.to_be_bytes());
        want.extend([0, 1, b'b']);
        want.extend(1i32.to_be_bytes());
        want.extend(1i32.to_be_bytes());
        want.extend(1_700_000_000_123i64.to_be_bytes());
        want.extend(1_700_000_000_000i64.to_be_bytes());
        assert_eq!(value_v0(&r).to_vec(), want);
        assert_eq!(decode_value(Some(&value_v0(&r))), Ok(Some(r)));
        assert_eq!(key("tx").to_vec(), vec![0, 0, 0, 2, b't', b'x']);
        assert_eq!(decode_key(&key("tx")), Ok("tx".to_string()));
        assert_eq!(decode_value(None), Ok(None));
    }

    #[test]
    fn version_1_with_tagged_fields_decodes() {
        let mut v = vec![0, 1];
        v.extend(4242i64.to_be_bytes());
        v.extend(7i16.to_be_bytes());
        v.extend(60_000i32.to_be_bytes());
        v.push(4); // CompleteCommit
        v.push(2); // one topic
        v.extend([2, b'a']); // compact "a"
        v.extend([3]); // two ids
        v.extend(0i32.to_be_bytes());
        v.extend(5i32.to_be_bytes());
        v.push(0); // the entry's tagged fields
        v.extend(10i64.to_be_bytes());
        v.extend(9i64.to_be_bytes());
        v.push(3); // tagged fields: previous producer id, next producer id, an unknown one
        v.extend([0, 8]);
        v.extend(4000i64.to_be_bytes());
        v.extend([1, 8]);
        v.extend(4243i64.to_be_bytes());
        v.extend([9, 1, 0xff]);
        let r = decode_value(Some(&Bytes::from(v.clone()))).unwrap().unwrap();
        assert_eq!(
            (r.state, r.previous_producer_id, r.next_producer_id, r.last_update_ms, r.start_ms),
            (TxnState::CompleteCommit, 4000, 4243, 10, 9)
        );
        // What Spate writes is these bytes, less the unknown tag.
        let mut written = v[..v.len() - 3].to_vec();
        let tags = written.len() - 2 * 10 - 1;
        written[tags] = 2;
        assert_eq!(value(&r).to_vec(), written);
        let r2 = TxnRecord { client_version: 2, ..r.clone() };
        assert_eq!(decode_value(Some(&value(&r2))), Ok(Some(r2)));
        assert_eq!(
            r.partitions.into_iter().collect::<Vec<_>>(),
            vec![TopicPartition::new("a", 0), TopicPartition::new("a", 5)]
        );
    }

    #[test]
    fn malformed_values_are_refused_without_allocating_what_they_claim() {
        let good = value(&record()).to_vec();
        for cut in 0..good.len() {
            assert!(decode_value(Some(&Bytes::copy_from_slice(&good[..cut]))).is_err(), "cut at {cut}");
        }
        // A partition count of 2^31-1 in a short value: refused on the count.
        let mut huge = good[..17].to_vec();
        huge.extend(i32::MAX.to_be_bytes());
        huge.extend([0u8; 16]);
        assert!(decode_value(Some(&Bytes::from(huge))).unwrap_err().0.contains("elements"));
        let mut bad_status = good.clone();
        bad_status[16] = 9;
        assert!(decode_value(Some(&Bytes::from(bad_status))).is_err());
        let mut trailing = good;
        trailing.push(0);
        assert!(decode_value(Some(&Bytes::from(trailing))).is_err());
        assert!(decode_key(&Bytes::from_static(&[0, 1, 0, 2, b'x'])).is_err());
    }
}
