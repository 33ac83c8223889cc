//! Free space on the data dir's file system (issue 16: a full disk degrades, it does not
//! stop). One per process, shared by every shard. Also the writeback monitor
//! (`spawn_writeback_monitor`), which tells the append rings whether the kernel would
//! throttle a page-cache writer now.
//!
//! A std thread reads `statvfs` every `disk_check_interval_ms` (never a data core); the
//! produce path reads two atomics. Below the threshold (the larger of
//! `disk.free.min.bytes` and `disk.free.min.percent` of the file system) produce is
//! refused with a retriable error; fetches, groups (their commits use the headroom the
//! threshold keeps) and admin requests go on. Between two reads the free space is
//! estimated as the last reading minus what produce appended since, so a fast producer
//! cannot run past the threshold in the second between checks. Space freed by retention
//! or a topic deletion is seen at the next reading and produce resumes by itself.
//!
//! The metadata reserve (`<data-dir>/spate-meta/reserve`, `metadata_reserve_bytes_min`
//! or twice the metadata store, allocated with fallocate): held while the disk has room,
//! deleted once free space falls below the reserve's own size (the disk is full for
//! real: something other than produce filled it), at startup too, so the writes that
//! startup and admin requests need (metadata store, leader epoch and recovery point
//! checkpoints) find space. It is allocated again once free space is back above the
//! threshold plus twice its size. A disk that fills again after the release has no
//! reserve left until space is freed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::BrokerConfig;
use crate::model::limits;

/// The reserve's file name in `spate-meta/`.
const RESERVE_FILE: &str = "reserve";

pub struct DiskSpace {
    data_dir: PathBuf,
    min_bytes: u64,
    min_percent: u32,
    /// The last statvfs reading minus the bytes appended since.
    free_bytes: AtomicU64,
    /// Free space below this refuses produce (0: never).
    threshold_bytes: AtomicU64,
    /// Whether the last reading was below the threshold (for log lines on transitions).
    was_full: AtomicBool,
    /// The file system's size at the last reading (0: not read yet).
    total_bytes: AtomicU64,
}

/// Bytes available to the broker and the file system's size.
fn statvfs(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in the data dir path"))?;
    // SAFETY: a valid C string and a zeroed out-parameter of the right type.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * unit, st.f_blocks as u64 * unit))
}

/// The threshold for a file system of `total_bytes`.
pub fn threshold_bytes(min_bytes: u64, min_percent: u32, total_bytes: u64) -> u64 {
    min_bytes.max(total_bytes / 100 * min_percent as u64)
}

impl DiskSpace {
    pub fn new(config: &BrokerConfig) -> Arc<Self> {
        Arc::new(DiskSpace {
            data_dir: config.data_dir.clone(),
            min_bytes: config.disk_free_min_bytes,
            min_percent: config.disk_free_min_percent,
            free_bytes: AtomicU64::new(u64::MAX),
            threshold_bytes: AtomicU64::new(0),
            was_full: AtomicBool::new(false),
            total_bytes: AtomicU64::new(0),
        })
    }

    /// Why produce is refused now, if it is.
    pub fn produce_refusal(&self) -> Option<String> {
        let (free, threshold) = (self.free_bytes.load(Ordering::Relaxed), self.threshold_bytes.load(Ordering::Relaxed));
        (free < threshold).then(|| {
            format!(
                "disk nearly full: {free} bytes free, below the {threshold} bytes kept free \
                 (disk-free-min-bytes / disk-free-min-percent); produce resumes once space is freed"
            )
        })
    }

    /// (usable bytes, file system bytes) of the data dir's file system, as last read
    /// (usable: the reading minus what was appended since); None before the first
    /// reading. No syscall: what DescribeLogDirs answers.
    pub fn space(&self) -> Option<(u64, u64)> {
        let total = self.total_bytes.load(Ordering::Relaxed);
        (total > 0).then(|| (self.free_bytes.load(Ordering::Relaxed).min(total), total))
    }

    /// Produce appended `bytes`.
    pub fn note_appended(&self, bytes: u64) {
        let _ = self.free_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| Some(f.saturating_sub(bytes)));
    }

    fn reserve_path(&self) -> PathBuf {
        self.data_dir.join("spate-meta").join(RESERVE_FILE)
    }

    fn reserve_bytes(&self) -> u64 {
        let store = std::fs::metadata(self.data_dir.join("spate-meta").join("znodes.json")).map_or(0, |m| m.len());
        limits::metadata_reserve_bytes_min.max(2 * store)
    }

    /// Read the free space, refuse or resume produce, release or take the reserve.
    pub fn refresh(&self) -> std::io::Result<()> {
        let (mut free, total) = statvfs(&self.data_dir)?;
        let threshold = threshold_bytes(self.min_bytes, self.min_percent, total);
        let reserve = self.reserve_path();
        let reserve_bytes = self.reserve_bytes();
        let has_reserve = reserve.exists();
        if has_reserve && free < reserve_bytes {
            match std::fs::remove_file(&reserve) {
                Ok(()) => {
                    tracing::warn!(free_bytes = free, path = %reserve.display(),
                        "disk nearly full: released the metadata reserve so metadata can still be written");
                    free = statvfs(&self.data_dir)?.0;
                }
                Err(e) => tracing::warn!(error = %e, "cannot release the metadata reserve"),
            }
        } else if !has_reserve && free >= threshold + 2 * reserve_bytes {
            let allocated = reserve
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|_| allocate(&reserve, reserve_bytes));
            match allocated {
                Ok(()) => free = free.saturating_sub(reserve_bytes),
                Err(e) => {
                    let _ = std::fs::remove_file(&reserve);
                    tracing::debug!(error = %e, "cannot allocate the metadata reserve");
                }
            }
        }
        self.threshold_bytes.store(threshold, Ordering::Relaxed);
        self.free_bytes.store(free, Ordering::Relaxed);
        self.total_bytes.store(total, Ordering::Relaxed);
        let full = free < threshold;
        if full != self.was_full.swap(full, Ordering::Relaxed) {
            if full {
                tracing::warn!(
                    free_bytes = free,
                    threshold_bytes = threshold,
                    "disk nearly full: produce refused (KAFKA_STORAGE_ERROR, retriable) until space is freed"
                );
            } else {
                tracing::info!(free_bytes = free, threshold_bytes = threshold, "disk space freed: produce resumes");
            }
        }
        Ok(())
    }
}

/// A file of `bytes` whose blocks are allocated (fallocate: a sparse file reserves nothing).
fn allocate(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
    // SAFETY: fallocate on a descriptor we own.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, bytes as libc::off_t) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The checking thread: `refresh` every `disk_check_interval_ms` until shutdown.
pub fn spawn_monitor(disk: Arc<DiskSpace>, shutdown: Arc<AtomicBool>) -> std::io::Result<()> {
    std::thread::Builder::new().name("spate-disk".into()).spawn(move || {
        let mut failed = false;
        while !shutdown.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(limits::disk_check_interval_ms));
            match disk.refresh() {
                Ok(()) => failed = false,
                Err(e) if !failed => {
                    failed = true;
                    tracing::warn!(error = %e, "cannot read the free space of the data dir");
                }
                Err(_) => {}
            }
        }
    })?;
    Ok(())
}

/// The writeback monitor: every `writeback_check_interval_ms`, whether the kernel would
/// now let a page-cache writer through without throttling it
/// (`append_ring::writers_unthrottled`, read by every shard's append ring). An
/// unreadable /proc/vmstat leaves it false: every append goes through io_uring.
pub fn spawn_writeback_monitor(shutdown: Arc<AtomicBool>) -> std::io::Result<()> {
    use crate::shard::append_ring::{writers_unthrottled, writers_unthrottled_from_vmstat};
    // /proc/vmstat counts pages of the system's size (4 KiB on x86-64, up to 64 KiB on
    // arm64).
    // SAFETY: sysconf has no preconditions.
    let page_bytes = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    };
    std::thread::Builder::new().name("spate-writeback".into()).spawn(move || {
        let mut warned = false;
        // Opened once and read from its start each time (procfs renders it afresh on
        // every read at offset 0): one pread per check, not open, reads and close.
        let vmstat = std::fs::File::open("/proc/vmstat");
        let mut text = Vec::with_capacity(vmstat_read_bytes);
        while !shutdown.load(Ordering::Relaxed) {
            let ok = vmstat
                .as_ref()
                .ok()
                .and_then(|f| read_from_start(f, &mut text).ok())
                .and_then(|()| std::str::from_utf8(&text).ok())
                .and_then(|v| writers_unthrottled_from_vmstat(v, page_bytes, limits::writeback_headroom_bytes));
            if ok.is_none() && !warned {
                warned = true;
                tracing::warn!(
                    "cannot read the dirty page counters in /proc/vmstat: every append goes through io_uring"
                );
            }
            writers_unthrottled.store(ok.unwrap_or(false), Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(limits::writeback_check_interval_ms));
        }
        writers_unthrottled.store(false, Ordering::Relaxed);
    })?;
    Ok(())
}

/// What one read of /proc/vmstat asks for first (it is ~5-7 KiB on 6.x kernels); a read
/// that fills it goes on with twice the room.
const vmstat_read_bytes: usize = 16 * 1024;

/// The whole of `file` from offset 0 into `buf`: one pread when it fits in
/// `vmstat_read_bytes`, and a read short of the room asked for is the end.
fn read_from_start(file: &std::fs::File, buf: &mut Vec<u8>) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    buf.clear();
    let mut room = vmstat_read_bytes;
    loop {
        let start = buf.len();
        buf.resize(start + room, 0);
        let n = file.read_at(&mut buf[start..], start as u64)?;
        buf.truncate(start + n);
        if n < room {
            return Ok(());
        }
        room *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_file_whole_from_its_start_again_and_again() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        let body: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&body).unwrap();
        let mut buf = Vec::new();
        for _ in 0..2 {
            read_from_start(&f, &mut buf).unwrap();
            assert_eq!(buf, body, "larger than one read, and read again from the start");
        }
        if let Ok(vmstat) = std::fs::File::open("/proc/vmstat") {
            read_from_start(&vmstat, &mut buf).unwrap();
            assert!(std::str::from_utf8(&buf).unwrap().contains("nr_dirty "));
        }
    }

    #[test]
    fn threshold_is_the_larger_of_bytes_and_percent() {
        assert_eq!(threshold_bytes(1 << 30, 1, 10 << 30), 1 << 30);
        assert_eq!(threshold_bytes(1 << 20, 5, 100 << 30), 5 << 30);
        assert_eq!(threshold_bytes(0, 0, 100 << 30), 0);
    }
}
