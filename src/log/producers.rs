//! The partition log's producer state on disk: Kafka's `.snapshot` files (format in
//! `txn::producer_state`) and the rebuild from the log after a restart or truncation.
//!
//! A snapshot named `<offset>.snapshot` holds the state of every batch below `offset`.
//! One is written when a segment rolls (at the new segment's base offset) and at clean
//! shutdown (at the log end). Recovery loads the newest snapshot at or below the log end
//! offset and the high watermark that decodes (a torn or bit-flipped one is deleted with
//! a warning, never trusted; a snapshot beyond the log end, left by a crash before the
//! bytes it covers reached the file, is deleted), then replays the batch headers from
//! that offset to the log end. With no usable snapshot the whole log is replayed. A crash
//! between an append and the next snapshot therefore loses nothing: the replay brings the
//! batch back.
//!
//! Why not past the high watermark: a snapshot keeps the open transactions but not the
//! ended ones whose marker the high watermark has not passed (`ProducerStates`' `ended`),
//! and those still hold the last stable offset. A replica that restarts with a high
//! watermark checkpointed below such a marker, loading a snapshot taken after it, would
//! let a read_committed reader in below the marker: part of the transaction now, the
//! rest later (found by tests/replication_sim.rs, seed 18288). Replaying from at or below
//! the high watermark ends every such transaction again at its marker.
//!
//! Written with `write_file_atomically` (temp file, fsync, rename, fsync dir).

use std::path::{Path, PathBuf};

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::batch::{control_marker, BatchHeader, ControlMarker, ATTR_CONTROL};
use super::segment::Segment;
use super::txn_index::AbortedTxn;
use crate::model::{ProducerEpoch, ProducerId};
use crate::txn::producer_state::{CompletedTxn, ProducerBatch, ProducerStates};

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
        transactional: h.attributes & super::batch::ATTR_TRANSACTIONAL != 0,
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

/// The newest offset a rebuild may start from (the snapshot it loads is at or below
/// it): the log end, `replay_from_max` (what was recovered is replayed whole) and the
/// replica's high watermark (so that transactions ended at or above it are ended again
/// by the replay; see the module header).
pub fn replay_from_bound(log_end_offset: i64, replay_from_max: i64, high_watermark: i64) -> i64 {
    log_end_offset.min(replay_from_max).min(high_watermark.max(0))
}

/// Rebuild the state of `segments` (recovered or trusted): the newest valid snapshot
/// at or below `replay_from_bound` (the log end, `replay_from_max`: the first recovered
/// segment, and `high_watermark`), then a replay of the headers after it. Snapshots past
/// the log end or `replay_from_max` are deleted; those between the high watermark and
/// the log end are kept, unread. Producers whose
/// last batch is below the log start, or idle past `expiration_ms`, are dropped. The
/// replay ends transactions at their markers and gives each segment's transaction index
/// the aborted ones it lacks (a crash can lose entries the recovery point did not
/// cover). Returns what it made (`Rebuilt`).
pub fn rebuild(
    dir: &Path,
    segments: &mut [Segment],
    replay_from_max: i64,
    high_watermark: i64,
    now_ms: i64,
    expiration_ms: i64,
) -> std::io::Result<Rebuilt> {
    let log_start_offset = segments[0].base_offset;
    let log_end_offset = segments[segments.len() - 1].next_offset;
    delete_snapshots_outside(dir, 0, log_end_offset.min(replay_from_max))?;
    let bound = replay_from_bound(log_end_offset, replay_from_max, high_watermark);
    let mut loaded = None;
    for offset in list_snapshots(dir)?.into_iter().rev().filter(|&o| o <= bound) {
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
    let (replayed, written) = replay(dir, segments, from, &mut states)?;
    states.remove_before(log_start_offset);
    states.expire(now_ms, expiration_ms);
    Ok(Rebuilt { states, replayed_from: from, replayed, written })
}

/// What `rebuild` made: the state, where its replay began (the snapshot's offset, or the
/// log start without one), the batches it applied, and the transaction index files it
/// wrote (for the caller to fsync).
pub struct Rebuilt {
    pub states: ProducerStates,
    pub replayed_from: i64,
    pub replayed: i64,
    pub written: Vec<Arc<File>>,
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

/// Apply every producer batch and marker of `segments` at or after `from`. Returns the
/// number of batches applied and the transaction index files written.
fn replay(
    dir: &Path,
    segments: &mut [Segment],
    from: i64,
    states: &mut ProducerStates,
) -> std::io::Result<(i64, Vec<Arc<File>>)> {
    let mut applied = 0;
    let mut written = Vec::new();
    for seg in segments.iter_mut().filter(|s| s.next_offset > from) {
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
                        } else if let Some(marker) = read_marker(seg, pos, &h) {
                            let txn = states.apply_marker(
                                ProducerId(h.producer_id),
                                ProducerEpoch(h.producer_epoch),
                                marker.commit,
                                marker.coordinator_epoch,
                                h.base_offset,
                                h.max_timestamp,
                            );
                            applied += 1;
                            if let Some(aborted) = aborted_entry(&txn) {
                                if !seg.txn_index.contains(&aborted) {
                                    written.push(seg.txn_index.push(aborted)?);
                                }
                            }
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
    Ok((applied, written))
}

/// The marker of the control batch at `pos` (None for a data batch, or one that does not
/// parse). Control batches are small: one larger than 4 KiB is not read.
pub fn read_marker(seg: &Segment, pos: u64, h: &BatchHeader) -> Option<ControlMarker> {
    const CONTROL_BATCH_BYTES_MAX: u64 = 4096;
    if h.producer_id < 0 || h.attributes & ATTR_CONTROL == 0 || h.size_bytes() > CONTROL_BATCH_BYTES_MAX {
        return None;
    }
    let mut buf = vec![0u8; h.size_bytes() as usize];
    seg.file().ok()?.read_exact_at(&mut buf, pos).ok()?;
    control_marker(&buf, h)
}

/// The transaction index entry of a transaction that ended: Some for an abort.
pub fn aborted_entry(txn: &CompletedTxn) -> Option<AbortedTxn> {
    txn.aborted.then_some(AbortedTxn {
        producer_id: txn.producer_id.0,
        first_offset: txn.first_offset,
        last_offset: txn.last_offset,
        last_stable_offset: txn.last_stable_offset,
    })
}
