//! Transactions through the partition log: transactional batches open a producer's
//! transaction, markers end it; the last stable offset stops at the oldest open one
//! (and at an ended one until the high watermark passes its marker); aborted
//! transactions go into the segment's `.txnindex` (Kafka's format) and come back for a
//! read_committed fetch; all of it survives a clean restart, a crash (the index file
//! lost, rebuilt from the log), a follower copying the leader, truncation and retention.

#[path = "log_common/mod.rs"]
mod common;

use std::os::unix::fs::FileExt;

use common::*;
use spate::log::batch::{encode_marker, ControlMarker};
use spate::log::txn_index::AbortedTxn;
use spate::log::{LogError, PartitionLog};
use spate::model::{Offset, ProducerId};
use spate::txn::producer_state::ProducerStateError;

const ATTR_TRANSACTIONAL: i16 = 0x10;

/// A batch of `n` records from producer `pid`, transactional or not.
fn batch(pid: i64, epoch: i16, seq: i32, n: usize, transactional: bool) -> Vec<u8> {
    let mut b = build_batch(&recs(n, 1_000, 20));
    b[43..51].copy_from_slice(&pid.to_be_bytes());
    b[51..53].copy_from_slice(&epoch.to_be_bytes());
    b[53..57].copy_from_slice(&seq.to_be_bytes());
    if transactional {
        b[21..23].copy_from_slice(&ATTR_TRANSACTIONAL.to_be_bytes());
    }
    fix_crc(&mut b);
    b
}

fn append(log: &mut PartitionLog, mut b: Vec<u8>) -> Result<(i64, i64), LogError> {
    log.append_with_leader_epoch(&mut b, 0, 1_000).map(|i| (i.base_offset.0, i.last_offset.0))
}

/// Append a marker the way the shard does (shared bytes, patched header); its offset.
fn marker(log: &mut PartitionLog, pid: i64, epoch: i16, commit: bool, coordinator_epoch: i32) -> Result<i64, LogError> {
    let mut b = encode_marker(pid, epoch, ControlMarker { commit, coordinator_epoch }, 2_000);
    let (info, write, patches) = log.append_marker_shared(&b, 0, 2_000)?;
    for p in patches {
        b[p.position..p.position + p.header.len()].copy_from_slice(&p.header);
    }
    let r = write.file.write_all_at(&b, write.position);
    log.write_done(write.id, r)?;
    Ok(info.base_offset.0)
}

/// Every aborted transaction a read_committed consumer reading the whole log is told of.
fn aborted_all(log: &PartitionLog) -> Vec<(i64, i64, i64)> {
    let (mut offset, mut found) = (0, Vec::new());
    while offset < log.log_end_offset().0 {
        let plan = log.read(Offset(offset), 1 << 20, log.log_end_offset(), true).unwrap();
        for a in log.aborted_txns(Offset(offset), &plan) {
            if !found.contains(&(a.producer_id, a.first_offset, a.last_offset)) {
                found.push((a.producer_id, a.first_offset, a.last_offset));
            }
        }
        offset = decode_batches(&plan.read_to_vec().unwrap()).last().expect("a batch").last_offset + 1;
    }
    found
}

fn lso(log: &mut PartitionLog) -> i64 {
    let hw = log.log_end_offset();
    log.last_stable_offset(hw).0
}

/// The aborted transactions a read_committed fetch from `offset` gets.
fn aborted(log: &PartitionLog, offset: i64) -> Vec<(i64, i64, i64)> {
    let plan = log.read(Offset(offset), 1 << 20, log.log_end_offset(), true).unwrap();
    log.aborted_txns(Offset(offset), &plan).iter().map(|a| (a.producer_id, a.first_offset, a.last_offset)).collect()
}

/// Producer 1 aborts [0, 3), producer 2 writes plainly at 3, producer 3 opens a
/// transaction at 4; the abort marker is at 5.
fn mixed(log: &mut PartitionLog) {
    assert_eq!(append(log, batch(1, 0, 0, 2, true)).unwrap(), (0, 1));
    assert_eq!(append(log, batch(1, 0, 2, 1, true)).unwrap(), (2, 2));
    assert_eq!(lso(log), 0, "producer 1's transaction is open");
    assert_eq!(append(log, batch(2, 0, 0, 1, false)).unwrap(), (3, 3));
    assert_eq!(append(log, batch(3, 0, 0, 1, true)).unwrap(), (4, 4));
    assert_eq!(marker(log, 1, 0, false, 0).unwrap(), 5);
}

#[test]
fn markers_end_transactions_and_the_last_stable_offset_follows() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    mixed(&mut log);
    // Ended but the marker not yet below the high watermark: still unstable.
    assert_eq!(log.last_stable_offset(Offset(5)).0, 0);
    assert_eq!(lso(&mut log), 4, "producer 3's transaction holds it now");
    assert_eq!(aborted(&log, 0), vec![(1, 0, 5)]);
    assert_eq!(aborted(&log, 6), vec![], "nothing aborted from 6 on");
    assert_eq!(marker(&mut log, 3, 0, true, 0).unwrap(), 6);
    assert_eq!(lso(&mut log), 7);
    assert_eq!(aborted(&log, 0), vec![(1, 0, 5)], "a commit adds no entry");
    // Kafka's .txnindex bytes: version 0, pid, first, last, last stable offset (4 then).
    let bytes = std::fs::read(dir.path().join("00000000000000000000.txnindex")).unwrap();
    let expected = AbortedTxn { producer_id: 1, first_offset: 0, last_offset: 5, last_stable_offset: 4 }.encode();
    assert_eq!(bytes, expected.to_vec());
    // A producer's marker with no transaction open ends an empty one.
    assert_eq!(marker(&mut log, 2, 0, false, 0).unwrap(), 7);
    assert_eq!(lso(&mut log), 8);
    log.close().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(aborted(&log, 0), vec![(1, 0, 5), (2, 7, 7)]);
    assert_eq!(lso(&mut log), 8);
}

#[test]
fn transactional_rules_on_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    append(&mut log, batch(1, 3, 0, 1, true)).unwrap();
    let plain = append(&mut log, batch(1, 3, 1, 1, false)).unwrap_err();
    assert!(matches!(plain, LogError::Producer(ProducerStateError::InvalidTxnState { .. })), "{plain}");
    let stale = marker(&mut log, 1, 2, true, 0).unwrap_err();
    assert!(matches!(stale, LogError::Producer(ProducerStateError::InvalidProducerEpoch { .. })), "{stale}");
    assert_eq!(marker(&mut log, 1, 3, true, 5).unwrap(), 1);
    let fenced = marker(&mut log, 1, 3, true, 4).unwrap_err();
    assert!(matches!(fenced, LogError::Producer(ProducerStateError::CoordinatorFenced { .. })), "{fenced}");
    // Clients may not write markers, nor transactional batches without a producer id.
    let mut control = encode_marker(1, 3, ControlMarker { commit: true, coordinator_epoch: 5 }, 0);
    let refused = log.append(&mut control, 0).unwrap_err();
    assert!(matches!(refused, LogError::InvalidRecord(_) | LogError::InvalidProducerFields(_)), "{refused}");
    let mut anonymous = batch(-1, -1, -1, 1, true);
    assert!(matches!(log.append(&mut anonymous, 0), Err(LogError::InvalidRecord(_))));
    // After the commit a plain batch of the same producer is fine again.
    append(&mut log, batch(1, 3, 1, 1, false)).unwrap();
    assert_eq!(log.log_end_offset(), Offset(3));
}

#[test]
fn a_crash_loses_neither_the_open_transaction_nor_the_aborted_index() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
        mixed(&mut log);
        // Dropped without close: a crash.
    }
    std::fs::remove_file(dir.path().join("00000000000000000000.txnindex")).unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(aborted(&log, 0), vec![(1, 0, 5)], "the replay writes the lost entry back");
    assert_eq!(lso(&mut log), 4, "producer 3's transaction is still open");
    let open: Vec<_> = log.producer_states().ongoing().collect();
    assert_eq!(open, vec![(4, ProducerId(3))]);
    assert_eq!(marker(&mut log, 3, 0, false, 0).unwrap(), 6);
    assert_eq!(aborted(&log, 0), vec![(1, 0, 5), (3, 4, 6)]);
    assert!(dir.path().join("00000000000000000000.txnindex").exists());
}

#[test]
fn state_survives_rolls_snapshots_and_a_torn_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config();
    config.segment_bytes = 400;
    {
        let mut log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
        // Producer 9 opens a transaction early and keeps it open across many rolls.
        append(&mut log, batch(9, 0, 0, 1, true)).unwrap();
        for i in 0..20 {
            append(&mut log, batch(1, 0, i * 2, 2, true)).unwrap();
            marker(&mut log, 1, 0, i % 2 == 1, 0).unwrap();
        }
        let logs = std::fs::read_dir(dir.path()).unwrap().filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "log")).count();
        assert!(logs > 3, "rolled: {logs} segments");
        assert_eq!(lso(&mut log), 0);
        log.close().unwrap();
    }
    // Tear the last entry of the first index that has one.
    let mut first = None;
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "txnindex") && first.as_ref().is_none_or(|f: &std::path::PathBuf| p < *f) {
            first = Some(p);
        }
    }
    let first = first.expect("an index file");
    let len = std::fs::metadata(&first).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&first).unwrap().set_len(len - 3).unwrap();
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert_eq!(lso(&mut log), 0, "producer 9's transaction is still open after the restart");
    let all = aborted_all(&log);
    // The clean restart trusts the files: the torn entry is gone from its segment; all
    // others (10 aborts in all) are there.
    assert_eq!(all.len(), 9, "{all:?}");
    assert!(all.iter().all(|(pid, first, last)| *pid == 1 && last - first == 2));
}

#[test]
fn a_follower_copying_the_leader_ends_in_the_same_state() {
    let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut leader = PartitionLog::open(ld.path(), small_config(), 0).unwrap();
    let mut follower = PartitionLog::open(fd.path(), small_config(), 0).unwrap();
    mixed(&mut leader);
    let plan = leader.read(Offset(0), 1 << 20, leader.log_end_offset(), true).unwrap();
    let bytes = plan.read_to_vec().unwrap();
    follower.append_replicated(&bytes, 1_000).unwrap();
    assert_eq!(aborted(&follower, 0), aborted(&leader, 0));
    assert_eq!(lso(&mut follower), lso(&mut leader));
    assert_eq!(
        std::fs::read(fd.path().join("00000000000000000000.txnindex")).unwrap(),
        std::fs::read(ld.path().join("00000000000000000000.txnindex")).unwrap()
    );
    // Truncating below the abort marker forgets the entry and reopens the transaction.
    follower.truncate_to(Offset(5)).unwrap();
    assert_eq!(aborted(&follower, 0), vec![]);
    assert_eq!(lso(&mut follower), 0);
}
