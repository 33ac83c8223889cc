//! Appends through io_uring: a small raw ring per shard (the io-uring crate; glommio has
//! no vectored buffered write on a file it did not open).
//!
//! Appends staged while the shard handles a burst of produce requests are submitted
//! together; consecutive appends to the same segment file become one `writev`
//! (coalescing), so many connections producing to one partition cost one write.
//!
//! Where each writev runs: ext4 and tmpfs (kernel 6.18) have no non-blocking buffered
//! write (`pwritev2(RWF_NOWAIT)` answers EOPNOTSUPP), so io_uring hands every such write
//! to one of its worker threads: a thread hop per write, the copy done on a core where
//! the bytes are not in cache, and the shard polling for the completion. So while the
//! kernel would not throttle a writer (`writers_unthrottled`, kept by a monitor thread
//! of the server from /proc/vmstat), a ring built `with_inline_writes` writes on the
//! shard itself (pwritev: a copy into the page cache, no disk I/O), and only past that
//! point through the ring, so that dirty-page throttling blocks a kernel worker and the
//! core keeps serving. Measured in bench/README.md ("What limits produce here").
//!
//! Write-behind: the kernel's flusher writes a file's dirty pages back once the oldest
//! is `vm.dirty_expire_centisecs` old (30 s), all of them at once: at 33 MB/s into 8
//! partitions, ~1 GB every 30 s. During such a burst an append to the file being
//! written back waited 15-36 ms in its pwritev (ext4; `perf trace` of the broker), and
//! with the write on the shard so did every request of that core. So a ring built
//! `with_write_behind(n)` hands each file's written pages to writeback itself, every `n`
//! bytes, with `sync_file_range(SYNC_FILE_RANGE_WRITE)` through the ring: io_uring runs
//! it on a worker, the shard does not wait, and nothing is made durable by it (durability
//! is still the fsync mode's; RocksDB's `bytes_per_sync` is the same idea).
//!
//! Drop-behind: a ring built `with_drop_behind(n)` keeps only the `n` most recently
//! appended bytes of its shard in the page cache. Appended ranges (whole pages, at
//! least `drop_behind_range_bytes_min` each) queue in append order across the shard's
//! files; once more than `n` bytes are queued, the oldest leave the cache through
//! `fadvise(POSIX_FADV_DONTNEED)` in the ring (io_uring runs it on a worker). The page
//! cache then recycles the pages it just freed instead of growing into free memory,
//! which on a VM whose host took that memory back costs a host fault per 4 KiB: on the
//! development VM, page-cache writes at 100 MB/s ran at 2.2-2.6 GB/s of copy for the
//! first ~2.5 GB and at 85-170 MB/s after, and at 2.0-3.2 GB/s throughout with 64 MiB
//! or 2 GiB kept (bench/README.md, "Drop-behind"). The kernel skips pages still dirty,
//! under writeback, or in use by a reader, so it changes only what is cached: a
//! consumer further back than `n` reads from disk.
//!
//! Runtime-free: the server's poller calls `submit` and `reap`; nothing here waits
//! except the inline writes just described.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use io_uring::{opcode, types, IoUring};

use crate::model::{limits, TopicPartition};

/// Submission queue entries of the ring.
const ring_entries: u32 = 256;

/// Write-behind covers whole pages only: the page an append ends in is left out, since
/// the next append writes into it.
const write_behind_page_bytes: u64 = 4096;

/// user_data of write-behind requests carry this bit (writes count up from 0).
const write_behind_tag: u64 = 1 << 63;

/// How many files' write-behind and drop-behind positions are kept before those of
/// closed files are forgotten.
const write_behind_files_pruned_at: usize = 4096;

/// user_data of drop-behind requests carry this bit.
const drop_behind_tag: u64 = 1 << 62;

/// A file's appended pages join the drop-behind queue in ranges of at least this much,
/// and of at least `n / drop_behind_queue_ranges_max`, so the queue holds about that
/// many ranges (plus one per deleted file's range not yet reached) whatever `n` is.
const drop_behind_range_bytes_min: u64 = 256 * 1024;
const drop_behind_queue_ranges_max: u64 = 4096;

/// Drop-behind requests in flight per ring; past it the queue waits for the next reap.
const drop_behind_in_flight_max: usize = 4;

/// Write-behind requests in flight per ring, and per file one. sync_file_range waits
/// when the disk's queue is full, holding an io_uring worker: past these, a file's
/// pages wait for its next append (which hands over all of them since).
const write_behind_in_flight_max: usize = 4;

/// Whether a page-cache write would now go through without the kernel throttling its
/// writer (dirty pages well below its thresholds). Set by the server's writeback monitor
/// (`writers_unthrottled_from_vmstat`); false until that runs, so rings elsewhere (tests,
/// tools) always submit. One machine-wide fact: the thresholds are the kernel's, global.
pub static writers_unthrottled: AtomicBool = AtomicBool::new(false);

/// From /proc/vmstat's text (counts in pages of `page_bytes`): true while dirty plus
/// writeback pages stay `headroom_bytes` below the kernel's freerun ceiling (halfway
/// between `nr_dirty_background_threshold` and `nr_dirty_threshold`, below which
/// balance_dirty_pages never makes a writer wait). None when a counter is missing.
pub fn writers_unthrottled_from_vmstat(vmstat: &str, page_bytes: u64, headroom_bytes: u64) -> Option<bool> {
    let field =
        |name: &str| vmstat.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok());
    let dirty = field("nr_dirty")? + field("nr_writeback")?;
    let freerun = (field("nr_dirty_threshold")? + field("nr_dirty_background_threshold")?) / 2;
    Some(dirty.saturating_mul(page_bytes).saturating_add(headroom_bytes) < freerun.saturating_mul(page_bytes))
}

/// One append waiting to be written: its pieces go to consecutive file positions
/// (patched batch headers and the record bytes of the request, not copied).
pub struct StagedWrite {
    pub tp: TopicPartition,
    /// The `PartitionLog::instance` written for.
    pub log: u64,
    pub write_id: u64,
    pub file: Arc<File>,
    pub position: u64,
    pub parts: Vec<Bytes>,
}

impl StagedWrite {
    fn len(&self) -> usize {
        self.parts.iter().map(|p| p.len()).sum()
    }
}

/// Write `parts` to consecutive positions from `position`, skipping the first `skip`
/// bytes (already written).
fn write_parts_sync(file: &File, position: u64, parts: &[Bytes], mut skip: usize) -> std::io::Result<()> {
    let mut position = position;
    for part in parts {
        let from = skip.min(part.len());
        skip -= from;
        file.write_all_at(&part[from..], position + from as u64)?;
        position += part.len() as u64;
    }
    Ok(())
}

/// The iovecs of `parts`, pointing into them (valid while they live).
fn iovecs_of(parts: &[Bytes]) -> Box<[libc::iovec]> {
    parts.iter().map(|p| libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() }).collect()
}

/// One pwritev of `parts` (at most `limits::writev_iovecs_max` of them) to consecutive
/// positions from `position`; a short write (near a full disk) finishes piece by piece.
fn pwritev_parts(file: &File, position: u64, parts: &[Bytes]) -> std::io::Result<()> {
    let iovecs = iovecs_of(parts);
    let total: usize = parts.iter().map(|p| p.len()).sum();
    // SAFETY: the iovecs point into `parts`, alive and unchanged for the call.
    let n = unsafe {
        libc::pwritev(file.as_raw_fd(), iovecs.as_ptr(), iovecs.len() as libc::c_int, position as libc::off_t)
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if (n as usize) < total {
        return write_parts_sync(file, position, parts, n as usize);
    }
    Ok(())
}

/// Cut a run's pieces into writev calls the kernel accepts: at most `iovecs_max` iovecs
/// and `bytes_max` bytes each (a piece larger than `bytes_max` is sliced). Returns
/// (file position, pieces) per call, in file order; empty pieces are dropped.
fn split_for_writev(position: u64, parts: &[Bytes], iovecs_max: usize, bytes_max: usize) -> Vec<(u64, Vec<Bytes>)> {
    assert!(iovecs_max > 0 && bytes_max > 0);
    let mut chunks: Vec<(u64, Vec<Bytes>)> = Vec::new();
    let (mut at, mut current, mut current_bytes) = (position, Vec::new(), 0usize);
    let mut chunk_start = position;
    for part in parts {
        let mut rest = part.clone();
        while !rest.is_empty() {
            if current.len() == iovecs_max || current_bytes == bytes_max {
                chunks.push((chunk_start, std::mem::take(&mut current)));
                (chunk_start, current_bytes) = (at, 0);
            }
            let take = rest.len().min(bytes_max - current_bytes);
            let piece = rest.split_to(take);
            at += piece.len() as u64;
            current_bytes += piece.len();
            current.push(piece);
        }
    }
    if !current.is_empty() {
        chunks.push((chunk_start, current));
    }
    for (_, c) in &chunks {
        assert!(c.len() <= iovecs_max && c.iter().map(|p| p.len()).sum::<usize>() <= bytes_max);
    }
    chunks
}

/// Contiguous appends to one file, written by one or more writev calls (`Chunk`s).
/// Its appends complete when every chunk did; any chunk's error fails them all.
struct Run {
    writes: Vec<StagedWrite>,
    chunks_left: usize,
    error: Option<std::io::Error>,
}

/// A submitted writev: it owns its buffers and iovecs until the kernel is done.
struct Chunk {
    run: u64,
    file: Arc<File>,
    position: u64,
    parts: Vec<Bytes>,
    _iovecs: Box<[libc::iovec]>,
    total_bytes: usize,
}

/// What the ring did with one file's appended pages so far.
struct FilePages {
    /// Keeps the address (the key) from being reused while the entry is there.
    file: Weak<File>,
    /// Handed to writeback up to here (write-behind).
    handed: u64,
    /// Queued for drop-behind up to here (a page boundary).
    queued: u64,
}

/// The outcome of one append's write.
pub struct Completed {
    pub tp: TopicPartition,
    pub log: u64,
    pub write_id: u64,
    pub result: std::io::Result<()>,
}

pub struct AppendRing {
    ring: IoUring,
    staged: Vec<StagedWrite>,
    runs: HashMap<u64, Run>,
    in_flight: HashMap<u64, Chunk>,
    next_user_data: u64,
    next_run: u64,
    /// The most iovecs and bytes one writev carries (the kernel's IOV_MAX and
    /// MAX_RW_COUNT; smaller in tests).
    iovecs_max: usize,
    bytes_max: usize,
    /// Write on the caller's thread while `writers_unthrottled` says so.
    inline_writes: bool,
    /// Hand a file's written pages to writeback every this many bytes (0: never; the
    /// module doc).
    write_behind_bytes: u64,
    /// Per file (by its `Arc`'s address): how far its pages were handed to writeback and
    /// queued for drop-behind.
    files: HashMap<usize, FilePages>,
    /// Write-behind requests in io_uring, holding their files open until reaped.
    syncs_in_flight: HashMap<u64, Arc<File>>,
    /// Write-behind requests submitted since start.
    pub write_behind_calls: u64,
    /// Keep this many of the most recently appended bytes cached (0: all; module doc).
    drop_behind_bytes: u64,
    /// Appended ranges still cached, oldest first, and their total.
    drop_queue: VecDeque<(Weak<File>, u64, u64)>,
    drop_queued_bytes: u64,
    /// Drop-behind requests in io_uring, holding their files open until reaped.
    drops_in_flight: HashMap<u64, Arc<File>>,
    /// Drop-behind requests submitted since start, and the bytes they covered.
    pub drop_behind_calls: u64,
    pub drop_behind_bytes_total: u64,
    /// Appends written since start, and the writev calls that carried them (through the
    /// ring or on the shard); `writes_inline` of those on the shard.
    pub appends_written: u64,
    pub writes_submitted: u64,
    pub writes_inline: u64,
}

impl AppendRing {
    pub fn new() -> std::io::Result<Self> {
        Self::with_writev_limits(limits::writev_iovecs_max, limits::writev_bytes_max)
    }

    /// A ring whose writev calls carry at most `iovecs_max` iovecs and `bytes_max` bytes
    /// (tests use small values to exercise the splitting).
    pub fn with_writev_limits(iovecs_max: usize, bytes_max: usize) -> std::io::Result<Self> {
        assert!((1..=limits::writev_iovecs_max).contains(&iovecs_max));
        assert!((1..=limits::writev_bytes_max).contains(&bytes_max));
        Ok(Self {
            ring: IoUring::new(ring_entries)?,
            staged: Vec::new(),
            runs: HashMap::new(),
            in_flight: HashMap::new(),
            next_user_data: 0,
            next_run: 0,
            iovecs_max,
            bytes_max,
            inline_writes: false,
            write_behind_bytes: 0,
            files: HashMap::new(),
            syncs_in_flight: HashMap::new(),
            write_behind_calls: 0,
            drop_behind_bytes: 0,
            drop_queue: VecDeque::new(),
            drop_queued_bytes: 0,
            drops_in_flight: HashMap::new(),
            drop_behind_calls: 0,
            drop_behind_bytes_total: 0,
            appends_written: 0,
            writes_submitted: 0,
            writes_inline: 0,
        })
    }

    /// Write on the shard while the kernel would not throttle writers (the module doc).
    pub fn with_inline_writes(mut self, on: bool) -> Self {
        self.inline_writes = on;
        self
    }

    /// Hand each file's written pages to writeback every `bytes` (0: never).
    pub fn with_write_behind(mut self, bytes: u64) -> Self {
        self.write_behind_bytes = bytes;
        self
    }

    /// Keep only the `bytes` most recently appended bytes in the page cache (0: all).
    pub fn with_drop_behind(mut self, bytes: u64) -> Self {
        self.drop_behind_bytes = bytes;
        self
    }

    pub fn stage(&mut self, write: StagedWrite) {
        self.staged.push(write);
    }

    pub fn is_idle(&self) -> bool {
        self.staged.is_empty() && self.in_flight.is_empty() && !self.has_background_in_flight()
    }

    /// Appends in flight in io_uring (write-behind requests not counted).
    pub fn has_in_flight(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Write-behind or drop-behind requests in flight in io_uring: nothing waits on them.
    pub fn has_background_in_flight(&self) -> bool {
        !self.syncs_in_flight.is_empty() || !self.drops_in_flight.is_empty()
    }

    /// Whether more than the drop-behind budget is queued (still to be dropped).
    fn drop_behind_waiting(&self) -> bool {
        self.drop_behind_bytes > 0 && self.drop_queued_bytes > self.drop_behind_bytes
    }

    /// Submit everything staged, merging contiguous appends to the same file, each run
    /// cut into writev calls within the kernel's limits. Chunks are written on this
    /// thread while inline writes are on and the kernel would not throttle them, and
    /// when they find the submission queue full (rare: the queue is as deep as a burst
    /// of appends is long); appends finished that way are returned at once.
    pub fn submit(&mut self) -> Vec<Completed> {
        let mut done = Vec::new();
        if self.staged.is_empty() {
            return done;
        }
        let inline = self.inline_writes && writers_unthrottled.load(Ordering::Relaxed);
        let mut staged = std::mem::take(&mut self.staged);
        // Group by file, keeping each file's appends in offset order.
        staged.sort_by_key(|w| Arc::as_ptr(&w.file) as usize);
        let mut runs: Vec<Vec<StagedWrite>> = Vec::new();
        for w in staged {
            match runs.last_mut() {
                Some(run)
                    if Arc::ptr_eq(&run[0].file, &w.file)
                        && run.last().map(|l| l.position + l.len() as u64) == Some(w.position) =>
                {
                    run.push(w)
                }
                _ => runs.push(vec![w]),
            }
        }
        for writes in runs {
            let file = writes[0].file.clone();
            let parts: Vec<Bytes> = writes.iter().flat_map(|w| w.parts.iter().cloned()).collect();
            let chunks = split_for_writev(writes[0].position, &parts, self.iovecs_max, self.bytes_max);
            let run = self.next_run;
            self.next_run += 1;
            self.runs.insert(run, Run { writes, chunks_left: chunks.len(), error: None });
            if chunks.is_empty() {
                self.finish_chunk(run, Ok(()), &mut done); // nothing but empty pieces
                continue;
            }
            for (position, parts) in chunks {
                if inline {
                    self.writes_submitted += 1;
                    self.writes_inline += 1;
                    let result = pwritev_parts(&file, position, &parts);
                    self.finish_chunk(run, result, &mut done);
                    continue;
                }
                let iovecs = iovecs_of(&parts);
                let total_bytes = parts.iter().map(|p| p.len()).sum();
                let user_data = self.next_user_data;
                self.next_user_data += 1;
                let sqe = opcode::Writev::new(types::Fd(file.as_raw_fd()), iovecs.as_ptr(), iovecs.len() as u32)
                    .offset(position)
                    .build()
                    .user_data(user_data);
                // SAFETY: the iovecs and the buffers they point to are owned by the Chunk
                // stored below, which lives until this user_data's completion is reaped.
                let pushed = unsafe { self.ring.submission().push(&sqe) }.is_ok() || {
                    let _ = self.ring.submit();
                    unsafe { self.ring.submission().push(&sqe) }.is_ok()
                };
                if pushed {
                    self.writes_submitted += 1;
                    let chunk = Chunk { run, file: file.clone(), position, parts, _iovecs: iovecs, total_bytes };
                    self.in_flight.insert(user_data, chunk);
                } else {
                    let result = write_parts_sync(&file, position, &parts, 0);
                    self.finish_chunk(run, result, &mut done);
                }
            }
        }
        if let Err(e) = self.ring.submit() {
            tracing::warn!(error = %e, "io_uring submit failed; will retry");
        }
        done
    }

    /// One chunk of `run` finished with `result`; when it was the last, every append of
    /// the run is done (with the first error any chunk had).
    fn finish_chunk(&mut self, run: u64, result: std::io::Result<()>, done: &mut Vec<Completed>) {
        let Some(r) = self.runs.get_mut(&run) else {
            tracing::error!(run, "completion for an unknown append run");
            return;
        };
        if let Err(e) = result {
            r.error.get_or_insert(e);
        }
        r.chunks_left = r.chunks_left.saturating_sub(1);
        if r.chunks_left > 0 {
            return;
        }
        let Some(r) = self.runs.remove(&run) else { return };
        if r.error.is_none() {
            if let Some(last) = r.writes.last() {
                let end = last.position + last.len() as u64;
                self.write_behind_after(&last.file, end);
                self.drop_behind_after(&last.file, end);
            }
        }
        for w in r.writes {
            self.appends_written += 1;
            // Each append gets its own copy of the run's error, with its OS error code (a
            // log tells a failed disk from a full one by it).
            let result = match &r.error {
                Some(e) => Err(match e.raw_os_error() {
                    Some(code) => std::io::Error::from_raw_os_error(code),
                    None => std::io::Error::new(e.kind(), e.to_string()),
                }),
                None => Ok(()),
            };
            done.push(Completed { tp: w.tp, log: w.log, write_id: w.write_id, result });
        }
    }

    /// `file` is written up to `end`: once `write_behind_bytes` of whole pages past what
    /// was handed to writeback before are there, hand them over (submitted with the next
    /// `ring.submit`).
    fn write_behind_after(&mut self, file: &Arc<File>, end: u64) {
        if self.write_behind_bytes == 0 {
            return;
        }
        let from = self.file_pages(file).handed;
        let upto = end / write_behind_page_bytes * write_behind_page_bytes;
        if upto < from.saturating_add(self.write_behind_bytes)
            || self.syncs_in_flight.len() >= write_behind_in_flight_max
            || self.syncs_in_flight.values().any(|f| Arc::ptr_eq(f, file))
        {
            return;
        }
        let len = (upto - from).min(u32::MAX as u64 / write_behind_page_bytes * write_behind_page_bytes);
        let user_data = write_behind_tag | self.next_user_data;
        self.next_user_data += 1;
        let sqe = opcode::SyncFileRange::new(types::Fd(file.as_raw_fd()), len as u32)
            .offset(from)
            .flags(libc::SYNC_FILE_RANGE_WRITE)
            .build()
            .user_data(user_data);
        // SAFETY: the request points at no memory; its file is held until it is reaped.
        if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
            self.file_pages(file).handed = from + len;
            self.write_behind_calls += 1;
            self.syncs_in_flight.insert(user_data, file.clone());
        } // else the queue is full: the next append's run tries again
    }

    /// This ring's record of `file`, made on first use.
    fn file_pages(&mut self, file: &Arc<File>) -> &mut FilePages {
        let key = Arc::as_ptr(file) as usize;
        if !self.files.contains_key(&key) && self.files.len() >= write_behind_files_pruned_at {
            self.files.retain(|_, p| p.file.strong_count() > 0);
        }
        // The Weak keeps the address from being reused while the entry is there, so a
        // live file's key is its own.
        self.files.entry(key).or_insert_with(|| FilePages { file: Arc::downgrade(file), handed: 0, queued: 0 })
    }

    /// `file` is written up to `end`: queue its whole pages appended since the last
    /// range (once there are `drop_behind_range_bytes_min` of them), then drop the oldest
    /// ranges while more than `drop_behind_bytes` are queued.
    fn drop_behind_after(&mut self, file: &Arc<File>, end: u64) {
        if self.drop_behind_bytes == 0 {
            return;
        }
        let range_min = (self.drop_behind_bytes / drop_behind_queue_ranges_max).max(drop_behind_range_bytes_min);
        let pages = self.file_pages(file);
        let from = pages.queued;
        let upto = end / write_behind_page_bytes * write_behind_page_bytes;
        if upto >= from.saturating_add(range_min) {
            pages.queued = upto;
            self.drop_queue.push_back((Arc::downgrade(file), from, upto));
            self.drop_queued_bytes += upto - from;
        }
        self.submit_drops();
    }

    /// Drop the oldest queued ranges from the page cache while the queue holds more than
    /// `drop_behind_bytes` (submitted with the next `ring.submit`). A range of a file
    /// since deleted needs nothing.
    fn submit_drops(&mut self) {
        while self.drop_behind_waiting() && self.drops_in_flight.len() < drop_behind_in_flight_max {
            let Some((weak, from, upto)) = self.drop_queue.pop_front() else { break };
            let Some(file) = weak.upgrade() else {
                self.drop_queued_bytes -= upto - from;
                continue;
            };
            let len = (upto - from).min(i32::MAX as u64 / write_behind_page_bytes * write_behind_page_bytes);
            let user_data = drop_behind_tag | self.next_user_data;
            self.next_user_data += 1;
            let sqe = opcode::Fadvise::new(types::Fd(file.as_raw_fd()), len as libc::off_t, libc::POSIX_FADV_DONTNEED)
                .offset(from)
                .build()
                .user_data(user_data);
            // SAFETY: the request points at no memory; its file is held until it is reaped.
            if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                self.drop_queue.push_front((weak, from, upto)); // queue full: next time
                break;
            }
            if len < upto - from {
                self.drop_queue.push_front((weak, from + len, upto));
            }
            self.drop_queued_bytes -= len;
            self.drop_behind_calls += 1;
            self.drop_behind_bytes_total += len;
            self.drops_in_flight.insert(user_data, file);
        }
    }

    /// How far `file`'s pages were handed to writeback (tests).
    #[cfg(test)]
    fn write_behind_position(&self, file: &Arc<File>) -> Option<u64> {
        self.files.get(&(Arc::as_ptr(file) as usize)).map(|p| p.handed)
    }

    /// Collect finished writes. A short write is finished synchronously (it only
    /// happens near a full disk, where the retry then reports the error).
    pub fn reap(&mut self) -> Vec<Completed> {
        let mut done = Vec::new();
        let background_calls = self.write_behind_calls + self.drop_behind_calls;
        let cqes: Vec<(u64, i32)> = self.ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (user_data, res) in cqes {
            if user_data & write_behind_tag != 0 {
                if self.syncs_in_flight.remove(&user_data).is_some() && res < 0 {
                    let error = std::io::Error::from_raw_os_error(-res);
                    tracing::debug!(%error, "write-behind sync_file_range failed (the flusher writes those pages)");
                }
                continue;
            }
            if user_data & drop_behind_tag != 0 {
                if self.drops_in_flight.remove(&user_data).is_some() && res < 0 {
                    let error = std::io::Error::from_raw_os_error(-res);
                    tracing::debug!(%error, "drop-behind fadvise failed (the kernel reclaims those pages)");
                }
                continue;
            }
            let Some(chunk) = self.in_flight.remove(&user_data) else {
                tracing::error!(user_data, "completion for an unknown append write");
                continue;
            };
            let result = if res < 0 {
                Err(std::io::Error::from_raw_os_error(-res))
            } else if (res as usize) < chunk.total_bytes {
                tracing::warn!(
                    written = res,
                    total = chunk.total_bytes,
                    "short append write; finishing it synchronously"
                );
                write_parts_sync(&chunk.file, chunk.position, &chunk.parts, res as usize)
            } else {
                Ok(())
            };
            self.finish_chunk(chunk.run, result, &mut done);
        }
        self.submit_drops(); // ranges the in-flight limit held back
        if self.write_behind_calls + self.drop_behind_calls != background_calls {
            if let Err(e) = self.ring.submit() {
                tracing::warn!(error = %e, "io_uring submit failed; will retry");
            }
        }
        done
    }

    /// Block until every submitted write completed (shutdown only).
    pub fn drain_blocking(&mut self) -> Vec<Completed> {
        let mut done = self.submit();
        while !self.in_flight.is_empty() {
            if let Err(e) = self.ring.submit_and_wait(1) {
                tracing::error!(error = %e, "io_uring wait failed during shutdown");
                break;
            }
            done.extend(self.reap());
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A write of `parts` at `position` of `file`, for log instance 0.
    fn staged(tp: &TopicPartition, write_id: u64, file: &Arc<File>, position: u64, parts: Vec<Bytes>) -> StagedWrite {
        StagedWrite { tp: tp.clone(), log: 0, write_id, file: file.clone(), position, parts }
    }

    #[test]
    fn contiguous_appends_coalesce_into_one_writev_and_land_in_order() {
        let mut ring = AppendRing::new().unwrap();
        let file = Arc::new(tempfile::tempfile().unwrap());
        let other = Arc::new(tempfile::tempfile().unwrap());
        let tp = TopicPartition::new("t", 0);
        let mut pos = 0;
        for i in 0..10u8 {
            let bytes = vec![i; 100 + i as usize];
            let len = bytes.len() as u64;
            // Two parts, as a patched header and the rest of a batch.
            let parts = vec![Bytes::copy_from_slice(&bytes[..7]), Bytes::copy_from_slice(&bytes[7..])];
            ring.stage(staged(&tp, i as u64, &file, pos, parts));
            ring.stage(staged(&tp, 100 + i as u64, &other, i as u64 * 10, vec![Bytes::from(vec![9; 10])]));
            pos += len;
        }
        let mut done = ring.submit();
        while ring.has_in_flight() {
            done.extend(ring.reap());
        }
        assert_eq!(done.len(), 20);
        assert!(done.iter().all(|c| c.result.is_ok()));
        assert_eq!(ring.writes_submitted, 2, "one writev per file");
        let mut content = Vec::new();
        (&*file).read_to_end(&mut content).unwrap();
        let expected: Vec<u8> = (0..10u8).flat_map(|i| vec![i; 100 + i as usize]).collect();
        assert_eq!(content, expected);
    }

    /// While the kernel would not throttle writers, a ring with inline writes finishes
    /// every append at submit (nothing left in io_uring), coalesced as through the ring;
    /// with the gate closed the same ring submits to io_uring. (The gate is process-wide:
    /// only this test opens it, and only rings built `with_inline_writes` read it.)
    #[test]
    fn inline_writes_finish_at_submit_while_writers_are_unthrottled() {
        let mut ring = AppendRing::new().unwrap().with_inline_writes(true);
        let file = Arc::new(tempfile::tempfile().unwrap());
        let tp = TopicPartition::new("t", 0);
        let mut expected = Vec::new();
        let mut pos = 0u64;
        let mut stage_some = |ring: &mut AppendRing, first_id: u64| {
            for i in 0..5u8 {
                let parts = vec![Bytes::from(vec![i; 61]), Bytes::from(vec![i ^ 0x5a; 1000 + i as usize])];
                for p in &parts {
                    expected.extend_from_slice(p);
                }
                let len = parts.iter().map(|p| p.len() as u64).sum::<u64>();
                ring.stage(staged(&tp, first_id + i as u64, &file, pos, parts));
                pos += len;
            }
        };
        writers_unthrottled.store(true, Ordering::Relaxed);
        stage_some(&mut ring, 0);
        let done = ring.submit();
        assert_eq!(done.len(), 5, "every append finished at submit");
        assert!(done.iter().all(|c| c.result.is_ok()));
        assert!(!ring.has_in_flight());
        assert_eq!((ring.writes_submitted, ring.writes_inline), (1, 1), "one pwritev for the run");
        writers_unthrottled.store(false, Ordering::Relaxed);
        stage_some(&mut ring, 5);
        let submitted = ring.submit();
        assert!(submitted.is_empty() && ring.has_in_flight(), "written through io_uring");
        let done = drain(&mut ring, submitted);
        assert_eq!(done.len(), 5);
        assert_eq!((ring.writes_submitted, ring.writes_inline), (2, 1), "the second run went through io_uring");
        let mut content = Vec::new();
        (&*file).read_to_end(&mut content).unwrap();
        assert_eq!(content, expected);
    }

    #[test]
    fn writers_are_unthrottled_below_the_freerun_ceiling_less_the_headroom() {
        // Thresholds of 1,000 and 500 pages: the freerun ceiling is 750 pages.
        let vmstat = |dirty: u64, writeback: u64| {
            format!(
                "nr_free_pages 5\nnr_dirty {dirty}\nnr_writeback {writeback}\nnr_writeback_temp 0\n\
                 nr_dirty_threshold 1000\nnr_dirty_background_threshold 500\n"
            )
        };
        let headroom = 100 * 4096;
        assert_eq!(writers_unthrottled_from_vmstat(&vmstat(0, 0), 4096, headroom), Some(true));
        assert_eq!(writers_unthrottled_from_vmstat(&vmstat(600, 49), 4096, headroom), Some(true));
        assert_eq!(
            writers_unthrottled_from_vmstat(&vmstat(600, 50), 4096, headroom),
            Some(false),
            "writeback counts too"
        );
        assert_eq!(writers_unthrottled_from_vmstat(&vmstat(2000, 0), 4096, headroom), Some(false));
        assert_eq!(writers_unthrottled_from_vmstat("nr_dirty 1\nnr_writeback 0\n", 4096, headroom), None);
        // nr_dirty is not read from nr_dirty_threshold's line.
        assert_eq!(
            writers_unthrottled_from_vmstat("nr_dirty_threshold 1000\nnr_dirty_background_threshold 500\n", 4096, 0),
            None
        );
    }

    fn drain(ring: &mut AppendRing, mut done: Vec<Completed>) -> Vec<Completed> {
        while ring.has_in_flight() {
            done.extend(ring.reap());
        }
        done
    }

    /// One append of 1,500 batches (a header and a body each: 3,000 pieces) used to be
    /// one writev of 3,000 iovecs, which Linux refuses (EINVAL, IOV_MAX is 1024) and
    /// which took the partition offline. It goes out as several writev calls now.
    #[test]
    fn an_append_with_more_pieces_than_iov_max_is_split_and_lands_whole() {
        let mut ring = AppendRing::new().unwrap();
        let file = Arc::new(tempfile::tempfile().unwrap());
        let tp = TopicPartition::new("t", 0);
        let mut parts = Vec::new();
        let mut expected = Vec::new();
        for i in 0..1_500u32 {
            let header = i.to_be_bytes().repeat(3);
            let body = vec![(i % 251) as u8; 1 + (i % 7) as usize];
            expected.extend_from_slice(&header);
            expected.extend_from_slice(&body);
            parts.push(Bytes::from(header));
            parts.push(Bytes::from(body));
        }
        assert!(parts.len() > limits::writev_iovecs_max);
        ring.stage(staged(&tp, 7, &file, 0, parts));
        let submitted = ring.submit();
        let done = drain(&mut ring, submitted);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].write_id, 7);
        assert!(done[0].result.is_ok(), "{:?}", done[0].result.as_ref().err());
        assert_eq!(ring.writes_submitted, 3, "3,000 iovecs in writev calls of at most 1,024");
        let mut content = Vec::new();
        (&*file).read_to_end(&mut content).unwrap();
        assert_eq!(content, expected);
    }

    #[test]
    fn runs_are_split_by_bytes_too_and_complete_once_every_chunk_did() {
        // Tiny limits: 3 iovecs and 10 bytes a writev.
        let mut ring = AppendRing::with_writev_limits(3, 10).unwrap();
        let file = Arc::new(tempfile::tempfile().unwrap());
        let tp = TopicPartition::new("t", 0);
        let mut expected = Vec::new();
        let mut pos = 0u64;
        for i in 0..20u8 {
            let parts: Vec<Bytes> =
                vec![Bytes::from(vec![i; 1 + i as usize % 4]), Bytes::new(), Bytes::from(vec![i ^ 0xff; 25])];
            for p in &parts {
                expected.extend_from_slice(p);
            }
            let len = parts.iter().map(|p| p.len() as u64).sum::<u64>();
            ring.stage(staged(&tp, i as u64, &file, pos, parts));
            pos += len;
        }
        let submitted = ring.submit();
        let done = drain(&mut ring, submitted);
        let mut ids: Vec<u64> = done.iter().map(|c| c.write_id).collect();
        ids.sort();
        assert_eq!(ids, (0..20).collect::<Vec<_>>(), "every append reported exactly once");
        assert!(done.iter().all(|c| c.result.is_ok()));
        assert!(ring.writes_submitted >= expected.len() as u64 / 10);
        assert!(ring.is_idle());
        let mut content = Vec::new();
        (&*file).read_to_end(&mut content).unwrap();
        assert_eq!(content, expected);
    }

    #[test]
    fn split_for_writev_keeps_order_positions_and_limits() {
        let parts: Vec<Bytes> = (0..50u8).map(|i| Bytes::from(vec![i; i as usize])).collect();
        for (iovecs_max, bytes_max) in [(1, 1), (1, 1000), (4, 7), (1024, 100), (1024, 1 << 20)] {
            let chunks = split_for_writev(100, &parts, iovecs_max, bytes_max);
            let mut at = 100u64;
            let mut joined = Vec::new();
            for (position, c) in &chunks {
                assert_eq!(*position, at, "chunks follow each other");
                assert!(c.len() <= iovecs_max);
                assert!(c.iter().map(|p| p.len()).sum::<usize>() <= bytes_max);
                assert!(c.iter().all(|p| !p.is_empty()));
                for p in c {
                    joined.extend_from_slice(p);
                    at += p.len() as u64;
                }
            }
            assert_eq!(joined, parts.concat());
        }
    }

    /// Write `sizes` one append after another to `file` from position `from`, each its
    /// own submit (as produce requests arrive), waiting after each until the ring is
    /// idle, write-behind included.
    fn append_each(ring: &mut AppendRing, file: &Arc<File>, from: u64, sizes: &[usize]) -> (Vec<Completed>, Vec<u8>) {
        let tp = TopicPartition::new("t", 0);
        let (mut done, mut expected, mut pos) = (Vec::new(), Vec::new(), from);
        for (i, &len) in sizes.iter().enumerate() {
            let bytes = vec![i as u8; len];
            ring.stage(staged(&tp, i as u64, file, pos, vec![Bytes::copy_from_slice(&bytes)]));
            expected.extend_from_slice(&bytes);
            pos += len as u64;
            done.extend(ring.submit());
            while !ring.is_idle() {
                done.extend(ring.reap());
            }
        }
        (done, expected)
    }

    /// Write-behind hands a file's whole pages to writeback each time another
    /// `write_behind_bytes` of them are written, never the page the last append ends in,
    /// and does not change what appends report or what the file holds.
    #[test]
    fn write_behind_hands_over_whole_written_pages_every_n_bytes() {
        let n = 64 * 1024u64;
        let mut ring = AppendRing::new().unwrap().with_write_behind(n);
        let file = Arc::new(tempfile::tempfile().unwrap());
        let sizes: Vec<usize> = (0..40).map(|i| 10_000 + i * 37).collect();
        let (done, expected) = append_each(&mut ring, &file, 0, &sizes);
        // The same decisions, worked out from the sizes alone.
        let (mut end, mut handed, mut calls) = (0u64, 0u64, 0u64);
        for &len in &sizes {
            end += len as u64;
            let whole = end / 4096 * 4096;
            if whole >= handed + n {
                (handed, calls) = (whole, calls + 1);
            }
        }
        assert!(calls >= 5, "the sizes cross the threshold several times: {calls}");
        assert_eq!(ring.write_behind_calls, calls);
        assert_eq!(ring.write_behind_position(&file), Some(handed));
        assert!(handed <= end / 4096 * 4096, "never past the last whole page");
        assert_eq!(done.len(), sizes.len(), "write-behind completions are not appends");
        assert!(done.iter().all(|c| c.result.is_ok()));
        let mut content = Vec::new();
        (&*file).read_to_end(&mut content).unwrap();
        assert_eq!(content, expected);
    }

    #[test]
    fn write_behind_is_off_unless_asked_for_and_below_its_threshold() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        let mut ring = AppendRing::new().unwrap();
        append_each(&mut ring, &file, 0, &[300_000, 300_000]);
        assert_eq!(ring.write_behind_calls, 0);
        let file = Arc::new(tempfile::tempfile().unwrap());
        let mut ring = AppendRing::new().unwrap().with_write_behind(1 << 20);
        append_each(&mut ring, &file, 0, &[300_000, 300_000, 300_000]);
        assert_eq!(ring.write_behind_calls, 0, "900,000 bytes: under 1 MiB");
        append_each(&mut ring, &file, 900_000, &[300_000]);
        assert_eq!(ring.write_behind_calls, 1);
        assert_eq!(ring.write_behind_position(&file), Some(1_200_000 / 4096 * 4096));
    }

    /// Drop-behind queues each file's whole appended pages in append order, in ranges of
    /// at least `drop_behind_range_bytes_min`, and drops the oldest while more than its
    /// budget is queued, across files; appends and the files' contents are unchanged.
    #[test]
    fn drop_behind_drops_the_oldest_appended_ranges_past_its_budget() {
        let budget = 1u64 << 20;
        let mut ring = AppendRing::new().unwrap().with_drop_behind(budget);
        let files = [Arc::new(tempfile::tempfile().unwrap()), Arc::new(tempfile::tempfile().unwrap())];
        let sizes: Vec<usize> = (0..60).map(|i| 50_000 + i * 911).collect();
        // The model: the same decisions worked out from the sizes alone.
        let (mut ends, mut queued) = ([0u64; 2], [0u64; 2]);
        let (mut queue, mut queued_total, mut calls, mut bytes) = (VecDeque::new(), 0u64, 0u64, 0u64);
        let mut done = 0;
        for (i, &len) in sizes.iter().enumerate() {
            let f = i % 3 % 2; // two appends to one file, one to the other
            done += append_each(&mut ring, &files[f], ends[f], &[len]).0.len();
            ends[f] += len as u64;
            let whole = ends[f] / 4096 * 4096;
            if whole >= queued[f] + drop_behind_range_bytes_min {
                queue.push_back(whole - queued[f]);
                queued_total += whole - queued[f];
                queued[f] = whole;
            }
            while queued_total > budget {
                let r = queue.pop_front().unwrap();
                (queued_total, calls, bytes) = (queued_total - r, calls + 1, bytes + r);
            }
        }
        assert!(calls >= 5, "the appends pass the budget several times: {calls}");
        assert_eq!((ring.drop_behind_calls, ring.drop_behind_bytes_total), (calls, bytes));
        assert_eq!(ring.write_behind_calls, 0, "drop-behind alone hands nothing to writeback");
        assert_eq!(done, sizes.len(), "drop-behind completions are not appends");
        for (f, file) in files.iter().enumerate() {
            let mut content = Vec::new();
            (&**file).read_to_end(&mut content).unwrap();
            assert_eq!(content.len() as u64, ends[f]);
            assert!(content.iter().all(|&b| b == 0), "append_each writes zeros for a one-append list");
        }
    }

    /// Pages of `file` in the page cache among the `len` bytes from 0.
    fn resident_pages(file: &File, len: usize) -> usize {
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(file) }.unwrap();
        let mut pages = vec![0u8; len.div_ceil(4096)];
        // SAFETY: the mapping is `len` bytes long and `pages` has a byte per page of it.
        let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, pages.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        pages.iter().filter(|&&p| p & 1 != 0).count()
    }

    /// What drop-behind asks for happens: appended pages past the budget, once written
    /// back, leave the page cache, and the newest stay.
    #[test]
    fn drop_behind_leaves_written_back_pages_out_of_the_page_cache() {
        let on_tmpfs = |dir: &std::path::Path| {
            let mut fs = unsafe { std::mem::zeroed::<libc::statfs>() };
            let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
            assert_eq!(unsafe { libc::statfs(path.as_ptr(), &mut fs) }, 0);
            fs.f_type == libc::TMPFS_MAGIC
        };
        // tmpfs pages cannot be dropped by fadvise: where the temporary directory is on
        // one, the build's target directory (a real disk on every CI machine) serves.
        let mut dir = tempfile::tempdir().unwrap();
        if on_tmpfs(dir.path()) {
            let target = concat!(env!("CARGO_MANIFEST_DIR"), "/target");
            std::fs::create_dir_all(target).unwrap();
            dir = tempfile::tempdir_in(target).unwrap();
        }
        if on_tmpfs(dir.path()) {
            // A skip that CI would report as a pass: under CI=true it fails instead.
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(!ci, "the temporary directory and target/ are both on tmpfs, whose pages fadvise cannot drop");
            eprintln!("skipped: the temporary directory and target/ are on tmpfs, whose pages fadvise cannot drop");
            return;
        }
        let open = |name: &str| {
            let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(dir.path().join(name));
            Arc::new(f.unwrap())
        };
        let mib = 1usize << 20;
        let mut ring = AppendRing::new().unwrap().with_drop_behind(mib as u64);
        let (a, b) = (open("a"), open("b"));
        append_each(&mut ring, &a, 0, &[mib / 2, mib / 2]);
        assert_eq!(ring.drop_behind_calls, 0, "1 MiB queued: within the budget");
        a.sync_data().unwrap();
        assert_eq!(resident_pages(&a, mib), 256, "just written");
        let (_, expected) = append_each(&mut ring, &b, 0, &[mib / 2, mib / 2]);
        assert_eq!(ring.drop_behind_calls, 2, "a's two ranges are the oldest past the budget");
        assert_eq!(resident_pages(&a, mib), 0, "a was written back, so its pages could go");
        assert_eq!(resident_pages(&b, mib), 256, "b is the newest 1 MiB");
        let mut content = Vec::new();
        (&*a).read_to_end(&mut content).unwrap();
        assert_eq!(content, expected, "a reads back from disk (the same sizes, the same bytes)");
    }

    /// The queue's ranges grow with the budget, so its length stays bounded: at 4 GiB a
    /// range is at least 1 MiB.
    #[test]
    fn drop_behind_ranges_are_at_least_a_4096th_of_the_budget() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        let mut ring = AppendRing::new().unwrap().with_drop_behind(4 << 30);
        append_each(&mut ring, &file, 0, &[300_000, 300_000, 300_000]);
        assert_eq!(ring.drop_queue.len(), 0, "900,000 bytes: under 1 MiB");
        append_each(&mut ring, &file, 900_000, &[300_000]);
        assert_eq!(ring.drop_queue.len(), 1);
        assert_eq!(ring.drop_queued_bytes, 1_200_000 / 4096 * 4096);
        assert_eq!(ring.drop_behind_calls, 0, "far below the budget");
    }
}
