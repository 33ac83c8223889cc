//! Producer state through the partition log: retries answered with their original
//! offsets and not appended; the state survives a crash between an append and its
//! snapshot (rebuilt by replay), a torn or bit-flipped `.snapshot` (discarded, rebuilt
//! from the log), truncation (reloaded) and retention (producers forgotten); a follower
//! appending the leader's batches ends with the same state.

#[path = "log_common/mod.rs"]
mod common;

use std::path::Path;

use common::*;
use spate::log::{LogConfig, LogError, PartitionLog};
use spate::model::{Offset, ProducerEpoch, ProducerId};
use spate::txn::producer_state::ProducerStateError;

/// An idempotent batch of `n` records: producer id, epoch, base sequence.
fn idem_batch(pid: i64, epoch: i16, seq: i32, n: usize, ts: i64) -> Vec<u8> {
    let mut b = build_batch(&recs(n, ts, 20));
    b[43..51].copy_from_slice(&pid.to_be_bytes());
    b[51..53].copy_from_slice(&epoch.to_be_bytes());
    b[53..57].copy_from_slice(&seq.to_be_bytes());
    fix_crc(&mut b);
    b
}

fn append(log: &mut PartitionLog, mut b: Vec<u8>) -> Result<(i64, i64, bool), LogError> {
    match log.append(&mut b, 1_000) {
        Ok(info) => Ok((info.base_offset.0, info.last_offset.0, false)),
        Err(LogError::DuplicateBatch(info)) => Ok((info.base_offset.0, info.last_offset.0, true)),
        Err(e) => Err(e),
    }
}

fn last(log: &PartitionLog, pid: i64) -> Option<(i16, i32, i64)> {
    log.producer_states().get(ProducerId(pid)).map(|e| (e.epoch.0, e.last_seq(), e.last_offset()))
}

fn snapshots(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".snapshot"))
        .collect();
    v.sort();
    v
}

#[test]
fn retries_are_answered_with_original_offsets_and_errors_append_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(append(&mut log, idem_batch(7, 0, 0, 3, 10)).unwrap(), (0, 2, false));
    assert_eq!(append(&mut log, idem_batch(7, 0, 3, 2, 11)).unwrap(), (3, 4, false));
    assert_eq!(append(&mut log, idem_batch(7, 0, 0, 3, 10)).unwrap(), (0, 2, true));
    let gap = append(&mut log, idem_batch(7, 0, 9, 1, 12)).unwrap_err();
    assert!(matches!(gap, LogError::Producer(ProducerStateError::OutOfOrderSequence { .. })), "{gap}");
    // A new epoch must start at sequence 0.
    let bumped = append(&mut log, idem_batch(7, 1, 5, 1, 12)).unwrap_err();
    assert!(matches!(bumped, LogError::Producer(ProducerStateError::OutOfOrderSequence { .. })), "{bumped}");
    assert_eq!(append(&mut log, idem_batch(7, 1, 0, 1, 12)).unwrap(), (5, 5, false));
    let stale = append(&mut log, idem_batch(7, 0, 5, 1, 12)).unwrap_err();
    assert!(matches!(stale, LogError::Producer(ProducerStateError::InvalidProducerEpoch { .. })), "{stale}");
    log.set_producer_id_bound(Some(1000));
    let never = append(&mut log, idem_batch(5000, 0, 0, 1, 12)).unwrap_err();
    assert!(matches!(never, LogError::Producer(ProducerStateError::UnknownProducerId { .. })), "{never}");
    let negative = append(&mut log, idem_batch(7, 1, -3, 1, 12)).unwrap_err();
    assert!(matches!(negative, LogError::InvalidProducerFields(_)), "{negative}");
    assert_eq!(log.log_end_offset(), Offset(6), "nothing refused was appended");
    assert_eq!(last(&log, 7), Some((1, 0, 5)));
}

#[test]
fn state_survives_a_crash_between_append_and_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
        for i in 0..4 {
            append(&mut log, idem_batch(1, 2, i * 2, 2, 100)).unwrap();
        }
        // kill -9: no close, no snapshot.
    }
    assert!(snapshots(dir.path()).is_empty());
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(last(&log, 1), Some((2, 7, 7)));
    // The in-flight retry of the last batch is still a duplicate.
    assert_eq!(append(&mut log, idem_batch(1, 2, 6, 2, 100)).unwrap(), (6, 7, true));
    assert_eq!(append(&mut log, idem_batch(1, 2, 8, 1, 100)).unwrap(), (8, 8, false));
}

#[test]
fn snapshots_at_roll_and_close_and_replay_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 400, ..small_config() };
    {
        let mut log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
        for i in 0..10 {
            append(&mut log, idem_batch(1, 0, i, 1, 100)).unwrap();
            append(&mut log, idem_batch(2, 4, i, 1, 100)).unwrap();
        }
        assert!(log.segment_base_offsets().len() > 2, "rolled");
        assert_eq!(snapshots(dir.path()).len(), log.segment_base_offsets().len() - 1);
        // A crash after the last roll: replayed from the newest snapshot.
    }
    let log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
    assert_eq!(last(&log, 1), Some((0, 9, 18)));
    assert_eq!(last(&log, 2), Some((4, 9, 19)));
    log.close().unwrap();
    let names = snapshots(dir.path());
    assert_eq!(names.last().unwrap(), &format!("{:020}.snapshot", 20));
    let log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert_eq!(last(&log, 2), Some((4, 9, 19)));
}

#[test]
fn torn_or_bit_flipped_snapshots_are_discarded_and_the_state_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
        append(&mut log, idem_batch(3, 1, 0, 2, 100)).unwrap();
        append(&mut log, idem_batch(3, 1, 2, 2, 100)).unwrap();
        log.close().unwrap();
    }
    let snap = dir.path().join(format!("{:020}.snapshot", 4));
    let good = std::fs::read(&snap).unwrap();
    for damage in 0..3 {
        let mut bad = good.clone();
        match damage {
            0 => bad.truncate(good.len() - 7), // torn
            1 => bad[20] ^= 0x10,              // a flipped bit in an entry
            _ => bad[3] ^= 0x01,               // a flipped bit in the crc
        }
        std::fs::write(&snap, &bad).unwrap();
        // Not a clean shutdown either: the marker goes with the reopen below.
        let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
        assert!(!snap.exists() || std::fs::read(&snap).unwrap() != bad, "corrupt snapshot left in place");
        assert_eq!(last(&log, 3), Some((1, 3, 3)), "damage {damage}");
        assert_eq!(append(&mut log, idem_batch(3, 1, 2, 2, 100)).unwrap(), (2, 3, true));
        log.close().unwrap();
        // close wrote a good one again.
        assert_eq!(std::fs::read(&snap).unwrap(), good);
    }
}

#[test]
fn truncation_and_retention_rebuild_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 300, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
    for i in 0..8 {
        append(&mut log, idem_batch(1, 0, i, 1, 100)).unwrap();
    }
    append(&mut log, idem_batch(2, 0, 0, 1, 100)).unwrap();
    // A follower cutting a divergent suffix: the state is as the shorter log leaves it.
    log.truncate_to(Offset(5), Offset(5)).unwrap();
    assert_eq!(last(&log, 1), Some((0, 4, 4)));
    assert_eq!(last(&log, 2), None);
    assert_eq!(append(&mut log, idem_batch(1, 0, 5, 1, 100)).unwrap(), (5, 5, false));
    // Retention by time removes every closed segment: producer 1's batches in them go,
    // and with them what is remembered of producers whose last batch was there.
    for seq in 0..4 {
        append(&mut log, idem_batch(9, 0, seq, 1, 100)).unwrap();
    }
    let segments_before = log.segment_base_offsets();
    let mut cfg = config;
    cfg.retention_ms = 0;
    log.set_config(cfg);
    let deleted = log.enforce_retention(1_000_000).unwrap();
    assert!(deleted > 0, "{segments_before:?}");
    let start = log.log_start_offset().0;
    assert!(start > 5, "producer 1's last batch (offset 5) was deleted: {segments_before:?}");
    assert_eq!(last(&log, 1), None, "forgotten with its last batch");
    assert_eq!(last(&log, 9).map(|(_, seq, _)| seq), Some(3));
    // Unknown again: accepted at any sequence (Kafka's rule).
    assert!(append(&mut log, idem_batch(1, 0, 40, 1, 100)).is_ok());
}

#[test]
fn a_follower_builds_the_same_state_from_the_leaders_batches() {
    let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut leader = PartitionLog::open(ld.path(), small_config(), 0).unwrap();
    let mut follower = PartitionLog::open(fd.path(), small_config(), 0).unwrap();
    for (pid, epoch, seq) in [(1, 0, 0), (1, 0, 2), (2, 5, 0), (1, 1, 0)] {
        let mut b = idem_batch(pid, epoch, seq, 2, 100);
        leader.append_with_leader_epoch(&mut b, 3, 100).unwrap();
        follower.append_replicated(&b, 100).unwrap();
    }
    assert_eq!(leader.producer_states(), follower.producer_states());
    // The follower, now leader, deduplicates a retry of what the old leader wrote.
    let retry = idem_batch(1, 1, 0, 2, 100);
    assert_eq!(append(&mut follower, retry).unwrap(), (6, 7, true));
    assert_eq!(follower.producer_states().get(ProducerId(2)).unwrap().epoch, ProducerEpoch(5));
}

#[test]
fn a_snapshot_claiming_batches_past_its_offset_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
        append(&mut log, idem_batch(3, 0, 0, 2, 100)).unwrap();
        log.close().unwrap();
    }
    // A well-formed snapshot (good CRC) at offset 2 whose entry says offset 50.
    let mut forged = spate::txn::producer_state::ProducerStates::new();
    let b = spate::txn::producer_state::ProducerBatch {
        producer_id: ProducerId(3),
        epoch: ProducerEpoch(0),
        first_seq: 100,
        offset_delta: 0,
        max_timestamp_ms: 100,
        transactional: false,
    };
    forged.apply(&b, 50);
    std::fs::write(dir.path().join(format!("{:020}.snapshot", 2)), forged.encode_snapshot()).unwrap();
    let log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(last(&log, 3), Some((0, 1, 1)), "rebuilt from the log instead");
}
