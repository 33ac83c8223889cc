//! Replication groundwork in the partition log: leader epochs (KIP-101, KIP-279) and
//! follower appends. A leader log and a follower log live side by side; the follower
//! copies the leader's bytes through the read API, exactly as a fetcher would, and
//! truncates by leader epoch where the two diverged.

#[path = "log_common/mod.rs"]
mod common;
#[path = "proptest_config/mod.rs"]
mod proptest_config;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use proptest::prelude::*;
use spate::log::leader_epoch::{LeaderEpochCache, CHECKPOINT_FILE, UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET};
use spate::log::{LogConfig, LogError, PartitionLog};
use spate::model::Offset;

const LOG: &str = "00000000000000000000.log";
/// Bound on OffsetForLeaderEpoch rounds in `reconcile` (each round drops at least one epoch).
#[allow(non_upper_case_globals)]
const reconcile_rounds_max: usize = 64;

fn config() -> LogConfig {
    LogConfig { index_interval_bytes: 64, ..small_config() }
}

fn open(dir: &Path) -> PartitionLog {
    PartitionLog::open(dir, config(), 1_000).unwrap()
}

fn entries(log: &PartitionLog) -> Vec<(i32, i64)> {
    log.epoch_entries().iter().map(|e| (e.epoch, e.start_offset)).collect()
}

/// The checkpoint file as the next open would read it.
fn checkpoint(dir: &Path) -> Vec<(i32, i64)> {
    LeaderEpochCache::load(dir).unwrap().entries().iter().map(|e| (e.epoch, e.start_offset)).collect()
}

/// A leader append of one batch of `n` records in `epoch`; returns its base offset.
fn lead(log: &mut PartitionLog, epoch: i32, n: usize) -> i64 {
    let ts = 1_000 + log.log_end_offset().0 * 10;
    log.append_with_leader_epoch(&mut build_batch(&recs(n, ts, 20 + n * 7)), epoch, 1_000).unwrap().base_offset.0
}

/// The leader log of the first scenario: epochs 0,0,1,1,3; batches at 0, 2, 5, 6, 8.
fn leader_with_epochs_0_0_1_1_3(dir: &Path) -> PartitionLog {
    let mut log = open(dir);
    let bases: Vec<i64> = [(0, 2), (0, 3), (1, 1), (1, 2), (3, 3)].iter().map(|&(e, n)| lead(&mut log, e, n)).collect();
    assert_eq!(bases, vec![0, 2, 5, 6, 8]);
    assert_eq!(log.log_end_offset(), Offset(11));
    log
}

/// The whole log through the read API.
fn log_bytes(log: &PartitionLog) -> Vec<u8> {
    fetch(log, log.log_start_offset().0, usize::MAX)
}

/// What a fetch from `from` to the end returns, `max_bytes` per read (reads stop at
/// segment ends, so this loops).
fn fetch(log: &PartitionLog, mut from: i64, max_bytes: usize) -> Vec<u8> {
    let end = log.log_end_offset();
    let mut out = Vec::new();
    while from < end.0 {
        let bytes = log.read(Offset(from), max_bytes, end, true).unwrap().read_to_vec().unwrap();
        let d = decode_batches(&bytes);
        from = d.last().unwrap().last_offset + 1;
        out.extend(bytes);
    }
    out
}

/// The follower fetches everything from its log end offset, `max_bytes` per fetch.
fn replicate(leader: &PartitionLog, follower: &mut PartitionLog, max_bytes: usize) {
    let end = leader.log_end_offset();
    while follower.log_end_offset() < end {
        let from = follower.log_end_offset();
        let bytes = leader.read(from, max_bytes, end, true).unwrap().read_to_vec().unwrap();
        let info = follower.append_replicated(&bytes, 2_000).unwrap();
        assert_eq!(info.base_offset, from);
        assert_eq!(info.bytes, bytes.len());
    }
    assert_eq!(follower.log_end_offset(), end);
}

/// The partitionLeaderEpoch field of each batch in `bytes`.
fn stored_epochs(bytes: &[u8]) -> Vec<i32> {
    let mut at = 0;
    decode_batches(bytes)
        .iter()
        .map(|d| {
            let e = i32::from_be_bytes(bytes[at + 12..at + 16].try_into().unwrap());
            at += d.size;
            e
        })
        .collect()
}

/// Kafka's follower rule (AbstractFetcherThread.getOffsetTruncationState, KIP-279)
/// given the leader's OffsetForLeaderEpoch answer: the offset to truncate to and whether
/// truncation is complete. None: the answer is UNDEFINED (Kafka falls back to the high
/// watermark).
fn truncation_point(follower: &PartitionLog, leader_answer: (i32, i64)) -> Option<(i64, bool)> {
    let (leader_epoch, leader_end) = leader_answer;
    if leader_epoch == UNDEFINED_EPOCH || leader_end == UNDEFINED_EPOCH_OFFSET {
        return None;
    }
    let (follower_epoch, follower_end) = follower.end_offset_for_epoch(leader_epoch);
    let log_end_offset = follower.log_end_offset().0;
    if follower_end == UNDEFINED_EPOCH_OFFSET {
        return None;
    }
    if follower_epoch != leader_epoch {
        // The follower does not know the epoch the leader answered with: cut to where its
        // own largest epoch below that one ends, and ask again.
        return Some((follower_end.min(log_end_offset), false));
    }
    Some((follower_end.min(leader_end).min(log_end_offset), true))
}

/// Ask, truncate, repeat until the follower's log is a prefix of the leader's. Returns
/// the truncation offsets, one per round.
fn reconcile(leader: &PartitionLog, follower: &mut PartitionLog) -> Vec<i64> {
    let mut rounds = Vec::new();
    while let Some(epoch) = follower.latest_epoch() {
        assert!(rounds.len() < reconcile_rounds_max, "no convergence: {rounds:?}");
        let answer = leader.end_offset_for_epoch(epoch);
        let (offset, complete) = truncation_point(follower, answer).expect("the leader knows an epoch <= ours");
        follower.truncate_to(Offset(offset), Offset(offset)).unwrap();
        rounds.push(offset);
        if complete {
            break;
        }
    }
    rounds
}

#[test]
fn follower_copies_the_leader_byte_for_byte() {
    let root = tempfile::tempdir().unwrap();
    let (ld, fd) = (root.path().join("leader"), root.path().join("follower"));
    let leader = leader_with_epochs_0_0_1_1_3(&ld);
    let mut follower = open(&fd);
    // Fetches of at most 400 bytes: two or three batches per append_replicated.
    replicate(&leader, &mut follower, 400);

    let expect = vec![(0, 0), (1, 5), (3, 8)];
    assert_eq!(entries(&leader), expect);
    assert_eq!(entries(&follower), expect);
    assert_eq!(follower.latest_epoch(), Some(3));
    assert_eq!(stored_epochs(&log_bytes(&follower)), vec![0, 0, 1, 1, 3]);
    assert_eq!(std::fs::read(ld.join(LOG)).unwrap(), std::fs::read(fd.join(LOG)).unwrap());
    assert_eq!(std::fs::read(ld.join(CHECKPOINT_FILE)).unwrap(), std::fs::read(fd.join(CHECKPOINT_FILE)).unwrap());
    assert_eq!(checkpoint(&fd), expect);
    // Same indexes: every offset and timestamp lookup answers alike.
    for o in 0..11 {
        let a = leader.read(Offset(o), 1, Offset(11), true).unwrap().read_to_vec().unwrap();
        let b = follower.read(Offset(o), 1, Offset(11), true).unwrap().read_to_vec().unwrap();
        assert_eq!(a, b, "read at {o}");
        let ts = 1_000 + o * 10;
        assert_eq!(leader.offset_for_timestamp(ts).unwrap(), follower.offset_for_timestamp(ts).unwrap());
    }
    for requested in [-1, 0, 1, 2, 3, 4] {
        assert_eq!(leader.end_offset_for_epoch(requested), follower.end_offset_for_epoch(requested));
    }
    assert_eq!(follower.end_offset_for_epoch(1), (1, 8));
    assert_eq!(follower.end_offset_for_epoch(2), (1, 8), "unknown epoch in between: the one below");
    assert_eq!(follower.end_offset_for_epoch(3), (3, 11), "latest epoch: the log end");
    assert_eq!(follower.end_offset_for_epoch(4), (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET));

    // The trimmed index files match too once both are closed.
    leader.close().unwrap();
    follower.close().unwrap();
    for name in ["00000000000000000000.index", "00000000000000000000.timeindex"] {
        let a = std::fs::read(ld.join(name)).unwrap();
        assert!(!a.is_empty(), "{name} has entries");
        assert_eq!(a, std::fs::read(fd.join(name)).unwrap(), "{name}");
    }
    // Reopen: caches and log end offsets survive, clean or not.
    let leader = open(&ld);
    let follower = open(&fd);
    assert_eq!((entries(&leader), leader.log_end_offset()), (expect.clone(), Offset(11)));
    assert_eq!((entries(&follower), follower.log_end_offset()), (expect.clone(), Offset(11)));
    drop(follower);
    let follower = open(&fd);
    assert_eq!((entries(&follower), follower.log_end_offset()), (expect, Offset(11)));
}

#[test]
fn leader_stamps_its_epoch_and_plain_appends_keep_the_producers() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    // A producer's batch carries -1: stored as sent, no epoch.
    log.append(&mut build_batch(&recs(1, 1_000, 5)), 1_000).unwrap();
    assert_eq!(log.latest_epoch(), None);
    assert!(!dir.path().join(CHECKPOINT_FILE).exists(), "nothing to save yet");
    // The shared (io_uring) leader path stamps the epoch into the patched header only.
    let set = [build_batch(&recs(2, 1_001, 5)), build_batch(&recs(1, 1_002, 5))].concat();
    let (info, write, patches) = log.append_shared_with_leader_epoch(&set, 4, 1_000).unwrap();
    assert_eq!(stored_epochs(&set), vec![-1, -1], "the caller's bytes are untouched");
    assert_eq!(entries(&log), vec![(4, 1)], "recorded at append time, before the write");
    let mut pos = write.position;
    for p in &patches {
        write.file.write_all_at(&p.header, pos).unwrap();
        write.file.write_all_at(&set[p.position + p.header.len()..p.position + p.size], pos + 61).unwrap();
        pos += p.size as u64;
    }
    log.write_done(write.id, Ok(())).unwrap();
    assert_eq!(info.last_offset, Offset(3));
    assert_eq!(stored_epochs(&log_bytes(&log)), vec![-1, 4, 4]);
    // An older epoch is stamped (the log does not fence) but starts nothing.
    lead(&mut log, 2, 1);
    assert_eq!(entries(&log), vec![(4, 1)]);
    // A new leader records its epoch at the log end before appending.
    log.assign_leader_epoch(6).unwrap();
    assert_eq!(entries(&log), vec![(4, 1), (6, 5)]);
    assert_eq!(log.end_offset_for_epoch(4), (4, 5));
    lead(&mut log, 6, 2);
    assert_eq!(entries(&log), vec![(4, 1), (6, 5)]);
    assert_eq!(checkpoint(dir.path()), vec![(4, 1), (6, 5)]);
    // Like Kafka's, an epoch assigned at the log end with no batch is cut on reopen.
    log.assign_leader_epoch(7).unwrap();
    assert_eq!(checkpoint(dir.path()), vec![(4, 1), (6, 5), (7, 7)]);
    drop(log);
    let log = open(dir.path());
    assert_eq!(entries(&log), vec![(4, 1), (6, 5)]);
    assert_eq!(checkpoint(dir.path()), vec![(4, 1), (6, 5)]);
}

#[test]
fn follower_refuses_overlaps_and_corruption_and_writes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let leader = leader_with_epochs_0_0_1_1_3(&root.path().join("leader"));
    let fd = root.path().join("follower");
    // A small max.message.bytes: a follower ignores it (the leader accepted the batch).
    let mut follower = PartitionLog::open(&fd, LogConfig { max_message_bytes: 80, ..config() }, 1_000).unwrap();
    let batch_at = |o: i64| leader.read(Offset(o), 1, Offset(11), true).unwrap().read_to_vec().unwrap();
    follower.append_replicated(&[batch_at(0), batch_at(2)].concat(), 2_000).unwrap();
    assert!(batch_at(0).len() > 80);
    let before = |f: &PartitionLog| {
        (f.log_end_offset(), f.size_bytes(), entries(f), std::fs::read(fd.join(LOG)).unwrap(), checkpoint(&fd))
    };
    let state = before(&follower);
    assert_eq!(state.0, Offset(5));
    assert_eq!(state.2, vec![(0, 0)]);

    let refuse = |f: &mut PartitionLog, records: &[u8]| {
        let e = f.append_replicated(records, 2_000).unwrap_err();
        assert_eq!(before(f), state, "nothing written after {e}");
        let e2 = f.append_replicated_deferred(records, 2_000).unwrap_err();
        assert_eq!(e.to_string(), e2.to_string());
        assert_eq!(before(f), state);
        e
    };
    // An overlap: the batch at 2 again (and 2..=5 continuing past the end).
    let e = refuse(&mut follower, &batch_at(2));
    assert!(matches!(e, LogError::OffsetOutOfRange { offset: 2, log_end_offset: 5, .. }), "{e}");
    let e = refuse(&mut follower, &[batch_at(2), batch_at(5)].concat());
    assert!(matches!(e, LogError::OffsetOutOfRange { offset: 2, .. }), "{e}");
    // Right start, then a batch that goes back inside the set.
    let e = refuse(&mut follower, &[batch_at(5), batch_at(5)].concat());
    assert!(matches!(&e, LogError::InvalidRecord(m) if m.contains("offset 5 where 6 or later")), "{e}");
    // A corrupt CRC, alone or behind a good batch.
    let mut bad = batch_at(5);
    *bad.last_mut().unwrap() ^= 0x40;
    assert!(matches!(refuse(&mut follower, &bad), LogError::Corrupt(_)));
    let mut bad_second = [batch_at(5), batch_at(6)].concat();
    *bad_second.last_mut().unwrap() ^= 0x40;
    assert!(matches!(refuse(&mut follower, &bad_second), LogError::Corrupt(_)));
    // Magic 1, a truncated batch, an empty set, a count that disagrees with the deltas.
    let mut magic = batch_at(5);
    magic[16] = 1;
    assert!(matches!(refuse(&mut follower, &magic), LogError::Corrupt(_)));
    let whole = batch_at(5);
    assert!(matches!(refuse(&mut follower, &whole[..whole.len() - 3]), LogError::Corrupt(_)));
    assert!(matches!(refuse(&mut follower, &[]), LogError::Corrupt(_)));
    // More records than the batch has offsets (fewer is a cleaned batch, below).
    let mut count = batch_at(5);
    let delta = i32::from_be_bytes(count[23..27].try_into().unwrap());
    count[57..61].copy_from_slice(&(delta + 2).to_be_bytes());
    fix_crc(&mut count);
    assert!(matches!(refuse(&mut follower, &count), LogError::InvalidRecord(_)));

    // And the right bytes go in.
    replicate(&leader, &mut follower, 1 << 20);
    assert_eq!(log_bytes(&follower), log_bytes(&leader));
    assert_eq!(entries(&follower), vec![(0, 0), (1, 5), (3, 8)]);
}

/// KIP-101: leader A writes m1, m2 in epoch 0; B copies only m1; B becomes leader in
/// epoch 1 and writes m3 at m2's offset. A, now following, asks B where epoch 0 ended,
/// truncates there (not at its high watermark) and copies m3.
#[test]
fn kip_101_follower_truncates_to_the_leaders_epoch_end() {
    let root = tempfile::tempdir().unwrap();
    let (ad, bd) = (root.path().join("a"), root.path().join("b"));
    let mut a = open(&ad);
    let mut b = open(&bd);
    lead(&mut a, 0, 2); // m1: 0..=1
    replicate(&a, &mut b, 1 << 20);
    lead(&mut a, 0, 3); // m2: 2..=4, never reaches B
    b.assign_leader_epoch(1).unwrap();
    lead(&mut b, 1, 2); // m3: 2..=3
    lead(&mut b, 1, 1); // m4: 4
    assert_eq!(entries(&a), vec![(0, 0)]);
    assert_eq!(entries(&b), vec![(0, 0), (1, 2)]);
    let divergent = fetch(&a, 2, usize::MAX);
    a.flush().unwrap();
    assert_eq!(a.recovery_point(), Offset(5));

    assert_eq!(b.end_offset_for_epoch(0), (0, 2));
    assert_eq!(reconcile(&b, &mut a), vec![2], "one round, to where epoch 0 ended on the leader");
    assert_eq!(a.log_end_offset(), Offset(2));
    assert_eq!(entries(&a), vec![(0, 0)]);
    assert_eq!(checkpoint(&ad), vec![(0, 0)]);
    assert_eq!(a.recovery_point(), Offset(2));
    assert_eq!(a.written_end_offset(), Offset(2));

    replicate(&b, &mut a, 1 << 20);
    let copied = fetch(&a, 2, usize::MAX);
    assert_ne!(copied, divergent);
    assert_eq!(log_bytes(&a), log_bytes(&b));
    assert_eq!(entries(&a), vec![(0, 0), (1, 2)]);
    drop(a);
    let a = open(&ad);
    assert_eq!(log_bytes(&a), log_bytes(&b));
    assert_eq!(entries(&a), vec![(0, 0), (1, 2)]);
}

/// A broker that led an epoch without appending (its cache says "epoch 1 starts at my
/// log end") and then follows a new leader truncates at its log end: no record goes,
/// but the epoch does (Kafka's `UnifiedLog.truncateTo` -> `truncateFromEnd`). Kept, it
/// would cover the older-epoch records the follower appends next, and when this broker
/// led again it would answer OffsetForLeaderEpoch(0) with 2 instead of 5: a follower
/// asking would cut committed records 2..5 (found by tests/replication_sim.rs).
#[test]
fn truncation_at_the_log_end_cuts_an_epoch_with_no_record_behind_it() {
    let root = tempfile::tempdir().unwrap();
    let (ad, bd) = (root.path().join("a"), root.path().join("b"));
    let mut a = open(&ad);
    let mut b = open(&bd);
    lead(&mut a, 0, 2); // 0..=1
    replicate(&a, &mut b, 1 << 20);
    lead(&mut a, 0, 3); // 2..=4, not yet on B
    b.assign_leader_epoch(1).unwrap(); // B leads epoch 1, appends nothing
    assert_eq!(entries(&b), vec![(0, 0), (1, 2)]);
    a.assign_leader_epoch(2).unwrap(); // A leads again

    // B follows A: OffsetForLeaderEpoch(1) -> (0, 5); B's epoch 0 ends at 2: cut at 2,
    // its log end.
    assert_eq!(reconcile(&a, &mut b), vec![2]);
    assert_eq!(b.log_end_offset(), Offset(2));
    assert_eq!(entries(&b), vec![(0, 0)], "the epoch with no record behind it is cut");
    assert_eq!(checkpoint(&bd), vec![(0, 0)], "and the checkpoint says so");

    replicate(&a, &mut b, 1 << 20);
    assert_eq!(log_bytes(&b), log_bytes(&a));
    assert_eq!(entries(&b), learnable(&a));
    b.assign_leader_epoch(3).unwrap(); // B leads again
    assert_eq!(b.end_offset_for_epoch(0), (0, 5), "epoch 0 ends where A's records end");

    // Past the end: cut at the end.
    b.truncate_to(Offset(9), Offset(9)).unwrap();
    assert_eq!((b.log_end_offset(), entries(&b)), (Offset(5), vec![(0, 0)]));
    assert_eq!(checkpoint(&bd), vec![(0, 0)]);
}

/// KIP-279: the leader does not know the follower's latest epoch, and the epoch it
/// answers with is one the follower does not know either. A (leader) has epochs 0 at 0,
/// 1 at 4, 3 at 8; B led epoch 2 from offset 4 without A's epoch-1 data. B asks for
/// epoch 2; A answers (1, 8); B does not know epoch 1, so it cuts to where its own
/// epoch below 1 ends (4), not to 8, and asks again for epoch 0: (0, 4), done.
#[test]
fn kip_279_follower_truncates_over_several_rounds() {
    let root = tempfile::tempdir().unwrap();
    let (ad, bd) = (root.path().join("a"), root.path().join("b"));
    let mut a = open(&ad);
    let mut b = open(&bd);
    lead(&mut a, 0, 2);
    lead(&mut a, 0, 2);
    replicate(&a, &mut b, 1 << 20);
    // B leads epoch 2 (A's epoch-1 writes never reached it).
    b.assign_leader_epoch(2).unwrap();
    for _ in 0..3 {
        lead(&mut b, 2, 2);
    }
    lead(&mut a, 1, 2);
    lead(&mut a, 1, 2);
    a.assign_leader_epoch(3).unwrap();
    lead(&mut a, 3, 2);
    assert_eq!(entries(&a), vec![(0, 0), (1, 4), (3, 8)]);
    assert_eq!(entries(&b), vec![(0, 0), (2, 4)]);
    assert_eq!(b.log_end_offset(), Offset(10));

    // Round one, step by step.
    assert_eq!(a.end_offset_for_epoch(2), (1, 8), "largest epoch <= 2 that A knows, and its end");
    assert_eq!(truncation_point(&b, (1, 8)), Some((4, false)), "B does not know epoch 1: cut to 4, ask again");
    assert_eq!(b.end_offset_for_epoch(1), (0, 4));
    // The whole exchange.
    assert_eq!(reconcile(&a, &mut b), vec![4, 4]);
    assert_eq!(b.log_end_offset(), Offset(4));
    assert_eq!(entries(&b), vec![(0, 0)]);
    assert_eq!(checkpoint(&bd), vec![(0, 0)]);
    replicate(&a, &mut b, 100);
    assert_eq!(log_bytes(&b), log_bytes(&a));
    assert_eq!(entries(&b), entries(&a));
    drop(b);
    let b = open(&bd);
    assert_eq!(entries(&b), vec![(0, 0), (1, 4), (3, 8)]);
}

#[test]
fn retention_truncates_the_epoch_cache_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 400, retention_ms: -1, ..config() };
    let mut log = PartitionLog::open(dir.path(), cfg.clone(), 1_000).unwrap();
    for (epoch, batches) in [(0, 4), (1, 4), (2, 4)] {
        for _ in 0..batches {
            lead(&mut log, epoch, 2);
        }
    }
    assert_eq!(entries(&log), vec![(0, 0), (1, 8), (2, 16)]);
    let segs: Vec<i64> = log.segment_base_offsets().iter().map(|o| o.0).collect();
    // Keep the segments from the first one that starts inside epoch 1 (not at its start).
    let keep_from = *segs.iter().find(|&&s| s > 8 && s < 16).expect("a segment starting inside epoch 1");
    let segment_bytes = |base: &i64| std::fs::metadata(dir.path().join(format!("{base:020}.log"))).unwrap().len();
    let keep_bytes: u64 = segs.iter().filter(|&&s| s >= keep_from).map(segment_bytes).sum();
    log.set_config(LogConfig { retention_bytes: keep_bytes as i64, ..cfg.clone() });
    assert!(log.enforce_retention(1_000).unwrap() > 0);
    assert_eq!(log.log_start_offset(), Offset(keep_from));
    let expect = vec![(1, keep_from), (2, 16)];
    assert_eq!(entries(&log), expect);
    assert_eq!(checkpoint(dir.path()), expect);
    assert_eq!(log.end_offset_for_epoch(0), (0, keep_from), "older than all: ends where the log starts");
    assert_eq!(log.end_offset_for_epoch(1), (1, 16));
    drop(log);
    let log = PartitionLog::open(dir.path(), cfg, 1_000).unwrap();
    assert_eq!(entries(&log), expect);
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A crash tears the last batches: recovery cuts the log and the epoch cache with it,
/// on disk too, and appends in a new epoch continue from there.
#[test]
fn torn_tail_recovery_truncates_the_epoch_cache_from_the_end() {
    let src = tempfile::tempdir().unwrap();
    let log = leader_with_epochs_0_0_1_1_3(src.path());
    let bytes = log_bytes(&log);
    drop(log); // a crash: no clean-shutdown marker
    let ends: Vec<(u64, i64)> = {
        let mut pos = 0;
        decode_batches(&bytes)
            .iter()
            .map(|d| {
                pos += d.size as u64;
                (pos, d.last_offset + 1)
            })
            .collect()
    };
    // Cut anywhere in the last three batches (epoch 1 from 5, epoch 1, epoch 3 from 8).
    for cut in ends[1].0..bytes.len() as u64 {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(src.path(), dir.path());
        let f = std::fs::OpenOptions::new().write(true).open(dir.path().join(LOG)).unwrap();
        f.set_len(cut).unwrap();
        let end = ends.iter().rev().find(|(p, _)| *p <= cut).unwrap().1;
        let expect: Vec<(i32, i64)> = [(0, 0), (1, 5), (3, 8)].into_iter().filter(|&(_, s)| s < end).collect();
        let mut log = open(dir.path());
        assert_eq!(log.log_end_offset(), Offset(end), "cut at {cut}");
        assert_eq!(entries(&log), expect, "cut at {cut}");
        assert_eq!(checkpoint(dir.path()), expect, "cut at {cut}: the file follows");
        let base = lead(&mut log, 4, 1);
        assert_eq!(base, end);
        assert_eq!(log.latest_epoch(), Some(4));
        assert_eq!(log.end_offset_for_epoch(3), (expect.last().unwrap().0, end));
    }
}

#[test]
fn unreadable_checkpoint_is_rebuilt_from_the_batches() {
    let cfg = LogConfig { segment_bytes: 300, ..config() };
    for garbage in [&b"0\n2\n3 9\n1 20\n"[..], b"7\n0\n", b"\xff\xfe junk", b"0\n3\n0 0\n"] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = PartitionLog::open(dir.path(), cfg.clone(), 1_000).unwrap();
        for (epoch, n) in [(0, 2), (0, 3), (1, 1), (1, 2), (3, 3), (3, 1)] {
            lead(&mut log, epoch, n);
        }
        // A producer's -1 and an older epoch in between change nothing on a rebuild either.
        log.append(&mut build_batch(&recs(1, 2_000, 3)), 1_000).unwrap();
        lead(&mut log, 2, 1);
        assert!(log.segment_base_offsets().len() > 2);
        let expect = entries(&log);
        assert_eq!(expect, vec![(0, 0), (1, 5), (3, 8)]);
        log.close().unwrap();
        std::fs::write(dir.path().join(CHECKPOINT_FILE), garbage).unwrap();
        let log = PartitionLog::open(dir.path(), cfg.clone(), 1_000).unwrap();
        assert_eq!(entries(&log), expect, "rebuilt after {garbage:?}");
        assert_eq!(std::fs::read_to_string(dir.path().join(CHECKPOINT_FILE)).unwrap(), "0\n3\n0 0\n1 5\n3 8\n");
    }
    // After a clean close, a missing checkpoint is an empty cache (as in Kafka), not a
    // rebuild; after a crash, the recovered tail's epochs come back from its batches.
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    lead(&mut log, 0, 1);
    log.close().unwrap();
    std::fs::remove_file(dir.path().join(CHECKPOINT_FILE)).unwrap();
    assert_eq!(entries(&open(dir.path())), vec![]);
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    lead(&mut log, 0, 1);
    drop(log);
    std::fs::remove_file(dir.path().join(CHECKPOINT_FILE)).unwrap();
    assert_eq!(entries(&open(dir.path())), vec![(0, 0)]);
}

/// The running log replaces `leader-epoch-checkpoint` without an fsync (on the data
/// core) and a flush syncs it before the recovery point passes the change, so a power
/// loss may leave the file as the last flush saw it. The open trusts it below the
/// recovery point and takes the rest from the recovered segments' batches.
#[test]
fn a_checkpoint_behind_the_log_is_completed_from_the_recovered_tail() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 300, ..config() };
    let mut log = PartitionLog::open(dir.path(), cfg.clone(), 1_000).unwrap();
    for (epoch, n) in [(0, 3), (0, 3), (1, 3), (1, 3)] {
        lead(&mut log, epoch, n);
    }
    log.flush().unwrap();
    let at_flush = std::fs::read(dir.path().join(CHECKPOINT_FILE)).unwrap();
    lead(&mut log, 3, 2);
    lead(&mut log, 3, 2);
    lead(&mut log, 5, 1);
    let expect = entries(&log);
    assert_eq!(expect, vec![(0, 0), (1, 6), (3, 12), (5, 16)]);
    assert!(log.segment_base_offsets().len() > 2, "the trusted checkpoint covers whole segments");
    drop(log);
    std::fs::write(dir.path().join(CHECKPOINT_FILE), &at_flush).unwrap(); // the power loss
    let log = PartitionLog::open(dir.path(), cfg, 1_000).unwrap();
    assert_eq!(entries(&log), expect);
    assert_eq!(checkpoint(dir.path()), expect, "the file follows");
}

/// A truncation cut an epoch and the log took older-epoch batches in its place (a
/// follower copying its new leader), then a power loss brought back the checkpoint from
/// before the truncation: the epoch it names past the recovery point is not trusted.
#[test]
fn a_checkpoint_a_truncation_made_stale_is_not_trusted_past_the_recovery_point() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    lead(&mut log, 4, 4);
    log.flush().unwrap();
    lead(&mut log, 5, 2); // a leader's suffix nobody copied
    assert_eq!(checkpoint(dir.path()), vec![(4, 0), (5, 4)]);
    let before_truncation = std::fs::read(dir.path().join(CHECKPOINT_FILE)).unwrap();
    log.truncate_to(Offset(4), Offset(4)).unwrap();
    append_in_epoch(&mut log, &[(3, 30)], 4); // the new leader's epoch-4 batches
    assert_eq!(entries(&log), vec![(4, 0)]);
    drop(log);
    std::fs::write(dir.path().join(CHECKPOINT_FILE), &before_truncation).unwrap(); // the power loss
    let log = open(dir.path());
    assert_eq!(log.log_end_offset(), Offset(7));
    assert_eq!(entries(&log), vec![(4, 0)]);
    assert_eq!(log.end_offset_for_epoch(4), (4, 7));
}

/// The io_uring split for followers: offsets and epochs are taken at append time, the
/// bytes land later (in any order), reads stop at the first unfinished write.
#[test]
fn deferred_replicated_appends() {
    let root = tempfile::tempdir().unwrap();
    let leader = leader_with_epochs_0_0_1_1_3(&root.path().join("leader"));
    let mut follower = open(&root.path().join("follower"));
    let first = fetch(&leader, 0, 1).to_vec();
    let (head, tail) = {
        let n = decode_batches(&first)[0].size + decode_batches(&first)[1].size;
        (first[..n].to_vec(), first[n..].to_vec())
    };
    let (ia, wa) = follower.append_replicated_deferred(&head, 2_000).unwrap();
    let (ib, wb) = follower.append_replicated_deferred(&tail, 2_000).unwrap();
    assert_eq!(
        (ia.base_offset, ia.last_offset, ib.base_offset, ib.last_offset),
        (Offset(0), Offset(4), Offset(5), Offset(10))
    );
    assert_eq!(entries(&follower), vec![(0, 0), (1, 5), (3, 8)]);
    assert_eq!(follower.written_end_offset(), Offset(0));
    wb.file.write_all_at(&tail, wb.position).unwrap();
    follower.write_done(wb.id, Ok(())).unwrap();
    assert_eq!(follower.read(Offset(0), 1 << 20, Offset(11), true).unwrap().length_bytes, 0);
    wa.file.write_all_at(&head, wa.position).unwrap();
    follower.write_done(wa.id, Ok(())).unwrap();
    assert!(!follower.has_pending_writes());
    assert_eq!(log_bytes(&follower), log_bytes(&leader));
}

#[test]
#[should_panic(expected = "truncate with appends still being written")]
fn truncation_below_a_pending_write_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let leader = leader_with_epochs_0_0_1_1_3(&root.path().join("leader"));
    let mut follower = open(&root.path().join("follower"));
    let (_, _write) = follower.append_replicated_deferred(&log_bytes(&leader), 2_000).unwrap();
    let _ = follower.truncate_to(Offset(5), Offset(5));
}

#[derive(Debug, Clone)]
enum Op {
    /// The leader appends batches of (records, value bytes) in its current epoch.
    Lead(Vec<(usize, usize)>),
    /// The follower fetches up to this many bytes per read, `fetches` times.
    Fetch {
        max_bytes: usize,
        fetches: u8,
    },
    /// Leadership moves to the follower for a while (it writes batches the leader never
    /// sees), then back to the leader in a newer epoch; the follower reconciles later.
    Diverge(Vec<(usize, usize)>),
    /// The follower reconciles by epoch and catches up completely.
    Sync,
    Reopen {
        leader: bool,
        clean: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let batches = || prop::collection::vec((1usize..4, 0usize..90), 1..4);
    prop_oneof![
        5 => batches().prop_map(Op::Lead),
        3 => (40usize..600, 1u8..4).prop_map(|(max_bytes, fetches)| Op::Fetch { max_bytes, fetches }),
        2 => batches().prop_map(Op::Diverge),
        2 => Just(Op::Sync),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(leader, clean)| Op::Reopen { leader, clean }),
    ]
}

/// The leader's cache as a follower can learn it, and as a reopen keeps it: entries
/// with a batch behind them.
fn learnable(log: &PartitionLog) -> Vec<(i32, i64)> {
    entries(log).into_iter().filter(|&(_, s)| s < log.log_end_offset().0).collect()
}

fn append_in_epoch(log: &mut PartitionLog, specs: &[(usize, usize)], epoch: i32) {
    let mut set: Vec<u8> = Vec::new();
    for &(n, value_bytes) in specs {
        set.extend(build_batch(&recs(n, 1_000 + log.log_end_offset().0, value_bytes)));
    }
    log.append_with_leader_epoch(&mut set, epoch, 1_000).unwrap();
}

fn reopen(log: PartitionLog, cfg: &LogConfig, clean: bool) -> PartitionLog {
    let dir = log.dir().to_path_buf();
    let before = (log.log_end_offset(), log_bytes(&log), learnable(&log));
    if clean {
        log.close().unwrap();
    } else {
        drop(log);
    }
    let log = PartitionLog::open(&dir, cfg.clone(), 1_000).unwrap();
    assert_eq!((log.log_end_offset(), log_bytes(&log), entries(&log)), before);
    log
}

fn run(ops: Vec<Op>) {
    let root = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 700, segment_index_bytes: 48, index_interval_bytes: 120, ..config() };
    let mut leader = PartitionLog::open(&root.path().join("leader"), cfg.clone(), 1_000).unwrap();
    let mut follower = PartitionLog::open(&root.path().join("follower"), cfg.clone(), 1_000).unwrap();
    let mut epoch = 0;
    leader.assign_leader_epoch(epoch).unwrap();
    // A follower that led in between must reconcile before it fetches again (as Kafka's
    // fetcher truncates first after every leader change).
    let mut diverged = false;
    for op in ops {
        match op {
            Op::Lead(specs) => append_in_epoch(&mut leader, &specs, epoch),
            Op::Fetch { max_bytes, fetches } => {
                for _ in 0..fetches {
                    let from = follower.log_end_offset();
                    if diverged || from >= leader.log_end_offset() {
                        break;
                    }
                    let plan = leader.read(from, max_bytes, leader.log_end_offset(), true).unwrap();
                    follower.append_replicated(&plan.read_to_vec().unwrap(), 2_000).unwrap();
                }
            }
            Op::Diverge(specs) => {
                epoch += 1;
                follower.assign_leader_epoch(epoch).unwrap();
                append_in_epoch(&mut follower, &specs, epoch);
                epoch += 1;
                leader.assign_leader_epoch(epoch).unwrap();
                diverged = true;
            }
            Op::Sync => {
                reconcile(&leader, &mut follower);
                diverged = false;
                let (f, l) = (log_bytes(&follower), log_bytes(&leader));
                assert!(f.len() <= l.len() && f[..] == l[..f.len()], "after truncation the follower is a prefix");
                replicate(&leader, &mut follower, 1 << 20);
                assert_eq!(log_bytes(&follower), log_bytes(&leader));
                assert_eq!(entries(&follower), learnable(&leader));
            }
            Op::Reopen { leader: true, clean } => {
                leader = reopen(leader, &cfg, clean);
                // Back as leader: its epoch starts at its log end again.
                leader.assign_leader_epoch(epoch).unwrap();
            }
            Op::Reopen { leader: false, clean } => follower = reopen(follower, &cfg, clean),
        }
        for log in [&leader, &follower] {
            assert_eq!(entries(log), checkpoint(log.dir()), "the checkpoint follows every change");
        }
    }
    reconcile(&leader, &mut follower);
    replicate(&leader, &mut follower, 1 << 20);
    assert_eq!(log_bytes(&follower), log_bytes(&leader));
    assert_eq!(entries(&follower), learnable(&leader));
}

proptest! {
    #![proptest_config(proptest_config::config(64))]
    /// Whatever the leader does and however the follower diverges, reconciling by epoch
    /// and fetching leaves the two logs byte-identical with the same epoch caches.
    #[test]
    fn follower_converges_on_the_leader(ops in prop::collection::vec(op(), 1..30)) {
        run(ops);
    }
}

/// A follower whose log ends below its leader's log start (retention removed what it
/// would fetch next) starts over, empty, at the leader's log start (Kafka's
/// truncateFullyAndStartAt): no segment, epoch or producer snapshot of its old log is
/// left, it takes the leader's batches from there, and a reopen without a clean close
/// finds the same log.
#[test]
fn a_follower_starts_over_at_the_leaders_log_start() {
    let root = tempfile::tempdir().unwrap();
    let (ld, fd) = (root.path().join("leader"), root.path().join("follower"));
    let leader = leader_with_epochs_0_0_1_1_3(&ld);
    let mut follower = open(&fd);
    // The follower has the first batch only (offsets 0-1, epoch 0), then falls behind the
    // leader's log start, taken here as 5 (the batch of epoch 1 starting there).
    let first = leader.read(Offset(0), 1, leader.log_end_offset(), true).unwrap().read_to_vec().unwrap();
    follower.append_replicated(&first, 2_000).unwrap();
    assert_eq!((follower.log_end_offset(), entries(&follower)), (Offset(2), vec![(0, 0)]));
    follower.truncate_fully_and_start_at(Offset(5)).unwrap();
    assert_eq!((follower.log_start_offset(), follower.log_end_offset()), (Offset(5), Offset(5)));
    assert_eq!((entries(&follower), checkpoint(&fd)), (vec![], vec![]), "every epoch went");
    let names: Vec<String> = std::fs::read_dir(&fd)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".log") || n.ends_with(".snapshot"))
        .collect();
    assert_eq!(names, vec!["00000000000000000005.log".to_string()], "only the new segment is left");
    let rest = fetch(&leader, 5, usize::MAX);
    let info = follower.append_replicated(&rest, 2_000).unwrap();
    assert_eq!(info.base_offset, Offset(5));
    assert_eq!(entries(&follower), vec![(1, 5), (3, 8)]);
    assert_eq!(log_bytes(&follower), rest);
    drop(follower); // no clean close: the next open recovers
    let reopened = open(&fd);
    assert_eq!((reopened.log_start_offset(), reopened.log_end_offset()), (Offset(5), Offset(11)));
    assert_eq!(entries(&reopened), vec![(1, 5), (3, 8)]);
    assert_eq!(log_bytes(&reopened), rest);
}
