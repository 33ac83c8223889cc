//! Appends through io_uring: a small raw ring per shard (the io-uring crate; glommio has
//! no vectored buffered write on a file it did not open).
//!
//! Appends staged while the shard handles a burst of produce requests are submitted
//! together; consecutive appends to the same segment file become one `writev`
//! (coalescing), so many connections producing to one partition cost one write. The
//! kernel completes page-cache writes inline and punts the ones that would block (dirty
//! page throttling) to its workers, so the core keeps serving.
//!
//! Runtime-free: the server's poller calls `submit` and `reap`; nothing here waits.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;
use io_uring::{opcode, types, IoUring};

use crate::model::TopicPartition;

/// Submission queue entries of the ring.
const ring_entries: u32 = 256;
/// iovecs in one writev (Linux's IOV_MAX is 1024).
const writev_iovecs_max: usize = 512;

/// One append waiting to be written: its pieces go to consecutive file positions
/// (patched batch headers and the record bytes of the request, not copied).
pub struct StagedWrite {
    pub tp: TopicPartition,
    pub write_id: u64,
    pub file: Arc<File>,
    pub position: u64,
    pub parts: Vec<Bytes>,
}

impl StagedWrite {
    fn len(&self) -> usize {
        self.parts.iter().map(|p| p.len()).sum()
    }

    /// Write synchronously, skipping the first `skip` bytes (already written).
    fn write_sync_from(&self, mut skip: usize) -> std::io::Result<()> {
        let mut position = self.position;
        for part in &self.parts {
            let from = skip.min(part.len());
            skip -= from;
            self.file.write_all_at(&part[from..], position + from as u64)?;
            position += part.len() as u64;
        }
        Ok(())
    }
}

/// A submitted writev: it owns its buffers and iovecs until the kernel is done.
struct InFlight {
    writes: Vec<StagedWrite>,
    _iovecs: Box<[libc::iovec]>,
    total_bytes: usize,
}

/// The outcome of one append's write.
pub struct Completed {
    pub tp: TopicPartition,
    pub write_id: u64,
    pub result: std::io::Result<()>,
}

pub struct AppendRing {
    ring: IoUring,
    staged: Vec<StagedWrite>,
    in_flight: HashMap<u64, InFlight>,
    next_user_data: u64,
    /// Appends written since start, and the writev calls that carried them.
    pub appends_written: u64,
    pub writes_submitted: u64,
}

impl AppendRing {
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            ring: IoUring::new(ring_entries)?,
            staged: Vec::new(),
            in_flight: HashMap::new(),
            next_user_data: 0,
            appends_written: 0,
            writes_submitted: 0,
        })
    }

    pub fn stage(&mut self, write: StagedWrite) {
        self.staged.push(write);
    }

    pub fn is_idle(&self) -> bool {
        self.staged.is_empty() && self.in_flight.is_empty()
    }

    pub fn has_in_flight(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Submit everything staged, merging contiguous appends to the same file. Writes
    /// that find the submission queue full are done synchronously (rare: the queue is
    /// as deep as a burst of appends is long) and reported as completed at once.
    pub fn submit(&mut self) -> Vec<Completed> {
        let mut done = Vec::new();
        if self.staged.is_empty() {
            return done;
        }
        let mut staged = std::mem::take(&mut self.staged);
        // Group by file, keeping each file's appends in offset order.
        staged.sort_by_key(|w| Arc::as_ptr(&w.file) as usize);
        let mut runs: Vec<Vec<StagedWrite>> = Vec::new();
        for w in staged {
            match runs.last_mut() {
                Some(run)
                    if run.iter().map(|r| r.parts.len()).sum::<usize>() + w.parts.len() <= writev_iovecs_max
                        && Arc::ptr_eq(&run[0].file, &w.file)
                        && run.last().map(|l| l.position + l.len() as u64) == Some(w.position) =>
                {
                    run.push(w)
                }
                _ => runs.push(vec![w]),
            }
        }
        for run in runs {
            let iovecs: Box<[libc::iovec]> = run
                .iter()
                .flat_map(|w| w.parts.iter())
                .filter(|p| !p.is_empty())
                .map(|p| libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() })
                .collect();
            let total_bytes = run.iter().map(|w| w.len()).sum();
            let user_data = self.next_user_data;
            self.next_user_data += 1;
            let sqe = opcode::Writev::new(types::Fd(run[0].file.as_raw_fd()), iovecs.as_ptr(), iovecs.len() as u32)
                .offset(run[0].position)
                .build()
                .user_data(user_data);
            // SAFETY: the iovecs and the buffers they point to are owned by the InFlight
            // entry stored below, which lives until this user_data's completion is reaped.
            let pushed = unsafe { self.ring.submission().push(&sqe) }.is_ok() || {
                let _ = self.ring.submit();
                unsafe { self.ring.submission().push(&sqe) }.is_ok()
            };
            if pushed {
                self.writes_submitted += 1;
                self.in_flight.insert(user_data, InFlight { writes: run, _iovecs: iovecs, total_bytes });
            } else {
                for w in run {
                    let result = w.write_sync_from(0);
                    self.appends_written += 1;
                    done.push(Completed { tp: w.tp, write_id: w.write_id, result });
                }
            }
        }
        if let Err(e) = self.ring.submit() {
            tracing::warn!(error = %e, "io_uring submit failed; will retry");
        }
        done
    }

    /// Collect finished writes. A short write is finished synchronously (it only
    /// happens near a full disk, where the retry then reports the error).
    pub fn reap(&mut self) -> Vec<Completed> {
        let mut done = Vec::new();
        let cqes: Vec<(u64, i32)> = self.ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (user_data, res) in cqes {
            let Some(flight) = self.in_flight.remove(&user_data) else {
                tracing::error!(user_data, "completion for an unknown append write");
                continue;
            };
            let mut written = if res < 0 { 0 } else { res as usize };
            let failure = (res < 0).then(|| std::io::Error::from_raw_os_error(-res));
            if failure.is_none() && written < flight.total_bytes {
                tracing::warn!(written, total = flight.total_bytes, "short append write; finishing it synchronously");
            }
            for w in flight.writes {
                self.appends_written += 1;
                let result = match &failure {
                    Some(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
                    None => {
                        let len = w.len();
                        let already = written.min(len);
                        written -= already;
                        if already < len {
                            w.write_sync_from(already)
                        } else {
                            Ok(())
                        }
                    }
                };
                done.push(Completed { tp: w.tp, write_id: w.write_id, result });
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
            ring.stage(StagedWrite { tp: tp.clone(), write_id: i as u64, file: file.clone(), position: pos, parts });
            ring.stage(StagedWrite {
                tp: tp.clone(),
                write_id: 100 + i as u64,
                file: other.clone(),
                position: i as u64 * 10,
                parts: vec![Bytes::from(vec![9; 10])],
            });
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
}
