//! The log start offset moved inside the log (DeleteRecords): reads below it are out of
//! range, segments wholly below it go, and the checkpoint brings it back at open.

#[path = "log_common/mod.rs"]
mod common;

use common::*;
use spate::log::start_offset::{write_log_start_checkpoint, LOG_START_OFFSET_FILE};
use spate::log::{LogConfig, LogError, PartitionLog};
use spate::model::Offset;

fn segmented() -> LogConfig {
    LogConfig { segment_bytes: 500, retention_ms: -1, ..small_config() }
}

#[test]
fn moved_log_start_hides_records_deletes_segments_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), segmented(), 0).unwrap();
    for i in 0..12 {
        log.append(&mut build_batch(&recs(1, i, 100)), 0).unwrap();
    }
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 4 && bases[3].0 - bases[2].0 >= 2, "{bases:?}");
    // Inside the third segment: the two before it go, the third stays.
    let start = Offset(bases[2].0 + 1);
    write_log_start_checkpoint(dir.path(), start).unwrap();
    assert_eq!(log.advance_log_start_offset(start).unwrap(), 2);
    assert_eq!(log.log_start_offset(), start);
    assert_eq!(log.segment_base_offsets()[0], bases[2]);
    assert!(matches!(log.read(Offset(start.0 - 1), 1 << 20, Offset(12), true), Err(LogError::OffsetOutOfRange { .. })));
    assert!(log.read(start, 1 << 20, Offset(12), true).unwrap().length_bytes > 0);
    // Never down.
    assert_eq!(log.advance_log_start_offset(Offset(1)).unwrap(), 0);
    assert_eq!(log.log_start_offset(), start);
    log.flush().unwrap();
    drop(log); // as a kill -9 would: no clean close

    let log = PartitionLog::open(dir.path(), segmented(), 0).unwrap();
    assert_eq!(log.log_start_offset(), start, "the checkpointed log start is back after a reopen");
    assert_eq!(log.log_end_offset(), Offset(12));
}

#[test]
fn without_the_checkpoint_the_log_starts_at_its_first_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    for i in 0..5 {
        log.append(&mut build_batch(&recs(1, i, 10)), 0).unwrap();
    }
    log.advance_log_start_offset(Offset(3)).unwrap();
    log.flush().unwrap();
    drop(log);
    assert!(!dir.path().join(LOG_START_OFFSET_FILE).exists());
    let log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(log.log_start_offset(), Offset(0));
}

#[test]
fn a_checkpoint_past_the_log_end_starts_the_log_over_there() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    for i in 0..3 {
        log.append(&mut build_batch(&recs(1, i, 10)), 0).unwrap();
    }
    log.close().unwrap();
    write_log_start_checkpoint(dir.path(), Offset(7)).unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (Offset(7), Offset(7)));
    assert_eq!(log.append(&mut build_batch(&recs(1, 0, 10)), 0).unwrap().base_offset, Offset(7));
}

#[test]
fn garbled_checkpoint_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    log.append(&mut build_batch(&recs(2, 0, 10)), 0).unwrap();
    log.close().unwrap();
    std::fs::write(dir.path().join(LOG_START_OFFSET_FILE), b"1 1 12345\n").unwrap();
    let log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(log.log_start_offset(), Offset(0));
}

#[test]
fn truncation_below_a_moved_log_start_keeps_the_segments_before_it() {
    // As Kafka's truncateTo: only a cut below the first segment starts the log over; a
    // cut below a log start moved inside the log brings the log start down to it.
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    for i in 0..6 {
        log.append(&mut build_batch(&recs(1, i, 10)), 0).unwrap();
    }
    log.advance_log_start_offset(Offset(4)).unwrap();
    log.truncate_to(Offset(2), Offset(2)).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (Offset(2), Offset(2)));
    assert_eq!(log.segment_base_offsets(), vec![Offset(0)]);
    assert!(log.read(Offset(0), 1 << 20, Offset(2), true).is_err(), "below the log start");
    assert!(log.read(Offset(2), 1 << 20, Offset(2), true).is_ok());
}
