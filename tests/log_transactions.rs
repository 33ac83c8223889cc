//! Transactions through the partition log: transactional batches open a producer's
//! transaction, markers end it; the last stable offset stops at the oldest open one
//! (and at an ended one until the high watermark passes its marker); aborted
//! transactions go into the segment's `.txnindex` (Kafka's format) and come back for a
//! read_committed fetch; all of it survives a clean restart, a crash (the index file
//! lost, rebuilt from the log), a follower copying the leader, truncation and retention.

#[path = "log_common/mod.rs"]
mod common;
#[path = "proptest_config/mod.rs"]
mod proptest_config;

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::FileExt;

use proptest::prelude::*;

use common::*;
use spate::log::batch::{encode_marker, ControlMarker};
use spate::log::txn_index::AbortedTxn;
use spate::log::{LogError, PartitionLog, TxnVerification};
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
    let (info, write, patches) = log.append_marker_shared(&b, 0, 2_000, 0)?;
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

/// KIP-890 part 1 on the leader, as `append_produced` does it for a Produce naming a
/// transactional id. Appends the record set the way the shard does (shared bytes).
fn produce(log: &mut PartitionLog, b: Vec<u8>, verification: TxnVerification) -> Result<i64, LogError> {
    let mut b = b;
    let (info, write, patches) = log.append_produced(&b, 0, 1_000, verification)?;
    for p in patches {
        b[p.position..p.position + p.header.len()].copy_from_slice(&p.header);
    }
    let r = write.file.write_all_at(&b, write.position);
    log.write_done(write.id, r)?;
    Ok(info.base_offset.0)
}

#[test]
fn a_transactional_batch_needs_verification_and_a_marker_voids_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    // The first transactional batch of producer 1 here: verify first, nothing appended.
    let guard = match produce(&mut log, batch(1, 0, 0, 1, true), TxnVerification::Unverified) {
        Err(LogError::TxnVerificationNeeded { producer_id: 1, producer_epoch: 0, guard }) => guard,
        other => panic!("{other:?}"),
    };
    assert_eq!(log.log_end_offset(), Offset(0));
    // Asking again (a retry) hands out the same guard; a wrong guard is refused.
    let again = produce(&mut log, batch(1, 0, 0, 1, true), TxnVerification::Unverified);
    assert!(matches!(again, Err(LogError::TxnVerificationNeeded { guard: g, .. }) if g == guard), "{again:?}");
    let wrong = produce(&mut log, batch(1, 0, 0, 1, true), TxnVerification::Verified(guard + 1));
    assert!(matches!(wrong, Err(LogError::TxnVerificationStale { producer_id: 1 })), "{wrong:?}");
    // Verified: appended, and the transaction is open, so later batches need no check.
    assert_eq!(produce(&mut log, batch(1, 0, 0, 1, true), TxnVerification::Verified(guard)).unwrap(), 0);
    assert_eq!(produce(&mut log, batch(1, 0, 1, 1, true), TxnVerification::Unverified).unwrap(), 1);
    // Plain batches and requests without a transactional id are not verified.
    assert_eq!(produce(&mut log, batch(2, 0, 0, 1, false), TxnVerification::Unverified).unwrap(), 2);
    assert_eq!(produce(&mut log, batch(3, 0, 0, 1, true), TxnVerification::Off).unwrap(), 3);
    marker(&mut log, 1, 0, false, 0).unwrap();

    // A batch verified while its transaction was still open, appended after the marker
    // that ended it (the hanging transaction KIP-890 prevents): the guard is void.
    let guard = match produce(&mut log, batch(1, 0, 2, 1, true), TxnVerification::Unverified) {
        Err(LogError::TxnVerificationNeeded { guard, .. }) => guard,
        other => panic!("{other:?}"),
    };
    marker(&mut log, 1, 0, false, 0).unwrap();
    let late = produce(&mut log, batch(1, 0, 2, 1, true), TxnVerification::Verified(guard));
    assert!(matches!(late, Err(LogError::TxnVerificationStale { producer_id: 1 })), "{late:?}");
    assert_eq!(log.log_end_offset(), Offset(6));
    assert_eq!(lso(&mut log), 3, "only producer 3's transaction (at 3) is open");
    // A guard handed out for another epoch does not serve a newer one.
    let guard = match produce(&mut log, batch(1, 0, 2, 1, true), TxnVerification::Unverified) {
        Err(LogError::TxnVerificationNeeded { guard, .. }) => guard,
        other => panic!("{other:?}"),
    };
    let bumped = produce(&mut log, batch(1, 1, 0, 1, true), TxnVerification::Verified(guard));
    assert!(matches!(bumped, Err(LogError::TxnVerificationStale { producer_id: 1 })), "{bumped:?}");
}

#[test]
fn transaction_version_2_the_next_transaction_at_the_bumped_epoch_is_not_part_of_the_open_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    let guard = match produce(&mut log, batch(1, 0, 0, 1, true), TxnVerification::Unverified) {
        Err(LogError::TxnVerificationNeeded { guard, .. }) => guard,
        other => panic!("{other:?}"),
    };
    assert_eq!(produce(&mut log, batch(1, 0, 0, 2, true), TxnVerification::Verified(guard)).unwrap(), 0);
    // EndTxn v5 answered epoch 1; the client's next transaction reaches this partition
    // before the marker (at epoch 1) of the one open here at epoch 0: it must be added
    // through the coordinator, not slip into the open transaction.
    let next = match produce(&mut log, batch(1, 1, 0, 1, true), TxnVerification::Unverified) {
        Err(LogError::TxnVerificationNeeded { producer_epoch: 1, guard, .. }) => guard,
        other => panic!("{other:?}"),
    };
    // The marker at the bumped epoch ends the open transaction; the late batch of it (at
    // epoch 0) is fenced, and the verification of the next one (at epoch 1) stands.
    assert_eq!(marker(&mut log, 1, 1, true, 0).unwrap(), 2);
    let late = produce(&mut log, batch(1, 0, 2, 1, true), TxnVerification::Unverified);
    assert!(matches!(late, Err(LogError::Producer(ProducerStateError::InvalidProducerEpoch { .. }))), "{late:?}");
    assert_eq!(lso(&mut log), 3, "nothing open");
    // The next transaction starts at sequence 0 of the new epoch.
    assert_eq!(produce(&mut log, batch(1, 1, 0, 1, true), TxnVerification::Verified(next)).unwrap(), 3);
    assert_eq!(produce(&mut log, batch(1, 1, 1, 1, true), TxnVerification::Unverified).unwrap(), 4);
    assert_eq!(lso(&mut log), 3, "the next transaction is open from 3");
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
        let logs = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "log"))
            .count();
        assert!(logs > 3, "rolled: {logs} segments");
        assert_eq!(lso(&mut log), 0);
        log.close().unwrap();
    }
    // Tear the last entry of the first index that has one.
    let mut first = None;
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "txnindex") && first.as_ref().is_none_or(|f: &std::path::PathBuf| p < *f)
        {
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

/// The offsets of the producer-state snapshots in `dir`.
fn snapshots(dir: &std::path::Path) -> Vec<i64> {
    spate::log::producers::list_snapshots(dir).unwrap()
}

/// Producer 1 commits a transaction at [3, 6) (marker at 6) after three plain records;
/// producer 2's plain batches then roll the log past the marker, so that the newest
/// snapshot is taken after it; flushed. Returns the log, unclosed (a crash when
/// dropped).
fn committed_then_rolled(dir: &std::path::Path) -> PartitionLog {
    let mut config = small_config();
    config.segment_bytes = 400;
    let mut log = PartitionLog::open(dir, config, 0).unwrap();
    assert_eq!(append(&mut log, batch(2, 0, 0, 3, false)).unwrap(), (0, 2));
    assert_eq!(append(&mut log, batch(1, 0, 0, 3, true)).unwrap(), (3, 5));
    assert_eq!(marker(&mut log, 1, 0, true, 0).unwrap(), 6);
    let mut seq = 3;
    while !snapshots(dir).iter().any(|&s| s > 6) {
        append(&mut log, batch(2, 0, seq, 2, false)).unwrap();
        seq += 2;
    }
    for _ in 0..2 {
        append(&mut log, batch(2, 0, seq, 2, false)).unwrap();
        seq += 2;
    }
    // Flushed: the recovery point is the log end, so a restart replays from a snapshot
    // (a crash before any flush recovers, and replays, the whole log).
    log.flush().unwrap();
    assert_eq!(log.recovery_point(), log.log_end_offset());
    // While the high watermark is below the marker the transaction holds the last
    // stable offset at its first offset, 3.
    assert_eq!(log.last_stable_offset(Offset(4)).0, 3);
    log
}

/// A replica that restarts with a high watermark checkpointed below a commit marker,
/// after a roll snapshotted the producer state past that marker, still holds the last
/// stable offset at the transaction's first offset: the snapshot does not keep ended
/// transactions, so the rebuild starts from a snapshot at or below the high watermark
/// and the replay ends the transaction again at its marker. Before, a read_committed
/// reader got offsets 3 and 4 without the rest of the transaction (found by the
/// simulation, `sim_seed_18288_...`).
#[test]
fn a_restart_with_a_stale_high_watermark_keeps_an_ended_transaction_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config();
    config.segment_bytes = 400;
    drop(committed_then_rolled(dir.path()));
    let mut log = PartitionLog::open_leading(dir.path(), config.clone(), 0, None, 5).unwrap();
    assert_eq!(log.last_stable_offset(Offset(5)).0, 3, "the stale high watermark cuts the committed transaction");
    assert_eq!(log.last_stable_offset(Offset(7)).0, 7, "past the marker every record is stable");
    drop(log);
    // The snapshots past the high watermark were kept, and serve a later restart whose
    // high watermark passed them.
    assert!(snapshots(dir.path()).iter().any(|&s| s > 6), "{:?}", snapshots(dir.path()));
    let end = PartitionLog::open(dir.path(), config, 0).unwrap().log_end_offset().0;
    assert!(end > 8, "{end}");
}

/// The same on a follower's truncation: a cut above the marker keeps the log past it,
/// but the producer state is rebuilt from a snapshot at or below the follower's high
/// watermark, not from the newest one below the cut.
#[test]
fn a_truncation_above_a_marker_keeps_an_ended_transaction_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = committed_then_rolled(dir.path());
    // The batch after the roll's snapshot has two records: the cut is where it ends.
    let cut = *snapshots(dir.path()).iter().rfind(|&&s| s > 6).unwrap() + 2;
    assert!(cut < log.log_end_offset().0);
    log.truncate_to(Offset(cut), Offset(5)).unwrap();
    assert_eq!(log.log_end_offset().0, cut);
    assert_eq!(log.last_stable_offset(Offset(5)).0, 3, "the follower's high watermark cuts the transaction");
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
    follower.truncate_to(Offset(5), Offset(5)).unwrap();
    assert_eq!(aborted(&follower, 0), vec![]);
    assert_eq!(lso(&mut follower), 0);
}

/// One step of the model test: producer `p` (0..3) writes a transactional or a plain
/// batch, or its coordinator ends its transaction; the log rolls; the broker restarts
/// cleanly or crashes (and may lose the `.txnindex` files that were not yet durable:
/// those of the segments an unclean open recovers, which end past the recovery point).
#[derive(Debug, Clone)]
enum Op {
    Txn(u8, u8),
    Plain(u8, u8),
    End(u8, bool),
    Roll,
    Restart,
    Crash { lose_indexes: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 1u8..4).prop_map(|(p, n)| Op::Txn(p, n)),
        2 => (0u8..3, 1u8..3).prop_map(|(p, n)| Op::Plain(p, n)),
        3 => (0u8..3, any::<bool>()).prop_map(|(p, c)| Op::End(p, c)),
        1 => Just(Op::Roll),
        1 => Just(Op::Restart),
        1 => any::<bool>().prop_map(|lose_indexes| Op::Crash { lose_indexes }),
    ]
}

/// What a consumer gets: records by offset, read the way Kafka's clients read with
/// isolation.level=read_committed (below the last stable offset; a transactional
/// batch is skipped while its producer is in an aborted transaction reported by the
/// fetch, from that transaction's first offset until its ABORT marker).
fn read_committed(log: &mut PartitionLog) -> Vec<i64> {
    let lso = lso(log);
    let mut out = Vec::new();
    let mut at = log.log_start_offset().0;
    let mut aborting: HashSet<i64> = HashSet::new();
    let mut reported: Vec<AbortedTxn> = Vec::new();
    while at < lso {
        let plan = log.read(Offset(at), 1 << 20, Offset(lso), true).unwrap();
        for a in log.aborted_txns(Offset(at), &plan) {
            if !reported.contains(&a) {
                reported.push(a);
            }
        }
        reported.sort_by_key(|a| a.first_offset);
        let bytes = plan.read_to_vec().unwrap();
        if bytes.is_empty() {
            break;
        }
        for b in decode_batches(&bytes) {
            let pid = i64::from_be_bytes(bytes[b_pos(&bytes, b.base_offset)..][43..51].try_into().unwrap());
            while let Some(i) = reported.iter().position(|a| a.first_offset <= b.base_offset) {
                aborting.insert(reported.remove(i).producer_id);
            }
            let control = b.attributes & 0x20 != 0;
            if control {
                if b.records[0].2.as_deref() == Some(&[0, 0, 0, 0][..]) {
                    aborting.remove(&pid);
                }
            } else if !(b.attributes & ATTR_TRANSACTIONAL != 0 && aborting.contains(&pid)) {
                out.extend(b.records.iter().map(|r| r.0));
            }
            at = b.last_offset + 1;
        }
    }
    out
}

/// Remove the `.txnindex` of every segment that ends past the recovery point (all an
/// unclean open recovers; what a crash may have lost).
fn lose_unsynced_indexes(dir: &std::path::Path) {
    let text = std::fs::read_to_string(dir.join("spate-recovery-point")).unwrap_or_default();
    let recovery_point: i64 = text.split_whitespace().nth(1).and_then(|o| o.parse().ok()).unwrap_or(0);
    let mut bases: Vec<i64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().unwrap().strip_suffix(".log").map(|b| b.parse().unwrap()))
        .collect();
    bases.sort_unstable();
    for (i, base) in bases.iter().enumerate() {
        if bases.get(i + 1).is_none_or(|next| *next > recovery_point) {
            let _ = std::fs::remove_file(dir.join(format!("{base:020}.txnindex")));
        }
    }
}

/// The position of the batch starting at `base` in a read's bytes.
fn b_pos(bytes: &[u8], base: i64) -> usize {
    let mut pos = 0;
    while i64::from_be_bytes(bytes[pos..pos + 8].try_into().unwrap()) != base {
        pos += 12 + i32::from_be_bytes(bytes[pos + 8..pos + 12].try_into().unwrap()) as usize;
    }
    pos
}

proptest! {
    #![proptest_config(proptest_config::config(64))]

    /// Against a model (every record's offset, the transaction it belongs to and how
    /// that ended): the last stable offset is the first offset of the oldest open
    /// transaction (or the log end), and a read_committed consumer gets exactly the
    /// plain records and those of committed transactions below it, in order, after any
    /// mix of rolls, clean restarts, crashes and lost `.txnindex` files.
    #[test]
    fn read_committed_sees_exactly_the_committed_records(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = small_config();
        config.segment_bytes = 600;
        let mut log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
        // Per record: Some(transaction number) or None (plain); per transaction: its
        // outcome (None: open) and first offset.
        let mut records: Vec<(i64, Option<usize>)> = Vec::new();
        let mut txns: Vec<(Option<bool>, i64)> = Vec::new();
        let mut open: BTreeMap<u8, usize> = BTreeMap::new();
        let mut seq = [0i32; 3];
        for op in ops {
            match op {
                Op::Txn(p, n) | Op::Plain(p, n) => {
                    let transactional = matches!(op, Op::Txn(..));
                    let r = append(&mut log, batch(p as i64 + 1, 0, seq[p as usize], n as usize, transactional));
                    if !transactional && open.contains_key(&p) {
                        let refused = matches!(r, Err(LogError::Producer(ProducerStateError::InvalidTxnState { .. })));
                        prop_assert!(refused, "a plain batch inside a transaction: {:?}", r);
                        continue;
                    }
                    let (first, last) = r.unwrap();
                    seq[p as usize] += n as i32;
                    let txn = transactional.then(|| *open.entry(p).or_insert_with(|| {
                        txns.push((None, first));
                        txns.len() - 1
                    }));
                    records.extend((first..=last).map(|o| (o, txn)));
                }
                Op::End(p, commit) => {
                    marker(&mut log, p as i64 + 1, 0, commit, 0).unwrap();
                    if let Some(t) = open.remove(&p) {
                        txns[t].0 = Some(commit);
                    }
                }
                Op::Roll => {
                    log.set_config(spate::log::LogConfig { segment_ms: 1, ..config.clone() });
                    log.maybe_roll(10_000_000).unwrap();
                    log.set_config(config.clone());
                }
                Op::Restart => {
                    log.close().unwrap();
                    log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
                }
                Op::Crash { lose_indexes } => {
                    drop(log);
                    if lose_indexes {
                        lose_unsynced_indexes(dir.path());
                    }
                    log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
                }
            }
            let model_lso = open.values().map(|t| txns[*t].1).min().unwrap_or(log.log_end_offset().0);
            prop_assert_eq!(lso(&mut log), model_lso);
            let expected: Vec<i64> = records
                .iter()
                .filter(|(o, t)| *o < model_lso && t.is_none_or(|t| txns[t].0 == Some(true)))
                .map(|(o, _)| *o)
                .collect();
            prop_assert_eq!(read_committed(&mut log), expected);
        }
    }
}

/// DeleteRecords past an open transaction's first records: the last stable offset is
/// never below the log start (Kafka's rule), so read_committed readers are not stuck
/// below what still exists.
#[test]
fn the_last_stable_offset_is_never_below_the_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    append(&mut log, batch(1, 0, 0, 2, true)).unwrap();
    append(&mut log, batch(2, 0, 0, 3, false)).unwrap();
    assert_eq!(lso(&mut log), 0);
    log.advance_log_start_offset(Offset(3)).unwrap();
    assert_eq!(lso(&mut log), 3);
    assert_eq!(log.stable_offset(Offset(5)), Offset(3));
    marker(&mut log, 1, 0, false, 0).unwrap();
    assert_eq!(lso(&mut log), 6);
}
