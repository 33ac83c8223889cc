//! The leader-epoch cache of one partition replica (KIP-101, KIP-279): which leader
//! epoch started at which offset, so a follower can ask "where did epoch E end?"
//! (OffsetForLeaderEpoch) and truncate where its log diverged, never by high watermark.
//!
//! Semantics follow Kafka's `LeaderEpochFileCache`. Pure: no clock; the file helpers
//! are the only I/O. `PartitionLog` owns one per partition (see `log/mod.rs`): it feeds
//! it from every appended batch's `partitionLeaderEpoch` (`assign_if_newer`), truncates
//! it with the log from either end, and saves the checkpoint whenever it changed.
//!
//! Invariants: epochs and start offsets strictly increase (asserted on every change);
//! inside a `PartitionLog`, every start offset lies in `[log_start_offset, log_end_offset]`.
//!
//! File format (Kafka's `leader-epoch-checkpoint`, version 0), text:
//! ```text
//! 0                 version
//! N                 number of entries
//! <epoch> <offset>  N lines, epochs and start offsets strictly increasing
//! ```

use std::path::Path;

/// Kafka's UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET.
pub const UNDEFINED_EPOCH: i32 = -1;
pub const UNDEFINED_EPOCH_OFFSET: i64 = -1;
pub const CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";
const CHECKPOINT_VERSION: u32 = 0;
/// A checkpoint with more entries than this is corrupt, not an allocation size.
const checkpoint_entries_max: usize = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderEpochCache {
    /// Strictly increasing in both epoch and start offset.
    entries: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.epoch)
    }

    /// The epoch `offset` belongs to: the latest starting at or below it (Kafka's
    /// `epochForOffset`); None below the first entry or with none.
    pub fn epoch_for_offset(&self, offset: i64) -> Option<i32> {
        self.entries.iter().rev().find(|e| e.start_offset <= offset).map(|e| e.epoch)
    }

    /// Record that `epoch` starts at `start_offset` (a leader appending its first batch
    /// of a new epoch, or a follower copying one). Entries it contradicts (epoch or
    /// start offset at or above it) are removed first. Returns whether anything changed.
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> bool {
        assert!(epoch >= 0 && start_offset >= 0, "epoch {epoch} at {start_offset}");
        let needed = match self.entries.last() {
            Some(last) => epoch != last.epoch || start_offset < last.start_offset,
            None => true,
        };
        if !needed {
            return false;
        }
        while self.entries.last().is_some_and(|e| e.epoch >= epoch || e.start_offset >= start_offset) {
            self.entries.pop();
        }
        self.entries.push(EpochEntry { epoch, start_offset });
        self.check();
        true
    }

    /// What an append does with a stored batch's `partitionLeaderEpoch` (Kafka's
    /// `LogSegment.recover` rule, also used on append here): a known epoch (>= 0) newer
    /// than the latest one starts at `base_offset`. A negative (unset) or older epoch
    /// changes nothing. Returns whether anything changed.
    pub fn assign_if_newer(&mut self, epoch: i32, base_offset: i64) -> bool {
        if epoch < 0 || self.latest_epoch().is_some_and(|latest| epoch <= latest) {
            return false;
        }
        self.assign(epoch, base_offset)
    }

    /// OffsetForLeaderEpoch: the largest epoch <= `requested` that we know and the offset
    /// where it ended (the start of the next epoch, or `log_end_offset` for the latest).
    /// (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET) when we cannot tell.
    pub fn end_offset_for(&self, requested: i32, log_end_offset: i64) -> (i32, i64) {
        if requested == UNDEFINED_EPOCH {
            return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET);
        }
        let Some(latest) = self.entries.last() else { return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET) };
        if requested == latest.epoch {
            return (requested, log_end_offset);
        }
        let Some(higher) = self.entries.iter().find(|e| e.epoch > requested) else {
            // Newer than anything we know.
            return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET);
        };
        match self.entries.iter().rev().find(|e| e.epoch <= requested) {
            Some(floor) => (floor.epoch, higher.start_offset),
            // Older than anything we know (KIP-279): the requested epoch, ending where our
            // first known epoch starts.
            None => (requested, higher.start_offset),
        }
    }

    /// The log was truncated to `end_offset` (exclusive): forget epochs starting there or
    /// later. Returns whether anything changed.
    pub fn truncate_from_end(&mut self, end_offset: i64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < end_offset);
        self.entries.len() != before
    }

    /// The log start moved to `start_offset` (retention): drop earlier epochs, keeping the
    /// one that covers `start_offset`, now starting there. Returns whether anything changed.
    pub fn truncate_from_start(&mut self, start_offset: i64) -> bool {
        let covering = self.entries.iter().rposition(|e| e.start_offset <= start_offset);
        let Some(i) = covering else { return false };
        let changed = i > 0 || self.entries[0].start_offset != start_offset;
        self.entries.drain(..i);
        self.entries[0].start_offset = start_offset;
        self.check();
        changed
    }

    fn check(&self) {
        assert!(
            self.entries.windows(2).all(|w| w[0].epoch < w[1].epoch && w[0].start_offset < w[1].start_offset),
            "leader epochs must grow with their start offsets: {:?}",
            self.entries
        );
    }

    pub fn encode(&self) -> String {
        let mut s = format!("{CHECKPOINT_VERSION}\n{}\n", self.entries.len());
        for e in &self.entries {
            s.push_str(&format!("{} {}\n", e.epoch, e.start_offset));
        }
        s
    }

    pub fn decode(text: &str) -> Result<Self, String> {
        let mut lines = text.lines();
        let version: u32 = lines.next().and_then(|l| l.trim().parse().ok()).ok_or("missing version")?;
        if version != CHECKPOINT_VERSION {
            return Err(format!("unknown leader-epoch checkpoint version {version}"));
        }
        let count: usize = lines.next().and_then(|l| l.trim().parse().ok()).ok_or("missing entry count")?;
        if count > checkpoint_entries_max {
            return Err(format!("{count} entries is more than {checkpoint_entries_max}"));
        }
        let mut entries = Vec::with_capacity(count.min(1024));
        for i in 0..count {
            let line = lines.next().ok_or_else(|| format!("entry {i} missing"))?;
            let mut parts = line.split_whitespace();
            let epoch: i32 = parts.next().and_then(|p| p.parse().ok()).ok_or_else(|| format!("bad entry {line:?}"))?;
            let start_offset: i64 =
                parts.next().and_then(|p| p.parse().ok()).ok_or_else(|| format!("bad entry {line:?}"))?;
            if epoch < 0 || start_offset < 0 || parts.next().is_some() {
                return Err(format!("bad entry {line:?}"));
            }
            if entries.last().is_some_and(|l: &EpochEntry| l.epoch >= epoch || l.start_offset >= start_offset) {
                return Err(format!("entry {line:?} does not grow"));
            }
            entries.push(EpochEntry { epoch, start_offset });
        }
        Ok(Self { entries })
    }

    /// Read `<dir>/leader-epoch-checkpoint`; an absent file is an empty cache.
    pub fn load(dir: &Path) -> Result<Self, String> {
        match std::fs::read_to_string(dir.join(CHECKPOINT_FILE)) {
            Ok(text) => Self::decode(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Write the checkpoint atomically and durably (temp file, fsync, rename, fsync dir).
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        crate::model::write_file_atomically(&dir.join(CHECKPOINT_FILE), self.encode().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(entries: &[(i32, i64)]) -> LeaderEpochCache {
        let mut c = LeaderEpochCache::default();
        for &(e, o) in entries {
            assert!(c.assign(e, o));
        }
        c
    }

    #[test]
    fn assign_ignores_repeats_and_drops_contradicted_entries() {
        let mut c = cache(&[(2, 6), (3, 8), (4, 11)]);
        assert!(!c.assign(4, 15), "same epoch, later offset: nothing new");
        // A new leader's epoch 4 starting earlier replaces the old one.
        assert!(c.assign(4, 9));
        assert_eq!(
            c.entries(),
            &[
                EpochEntry { epoch: 2, start_offset: 6 },
                EpochEntry { epoch: 3, start_offset: 8 },
                EpochEntry { epoch: 4, start_offset: 9 }
            ]
        );
        // An epoch lower than known ones wins over all entries it contradicts.
        assert!(c.assign(3, 7));
        assert_eq!(c.entries().len(), 2);
    }

    /// KIP-101 / KIP-279 answers, as Kafka's LeaderEpochFileCacheTest expects them.
    #[test]
    fn end_offset_for_epoch() {
        let c = cache(&[(2, 6), (3, 8), (5, 11)]);
        assert_eq!(c.end_offset_for(5, 20), (5, 20), "latest epoch ends at the log end");
        assert_eq!(c.end_offset_for(3, 20), (3, 11));
        assert_eq!(
            c.end_offset_for(4, 20),
            (3, 11),
            "unknown epoch in between: the one below, ending at the next start"
        );
        assert_eq!(c.end_offset_for(1, 20), (1, 6), "older than all: the requested epoch, ending at our first start");
        assert_eq!(c.end_offset_for(6, 20), (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET), "newer than all");
        assert_eq!(c.end_offset_for(UNDEFINED_EPOCH, 20), (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET));
        assert_eq!(LeaderEpochCache::default().end_offset_for(0, 0), (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET));
    }

    #[test]
    fn truncation_from_either_end() {
        let mut c = cache(&[(2, 6), (3, 8), (4, 11)]);
        assert!(c.truncate_from_end(9));
        assert_eq!(c.latest_epoch(), Some(3));
        assert!(!c.truncate_from_end(9), "nothing left at or after 9");
        assert!(c.truncate_from_end(6));
        assert_eq!(c.latest_epoch(), None, "an epoch starting at the truncation point goes");
        let mut c = cache(&[(2, 6), (3, 8), (4, 11)]);
        assert!(c.truncate_from_start(9));
        assert_eq!(c.entries(), &[EpochEntry { epoch: 3, start_offset: 9 }, EpochEntry { epoch: 4, start_offset: 11 }]);
        assert!(!c.truncate_from_start(9), "already starts there");
        assert!(!c.truncate_from_start(2));
        assert_eq!(c.entries()[0], EpochEntry { epoch: 3, start_offset: 9 }, "nothing before the start to drop");
    }

    #[test]
    fn assign_if_newer_ignores_unset_and_older_epochs() {
        let mut c = LeaderEpochCache::default();
        assert!(!c.assign_if_newer(-1, 0), "a producer's unset epoch");
        assert!(c.assign_if_newer(0, 0));
        assert!(!c.assign_if_newer(0, 3), "same epoch, later batch");
        assert!(c.assign_if_newer(2, 5));
        assert!(!c.assign_if_newer(1, 9), "an older epoch does not rewrite history");
        assert_eq!(c.entries(), &[EpochEntry { epoch: 0, start_offset: 0 }, EpochEntry { epoch: 2, start_offset: 5 }]);
    }

    #[test]
    fn checkpoint_file_round_trip_and_corruption() {
        let c = cache(&[(0, 0), (1, 120), (7, 5000)]);
        assert_eq!(c.encode(), "0\n3\n0 0\n1 120\n7 5000\n");
        let dir = tempfile::tempdir().unwrap();
        c.save(dir.path()).unwrap();
        assert_eq!(LeaderEpochCache::load(dir.path()).unwrap(), c);
        assert_eq!(
            LeaderEpochCache::load(&dir.path().join("missing")).unwrap_or_default(),
            LeaderEpochCache::default()
        );
        for bad in ["1\n0\n", "0\n2\n1 10\n", "0\n2\n1 10\n1 20\n", "0\n1\n-1 0\n", "0\n99999999999\n", "0\n1\n1 x\n"] {
            assert!(LeaderEpochCache::decode(bad).is_err(), "{bad:?}");
        }
    }
}
