//! Deferred appends: the broker assigns offsets first and writes the bytes through
//! io_uring afterwards. Until a write is reported, nothing at or after it is readable,
//! flushed or counted in the recovery point, even when later writes finish first.

#[path = "log_common/mod.rs"]
mod common;

use std::os::unix::fs::FileExt;

use common::*;
use spate::log::PartitionLog;
use spate::model::Offset;

#[test]
fn reads_and_flushes_stop_at_the_first_unfinished_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(&dir.path().join("t-0"), small_config(), 1_000).unwrap();
    let mut a = build_batch(&recs(3, 1_000, 10));
    let mut b = build_batch(&recs(2, 1_001, 10));
    let mut c = build_batch(&recs(4, 1_002, 10));
    let (ia, wa) = log.append_deferred(&mut a, 1_000).unwrap();
    let (ib, wb) = log.append_deferred(&mut b, 1_000).unwrap();
    let (ic, wc) = log.append_deferred(&mut c, 1_000).unwrap();
    assert_eq!((ia.base_offset, ib.base_offset, ic.base_offset), (Offset(0), Offset(3), Offset(5)));
    assert_eq!(log.log_end_offset(), Offset(9));
    assert_eq!(log.written_end_offset(), Offset(0));
    assert_eq!(log.read(Offset(0), 1 << 20, Offset(9), true).unwrap().length_bytes, 0, "nothing written yet");

    // The last write finishes first: still nothing readable.
    wc.file.write_all_at(&c, wc.position).unwrap();
    log.write_done(wc.id, Ok(())).unwrap();
    assert_eq!(log.written_end_offset(), Offset(0));
    assert_eq!(log.flush_handle().upto, Offset(0));

    // The first finishes: only it is readable.
    wa.file.write_all_at(&a, wa.position).unwrap();
    log.write_done(wa.id, Ok(())).unwrap();
    assert_eq!(log.written_end_offset(), Offset(3));
    let plan = log.read(Offset(0), 1 << 20, Offset(9), true).unwrap();
    assert_eq!(plan.read_to_vec().unwrap(), a);
    assert_eq!(log.read(Offset(3), 1 << 20, Offset(9), true).unwrap().length_bytes, 0);
    assert!(log.has_pending_writes());

    // The middle one: everything.
    wb.file.write_all_at(&b, wb.position).unwrap();
    log.write_done(wb.id, Ok(())).unwrap();
    assert_eq!(log.written_end_offset(), Offset(9));
    assert!(!log.has_pending_writes());
    let all = log.read(Offset(0), 1 << 20, Offset(9), true).unwrap().read_to_vec().unwrap();
    assert_eq!(all, [a.clone(), b.clone(), c.clone()].concat());
    let decoded = decode_batches(&all);
    assert_eq!(decoded.iter().map(|d| d.base_offset).collect::<Vec<_>>(), vec![0, 3, 5]);
    log.flush().unwrap();
    assert_eq!(log.recovery_point(), Offset(9));
    log.close().unwrap();

    let log = PartitionLog::open(&dir.path().join("t-0"), small_config(), 2_000).unwrap();
    assert_eq!(log.log_end_offset(), Offset(9));
}

#[test]
fn a_failed_write_takes_the_log_offline() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(&dir.path().join("t-0"), small_config(), 1_000).unwrap();
    let mut a = build_batch(&recs(1, 1_000, 10));
    let (_, wa) = log.append_deferred(&mut a, 1_000).unwrap();
    assert!(log.write_done(wa.id, Err(std::io::Error::from_raw_os_error(libc::ENOSPC))).is_err());
    let mut b = build_batch(&recs(1, 1_000, 10));
    assert!(log.append(&mut b, 1_000).is_err(), "offline for good");
}
