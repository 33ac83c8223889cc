//! Flush policy, group commit, offline-for-good, retention with open readers, roll by time.

#[path = "log_common/mod.rs"]
mod common;

use common::*;
use spate::log::{LogConfig, LogError, PartitionLog};
use spate::model::Offset;

#[test]
fn flush_policy_and_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { flush_messages: 3, flush_ms: 1000, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert!(!log.flush_due(0));
    log.append(&mut build_batch(&recs(2, 0, 1)), 100).unwrap();
    assert!(!log.flush_due(100));
    assert!(log.flush_due(1100), "flush.ms");
    log.append(&mut build_batch(&recs(1, 0, 1)), 200).unwrap();
    assert!(log.flush_due(200), "flush.messages");
    let handle = log.flush_handle();
    assert_eq!(handle.flushed.upto, Offset(3));
    log.append(&mut build_batch(&recs(1, 0, 1)), 300).unwrap();
    handle.sync().unwrap();
    log.mark_flushed(handle.flushed, Ok(())).unwrap();
    assert_eq!(log.recovery_point(), Offset(3));
    assert_eq!(log.unflushed_end(), Offset(4));
    log.flush().unwrap();
    assert_eq!(log.recovery_point(), Offset(4));
    assert!(!log.flush_due(10_000));
}

#[test]
fn failed_fsync_takes_the_log_offline_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    log.append(&mut build_batch(&recs(1, 0, 1)), 0).unwrap();
    let h = log.flush_handle();
    let err = log.mark_flushed(h.flushed, Err(std::io::Error::other("EIO"))).unwrap_err();
    assert!(matches!(err, LogError::Offline(_)));
    assert!(matches!(log.append(&mut build_batch(&recs(1, 0, 1)), 0), Err(LogError::Offline(_))));
    assert!(matches!(log.read(Offset(0), 10, Offset(1), true), Err(LogError::Offline(_))));
    assert!(matches!(log.flush(), Err(LogError::Offline(_))));
    assert!(matches!(log.mark_flushed(h.flushed, Ok(())), Err(LogError::Offline(_))));
    assert!(matches!(log.close(), Err(LogError::Offline(_))));
}

#[test]
fn retention_keeps_open_readers_working() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 500, retention_bytes: 600, retention_ms: -1, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    for i in 0..12 {
        log.append(&mut build_batch(&recs(1, i, 200)), 0).unwrap();
    }
    let plan = log.read(Offset(0), 1 << 20, Offset(12), true).unwrap();
    let before = plan.read_to_vec().unwrap();
    let deleted = log.enforce_retention(0).unwrap();
    assert!(deleted > 0);
    assert!(log.log_start_offset() > Offset(0));
    // Renamed on the spot (the data core), unlinked later by whoever takes them.
    assert!(!dir.path().join("00000000000000000000.log").exists());
    assert!(dir.path().join("00000000000000000000.log.deleted").exists());
    let removed = log.take_deleted_segments();
    assert_eq!(removed.len(), deleted);
    for segment in removed {
        segment.remove().unwrap();
    }
    assert!(!dir.path().join("00000000000000000000.log.deleted").exists());
    assert_eq!(plan.read_to_vec().unwrap(), before, "unlinked segment still readable");
    assert!(matches!(log.read(Offset(0), 10, Offset(12), true), Err(LogError::OffsetOutOfRange { .. })));
    // time retention by largest timestamp, never the active segment
    let mut c = small_config();
    c.segment_bytes = 500;
    c.retention_ms = 100;
    log.set_config(c);
    log.enforce_retention(1_000_000).unwrap();
    assert_eq!(log.segment_base_offsets().len(), 1);
    assert_eq!(log.log_end_offset(), Offset(12));
}

/// A crash between retention's rename and the unlink off the data core: the open
/// removes the renamed files and the log keeps the start retention gave it.
#[test]
fn segments_retention_renamed_are_removed_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 500, retention_bytes: 600, retention_ms: -1, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
    for i in 0..12 {
        log.append(&mut build_batch(&recs(1, i, 200)), 0).unwrap();
    }
    assert!(log.enforce_retention(0).unwrap() > 0);
    let start = log.log_start_offset();
    let renamed = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_str().unwrap().ends_with(".deleted"))
            .count()
    };
    assert!(renamed() >= 3, "a segment's .log, .index and .timeindex");
    drop(log); // kill -9: the renamed segments were never unlinked
    let log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert_eq!(renamed(), 0);
    assert_eq!(log.log_start_offset(), start);
    assert_eq!(log.log_end_offset(), Offset(12));
}

#[test]
fn roll_by_segment_ms() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_ms: 1000, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    log.append(&mut build_batch(&recs(1, 5_000, 1)), 5_000).unwrap();
    log.maybe_roll(5_500).unwrap();
    assert_eq!(log.segment_base_offsets().len(), 1);
    log.append(&mut build_batch(&recs(1, 6_001, 1)), 6_001).unwrap();
    assert_eq!(log.segment_base_offsets(), vec![Offset(0), Offset(1)]);
    assert!(dir.path().join("00000000000000000001.log").exists());
    assert!(log.flush_due(6_001), "a rolled, unsynced segment wants a flush");
    log.flush().unwrap();
    log.close().unwrap();
    let log = PartitionLog::open(dir.path(), small_config(), 7_000).unwrap();
    assert_eq!(log.log_end_offset(), Offset(2));
}

/// A truncation does no fsync (a follower's fetcher runs it on the data core): the next
/// flush round makes it durable, and a round that began before it does not count (the
/// fetcher asks again before it appends past the cut).
#[test]
fn a_truncation_is_durable_once_a_later_flush_is() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    for i in 0..3 {
        log.append(&mut build_batch(&recs(1, i, 10)), 0).unwrap();
    }
    log.flush().unwrap();
    assert!(log.truncation_durable() && !log.sync_owed());
    log.truncate_to(Offset(2), Offset(2)).unwrap();
    assert!(!log.truncation_durable() && log.sync_owed());
    let round = log.flush_handle();
    log.truncate_to(Offset(1), Offset(1)).unwrap(); // while that round runs
    round.sync().unwrap();
    let upto = log.mark_flushed(round.flushed, Ok(())).unwrap();
    assert_eq!(upto, Offset(1), "the round covers only what stayed below the cut");
    assert!(!log.truncation_durable(), "the round began before the second truncation");
    assert_eq!(log.recovery_point(), Offset(1));
    log.flush().unwrap();
    assert!(log.truncation_durable() && !log.sync_owed());
    drop(log);
    let log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(1));
}

/// The recovery point a round passed a segment with is synced, with the directory, by
/// the next round (the shard's tick queues it: `sync_owed`). Unsynced, a power cut left
/// it empty and the next start recovered the whole log.
#[test]
fn the_recovery_point_a_round_writes_is_synced_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 1024, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    log.flush().unwrap();
    while log.segment_base_offsets().len() < 2 {
        log.append(&mut build_batch(&recs(1, 0, 300)), 0).unwrap();
    }
    log.flush().unwrap();
    assert!(log.sync_owed(), "the recovery point written after the round is owed a sync");
    let round = log.flush_handle();
    let checkpoint = spate::log::SyncTarget::Path(dir.path().join(spate::log::RECOVERY_POINT_FILE));
    assert!(round.files.contains(&checkpoint), "the next round syncs the recovery point");
    assert!(round.files.contains(&spate::log::SyncTarget::Path(dir.path().to_path_buf())), "and its directory");
    round.sync().unwrap();
    log.mark_flushed(round.flushed, Ok(())).unwrap();
    assert!(!log.sync_owed());
}

/// A segment whose last batch was flushed before it rolled still gets its trimmed
/// indexes synced by the next round (a round synced a segment's indexes only while it
/// held unflushed batches, so such a roll left them at their unsynced length for good).
#[test]
fn a_segment_rolled_at_a_rounds_edge_has_its_indexes_synced() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 1024, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    while log.segment_base_offsets().len() < 2 {
        log.flush().unwrap();
        log.append(&mut build_batch(&recs(1, 0, 300)), 0).unwrap();
    }
    let rolled = log.segment_base_offsets()[0];
    let round = log.flush_handle();
    for suffix in ["index", "timeindex"] {
        let path = dir.path().join(format!("{:020}.{suffix}", rolled.0));
        assert!(round.files.contains(&spate::log::SyncTarget::Path(path)), "the rolled segment's .{suffix}");
    }
}

/// A torn index on a segment below the recovery point (a power cut can leave one whose
/// preallocation was never synced) is rebuilt and synced at open, and does not send the
/// producer-state replay back to that segment: the snapshots after it stay. Before, every
/// later start replayed the whole log and deleted every snapshot.
#[test]
fn a_torn_index_below_the_recovery_point_keeps_the_snapshots_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 1024, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
    while log.segment_base_offsets().len() < 4 {
        log.append(&mut build_batch(&recs(1, 0, 300)), 0).unwrap();
        log.flush().unwrap();
    }
    log.flush().unwrap();
    let end = log.log_end_offset();
    drop(log); // no clean stop
    let snapshots = || {
        let mut s: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".snapshot"))
            .collect();
        s.sort();
        s
    };
    let before = snapshots();
    assert_eq!(before.len(), 3, "{before:?}");
    let torn = dir.path().join("00000000000000000000.timeindex");
    std::fs::OpenOptions::new().write(true).open(&torn).unwrap().set_len(4096 * 5).unwrap();
    let log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert_eq!(snapshots(), before, "a rebuilt index dropped the snapshots after it");
    assert_eq!(std::fs::metadata(&torn).unwrap().len() % 12, 0, "the torn index was rebuilt");
    assert_eq!(log.log_end_offset(), end);
}

/// The descriptors an open log holds inside its directory (by /proc/self/fd, so other
/// tests' files, in other directories, do not count).
fn descriptors_into(dir: &std::path::Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap();
    let mut held = Vec::new();
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(target) = std::fs::read_link(fd.path()) {
            if target.starts_with(&dir) {
                held.push(target.strip_prefix(&dir).unwrap().display().to_string());
            }
        }
    }
    held.sort();
    held
}

/// A log holds one descriptor per segment (its `.log`), none for the mmap'ed indexes,
/// the directory or replaced checkpoint files: a broker with thousands of partitions
/// ran out of descriptors at four per partition (issue 52).
#[test]
fn an_open_log_holds_a_descriptor_per_segment_and_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 500, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
    for i in 0..8 {
        log.append(&mut build_batch(&recs(1, i, 200)), 0).unwrap();
    }
    log.assign_leader_epoch(3).unwrap();
    let segments = log.segment_base_offsets().len();
    assert!(segments >= 3, "{segments} segments");
    let want: Vec<String> = log.segment_base_offsets().iter().map(|b| format!("{:020}.log", b.0)).collect();
    assert_eq!(descriptors_into(dir.path()), want);
    // Replaced files are synced by path: a flush opens and closes them.
    log.flush().unwrap();
    assert_eq!(descriptors_into(dir.path()), want);
    log.close().unwrap();
    assert!(descriptors_into(dir.path()).is_empty());
    // A restart keeps the active segment's file only: the rest open again when read.
    let log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert_eq!(descriptors_into(dir.path()), want[want.len() - 1..], "after a clean restart");
    drop(log);
}

/// Segment files not used since the last sweep are closed, and opened again when a
/// read, an append or a flush needs them: a broker's descriptors follow the partitions
/// in use (issue 52: 20,000 partitions at an open-files limit of 20,000).
#[test]
fn idle_segment_files_close_and_open_again_when_used() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 500, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    for i in 0..6 {
        log.append(&mut build_batch(&recs(1, i, 200)), 0).unwrap();
    }
    let segments = log.segment_base_offsets().len();
    assert!(segments >= 3, "{segments} segments");
    assert_eq!(log.close_idle_files(), 0, "every file was used since it opened");
    assert_eq!(log.close_idle_files(), segments);
    assert!(descriptors_into(dir.path()).is_empty());
    // A read of the first segment opens its file only.
    let plan = log.read(Offset(0), 1 << 20, Offset(6), true).unwrap();
    assert!(!plan.read_to_vec().unwrap().is_empty());
    assert_eq!(descriptors_into(dir.path()), vec!["00000000000000000000.log".to_string()]);
    drop(plan);
    // An append opens the active one; a flush syncs closed ones by path.
    log.append(&mut build_batch(&recs(1, 6, 10)), 0).unwrap();
    log.flush().unwrap();
    assert!(!log.read(Offset(6), 1 << 20, Offset(7), true).unwrap().read_to_vec().unwrap().is_empty());
    let active = format!("{:020}.log", log.segment_base_offsets().last().unwrap().0);
    assert!(descriptors_into(dir.path()).contains(&active));
    // Used since the last sweep: kept once more, then closed.
    assert_eq!(log.close_idle_files(), 0);
    assert_eq!(log.close_idle_files(), 2);
    assert!(descriptors_into(dir.path()).is_empty());
    log.close().unwrap();
}
