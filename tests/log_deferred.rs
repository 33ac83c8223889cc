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
    assert_eq!(log.flush_handle().flushed.upto, Offset(0));

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

/// `append_shared` leaves the caller's bytes alone and returns new headers; writing
/// each header followed by the rest of its batch gives exactly what `append` writes,
/// CRC included (LogAppendTime rewrites attributes and max timestamp, so the CRC too).
#[test]
fn shared_appends_write_the_same_bytes_as_in_place_appends() {
    for log_append_time in [false, true] {
        let mut config = small_config();
        if log_append_time {
            config.timestamp_type = spate::log::TimestampType::LogAppendTime;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut a = PartitionLog::open(&dir.path().join("a-0"), config.clone(), 1_000).unwrap();
        let mut b = PartitionLog::open(&dir.path().join("b-0"), config, 1_000).unwrap();
        let set = [build_batch(&recs(3, 1_000, 10)), build_batch(&recs(2, 1_001, 30))].concat();

        let mut in_place = set.clone();
        a.append(&mut in_place, 5_000).unwrap();

        let original = set.clone();
        let (info, write, patches) = b.append_shared(&set, 5_000).unwrap();
        assert_eq!(set, original, "the caller's bytes are untouched");
        assert_eq!(patches.len(), 2);
        let mut pos = write.position;
        for p in &patches {
            write.file.write_all_at(&p.header, pos).unwrap();
            let body = &set[p.position + p.header.len()..p.position + p.size];
            write.file.write_all_at(body, pos + p.header.len() as u64).unwrap();
            pos += p.size as u64;
        }
        b.write_done(write.id, Ok(())).unwrap();
        assert_eq!(info.last_offset, Offset(4));
        let written = b.read(Offset(0), 1 << 20, Offset(5), true).unwrap().read_to_vec().unwrap();
        assert_eq!(written, in_place);
        // The independent decoder checks every CRC (and panics on a bad one).
        let decoded = decode_batches(&written);
        assert_eq!(decoded.len(), 2);
        if log_append_time {
            assert!(decoded.iter().all(|d| d.max_timestamp == 5_000 && d.attributes & 0x08 != 0));
        }
    }
}
