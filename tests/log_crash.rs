//! Crash tests: a torn or bit-flipped tail in the active segment, reopened without the
//! clean-shutdown marker, leaves exactly the intact prefix, and appends continue at the
//! right offset. Also: corrupt middle segments drop what follows; junk indexes rebuild.

#[path = "log_common/mod.rs"]
mod common;

use std::path::Path;

use common::*;
use spate::log::{LogConfig, PartitionLog};
use spate::model::Offset;

const LOG: &str = "00000000000000000000.log";

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A log of batches of varied sizes, left without close (as after a crash).
/// Returns the batch end positions and their next offsets.
fn crashed_log(dir: &Path) -> Vec<(u64, i64)> {
    let mut log = PartitionLog::open(dir, small_config(), 0).unwrap();
    let mut ends = Vec::new();
    let mut pos = 0u64;
    for i in 0..12 {
        let mut b = build_batch(&recs(1 + i % 3, 100 + i as i64, 40 + 13 * i));
        pos += b.len() as u64;
        let info = log.append(&mut b, 0).unwrap();
        ends.push((pos, info.last_offset.0 + 1));
    }
    drop(log);
    ends
}

/// Reopen the log in `dir`; expect `end_offset` and `end_pos` bytes, then append.
fn check_prefix(dir: &Path, original: &[u8], end_pos: u64, end_offset: i64) {
    let mut log = PartitionLog::open(dir, small_config(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(end_offset));
    assert_eq!(log.size_bytes(), end_pos);
    if end_offset > 0 {
        let bytes = log.read(Offset(0), 1 << 20, Offset(end_offset), true).unwrap().read_to_vec().unwrap();
        assert_eq!(bytes, &original[..end_pos as usize]);
        decode_batches(&bytes);
    }
    let info = log.append(&mut build_batch(&recs(2, 5, 5)), 0).unwrap();
    assert_eq!(info.base_offset, Offset(end_offset));
    // and it survives another crash
    drop(log);
    let log = PartitionLog::open(dir, small_config(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(end_offset + 2));
}

#[test]
fn torn_tail_at_every_byte() {
    let src = tempfile::tempdir().unwrap();
    let ends = crashed_log(src.path());
    let original = std::fs::read(src.path().join(LOG)).unwrap();
    let n = ends.len();
    let from = ends[n - 3].0;
    for cut in from..original.len() as u64 {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(src.path(), dir.path());
        let f = std::fs::OpenOptions::new().write(true).open(dir.path().join(LOG)).unwrap();
        f.set_len(cut).unwrap();
        let (end_pos, end_offset) = ends.iter().rev().find(|(p, _)| *p <= cut).copied().unwrap();
        check_prefix(dir.path(), &original, end_pos, end_offset);
    }
}

#[test]
fn bit_flips_in_the_last_batches() {
    let src = tempfile::tempdir().unwrap();
    let ends = crashed_log(src.path());
    let original = std::fs::read(src.path().join(LOG)).unwrap();
    let n = ends.len();
    for k in [n - 2, n - 1] {
        let (start, start_offset) = ends[k - 1];
        let end = ends[k].0;
        for at in start..end {
            let rel = at - start;
            let dir = tempfile::tempdir().unwrap();
            copy_dir(src.path(), dir.path());
            let mut bytes = original.clone();
            bytes[at as usize] ^= 1 << (at % 8);
            std::fs::write(dir.path().join(LOG), &bytes).unwrap();
            match rel {
                // baseOffset is not covered by the CRC: a flip may read as a gap; only
                // require a usable log
                0..=7 => {
                    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
                    assert!(log.log_end_offset().0 >= start_offset);
                    log.append(&mut build_batch(&recs(1, 5, 5)), 0).unwrap();
                }
                // partitionLeaderEpoch is not covered by the CRC either: batch kept
                12..=15 => {
                    let log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
                    assert_eq!(log.log_end_offset().0, ends[n - 1].1);
                }
                _ => check_prefix(dir.path(), &original, start, start_offset),
            }
        }
    }
}

#[test]
fn corrupt_middle_segment_drops_later_segments() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_bytes: 300, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
    for i in 0..10 {
        log.append(&mut build_batch(&recs(2, i, 100)), 0).unwrap();
    }
    let segs = log.segment_base_offsets();
    assert!(segs.len() >= 4, "{segs:?}");
    drop(log);
    let victim = dir.path().join(format!("{:020}.log", segs[1].0));
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&victim, &bytes).unwrap();
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert_eq!(log.segment_base_offsets(), segs[..2].to_vec());
    assert!(log.log_end_offset() < segs[2]);
    for s in &segs[2..] {
        assert!(!dir.path().join(format!("{:020}.log", s.0)).exists());
    }
    let end = log.log_end_offset();
    assert_eq!(log.append(&mut build_batch(&recs(1, 1, 1)), 0).unwrap().base_offset, end);
}

#[test]
fn junk_index_is_rebuilt_and_clean_marker_is_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { index_interval_bytes: 64, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
    for i in 0..20 {
        log.append(&mut build_batch(&recs(1, i * 10, 50)), 0).unwrap();
    }
    drop(log);
    std::fs::write(dir.path().join("00000000000000000000.index"), vec![0xAB; 4096]).unwrap();
    std::fs::write(dir.path().join("00000000000000000000.timeindex"), vec![0x5A; 4096]).unwrap();
    let log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(20));
    for o in 0..20 {
        let d = decode_batches(&log.read(Offset(o), 1, Offset(20), true).unwrap().read_to_vec().unwrap());
        assert_eq!(d[0].base_offset, o);
        assert_eq!(log.offset_for_timestamp(o * 10 - 5).unwrap(), Some((Offset(o), o * 10)));
    }
    log.close().unwrap();
    // With the marker the log is not re-read: a flipped CRC byte is not noticed...
    let path = dir.path().join(LOG);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[17] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(20));
    drop(log);
    // ...but the marker is gone, so the next (unclean) open re-validates everything.
    let log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(0));
}
