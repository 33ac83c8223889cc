//! One segment: a `.log` file of record batches plus its `.index` and `.timeindex`.
//!
//! Invariants: batches in the file are contiguous from position 0 to `size_bytes`, their
//! offsets strictly increase and lie in `[base_offset, next_offset)`, every position fits
//! a u32 and every relative offset fits a u32.

use std::cell::{Cell, RefCell};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::batch::{self, BatchHeader, HEADER_BYTES};
use super::index::{Index, Kind};
use super::txn_index::TxnIndex;
use super::SyncTarget;

/// Appended to a segment's file names when retention removes it (Kafka's suffix): the
/// files are unlinked later, off the data core, and an open removes any it finds.
pub const DELETED_SUFFIX: &str = ".deleted";

pub fn file_name(base_offset: i64, suffix: &str) -> String {
    format!("{base_offset:020}{suffix}")
}

/// Segment `.log` files open in this process (`LogFile`), for the descriptor budget.
static LOG_FILES_OPEN: AtomicUsize = AtomicUsize::new(0);
/// Ids for segments (`Segment::id`).
static NEXT_SEGMENT_ID: AtomicU64 = AtomicU64::new(1);

/// Segment `.log` files this process holds open.
pub fn log_files_open() -> usize {
    LOG_FILES_OPEN.load(Ordering::Relaxed)
}

/// How many segment `.log` files the broker keeps open before its shards close idle
/// ones (`set_log_files_budget`; unbounded until set).
static LOG_FILES_BUDGET: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Set the descriptor budget for segment files (the server derives it from the
/// open-files limit at start).
pub fn set_log_files_budget(files: usize) {
    LOG_FILES_BUDGET.store(files, Ordering::Relaxed);
}

/// More segment files open than three quarters of the budget: time to close idle ones
/// (the quarter left absorbs the files opened before the next sweep).
pub fn log_files_sweep_due() -> bool {
    let budget = LOG_FILES_BUDGET.load(Ordering::Relaxed);
    budget != usize::MAX && log_files_open() > budget / 4 * 3
}

/// A segment's `.log` file, opened when first needed and closed by `close_if_idle`
/// when it was not used since the last call (a second-chance sweep the shard runs when
/// the broker holds more than its budget of descriptors): a broker's descriptors follow
/// the partitions in use, not every partition it hosts. Whoever holds an `Arc<File>`
/// from `get` (an append in flight, a fetch's zero-copy send, a flush, the cleaner)
/// keeps the descriptor open until done with it.
struct LogFile {
    path: PathBuf,
    file: RefCell<Option<Arc<File>>>,
    used: Cell<bool>,
}

impl LogFile {
    fn opened(path: PathBuf, file: File) -> LogFile {
        LOG_FILES_OPEN.fetch_add(1, Ordering::Relaxed);
        LogFile { path, file: RefCell::new(Some(Arc::new(file))), used: Cell::new(true) }
    }

    fn get(&self) -> std::io::Result<Arc<File>> {
        self.used.set(true);
        if let Some(f) = &*self.file.borrow() {
            return Ok(f.clone());
        }
        let f = Arc::new(OpenOptions::new().read(true).write(true).open(&self.path)?);
        LOG_FILES_OPEN.fetch_add(1, Ordering::Relaxed);
        *self.file.borrow_mut() = Some(f.clone());
        Ok(f)
    }

    fn close_if_idle(&self) -> bool {
        if self.used.replace(false) {
            return false;
        }
        self.close()
    }

    fn close(&self) -> bool {
        let closed = self.file.borrow_mut().take().is_some();
        if closed {
            LOG_FILES_OPEN.fetch_sub(1, Ordering::Relaxed);
        }
        closed
    }

    fn sync_target(&self) -> SyncTarget {
        match &*self.file.borrow() {
            Some(f) => SyncTarget::File(f.clone()),
            None => SyncTarget::Path(self.path.clone()),
        }
    }
}

impl Drop for LogFile {
    fn drop(&mut self) {
        self.close();
    }
}

pub struct Segment {
    pub base_offset: i64,
    /// Unique in the process: tells a segment from a later one with the same base
    /// offset (the cleaner's swap checks it).
    pub id: u64,
    pub log_path: PathBuf,
    log: LogFile,
    pub size_bytes: u64,
    pub next_offset: i64,
    pub index: Index,
    pub time_index: Index,
    pub max_timestamp_ms: i64,
    pub offset_of_max_timestamp: i64,
    /// For `segment.ms`: the first batch's max timestamp (or the append clock if none).
    pub first_batch_time_ms: Option<i64>,
    pub bytes_since_index_entry: u64,
    /// The aborted transactions whose markers are in this segment (`.txnindex`).
    pub txn_index: TxnIndex,
}

/// Why a scan stopped before the end of the file.
pub struct ScanStop {
    pub position_bytes: u64,
    pub reason: String,
}

impl Segment {
    /// Create a fresh, empty segment (any leftover files with its name are truncated).
    pub fn create(dir: &Path, base_offset: i64, index_bytes_max: u32) -> std::io::Result<Segment> {
        Self::create_named(dir, base_offset, "", index_bytes_max)
    }

    /// `create` with `extra` after each file name (the cleaner's `.cleaned` files).
    pub fn create_named(dir: &Path, base_offset: i64, extra: &str, index_bytes_max: u32) -> std::io::Result<Segment> {
        let path = |suffix: &str| dir.join(file_name(base_offset, suffix) + extra);
        let log_path = path(".log");
        let log = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&log_path)?;
        let log = LogFile::opened(log_path.clone(), log);
        for suffix in [".index", ".timeindex"] {
            let _ = std::fs::remove_file(path(suffix));
        }
        let (mut index, _) = Index::open(&path(".index"), Kind::Offset, 0)?;
        let (mut time_index, _) = Index::open(&path(".timeindex"), Kind::Time, 0)?;
        index.make_active(index_bytes_max)?;
        time_index.make_active(index_bytes_max)?;
        let txn_index = TxnIndex::create(path(".txnindex"))?;
        Ok(Segment {
            base_offset,
            id: NEXT_SEGMENT_ID.fetch_add(1, Ordering::Relaxed),
            log_path,
            log,
            size_bytes: 0,
            next_offset: base_offset,
            index,
            time_index,
            max_timestamp_ms: batch::NO_TIMESTAMP,
            offset_of_max_timestamp: base_offset,
            first_batch_time_ms: None,
            bytes_since_index_entry: 0,
            txn_index,
        })
    }

    /// Open an existing segment's files. `next_offset` and the timestamps are not known
    /// yet: the caller finishes with `load_trusting_indexes` or `recover`. Returns whether
    /// the index files looked inconsistent.
    pub fn open(dir: &Path, base_offset: i64) -> std::io::Result<(Segment, bool)> {
        let log_path = dir.join(file_name(base_offset, ".log"));
        let log = OpenOptions::new().read(true).write(true).open(&log_path)?;
        let size_bytes = log.metadata()?.len();
        let log = LogFile::opened(log_path.clone(), log);
        let (index, bad_index) = Index::open(&dir.join(file_name(base_offset, ".index")), Kind::Offset, size_bytes)?;
        let (time_index, bad_time) =
            Index::open(&dir.join(file_name(base_offset, ".timeindex")), Kind::Time, size_bytes)?;
        // Every entry needs an ABORT marker batch in this segment.
        let entries_max = (size_bytes / HEADER_BYTES as u64) as usize;
        let txn_index = TxnIndex::open(dir.join(file_name(base_offset, ".txnindex")), base_offset, entries_max)?;
        let segment = Segment {
            base_offset,
            id: NEXT_SEGMENT_ID.fetch_add(1, Ordering::Relaxed),
            log_path,
            log,
            size_bytes,
            next_offset: base_offset,
            index,
            time_index,
            max_timestamp_ms: batch::NO_TIMESTAMP,
            offset_of_max_timestamp: base_offset,
            first_batch_time_ms: None,
            bytes_since_index_entry: 0,
            txn_index,
        };
        Ok((segment, bad_index || bad_time))
    }

    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }

    /// The `.log` file, opened if it was closed (see `LogFile`).
    pub fn file(&self) -> std::io::Result<Arc<File>> {
        self.log.get()
    }

    /// What to fdatasync for the `.log` file (by path while it is closed).
    pub fn log_sync_target(&self) -> SyncTarget {
        self.log.sync_target()
    }

    /// Close the `.log` file now (it opens again when needed).
    pub fn close_file(&self) {
        self.log.close();
    }

    /// Close the `.log` file if it was not used since the last call; whether it closed.
    pub fn close_file_if_idle(&self) -> bool {
        self.log.close_if_idle()
    }

    /// Read and sanity-check the header at `pos` (no CRC): Ok(None) at `limit`.
    pub fn header_at(&self, pos: u64, limit: u64) -> Result<Option<BatchHeader>, ScanStop> {
        if pos >= limit {
            return Ok(None);
        }
        let stop = |reason: String| ScanStop { position_bytes: pos, reason };
        let left = limit - pos;
        if left < HEADER_BYTES as u64 {
            return Err(stop(format!("{left} bytes left, short of a batch header")));
        }
        let mut buf = [0u8; HEADER_BYTES];
        let file = self.file().map_err(|e| stop(format!("open failed: {e}")))?;
        file.read_exact_at(&mut buf, pos).map_err(|e| stop(format!("read failed: {e}")))?;
        let h = BatchHeader::parse(&buf);
        if h.batch_length < batch::BATCH_LENGTH_MIN || h.size_bytes() > left {
            return Err(stop(format!("batchLength {} with {left} bytes left", h.batch_length)));
        }
        if h.magic != 2 || h.last_offset_delta < 0 {
            return Err(stop(format!("magic {} lastOffsetDelta {}", h.magic, h.last_offset_delta)));
        }
        Ok(Some(h))
    }

    fn rel(&self, offset: i64) -> u32 {
        let rel = offset - self.base_offset;
        assert!((0..=u32::MAX as i64).contains(&rel), "offset {offset} outside segment {}", self.base_offset);
        rel as u32
    }

    /// Account for a batch just written at `pos`: indexes (one entry per
    /// `index_interval_bytes`, Kafka's rule), timestamps, next offset.
    pub fn note_batch(&mut self, pos: u64, h: &BatchHeader, index_interval_bytes: u32) {
        assert!(h.base_offset >= self.next_offset, "offsets must increase: {} < {}", h.base_offset, self.next_offset);
        assert!(pos + h.size_bytes() <= u32::MAX as u64, "segment position overflows u32");
        if h.max_timestamp > self.max_timestamp_ms {
            self.max_timestamp_ms = h.max_timestamp;
            self.offset_of_max_timestamp = h.last_offset();
        }
        if self.first_batch_time_ms.is_none() && h.max_timestamp >= 0 {
            self.first_batch_time_ms = Some(h.max_timestamp);
        }
        if self.bytes_since_index_entry > index_interval_bytes as u64 {
            let rel = self.rel(h.last_offset());
            self.index.push_offset(rel, pos as u32);
            let rel_max = self.rel(self.offset_of_max_timestamp);
            self.time_index.maybe_push_time(self.max_timestamp_ms, rel_max);
            self.bytes_since_index_entry = 0;
        }
        self.bytes_since_index_entry += h.size_bytes();
        self.next_offset = h.last_offset() + 1;
    }

    /// Clean shutdown path: indexes are trusted; only the tail after the last offset
    /// index entry is scanned (headers only). Err when the tail does not parse.
    pub fn load_trusting_indexes(&mut self) -> Result<(), ScanStop> {
        let (mut pos, mut next) = match self.index.last_offset_entry() {
            Some((rel, pos)) => (pos as u64, self.base_offset + rel as i64),
            None => (0, self.base_offset),
        };
        if let Some((ts, rel)) = self.time_index.last_time() {
            self.max_timestamp_ms = ts;
            self.offset_of_max_timestamp = self.base_offset + rel as i64;
        }
        let tail_start = pos;
        let mut expected = self.base_offset;
        // The indexes are trusted, not believed blindly: the last offset entry must name
        // the batch at its position, and no entry may point past the log (a file the
        // clean marker vouches for can still be damaged; found by fuzzing).
        let mismatch = |pos: u64, reason: String| Err(ScanStop { position_bytes: pos, reason });
        if self.index.last_offset_entry().is_some() {
            match self.header_at(pos, self.size_bytes)? {
                Some(h) if h.last_offset() == next => {}
                _ => {
                    return mismatch(pos, format!("the offset index's last entry (offset {next}) names no batch here"))
                }
            }
        }
        while let Some(h) = self.header_at(pos, self.size_bytes)? {
            if h.base_offset < expected || h.last_offset() - self.base_offset > u32::MAX as i64 {
                return Err(ScanStop { position_bytes: pos, reason: format!("offset {} out of order", h.base_offset) });
            }
            if h.max_timestamp > self.max_timestamp_ms && h.last_offset() < self.offset_of_max_timestamp {
                return mismatch(pos, format!("batch {} is newer than the time index's last entry", h.base_offset));
            }
            if h.max_timestamp > self.max_timestamp_ms {
                self.max_timestamp_ms = h.max_timestamp;
                self.offset_of_max_timestamp = h.last_offset();
            }
            next = next.max(h.last_offset() + 1);
            expected = h.last_offset() + 1;
            pos += h.size_bytes();
        }
        if self.time_index.last_time().is_some() && self.offset_of_max_timestamp >= next {
            return mismatch(pos, format!("the time index names offset {} past the log", self.offset_of_max_timestamp));
        }
        self.next_offset = next;
        self.bytes_since_index_entry = pos - tail_start;
        self.load_first_batch_time();
        Ok(())
    }

    fn load_first_batch_time(&mut self) {
        if let Ok(Some(h)) = self.header_at(0, self.size_bytes) {
            if h.max_timestamp >= 0 {
                self.first_batch_time_ms = Some(h.max_timestamp);
            }
        }
    }

    /// Crash path: re-validate every batch (CRC included), rebuild both indexes, and
    /// truncate the file at the first bad batch. Returns the stop (position, reason) and
    /// the bytes dropped when something was cut.
    pub fn recover(
        &mut self,
        batch_bytes_max: usize,
        index_interval_bytes: u32,
    ) -> std::io::Result<Option<(ScanStop, u64)>> {
        self.index.truncate_entries(0);
        self.time_index.truncate_entries(0);
        self.next_offset = self.base_offset;
        self.max_timestamp_ms = batch::NO_TIMESTAMP;
        self.offset_of_max_timestamp = self.base_offset;
        self.first_batch_time_ms = None;
        self.bytes_since_index_entry = 0;
        let limit = self.size_bytes.min(u32::MAX as u64);
        let mut pos = 0u64;
        let mut buf = Vec::new();
        let file = self.file()?;
        let stop = loop {
            let h = match self.header_at(pos, limit) {
                Ok(None) => break None,
                Ok(Some(h)) => h,
                Err(stop) => break Some(stop),
            };
            let size = h.size_bytes();
            if size > batch_bytes_max as u64 {
                break Some(ScanStop { position_bytes: pos, reason: format!("batch of {size} bytes above the limit") });
            }
            if h.base_offset < self.next_offset || h.last_offset() - self.base_offset > u32::MAX as i64 {
                break Some(ScanStop {
                    position_bytes: pos,
                    reason: format!("base offset {} where {} or later was expected", h.base_offset, self.next_offset),
                });
            }
            buf.resize(size as usize, 0);
            if let Err(e) = file.read_exact_at(&mut buf, pos) {
                break Some(ScanStop { position_bytes: pos, reason: format!("read failed: {e}") });
            }
            if let Err(e) = batch::check_structure(&buf, batch_bytes_max) {
                break Some(ScanStop { position_bytes: pos, reason: e.to_string() });
            }
            self.note_batch(pos, &h, index_interval_bytes);
            pos += size;
        };
        match stop {
            None => Ok(None),
            Some(stop) => {
                let dropped = self.size_bytes - stop.position_bytes;
                file.set_len(stop.position_bytes)?;
                self.size_bytes = stop.position_bytes;
                Ok(Some((stop, dropped)))
            }
        }
    }

    /// The position of the first batch whose last offset >= `offset` (or the end).
    /// Uses the offset index then scans headers.
    pub fn position_of(&self, offset: i64) -> Result<(u64, Option<BatchHeader>), ScanStop> {
        let mut pos = if offset > self.base_offset {
            self.index.lookup_offset(self.rel(offset.min(self.next_offset))).map_or(0, |(_, p)| p as u64)
        } else {
            0
        };
        loop {
            match self.header_at(pos, self.size_bytes)? {
                None => return Ok((pos, None)),
                Some(h) if h.last_offset() >= offset => return Ok((pos, Some(h))),
                Some(h) => pos += h.size_bytes(),
            }
        }
    }

    /// Cut everything at or above `offset` (whole batches: the batch containing `offset`
    /// goes too), then rebuild the in-memory state by a header scan.
    pub fn truncate_to(&mut self, offset: i64, index_interval_bytes: u32) -> std::io::Result<()> {
        let pos = match self.position_of(offset) {
            Ok((pos, _)) => pos,
            Err(stop) => stop.position_bytes,
        };
        self.file()?.set_len(pos)?;
        self.size_bytes = pos;
        self.index.truncate_while(|ix, i| (ix.offset_entry(i).1 as u64) < pos);
        self.rescan_headers(index_interval_bytes);
        self.txn_index.truncate_to(self.next_offset)
    }

    /// Rebuild indexes and timestamps from the batch headers (no CRC check).
    fn rescan_headers(&mut self, index_interval_bytes: u32) {
        self.index.truncate_entries(0);
        self.time_index.truncate_entries(0);
        self.next_offset = self.base_offset;
        self.max_timestamp_ms = batch::NO_TIMESTAMP;
        self.offset_of_max_timestamp = self.base_offset;
        self.first_batch_time_ms = None;
        self.bytes_since_index_entry = 0;
        let mut pos = 0;
        while let Ok(Some(h)) = self.header_at(pos, self.size_bytes) {
            self.note_batch(pos, &h, index_interval_bytes);
            pos += h.size_bytes();
        }
        assert_eq!(pos, self.size_bytes, "truncated segment does not end on a batch boundary");
    }

    /// Leaving the active role: final time index entry (as Kafka), trim both indexes.
    pub fn become_inactive(&mut self) -> std::io::Result<()> {
        if self.max_timestamp_ms >= 0 {
            let rel = self.rel(self.offset_of_max_timestamp);
            self.time_index.maybe_push_time(self.max_timestamp_ms, rel);
        }
        self.index.trim()?;
        self.time_index.trim()
    }

    pub fn make_active(&mut self, index_bytes_max: u32) -> std::io::Result<()> {
        self.index.make_active(index_bytes_max)?;
        self.time_index.make_active(index_bytes_max)
    }

    /// Rename the files to `<name>.deleted` (one rename each, directory metadata
    /// only: cheap enough for a data core). Open `Arc<File>` readers keep working;
    /// `delete_files` unlinks them later.
    pub fn rename_deleted(&mut self) -> std::io::Result<()> {
        self.log_path = with_deleted_suffix(&self.log_path)?;
        self.log.path.clone_from(&self.log_path);
        let index = with_deleted_suffix(self.index.path())?;
        self.index.renamed(index);
        let time_index = with_deleted_suffix(self.time_index.path())?;
        self.time_index.renamed(time_index);
        if self.txn_index.has_file() {
            let txn_index = with_deleted_suffix(self.txn_index.path())?;
            self.txn_index.renamed(txn_index);
        }
        Ok(())
    }

    /// Unlink the files; open `Arc<File>` readers keep working.
    pub fn delete_files(self) -> std::io::Result<()> {
        let paths = [
            self.log_path.clone(),
            self.index.path().to_path_buf(),
            self.time_index.path().to_path_buf(),
            self.txn_index.path().to_path_buf(),
        ];
        drop(self);
        for p in paths {
            match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Files whose fdatasync makes this segment durable.
    pub fn sync_files(&self, with_indexes: bool) -> Vec<SyncTarget> {
        let mut files = vec![self.log.sync_target()];
        // Aborted transactions are not rebuilt below the recovery point: always synced.
        files.extend(self.txn_index.file().map(SyncTarget::File));
        if with_indexes {
            files.push(self.index.sync_target());
            files.push(self.time_index.sync_target());
        }
        files
    }
}

fn with_deleted_suffix(path: &Path) -> std::io::Result<PathBuf> {
    let mut renamed = path.as_os_str().to_owned();
    renamed.push(DELETED_SUFFIX);
    match std::fs::rename(path, &renamed) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(PathBuf::from(renamed)),
    }
}
