//! The log start offset: the first offset a reader may still fetch. It starts at the
//! first segment's base offset and moves up when retention deletes segments, and inside
//! a segment when records are deleted (DeleteRecords on the leader, the leader's log
//! start learned by a follower: Kafka's `maybeIncrementLogStartOffset`).
//!
//! Invariant: `segments[0].base_offset <= log_start_offset <= log_end_offset`; reads
//! below it are OFFSET_OUT_OF_RANGE, ListOffsets earliest answers it, segments wholly
//! below it are deleted (never the active one).
//!
//! # On-disk format, version 1
//!
//! `spate-log-start-offset` in the partition directory (Kafka keeps one
//! `log-start-offset-checkpoint` per data dir; here each partition has one owner shard,
//! so per-partition files need no coordination between shards), ASCII, the recovery
//! point's format:
//!
//! ```text
//! 1 <offset> <crc>\n      1 = format version; <crc> = decimal CRC32C of the text "1 <offset>"
//! ```
//!
//! Written only when a move is asked for, before the move is applied or answered:
//! temporary file, fdatasync, rename, directory fsync (`write_log_start_checkpoint`, run
//! off the data core by the caller). A crash leaves the old file or the new one. At
//! open the log start is the larger of the file's offset and the first segment's base
//! offset; a missing or garbled file counts as no file (the segments' start). A file
//! naming an offset past the recovered log end (the unsynced tail was lost) makes the
//! log start over, empty, at that offset, as Kafka's log loader does.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{checkpoint_text, LogError, PartitionLog, FORMAT_VERSION};
use crate::model::Offset;

/// The log start checkpoint's file name (per partition directory).
pub const LOG_START_OFFSET_FILE: &str = "spate-log-start-offset";
/// The longest a valid checkpoint file can be ("1 " + 19 digits + " " + 10 digits + "\n").
const checkpoint_bytes_max: usize = 64;

/// Write `offset` as the log start checkpoint of the partition in `dir`, durably: temp
/// file, fdatasync, rename, directory fsync. Blocking: run it off the data core.
pub fn write_log_start_checkpoint(dir: &Path, offset: Offset) -> std::io::Result<()> {
    assert!(offset.0 >= 0, "log start offset {} is negative", offset.0);
    let tmp = dir.join(format!("{LOG_START_OFFSET_FILE}.tmp"));
    {
        let f = File::create(&tmp)?;
        f.write_all_at(checkpoint_text(offset.0).as_bytes(), 0)?;
        f.sync_data()?;
    }
    std::fs::rename(&tmp, dir.join(LOG_START_OFFSET_FILE))?;
    File::open(dir)?.sync_all()
}

/// Decode a log start checkpoint's bytes; None when they do not check out.
pub fn decode_log_start_checkpoint(bytes: &[u8]) -> Option<i64> {
    if bytes.len() > checkpoint_bytes_max {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let mut parts = text.trim_end_matches('\n').split(' ');
    let (version, offset) = (parts.next()?, parts.next()?);
    if version != FORMAT_VERSION.to_string() {
        return None;
    }
    let offset: i64 = offset.parse().ok()?;
    (offset >= 0 && checkpoint_text(offset) == text).then_some(offset)
}

/// The checkpointed log start of the partition in `dir`: None when there is no file,
/// Err(reason) when it does not check out.
fn read_log_start_checkpoint(dir: &Path) -> Result<Option<i64>, String> {
    match std::fs::read(dir.join(LOG_START_OFFSET_FILE)) {
        Ok(bytes) => decode_log_start_checkpoint(&bytes).map(Some).ok_or_else(|| format!("{bytes:?}")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl PartitionLog {
    /// At open: take the checkpointed log start, if any (see the module comment).
    pub(super) fn load_log_start_offset(&mut self) -> Result<(), LogError> {
        let start = match read_log_start_checkpoint(&self.dir) {
            Ok(Some(start)) => start,
            Ok(None) => return Ok(()),
            Err(reason) => {
                tracing::warn!(dir = %self.dir.display(), %reason,
                    "unreadable log start checkpoint: the log starts at its first segment");
                return Ok(());
            }
        };
        let end = self.log_end_offset().0;
        if start > end {
            tracing::warn!(dir = %self.dir.display(), log_start_offset = start, log_end_offset = end,
                "the log ends below its checkpointed log start: starting over, empty, there");
            return self.truncate_fully_and_start_at(Offset(start));
        }
        self.advance_log_start_offset(Offset(start)).map(|_| ())
    }

    /// Move the log start up to `offset` (at most the log end; never down): what the
    /// caller wrote with `write_log_start_checkpoint` first. Readers below it get
    /// OFFSET_OUT_OF_RANGE from now on; segments wholly below it are deleted (never the
    /// active one), the leader epochs before it forgotten (in memory: the checkpoint on
    /// disk is cut the same way at open). Returns the segments deleted.
    pub fn advance_log_start_offset(&mut self, offset: Offset) -> Result<usize, LogError> {
        self.check_online()?;
        let end = self.log_end_offset().0;
        assert!(offset.0 <= end, "log start {} past the log end {end}", offset.0);
        if offset.0 <= self.log_start_offset {
            return Ok(0);
        }
        self.log_start_offset = offset.0;
        // As Kafka's updateLogStartOffset: nothing below the log start is recovered.
        self.recovery_point = self.recovery_point.max(offset.0.min(self.written_end_offset().0));
        self.leader_epochs.truncate_from_start(offset.0);
        self.delete_segments_below_log_start()
    }

    /// Delete the segments wholly below the log start (whose successor starts at or
    /// below it), never the active one. Returns how many.
    pub(super) fn delete_segments_below_log_start(&mut self) -> Result<usize, LogError> {
        let mut deleted = 0;
        while self.segments.len() > 1
            && self.segments[1].base_offset <= self.log_start_offset
            && self.written_size(&self.segments[0]) == self.segments[0].size_bytes
        {
            self.delete_oldest_segment()?;
            deleted += 1;
        }
        if deleted > 0 {
            // As retention does: producers whose batches all went are forgotten.
            let first = self.segments[0].base_offset;
            self.producers.remove_before(first);
            let r = super::producers::delete_snapshots_outside(&self.dir, first, i64::MAX);
            self.offline_on_err("log start: delete producer snapshots", r)?;
        }
        debug_assert!(self.segments[0].base_offset <= self.log_start_offset);
        Ok(deleted)
    }

    /// A write of the log start checkpoint failed: the log goes offline, as after any
    /// failed fsync.
    pub fn log_start_checkpoint_failed(&mut self, error: &std::io::Error) -> LogError {
        self.go_offline(format!("log start checkpoint: {error}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Format version 1, byte for byte.
    #[test]
    fn checkpoint_fixture() {
        let dir = tempfile::tempdir().unwrap();
        write_log_start_checkpoint(dir.path(), Offset(42)).unwrap();
        let bytes = std::fs::read(dir.path().join(LOG_START_OFFSET_FILE)).unwrap();
        let crc = crc32c::crc32c(b"1 42");
        assert_eq!(bytes, format!("1 42 {crc}\n").into_bytes());
        assert_eq!(decode_log_start_checkpoint(&bytes), Some(42));
        assert!(!dir.path().join(format!("{LOG_START_OFFSET_FILE}.tmp")).exists());
    }

    #[test]
    fn garbled_checkpoints_do_not_decode() {
        let crc = crc32c::crc32c(b"1 42");
        assert_eq!(decode_log_start_checkpoint(format!("1 43 {crc}\n").as_bytes()), None);
        assert_eq!(decode_log_start_checkpoint(format!("2 42 {crc}\n").as_bytes()), None);
        assert_eq!(decode_log_start_checkpoint(b"1 -1 0\n"), None);
        assert_eq!(decode_log_start_checkpoint(b""), None);
        assert_eq!(decode_log_start_checkpoint(&[b'1'; 100]), None);
    }
}
