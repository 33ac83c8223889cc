//! A segment's aborted-transaction index, `<base>.txnindex` (Kafka's `TransactionIndex`,
//! byte for byte): one entry per transaction whose ABORT marker lies in the segment.
//! A read_committed fetch returns the entries that overlap what it read, and the client
//! drops those producers' records in that range.
//!
//! Big-endian entries of 34 bytes, appended in marker order (so `last_offset` increases):
//!
//! ```text
//! off len field
//!   0   2 version             i16 = 0
//!   2   8 producerId          i64
//!  10   8 firstOffset         i64  the transaction's first offset in this partition
//!  18   8 lastOffset          i64  its ABORT marker's offset (in this segment)
//!  26   8 lastStableOffset    i64  the partition's first unstable offset once it ended
//! ```
//!
//! The file exists only once a segment has an entry. Entries are also kept in memory
//! (32 bytes each); the file is written with a positional write on the data core and
//! fsynced with its segment (`sync_files`), so it is durable before the recovery point
//! passes the marker. Untrusted on open: the valid prefix is kept (version 0, first <=
//! last, last inside the segment, increasing), anything after it is cut off; recovery
//! then adds back what the replay of the log finds missing (`producers::rebuild`).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const ENTRY_BYTES: usize = 34;
pub const VERSION: i16 = 0;

/// An aborted transaction (Kafka's `AbortedTxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    pub last_offset: i64,
    pub last_stable_offset: i64,
}

impl AbortedTxn {
    pub fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[0..2].copy_from_slice(&VERSION.to_be_bytes());
        b[2..10].copy_from_slice(&self.producer_id.to_be_bytes());
        b[10..18].copy_from_slice(&self.first_offset.to_be_bytes());
        b[18..26].copy_from_slice(&self.last_offset.to_be_bytes());
        b[26..34].copy_from_slice(&self.last_stable_offset.to_be_bytes());
        b
    }

    /// One entry's bytes; None unless version 0 with `0 <= first <= last`.
    pub fn decode(b: &[u8]) -> Option<AbortedTxn> {
        let b: &[u8; ENTRY_BYTES] = b.try_into().ok()?;
        let i64_at = |at: usize| i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let e = AbortedTxn {
            producer_id: i64_at(2),
            first_offset: i64_at(10),
            last_offset: i64_at(18),
            last_stable_offset: i64_at(26),
        };
        let version = i16::from_be_bytes([b[0], b[1]]);
        (version == VERSION && e.producer_id >= 0 && 0 <= e.first_offset && e.first_offset <= e.last_offset)
            .then_some(e)
    }
}

pub struct TxnIndex {
    path: PathBuf,
    entries: Vec<AbortedTxn>,
    file: Option<Arc<File>>,
}

impl TxnIndex {
    /// A new segment's index: no file until the first entry.
    pub fn create(path: PathBuf) -> std::io::Result<TxnIndex> {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        Ok(TxnIndex { path, entries: Vec::new(), file: None })
    }

    /// An existing segment's index, if it has a file: the valid prefix of its entries
    /// with `last_offset >= base_offset`, at most `entries_max` (what the segment's bytes
    /// can hold markers for); the rest of the file is cut off.
    pub fn open(path: PathBuf, base_offset: i64, entries_max: usize) -> std::io::Result<TxnIndex> {
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(TxnIndex { path, entries: Vec::new(), file: None })
            }
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        let count = ((len / ENTRY_BYTES as u64) as usize).min(entries_max);
        let mut bytes = vec![0u8; count * ENTRY_BYTES];
        file.read_exact_at(&mut bytes, 0)?;
        let mut entries = Vec::with_capacity(count);
        for chunk in bytes.chunks_exact(ENTRY_BYTES) {
            let Some(e) = AbortedTxn::decode(chunk) else { break };
            if e.last_offset < base_offset
                || entries.last().is_some_and(|p: &AbortedTxn| p.last_offset >= e.last_offset)
            {
                break;
            }
            entries.push(e);
        }
        let kept = (entries.len() * ENTRY_BYTES) as u64;
        if kept != len {
            tracing::warn!(path = %path.display(), bytes = len, kept, "transaction index cut to its valid entries");
            file.set_len(kept)?;
        }
        Ok(TxnIndex { path, entries, file: Some(Arc::new(file)) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &[AbortedTxn] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The file, once there is one (to fsync with the segment).
    pub fn file(&self) -> Option<Arc<File>> {
        self.file.clone()
    }

    /// Add an entry: appended on the leader (its marker comes after every earlier one);
    /// put in its place when a replay gives back the entry of a marker the cleaner kept
    /// after dropping the entry (its transaction had no batch left), the entries after
    /// it rewritten. Writes the file, no fsync; returns the file to sync before the
    /// recovery point passes the marker.
    pub fn push(&mut self, e: AbortedTxn) -> std::io::Result<Arc<File>> {
        let at = self.entries.partition_point(|p| p.last_offset < e.last_offset);
        assert!(
            self.entries.get(at).is_none_or(|p| p.last_offset != e.last_offset),
            "two aborted transactions end at offset {}",
            e.last_offset
        );
        let file = match &self.file {
            Some(f) => f.clone(),
            None => {
                let f =
                    Arc::new(OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&self.path)?);
                self.file = Some(f.clone());
                f
            }
        };
        let mut bytes = Vec::with_capacity((self.entries.len() + 1 - at) * ENTRY_BYTES);
        for x in std::iter::once(&e).chain(&self.entries[at..]) {
            bytes.extend_from_slice(&x.encode());
        }
        file.write_all_at(&bytes, (at * ENTRY_BYTES) as u64)?;
        self.entries.insert(at, e);
        Ok(file)
    }

    /// Whether an entry for this marker is there (recovery adds only what is missing).
    pub fn contains(&self, e: &AbortedTxn) -> bool {
        self.entries.iter().any(|x| x.producer_id == e.producer_id && x.last_offset == e.last_offset)
    }

    /// Drop the entries whose marker is at or above `offset` (truncation, or recovery
    /// cutting a segment's tail).
    pub fn truncate_to(&mut self, offset: i64) -> std::io::Result<()> {
        let keep = self.entries.partition_point(|e| e.last_offset < offset);
        if keep < self.entries.len() {
            self.entries.truncate(keep);
            if let Some(f) = &self.file {
                f.set_len((keep * ENTRY_BYTES) as u64)?;
            }
        }
        Ok(())
    }

    /// The entries a fetch of `[fetch_offset, upper)` must return: every aborted
    /// transaction that ends at or after `fetch_offset` and starts below `upper`.
    pub fn overlapping(&self, fetch_offset: i64, upper: i64) -> impl Iterator<Item = &AbortedTxn> {
        self.entries.iter().filter(move |e| e.last_offset >= fetch_offset && e.first_offset < upper)
    }

    /// The file was renamed (retention's `.deleted`, the cleaner's swap).
    pub fn renamed(&mut self, path: PathBuf) {
        self.path = path;
    }

    /// Whether a file exists for this index.
    pub fn has_file(&self) -> bool {
        self.file.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(pid: i64, first: i64, last: i64) -> AbortedTxn {
        AbortedTxn { producer_id: pid, first_offset: first, last_offset: last, last_stable_offset: last + 1 }
    }

    #[test]
    fn entries_round_trip_through_the_file_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000100.txnindex");
        let mut ix = TxnIndex::create(path.clone()).unwrap();
        assert!(!path.exists(), "no file before the first entry");
        ix.push(txn(7, 100, 105)).unwrap();
        ix.push(txn(8, 101, 110)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * ENTRY_BYTES as u64);
        // Kafka's layout: version 0, then the four longs.
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[0..2], &[0, 0]);
        assert_eq!(i64::from_be_bytes(bytes[2..10].try_into().unwrap()), 7);
        assert_eq!(i64::from_be_bytes(bytes[26..34].try_into().unwrap()), 106);
        // A torn third entry is cut off on open.
        let f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all_at(&txn(9, 111, 120).encode()[..20], (2 * ENTRY_BYTES) as u64).unwrap();
        let ix = TxnIndex::open(path.clone(), 100, 1000).unwrap();
        assert_eq!(ix.entries(), &[txn(7, 100, 105), txn(8, 101, 110)]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * ENTRY_BYTES as u64);
        let found: Vec<_> = ix.overlapping(106, 200).copied().collect();
        assert_eq!(found, vec![txn(8, 101, 110)]);
        assert_eq!(ix.overlapping(0, 100).count(), 0, "both start at or above 100");
    }

    #[test]
    fn garbage_and_out_of_order_entries_end_the_valid_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.txnindex");
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&txn(1, 0, 5).encode());
        bytes.extend_from_slice(&txn(1, 6, 4).encode()); // first > last
        bytes.extend_from_slice(&txn(1, 7, 9).encode());
        std::fs::write(&path, &bytes).unwrap();
        let ix = TxnIndex::open(path.clone(), 0, 1000).unwrap();
        assert_eq!(ix.entries(), &[txn(1, 0, 5)]);
        let mut bytes = txn(1, 0, 5).encode().to_vec();
        bytes.extend_from_slice(&txn(2, 0, 5).encode()); // not increasing
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(TxnIndex::open(path.clone(), 0, 1000).unwrap().entries().len(), 1);
        // The bound on entries is applied before anything is read.
        let ten: Vec<u8> = (0..10).flat_map(|i| txn(1, i * 10, i * 10 + 1).encode()).collect();
        std::fs::write(&path, &ten).unwrap();
        assert_eq!(TxnIndex::open(path.clone(), 0, 2).unwrap().entries().len(), 2);
        for len in 0..70 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            std::fs::write(&path, &junk).unwrap();
            TxnIndex::open(path.clone(), 0, 1000).unwrap();
        }
    }

    /// A replay may give back an entry the cleaner dropped (its marker stayed, its
    /// batches went) below a later one: it goes in its place, in memory and in the file.
    #[test]
    fn an_entry_below_the_last_goes_in_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("z.txnindex");
        let mut ix = TxnIndex::create(path.clone()).unwrap();
        ix.push(txn(1, 0, 5)).unwrap();
        ix.push(txn(3, 20, 30)).unwrap();
        ix.push(txn(2, 12, 12)).unwrap();
        let want = [txn(1, 0, 5), txn(2, 12, 12), txn(3, 20, 30)];
        assert_eq!(ix.entries(), &want);
        assert_eq!(TxnIndex::open(path, 0, 100).unwrap().entries(), &want);
    }

    #[test]
    fn truncation_drops_markers_at_or_above_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("y.txnindex");
        let mut ix = TxnIndex::create(path.clone()).unwrap();
        for i in 0..4 {
            ix.push(txn(i, i * 10, i * 10 + 5)).unwrap();
        }
        ix.truncate_to(25).unwrap();
        assert_eq!(ix.entries().len(), 2);
        assert_eq!(TxnIndex::open(path, 0, 100).unwrap().entries().len(), 2);
    }
}
