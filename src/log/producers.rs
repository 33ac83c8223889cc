//! The partition log's producer state on disk: Kafka's `.snapshot` files (format in
//! `txn::producer_state`) and the rebuild from the log after a restart or truncation.
//!
//! A snapshot named `<offset>.snapshot` holds the state of every batch below `offset`.
//! One is written when a segment rolls (at the new segment's base offset) and at clean
//! shutdown (at the log end). Recovery loads the newest snapshot at or below the log end
//! offset that decodes (a torn or bit-flipped one is deleted with a warning, never
//! trusted; a snapshot beyond the log end, left by a crash before the bytes it covers
//! reached the file, is deleted), then replays the batch headers from that offset to the
//! log end. With no usable snapshot the whole log is replayed. A crash between an append
//! and the next snapshot therefore loses nothing: the replay brings the batch back.
//!
//! Written with `write_file_atomically` (temp file, fsync, rename, fsync dir).

use std::path::{Path, PathBuf};

use super::batch::{BatchHeader, ATTR_CONTROL};
use super::segment::Segment;
use crate::model::{ProducerEpoch, ProducerId};
use crate::txn::producer_state::{ProducerBatch, ProducerStates};

pub const SNAPSHOT_SUFFIX: &str = ".snapshot";

/// The producer-state view of a stored batch header; None for batches without a
/// producer id and for control batches.
pub fn producer_batch(h: &BatchHeader) -> Option<ProducerBatch> {
    (h.producer_id >= 0 && h.attributes & ATTR_CONTROL == 0).then_some(ProducerBatch {
        producer_id: ProducerId(h.producer_id),
        epoch: ProducerEpoch(h.producer_epoch),
        first_seq: h.base_sequence,
        offset_delta: h.last_offset_delta,
        max_timestamp_ms: h.max_timestamp,
    })
}

pub fn snapshot_path(dir: &Path, offset: i64) -> PathBuf {
    dir.join(format!("{offset:020}{SNAPSHOT_SUFFIX}"))
}

/// The snapshot files in `dir`, by offset, oldest first.
pub fn list_snapshots(dir: &Path) -> std::io::Result<Vec<i64>> {
    let mut offsets = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(SNAPSHOT_SUFFIX)) else { continue };
        if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(offset) = stem.parse::<i64>() {
                offsets.push(offset);
            }
        }
    }
    offsets.sort_unstable();
    Ok(offsets)
}

/// Write the snapshot of `states` at `offset`.
pub fn write_snapshot(dir: &Path, offset: i64, states: &ProducerStates) -> std::io::Result<()> {
    crate::model::write_file_atomically(&snapshot_path(dir, offset), &states.encode_snapshot())
}

/// Delete the snapshots with `offset < below` or `offset > above`.
pub fn delete_snapshots_outside(dir: &Path, below: i64, above: i64) -> std::io::Result<()> {
    for offset in list_snapshots(dir)? {
        if offset < below || offset > above {
            match std::fs::remove_file(snapshot_path(dir, offset)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Rebuild the state of `segments` (recovered or trusted): the newest valid snapshot
/// at or below the log end, then a replay of the headers after it. Producers whose last
/// batch is below the log start, or idle past `expiration_ms`, are dropped.
pub fn rebuild(
    dir: &Path,
    segments: &[Segment],
    now_ms: i64,
    expiration_ms: i64,
) -> std::io::Result<(ProducerStates, i64)> {
    let log_start_offset = segments[0].base_offset;
    let log_end_offset = segments[segments.len() - 1].next_offset;
    delete_snapshots_outside(dir, 0, log_end_offset)?;
    let mut loaded = None;
    for offset in list_snapshots(dir)?.into_iter().rev() {
        let path = snapshot_path(dir, offset);
        let decoded = read_snapshot(&path, offset)?;
        match decoded {
            Ok(states) => {
                loaded = Some((states, offset));
                break;
            }
            Err(reason) => {
                tracing::warn!(path = %path.display(), %reason, "corrupt producer state snapshot: deleted, not trusted");
                std::fs::remove_file(&path)?;
            }
        }
    }
    let (mut states, from) = loaded.unwrap_or_else(|| (ProducerStates::new(), log_start_offset));
    let from = from.max(log_start_offset);
    let replayed = replay(dir, segments, from, &mut states);
    states.remove_before(log_start_offset);
    states.expire(now_ms, expiration_ms);
    Ok((states, replayed))
}

/// Read and check one snapshot file: no larger than `producer_snapshot_entries_max`
/// entries allow (checked before reading it), then `decode_snapshot_at`.
fn read_snapshot(path: &Path, offset: i64) -> std::io::Result<Result<ProducerStates, String>> {
    use crate::txn::producer_state::{SNAPSHOT_ENTRY_BYTES, SNAPSHOT_HEADER_BYTES};
    let size_max = SNAPSHOT_HEADER_BYTES + crate::model::limits::producer_snapshot_entries_max * SNAPSHOT_ENTRY_BYTES;
    let size = std::fs::metadata(path)?.len();
    if size > size_max as u64 {
        return Ok(Err(format!("{size} bytes, above the {size_max} a snapshot may have")));
    }
    let bytes = std::fs::read(path)?;
    Ok(ProducerStates::decode_snapshot_at(&bytes, offset))
}

/// Apply every producer batch of `segments` at or after `from`. Returns the number of
/// batches applied.
fn replay(dir: &Path, segments: &[Segment], from: i64, states: &mut ProducerStates) -> i64 {
    let mut applied = 0;
    for seg in segments.iter().filter(|s| s.next_offset > from) {
        let start = if from > seg.base_offset {
            match seg.position_of(from) {
                Ok((pos, _)) => pos,
                Err(stop) => {
                    tracing::warn!(dir = %dir.display(), segment = seg.base_offset, reason = %stop.reason,
                        "producer state replay stopped in a segment");
                    continue;
                }
            }
        } else {
            0
        };
        let mut pos = start;
        loop {
            match seg.header_at(pos, seg.size_bytes) {
                Ok(Some(h)) => {
                    if h.last_offset() >= from {
                        if let Some(b) = producer_batch(&h) {
                            states.apply(&b, h.last_offset());
                            applied += 1;
                        }
                    }
                    pos += h.size_bytes();
                }
                Ok(None) => break,
                Err(stop) => {
                    tracing::warn!(dir = %dir.display(), segment = seg.base_offset, position = stop.position_bytes,
                        reason = %stop.reason, "producer state replay stopped in a segment");
                    break;
                }
            }
        }
    }
    applied
}
