//! A produce request whose record set for one partition holds more batches than one
//! writev may carry iovecs (Linux's IOV_MAX, 1024; each batch is two pieces: its patched
//! header and its bytes from the request). It used to become one writev that failed
//! with EINVAL and took the partition offline; the append ring now splits it.

#[path = "log_common/mod.rs"]
mod common;

use bytes::Bytes;
use common::*;
use spate::log::PartitionLog;
use spate::model::{limits, Offset, TopicPartition};
use spate::shard::{AppendRing, StagedWrite};

#[test]
fn one_append_of_1100_batches_through_the_ring_is_written_whole_and_the_log_stays_online() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(&dir.path().join("t-0"), small_config(), 1_000).unwrap();
    let batches = 1_100;
    let mut set = Vec::new();
    for i in 0..batches {
        set.extend_from_slice(&build_batch(&recs(1 + i % 3, 1_000 + i as i64, 20)));
    }
    let records = Bytes::from(set);
    let (info, write, patches) = log.append_shared_with_leader_epoch(&records, 3, 1_000).unwrap();
    assert_eq!(patches.len(), batches);
    // As the shard stages a produce: each patched header, then the rest of its batch.
    let mut parts = Vec::new();
    for p in &patches {
        parts.push(Bytes::copy_from_slice(&p.header));
        parts.push(records.slice(p.position + p.header.len()..p.position + p.size));
    }
    assert!(parts.len() > limits::writev_iovecs_max);

    let mut ring = AppendRing::new().unwrap();
    let tp = TopicPartition::new("t", 0);
    ring.stage(StagedWrite {
        tp,
        log: write.log,
        write_id: write.id,
        file: write.file.clone(),
        position: write.position,
        parts,
    });
    let mut done = ring.submit();
    while ring.has_in_flight() {
        done.extend(ring.reap());
    }
    assert_eq!(done.len(), 1);
    let c = done.pop().unwrap();
    assert!(c.result.is_ok(), "the write failed: {:?}", c.result.err());
    log.write_done(c.write_id, c.result).unwrap();
    assert!(log.offline_reason().is_none());

    let end = info.last_offset.0 + 1;
    assert_eq!(log.written_end_offset(), Offset(end));
    let read = log.read(Offset(0), 64 << 20, Offset(end), true).unwrap().read_to_vec().unwrap();
    let decoded = decode_batches(&read);
    assert_eq!(decoded.len(), batches);
    let offsets: Vec<i64> = decoded.iter().flat_map(|d| d.records.iter().map(|r| r.0)).collect();
    assert_eq!(offsets, (0..end).collect::<Vec<_>>(), "every record, dense offsets");

    // The log takes the next append, and reopens with everything.
    let mut next = build_batch(&recs(2, 5_000, 5));
    assert_eq!(log.append(&mut next, 2_000).unwrap().base_offset, Offset(end));
    log.close().unwrap();
    let log = PartitionLog::open(&dir.path().join("t-0"), small_config(), 3_000).unwrap();
    assert_eq!(log.log_end_offset(), Offset(end + 2));
}
