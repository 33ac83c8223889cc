//! Sparse, mmap'ed, fixed-width index files: `.index` (relative offset u32 BE, position
//! u32 BE) and `.timeindex` (timestamp i64 BE, relative offset u32 BE).
//!
//! The active segment's index files are preallocated to `segment.index.bytes` (rounded
//! down to whole entries) and trimmed to the used entries on roll and close. Entries are
//! appended in strictly increasing order (asserted); lookups binary-search.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use super::SyncTarget;

pub const OFFSET_ENTRY_BYTES: usize = 8;
pub const TIME_ENTRY_BYTES: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Offset,
    Time,
}

/// One index file. `entries` counts the valid entries; the rest of the mapping is zeros
/// (preallocated) or absent (trimmed). No file descriptor is kept: the mapping outlives
/// the descriptor it was made from, and the file is opened again by path for the rare
/// resize (roll, truncation) and sync, as Kafka's indexes do. A broker with thousands of
/// partitions would otherwise hold two descriptors per segment for nothing.
pub struct Index {
    kind: Kind,
    path: PathBuf,
    mmap: Option<MmapMut>,
    entries: usize,
    capacity: usize,
}

impl Index {
    fn entry_bytes(kind: Kind) -> usize {
        match kind {
            Kind::Offset => OFFSET_ENTRY_BYTES,
            Kind::Time => TIME_ENTRY_BYTES,
        }
    }

    /// Open (or create) the index file; its entries are taken as the longest valid
    /// prefix (see `valid_prefix`), so a zero-filled preallocated tail is harmless.
    /// Returns the index and whether entries after the valid prefix were non-zero
    /// (a sign of an inconsistent file that the caller should rebuild).
    pub fn open(path: &Path, kind: Kind, log_size_bytes: u64) -> std::io::Result<(Index, bool)> {
        let file = Self::open_file(path)?;
        let len = file.metadata()?.len() as usize;
        let eb = Self::entry_bytes(kind);
        let capacity = len / eb;
        let mut index = Index { kind, path: path.to_path_buf(), mmap: None, entries: 0, capacity };
        index.map(&file, capacity * eb)?;
        let entries = index.valid_prefix(log_size_bytes);
        index.entries = entries;
        let garbage = !len.is_multiple_of(eb) || index.nonzero_from(&file, entries * eb);
        Ok((index, garbage))
    }

    fn open_file(path: &Path) -> std::io::Result<File> {
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)
    }

    /// Whether any byte of the mapping at or after `from` is non-zero. Only the file's
    /// data regions are read (`SEEK_DATA`/`SEEK_HOLE`): an active index is a sparse
    /// file preallocated to `segment.index.bytes`, and faulting in its zero tail cost
    /// 20 MB of reads per partition after a kill -9 (38 s for 1,000 partitions). Where
    /// the file system cannot say, every byte is read.
    fn nonzero_from(&self, file: &File, from: usize) -> bool {
        use std::os::fd::AsRawFd;
        let Some(m) = &self.mmap else { return false };
        let fd = file.as_raw_fd();
        let mut pos = from;
        while pos < m.len() {
            // SAFETY: lseek on a descriptor borrowed for the call; it only moves the offset.
            let data = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
            if data < 0 {
                let no_more_data = std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
                return !no_more_data && m[pos..].iter().any(|b| *b != 0);
            }
            let start = (data as usize).max(pos).min(m.len());
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, start as libc::off_t, libc::SEEK_HOLE) };
            let end = if hole < 0 { m.len() } else { (hole as usize).clamp(start, m.len()) };
            if m[start..end].iter().any(|b| *b != 0) {
                return true;
            }
            if end == start {
                // No progress (a file system answering oddly): read the rest.
                return m[start..].iter().any(|b| *b != 0);
            }
            pos = end;
        }
        false
    }

    /// Resize the file to `len_bytes` and map it again (the file opened for the call).
    fn remap(&mut self, len_bytes: usize) -> std::io::Result<()> {
        self.mmap = None;
        let file = Self::open_file(&self.path)?;
        self.map(&file, len_bytes)
    }

    fn map(&mut self, file: &File, len_bytes: usize) -> std::io::Result<()> {
        self.mmap = None;
        if file.metadata()?.len() as usize != len_bytes {
            file.set_len(len_bytes as u64)?;
        }
        self.capacity = len_bytes / Self::entry_bytes(self.kind);
        if len_bytes > 0 {
            // SAFETY: the file is private to this partition directory and owned by this
            // log; nothing else resizes it while mapped.
            let mmap = unsafe { MmapMut::map_mut(file)? };
            // Lookups are binary searches and appends touch the last page: random access.
            // Without this a fault reads around it as far as the device's read-ahead (8 MiB
            // on the development VM), so opening the sparse preallocated index of 1,000
            // partitions zero-filled ~20 GB of page cache and a restart took 10-25 s.
            mmap.advise(memmap2::Advice::Random)?;
            self.mmap = Some(mmap);
        }
        Ok(())
    }

    /// Entries that are in order: offset index relative offsets and positions strictly
    /// increasing, positions inside the log (and > 0: the first batch is never indexed);
    /// time index timestamps strictly increasing, offsets non-decreasing.
    fn valid_prefix(&self, log_size_bytes: u64) -> usize {
        let mut n = 0;
        while n < self.capacity {
            let ok = match self.kind {
                Kind::Offset => {
                    let (rel, pos) = self.offset_entry(n);
                    pos > 0
                        && (pos as u64) < log_size_bytes
                        && (n == 0 || {
                            let (prel, ppos) = self.offset_entry(n - 1);
                            rel > prel && pos > ppos
                        })
                }
                Kind::Time => {
                    let (ts, rel) = self.time_entry(n);
                    ts >= 0
                        && !(ts == 0 && rel == 0)
                        && (n == 0 || {
                            let (pts, prel) = self.time_entry(n - 1);
                            ts > pts && rel >= prel
                        })
                }
            };
            if !ok {
                break;
            }
            n += 1;
        }
        n
    }

    pub fn entries(&self) -> usize {
        self.entries
    }

    pub fn is_full(&self) -> bool {
        self.entries >= self.capacity
    }

    fn raw(&self, i: usize) -> &[u8] {
        let eb = Self::entry_bytes(self.kind);
        &self.mmap.as_ref().expect("index entry of an unmapped index")[i * eb..(i + 1) * eb]
    }

    pub fn offset_entry(&self, i: usize) -> (u32, u32) {
        let r = self.raw(i);
        (u32::from_be_bytes(r[0..4].try_into().unwrap()), u32::from_be_bytes(r[4..8].try_into().unwrap()))
    }

    pub fn time_entry(&self, i: usize) -> (i64, u32) {
        let r = self.raw(i);
        (i64::from_be_bytes(r[0..8].try_into().unwrap()), u32::from_be_bytes(r[8..12].try_into().unwrap()))
    }

    fn push(&mut self, bytes: &[u8]) {
        assert!(!self.is_full());
        let eb = Self::entry_bytes(self.kind);
        assert_eq!(bytes.len(), eb);
        let at = self.entries * eb;
        self.mmap.as_mut().unwrap()[at..at + eb].copy_from_slice(bytes);
        self.entries += 1;
    }

    /// Append (relative offset, position); both strictly increase. Skipped when full.
    pub fn push_offset(&mut self, rel: u32, pos: u32) {
        assert_eq!(self.kind, Kind::Offset);
        if self.is_full() {
            return;
        }
        if let Some(last) = self.entries.checked_sub(1) {
            let (prel, ppos) = self.offset_entry(last);
            assert!(rel > prel && pos > ppos, "offset index out of order: ({rel},{pos}) after ({prel},{ppos})");
        }
        let mut b = [0u8; OFFSET_ENTRY_BYTES];
        b[0..4].copy_from_slice(&rel.to_be_bytes());
        b[4..8].copy_from_slice(&pos.to_be_bytes());
        self.push(&b);
    }

    /// Append (timestamp, relative offset) only when the timestamp grows (as Kafka).
    pub fn maybe_push_time(&mut self, ts: i64, rel: u32) {
        assert_eq!(self.kind, Kind::Time);
        if self.is_full() || ts <= self.last_time().map_or(-1, |(t, _)| t) || (ts == 0 && rel == 0) {
            return;
        }
        if let Some((_, prel)) = self.last_time() {
            assert!(rel >= prel, "time index offsets out of order: {rel} after {prel}");
        }
        let mut b = [0u8; TIME_ENTRY_BYTES];
        b[0..8].copy_from_slice(&ts.to_be_bytes());
        b[8..12].copy_from_slice(&rel.to_be_bytes());
        self.push(&b);
    }

    pub fn last_time(&self) -> Option<(i64, u32)> {
        self.entries.checked_sub(1).map(|i| self.time_entry(i))
    }

    pub fn last_offset_entry(&self) -> Option<(u32, u32)> {
        self.entries.checked_sub(1).map(|i| self.offset_entry(i))
    }

    /// The last entry with relative offset <= `rel`.
    pub fn lookup_offset(&self, rel: u32) -> Option<(u32, u32)> {
        let n = partition_point(self.entries, |i| self.offset_entry(i).0 <= rel);
        n.checked_sub(1).map(|i| self.offset_entry(i))
    }

    /// The last entry with position <= `pos` (positions grow with offsets).
    pub fn lookup_position(&self, pos: u32) -> Option<(u32, u32)> {
        let n = partition_point(self.entries, |i| self.offset_entry(i).1 <= pos);
        n.checked_sub(1).map(|i| self.offset_entry(i))
    }

    /// The last entry with timestamp < `ts`.
    pub fn lookup_time_below(&self, ts: i64) -> Option<(i64, u32)> {
        let n = partition_point(self.entries, |i| self.time_entry(i).0 < ts);
        n.checked_sub(1).map(|i| self.time_entry(i))
    }

    /// Keep only the first `entries` entries (zeroing the rest so a crash cannot revive them).
    pub fn truncate_entries(&mut self, entries: usize) {
        if entries >= self.entries {
            return;
        }
        let eb = Self::entry_bytes(self.kind);
        if let Some(m) = self.mmap.as_mut() {
            m[entries * eb..self.entries * eb].fill(0);
        }
        self.entries = entries;
    }

    /// Keep the entries whose predicate holds (a prefix).
    pub fn truncate_while(&mut self, keep: impl Fn(&Index, usize) -> bool) {
        let n = partition_point(self.entries, |i| keep(self, i));
        self.truncate_entries(n);
    }

    /// Shrink the file to the used entries (roll, close).
    pub fn trim(&mut self) -> std::io::Result<()> {
        let len = self.entries * Self::entry_bytes(self.kind);
        self.remap(len)
    }

    /// Grow the file to `max_bytes` (rounded down to whole entries) for appends.
    pub fn make_active(&mut self, max_bytes: u32) -> std::io::Result<()> {
        let eb = Self::entry_bytes(self.kind);
        let len = (max_bytes as usize / eb).max(self.entries) * eb;
        self.remap(len)
    }

    /// Write back the mapping and the file (fdatasync).
    pub fn sync(&self) -> std::io::Result<()> {
        if let Some(m) = &self.mmap {
            m.flush()?;
        }
        SyncTarget::Path(self.path.clone()).sync()
    }

    /// What to fdatasync to make the file durable (by path: no descriptor is kept). An
    /// fdatasync through any descriptor of the file writes back the pages dirtied
    /// through the mapping too.
    pub fn sync_target(&self) -> SyncTarget {
        SyncTarget::Path(self.path.clone())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file was renamed to `path`.
    pub fn renamed(&mut self, path: PathBuf) {
        self.path = path;
    }
}

/// The first i in 0..n where `pred` turns false (pred must be monotone true..false).
fn partition_point(n: usize, pred: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// Pages of `index`'s mapping in the page cache (mincore).
    fn resident_pages(index: &Index) -> usize {
        let m = index.mmap.as_ref().unwrap();
        let page = 4096;
        let mut vec = vec![0u8; m.len().div_ceil(page)];
        // SAFETY: the range is this index's live mapping; `vec` has a byte per page.
        let r = unsafe { libc::mincore(m.as_ptr() as *mut libc::c_void, m.len(), vec.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|b| **b & 1 == 1).count()
    }

    /// Opening an index reads the pages it looks at, not the device's read-ahead around
    /// them: a 10 MiB preallocated index with one entry, evicted from the page cache,
    /// then opened and searched, brings in a handful of pages. (With read-around, a fault
    /// on the development VM's disk, `read_ahead_kb` 8192, pulled in 2,048 pages per
    /// index, and a restart of 1,000 partitions zero-filled ~20 GB.) On a file system
    /// without read-ahead (tmpfs) this passes either way.
    #[test]
    fn opening_an_index_does_not_read_around_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.index");
        let (mut index, _) = Index::open(&path, Kind::Offset, 0).unwrap();
        index.make_active(10 * 1024 * 1024).unwrap();
        index.push_offset(5, 100);
        index.sync().unwrap();
        drop(index);
        let f = File::open(&path).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: an advisory call on a descriptor owned here.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        drop(f);
        let (mut index, garbage) = Index::open(&path, Kind::Offset, 1000).unwrap();
        assert_eq!((index.entries(), garbage), (1, false));
        index.make_active(10 * 1024 * 1024).unwrap();
        assert_eq!(index.lookup_offset(7), Some((5, 100)));
        let resident = resident_pages(&index);
        assert!(resident <= 16, "{resident} pages of a 2,560-page index read in to open it");
    }

    /// `lookup_position` finds the last entry at or below a byte position: none below the
    /// first entry, the entry itself on an exact hit, the one before between two.
    #[test]
    fn lookup_position_finds_the_last_entry_at_or_below() {
        let dir = tempfile::tempdir().unwrap();
        let (mut index, _) = Index::open(&dir.path().join("0.index"), Kind::Offset, 0).unwrap();
        index.make_active(4096).unwrap();
        for (rel, pos) in [(0, 0), (3, 150), (9, 400), (12, 1000)] {
            index.push_offset(rel, pos);
        }
        let found: Vec<_> =
            [0, 149, 150, 151, 399, 400, 999, 1000, u32::MAX].iter().map(|&p| index.lookup_position(p)).collect();
        let want = [(0, 0), (0, 0), (3, 150), (3, 150), (3, 150), (9, 400), (9, 400), (12, 1000), (12, 1000)];
        assert_eq!(found, want.map(Some).to_vec());
        let (mut late, _) = Index::open(&dir.path().join("1.index"), Kind::Offset, 0).unwrap();
        late.make_active(4096).unwrap();
        late.push_offset(2, 300);
        assert_eq!((late.lookup_position(299), late.lookup_position(300)), (None, Some((2, 300))));
    }

    /// The zero tail of a preallocated (sparse) index is skipped by SEEK_DATA, but a
    /// stray entry anywhere in it, written through the mapping or the file, is still seen.
    #[test]
    fn garbage_in_a_sparse_tail_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.index");
        let (mut index, garbage) = Index::open(&path, Kind::Offset, 0).unwrap();
        assert!(!garbage);
        index.make_active(10 * 1024 * 1024).unwrap();
        index.push_offset(5, 100);
        drop(index);
        let (index, garbage) = Index::open(&path, Kind::Offset, 1000).unwrap();
        assert_eq!((index.entries(), garbage), (1, false), "a clean sparse tail");
        drop(index);
        for at in [8u64, 4096, 5 * 1024 * 1024 + 8, 10 * 1024 * 1024 - 8] {
            let f = OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&[0, 0, 0, 1, 0, 0, 0, 1], at).unwrap();
            drop(f);
            let (_, garbage) = Index::open(&path, Kind::Offset, 1000).unwrap();
            assert!(garbage, "stray entry at {at}");
            let f = OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(&[0; 8], at).unwrap();
        }
        // Through the mapping (dirty pages, no blocks yet on delalloc file systems).
        let (mut index, _) = Index::open(&path, Kind::Offset, 1000).unwrap();
        index.mmap.as_mut().unwrap()[7 * 1024 * 1024 + 3] = 9;
        drop(index);
        let (_, garbage) = Index::open(&path, Kind::Offset, 1000).unwrap();
        assert!(garbage, "stray byte written through the mapping");
    }
}
