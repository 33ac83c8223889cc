//! The partition log: one replica of one partition, on disk, in Kafka's own format.
//!
//! CONTRACT (the broker codes against these signatures; fill the bodies, keep the names).
//! Owned by exactly one shard; not Sync; no network code and no async runtime. Plain
//! positional file I/O into the page cache; fdatasync only in `flush` / group commit.
//! No clock reads: every method that needs the time takes `now_ms`.
//!
//! Invariants (asserted, on in release): offsets strictly increase across batches and
//! segments; every position inside a segment fits a u32; index entries strictly increase;
//! `log_start_offset <= recovery_point <= log_end_offset` (recovery point clamped).
//!
//! # On-disk format, version 1 (byte-identical to Kafka's for `.log`/`.index`/`.timeindex`)
//!
//! All integers are big-endian. One directory per partition, `<topic>-<partition>/`:
//!
//! ```text
//! 00000000000000000000.log        segment: record batches back to back, no file header
//! 00000000000000000000.index      offset index of that segment
//! 00000000000000000000.timeindex  time index of that segment
//! 00000000000000000000.txnindex   its aborted transactions, once it has one (txn_index.rs)
//! 00000000000000001234.log ...    the next segment, named by its base offset (20 digits)
//! spate-recovery-point            checkpoint: offset below which data is known fsynced
//! spate-log-start-offset          checkpoint: the log start offset (see start_offset.rs)
//! leader-epoch-checkpoint         Kafka's leader epoch cache file (see leader_epoch.rs)
//! .spate-clean-shutdown           present only after a clean close()
//! ```
//!
//! `.log`, one record batch (magic 2), 61-byte header then the records:
//!
//! ```text
//! off len field
//!   0   8 baseOffset            i64  assigned by the log (not covered by the CRC)
//!   8   4 batchLength           i32  bytes after this field (whole batch = 12 + batchLength)
//!  12   4 partitionLeaderEpoch  i32  (not covered by the CRC)
//!  16   1 magic                 i8   = 2
//!  17   4 crc                   u32  CRC32C (Castagnoli) of bytes 21..end of batch
//!  21   2 attributes            i16  bits 0-2 codec (0 none,1 gzip,2 snappy,3 lz4,4 zstd),
//!                                    bit 3 timestamp type (1 = LogAppendTime),
//!                                    bit 4 transactional, bit 5 control
//!  23   4 lastOffsetDelta       i32  = recordsCount - 1 for produced batches
//!  27   8 baseTimestamp         i64
//!  35   8 maxTimestamp          i64  (the append time for LogAppendTime)
//!  43   8 producerId            i64  -1 when not idempotent
//!  51   2 producerEpoch         i16
//!  53   4 baseSequence          i32
//!  57   4 recordsCount          i32
//!  61   . records (compressed as a whole when the codec is not 0), each:
//!         length varint, attributes i8, timestampDelta varlong, offsetDelta varint,
//!         keyLength varint, key, valueLength varint, value, headerCount varint,
//!         headers (keyLength varint, key, valueLength varint, value)
//!         (varints are zig-zag, 7 bits per byte, low group first)
//! ```
//!
//! `.index`, 8-byte entries: `relativeOffset u32` (offset - segment base), `position u32`
//! (byte position of a batch in the `.log`). The offset is the *last* offset of the batch
//! at that position (as Kafka 3.x writes it). One entry when more than
//! `index.interval.bytes` were appended since the previous entry; the first batch of a
//! segment is never indexed, so a valid entry has position > 0. While a segment is
//! active the file is preallocated to `segment.index.bytes` (zero-filled, mmap'ed); on
//! roll and close it is trimmed to the used entries.
//!
//! `.timeindex`, 12-byte entries: `timestamp i64` (max timestamp so far in the segment),
//! `relativeOffset u32` (last offset of the batch holding that timestamp). Written beside
//! each offset index entry, but only when the max timestamp grew; one final entry on roll
//! and close. Preallocated and trimmed like `.index`.
//!
//! `spate-recovery-point`, ASCII: `1 <offset> <crc>\n`, where `1` is the format version
//! and `<crc>` is the decimal CRC32C of the text `1 <offset>`. A missing or garbled file
//! reads as offset 0 (recover everything): a stale, lower value is always safe.
//!
//! `.spate-clean-shutdown`, ASCII `1\n`, written last by `close`, once segments and indexes
//! are fsynced; only its presence counts (a crash right after close may leave it empty).
//! Removed (and the removal fsynced) on open, so a crash afterwards is seen as unclean.
//!
//! `leader-epoch-checkpoint`: Kafka's text format, version 0, drawn in `leader_epoch.rs`.
//! Which leader epoch started at which offset (KIP-101). Rewritten (temp file, fsync,
//! rename, fsync dir) whenever the cache changes: an append that brings a newer
//! `partitionLeaderEpoch`, a truncation, retention. It is saved *before* the appended
//! bytes are written, so after a crash it may run ahead of the log (fixed on open by
//! truncating it to the log) but never lacks an epoch whose batches survived.
//!
//! # Leader epochs and replication
//!
//! Every append (leader or follower) feeds each batch's stored `partitionLeaderEpoch` to
//! the cache: an epoch >= 0 newer than the latest cached one starts at that batch's base
//! offset. Leader appends that take a `leader_epoch` stamp it into every batch first, as
//! Kafka's leader does; the plain appends store the producer's value untouched (-1 from
//! every Kafka client), so a partition that replicates must use the `*_with_leader_epoch`
//! forms. Followers append the leader's batches byte for byte (`append_replicated*`):
//! offsets must continue the log exactly. `truncate_to` is how a follower drops a
//! divergent suffix after asking the leader `end_offset_for_epoch` (KIP-101/KIP-279).
//!
//! # Recovery
//!
//! With the marker: indexes are trusted; only the tail after each segment's last index
//! entry is scanned (headers only). Without it: every segment at or after the recovery
//! point is re-read, each batch checked (length within the file and the 256 MiB batch
//! limit, magic, CRC, increasing offsets), indexes rebuilt, and the segment truncated at
//! the first bad batch; later segments are deleted. Earlier segments are trusted unless
//! their index files look inconsistent, in which case they are recovered the same way.
//! Then the leader epoch cache is loaded and cut to `[log_start_offset, log_end_offset)`
//! (Kafka's `truncateFromEnd` / `truncateFromStart`); a missing checkpoint is an empty
//! cache, an unreadable one is rebuilt from the retained batches' headers (with a
//! warning) and rewritten.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::model::limits;
use crate::model::Offset;

pub mod batch;
pub mod cleaner;
pub mod index;
pub mod leader_epoch;
pub mod producers;
pub mod segment;
pub mod start_offset;
pub mod txn_index;

use crate::txn::producer_state::{ProducerStates, Verdict};
use batch::BatchHeader;
use leader_epoch::{EpochEntry, LeaderEpochCache};
use segment::Segment;

/// The clean-shutdown marker's file name (per partition directory).
pub const CLEAN_SHUTDOWN_FILE: &str = ".spate-clean-shutdown";
/// The recovery-point checkpoint's file name (per partition directory).
pub const RECOVERY_POINT_FILE: &str = "spate-recovery-point";
/// Version of the marker and checkpoint formats described above.
pub const FORMAT_VERSION: u32 = 1;
/// Batches one produce record set may carry.
#[allow(non_upper_case_globals)]
pub const append_batches_max: usize = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Batch length above `max.message.bytes` -> MESSAGE_TOO_LARGE.
    #[error("record batch of {size_bytes} bytes exceeds max.message.bytes {limit_bytes}")]
    MessageTooLarge { size_bytes: usize, limit_bytes: usize },
    /// Bad CRC, bad magic, truncated batch, inconsistent lengths -> CORRUPT_MESSAGE.
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
    /// Structurally valid but semantically wrong (counts, deltas, timestamps) -> INVALID_RECORD.
    #[error("invalid record batch: {0}")]
    InvalidRecord(String),
    /// Some records are refused, each for its own reason (KIP-467) -> INVALID_RECORD with
    /// `record_errors`: (index of the record among the request's records for the
    /// partition, why), so that a client fails those records only.
    #[error("{message}")]
    InvalidRecords { message: String, record_errors: Vec<(i32, String)> },
    /// A CreateTime record outside `message.timestamp.before.max.ms` /
    /// `after.max.ms` of the broker's clock -> INVALID_TIMESTAMP.
    #[error("invalid timestamp: {0}")]
    InvalidTimestamp(String),
    /// A batch with a producer id but a negative epoch or sequence -> INVALID_RECORD
    /// (Kafka's "Invalid sequence number"), counted as a refused idempotent batch.
    #[error("invalid record batch: {0}")]
    InvalidProducerFields(String),
    /// Read below the log start offset or above the log end offset -> OFFSET_OUT_OF_RANGE.
    #[error("offset {offset} out of range [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange { offset: i64, log_start_offset: i64, log_end_offset: i64 },
    /// A failed fsync or write: the log is offline for good -> KAFKA_STORAGE_ERROR.
    #[error("log offline: {0}")]
    Offline(String),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// An idempotent batch the producer state refuses (stale epoch, sequence gap) ->
    /// INVALID_PRODUCER_EPOCH / OUT_OF_ORDER_SEQUENCE_NUMBER. Nothing was appended.
    #[error("{0}")]
    Producer(#[from] crate::txn::producer_state::ProducerStateError),
    /// Not a failure: the record set repeats a batch already in the log (a producer's
    /// retry); nothing was appended, and these are the original batch's offsets.
    #[error("duplicate of the batch at offsets {}..={}", .0.base_offset, .0.last_offset)]
    DuplicateBatch(AppendInfo),
    /// Not a failure yet: a producer's first transactional batch here must be verified
    /// with its transaction coordinator (KIP-890 part 1); append again with
    /// `TxnVerification::Verified(guard)` once it is. Nothing was appended.
    #[error("producer {producer_id} epoch {producer_epoch}: transaction not verified yet")]
    TxnVerificationNeeded { producer_id: i64, producer_epoch: i16, guard: u64 },
    /// A verified batch whose transaction ended (a marker came) while it was verified,
    /// or whose guard is unknown -> INVALID_TXN_STATE. Nothing was appended.
    #[error("producer {producer_id}: the transaction ended while this batch was verified")]
    TxnVerificationStale { producer_id: i64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
}

/// Per-topic configuration, with Kafka's defaults.
#[derive(Debug, Clone)]
pub struct LogConfig {
    pub segment_bytes: u64,            // segment.bytes, 1 GiB
    pub segment_ms: i64,               // segment.ms, 7 days
    pub segment_index_bytes: u32,      // segment.index.bytes, 10 MiB
    pub index_interval_bytes: u32,     // index.interval.bytes, 4096
    pub max_message_bytes: u32,        // max.message.bytes, 1048588
    pub retention_ms: i64,             // retention.ms, 7 days (-1 = forever)
    pub retention_bytes: i64,          // retention.bytes, -1
    pub timestamp_type: TimestampType, // message.timestamp.type, CreateTime
    pub flush_messages: u64,           // flush.messages, u64::MAX = never (1 = every append)
    pub flush_ms: i64,                 // flush.ms, i64::MAX = never
    /// Broker-wide `producer.id.expiration.ms` (1 day): idle producers are forgotten.
    pub producer_id_expiration_ms: i64,
    /// message.timestamp.before.max.ms / after.max.ms (each at most
    /// message.timestamp.difference.max.ms, the older setting): how far a CreateTime
    /// record's timestamp may lie behind / ahead of the broker's clock (i64::MAX: any).
    pub timestamp_before_max_ms: i64,
    pub timestamp_after_max_ms: i64,
    /// compression.type as a Kafka codec (0 uncompressed .. 4 zstd); None: `producer`,
    /// batches are stored as they come.
    pub compression: Option<i16>,
    /// cleanup.policy has `delete`: retention.ms / retention.bytes delete old segments.
    pub delete: bool,
    /// cleanup.policy has `compact`: the cleaner keeps the newest record per key, and
    /// produced records must have keys.
    pub compact: bool,
    pub delete_retention_ms: i64,       // delete.retention.ms, 1 day
    pub min_compaction_lag_ms: i64,     // min.compaction.lag.ms, 0
    pub max_compaction_lag_ms: i64,     // max.compaction.lag.ms, i64::MAX
    pub min_cleanable_dirty_ratio: f64, // min.cleanable.dirty.ratio, 0.5
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            segment_index_bytes: 10 * 1024 * 1024,
            index_interval_bytes: 4096,
            max_message_bytes: crate::model::limits::message_bytes_default,
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            timestamp_type: TimestampType::CreateTime,
            flush_messages: u64::MAX,
            flush_ms: i64::MAX,
            producer_id_expiration_ms: limits::producer_id_expiration_ms_default,
            timestamp_before_max_ms: i64::MAX,
            timestamp_after_max_ms: i64::MAX,
            compression: None,
            delete: true,
            compact: false,
            delete_retention_ms: 86_400_000,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            min_cleanable_dirty_ratio: 0.5,
        }
    }
}

/// Broker-wide cleaner settings (`log.cleaner.*`) a clean job is planned with.
#[derive(Debug, Clone, Copy)]
pub struct CleanerSettings {
    /// log.cleaner.dedupe.buffer.size
    pub map_bytes_max: usize,
    /// log.cleaner.io.max.bytes.per.second (f64::INFINITY: no limit)
    pub io_bytes_per_second: f64,
}

impl Default for CleanerSettings {
    fn default() -> Self {
        CleanerSettings { map_bytes_max: 128 << 20, io_bytes_per_second: f64::INFINITY }
    }
}

/// What `install_cleaned` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanInstalled {
    pub segments_replaced: usize,
    pub segments_written: usize,
    /// Groups whose segments changed under the pass (retention, truncation): dropped.
    pub groups_discarded: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// What one append assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: Offset,
    pub last_offset: Offset,
    /// -1 unless the topic uses LogAppendTime.
    pub log_append_time_ms: i64,
    pub record_count: u32,
    pub bytes: usize,
}

/// Where the bytes for a fetch lie: whole batches, from the batch that contains the
/// fetch offset, never past `upper` (the first offset not to return).
/// `length_bytes == 0` means nothing to read yet (fetch offset == upper).
#[derive(Debug, Clone)]
pub struct ReadPlan {
    pub file: std::sync::Arc<std::fs::File>, // the segment's .log, kept open even if deleted
    pub segment_base_offset: Offset,
    pub position_bytes: u64,
    pub length_bytes: u64,
}

impl ReadPlan {
    /// The copying read: pread the planned range.
    pub fn read_to_vec(&self) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0u8; self.length_bytes as usize];
        self.file.read_exact_at(&mut buf, self.position_bytes)?;
        Ok(buf)
    }
}

pub struct PartitionLog {
    dir: PathBuf,
    config: LogConfig,
    /// Sorted by base offset; the last one is the active segment. Never empty.
    segments: Vec<Segment>,
    /// The first offset readers may fetch: `segments[0].base_offset` or above it
    /// (start_offset.rs).
    log_start_offset: i64,
    /// Offsets below this are known durable.
    recovery_point: i64,
    /// The value last written to the checkpoint file.
    checkpointed_recovery_point: i64,
    /// The append time of the oldest unflushed data (for `flush.ms`).
    first_unflushed_append_ms: Option<i64>,
    /// Directory changes (a roll, a deletion, a file replaced) so far, and how many of
    /// them a directory fsync has made durable: the next flush syncs the directory
    /// while they differ.
    dir_changes: u64,
    dir_synced_changes: u64,
    /// Small files replaced on the data core without an fsync (`leader-epoch-checkpoint`,
    /// a roll's producer snapshot): the next flush fsyncs them, before the recovery point
    /// passes what they describe.
    unsynced_files: Vec<SyncTarget>,
    /// Lowest truncation point since the last `flush_handle` (clamps `mark_flushed`).
    truncated_below: Option<i64>,
    /// `dir_changes` right after the last truncation (`truncation_durable`).
    truncated_at_change: u64,
    /// Segments retention removed, renamed `*.deleted`, to unlink off the data core
    /// (`take_deleted_segments`).
    deleted_segments: Vec<DeletedSegment>,
    /// The cleaner checkpoint: offsets below it were in some pass's key map.
    cleaner_checkpoint: i64,
    /// A pass left tombstones whose delete horizon is then: one is due by then.
    clean_horizon_ms: Option<i64>,
    /// When the last pass was installed (for the metrics).
    last_clean_ms: Option<i64>,
    /// `.cleaned` files of discarded groups, to unlink off the core (`take_cleaner_leftovers`).
    cleaner_leftovers: Vec<i64>,
    offline: Option<String>,
    /// Appends whose bytes the caller is still writing (`append_deferred`), in offset
    /// order. Nothing at or after the first unfinished one is read, flushed or trusted.
    pending_writes: VecDeque<PendingAppend>,
    next_write_id: u64,
    /// This opening of the log, unique in the process (`instance`): a write completed for
    /// a log since deleted and recreated under the same name is told apart by it.
    instance: u64,
    /// Which leader epoch started where; mirrored in `leader-epoch-checkpoint`.
    leader_epochs: LeaderEpochCache,
    /// Every idempotent producer's epoch and last batches (Kafka's producer state),
    /// covering every batch below the log end offset; snapshots in `<offset>.snapshot`.
    producers: ProducerStates,
    /// Producer ids at or above this were never issued (the coordinator's word; None
    /// until known): batches carrying one are refused.
    producer_id_bound: Option<i64>,
    /// KIP-890 part 1: producers whose first transactional batch here is being
    /// verified with the transaction coordinator, with the guard and epoch the check
    /// was started for (Kafka's `VerificationStateEntry`). A marker for the producer
    /// ends its entry, so a batch verified before its transaction ended is refused.
    /// In memory only, on the leader; at most `limits::partition_producers_max`.
    txn_verifications: HashMap<i64, (u64, i16)>,
    next_verification_guard: u64,
}

/// How a leader's append treats a transactional batch whose producer has no
/// transaction open in the partition (KIP-890 part 1, against hanging transactions: a
/// late batch must not start a transaction the coordinator has already ended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnVerification {
    /// Append without asking (the request named no transactional id, as Kafka).
    Off,
    /// Not verified yet: refuse with `LogError::TxnVerificationNeeded` and a guard.
    Unverified,
    /// The coordinator said the partition is in the transaction, for this guard: append
    /// if no marker for the producer came since the guard was handed out.
    Verified(u64),
}

/// One appended batch's new header: `header` replaces the first 61 bytes of the
/// `size`-byte batch at `position` of the record set.
#[derive(Debug, Clone)]
pub struct HeaderPatch {
    pub position: usize,
    pub size: usize,
    pub header: [u8; batch::HEADER_BYTES],
}

fn apply_patches(records: &mut [u8], patches: &[HeaderPatch]) {
    for p in patches {
        records[p.position..p.position + batch::HEADER_BYTES].copy_from_slice(&p.header);
    }
}

/// An append whose offsets are assigned but whose bytes may not be in the file yet.
#[derive(Debug)]
struct PendingAppend {
    id: u64,
    segment_base: i64,
    start_pos: u64,
    start_offset: i64,
    done: bool,
}

/// The write an `append_deferred` caller must perform: the rewritten record set at
/// `position` of `file`, then `write_done(id, result)`.
/// Openings of partition logs so far (`PartitionLog::instance`).
static LOG_INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[derive(Debug, Clone)]
pub struct PendingWrite {
    /// The log's `instance`.
    pub log: u64,
    pub id: u64,
    pub file: Arc<File>,
    pub position: u64,
}

fn io_err_string(context: &str, e: &std::io::Error) -> String {
    format!("{context}: {e}")
}

/// What the process does when a log's disk fails: set once by the broker (`server::run`
/// halts, as Kafka does when its only log dir has failed); unset in tests and tools, where
/// the log only goes offline. Called with the partition's directory and the reason.
static DIR_FAILURE_HOOK: std::sync::OnceLock<fn(&Path, &str)> = std::sync::OnceLock::new();

/// Install the log dir failure hook (the first call wins).
pub fn on_dir_failure(hook: fn(&Path, &str)) {
    let _ = DIR_FAILURE_HOOK.set(hook);
}

/// Whether an I/O error means the disk under the log failed, rather than a condition the
/// broker lives with: a failed fsync always does (fsyncgate: the data it was to make
/// durable may be gone, and a second fsync would report success); a write or a rename
/// only with EIO and its kin. A full disk (ENOSPC) keeps its read-only behaviour, and a
/// descriptor shortage (EMFILE) is retried by the file budget.
fn disk_failed(e: &std::io::Error, fsync: bool) -> bool {
    fsync || matches!(e.raw_os_error(), Some(libc::EIO | libc::EROFS | libc::EUCLEAN | libc::ENODEV | libc::ENXIO))
}

impl PartitionLog {
    /// Open (or create) the log in `dir` (`<data>/<topic>-<partition>`), recovering after
    /// a crash. `now_ms` is the wall clock (no clock reads inside the log). For a log
    /// with no high watermark below its end (tests, tools); a replica opens with
    /// `open_leading` and the high watermark it checkpointed.
    pub fn open(dir: &Path, config: LogConfig, now_ms: i64) -> Result<Self, LogError> {
        Self::open_leading(dir, config, now_ms, None, i64::MAX)
    }

    /// `open` for a replica whose high watermark was `high_watermark` when it stopped (its
    /// checkpoint; 0 when none): the producer state is rebuilt from a snapshot at or
    /// below it, so that transactions ended above it hold the last stable offset as
    /// before the restart (`producers::rebuild`). Then `assign_leader_epoch(leader_epoch)`
    /// when this replica is known to lead: the leader epoch cache is cut to the log and
    /// given the new epoch in one save (a restart otherwise wrote
    /// `leader-epoch-checkpoint` twice per partition, and the second time on the data
    /// core).
    pub fn open_leading(
        dir: &Path,
        config: LogConfig,
        now_ms: i64,
        leader_epoch: Option<i32>,
        high_watermark: i64,
    ) -> Result<Self, LogError> {
        std::fs::create_dir_all(dir)?;
        let marker = dir.join(CLEAN_SHUTDOWN_FILE);
        let clean = marker.exists();
        cleaner::finish_swaps(dir, limits::message_bytes_max as usize, config.index_interval_bytes)?;
        let checkpoint = read_checkpoint(dir);

        let mut bases = Vec::new();
        let mut index_files = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some((stem, suffix)) = name.split_once('.') else { continue };
            if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let Ok(base) = stem.parse::<i64>() else { continue };
            match suffix {
                "log" => bases.push(base),
                "index" | "timeindex" => index_files.push((base, name.to_string())),
                // Retention renamed it and a crash came before the unlink.
                s if s.ends_with(segment::DELETED_SUFFIX) => match std::fs::remove_file(dir.join(name)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                    _ => {}
                },
                _ => {}
            }
        }
        bases.sort_unstable();
        for (base, name) in index_files {
            if bases.binary_search(&base).is_err() {
                std::fs::remove_file(dir.join(name))?;
            }
        }
        if clean {
            std::fs::remove_file(&marker)?;
            File::open(dir)?.sync_all()?;
        }
        let recovery_point = if clean { i64::MAX } else { checkpoint.unwrap_or(0) };

        let mut segments: Vec<Segment> = Vec::with_capacity(bases.len().max(1));
        let mut cut_at: Option<usize> = None;
        let mut recovered_from: Option<i64> = None;
        // Per kept segment, in order: were its indexes rebuilt here?
        let mut reindexed: Vec<bool> = Vec::with_capacity(bases.len().max(1));
        for (i, &base) in bases.iter().enumerate() {
            if cut_at.is_some() {
                for suffix in [".log", ".index", ".timeindex"] {
                    let _ = std::fs::remove_file(dir.join(segment::file_name(base, suffix)));
                }
                continue;
            }
            let (mut seg, bad_index) = Segment::open(dir, base)?;
            let beyond_recovery_point = bases.get(i + 1).is_none_or(|next| *next > recovery_point);
            let mut must_recover = (!clean && beyond_recovery_point) || bad_index;
            if !must_recover {
                if let Err(stop) = seg.load_trusting_indexes() {
                    tracing::warn!(dir = %dir.display(), segment = base, position = stop.position_bytes,
                        reason = %stop.reason, "segment does not match its index; recovering it");
                    must_recover = true;
                }
            }
            if must_recover {
                // A segment below the recovery point recovered only for its indexes keeps
                // its batches: the producer snapshots and epochs after it still hold.
                if !clean && beyond_recovery_point {
                    recovered_from.get_or_insert(base);
                }
                if let Some((stop, dropped)) =
                    seg.recover(limits::message_bytes_max as usize, config.index_interval_bytes)?
                {
                    tracing::warn!(dir = %dir.display(), offset = seg.next_offset, position = stop.position_bytes,
                        dropped_bytes = dropped, reason = %stop.reason,
                        "truncated a torn or corrupt log tail; later segments dropped");
                    recovered_from.get_or_insert(base);
                    cut_at = Some(i);
                }
                if seg.first_batch_time_ms.is_none() && !seg.is_empty() {
                    seg.first_batch_time_ms = Some(now_ms);
                }
            }
            if let Some(prev) = segments.last() {
                if seg.base_offset < prev.next_offset {
                    tracing::warn!(dir = %dir.display(), segment = base, previous_end = prev.next_offset,
                        "segment overlaps its predecessor; dropping it and every later segment");
                    seg.delete_files()?;
                    cut_at = Some(i);
                    continue;
                }
            }
            segments.push(seg);
            reindexed.push(must_recover);
        }
        if segments.is_empty() {
            segments.push(Segment::create(dir, 0, config.segment_index_bytes)?);
            reindexed.push(false);
        }
        let last = segments.len() - 1;
        for (i, seg) in segments.iter_mut().enumerate() {
            if i == last {
                seg.make_active(config.segment_index_bytes)?;
                if seg.first_batch_time_ms.is_none() && !seg.is_empty() {
                    seg.first_batch_time_ms = Some(now_ms);
                }
            } else {
                seg.index.trim()?;
                seg.time_index.trim()?;
                // Rebuilt indexes below the active segment are never synced by a flush
                // round (they are below the recovery point): synced here, or the next
                // power cut brings back the torn ones and every start recovers them again.
                if reindexed[i] {
                    seg.index.sync()?;
                    seg.time_index.sync()?;
                }
            }
        }
        let log_end_offset = segments[last].next_offset;
        let recovery_point = recovery_point.min(log_end_offset).max(segments[0].base_offset);
        let leader_epochs = open_leader_epochs(dir, &segments, recovered_from, leader_epoch)?;
        for seg in segments.iter_mut() {
            seg.txn_index.truncate_to(seg.next_offset)?;
        }
        let replay_from_max = recovered_from.unwrap_or(i64::MAX);
        let producers::Rebuilt { states: producers, replayed_from, replayed, written } = producers::rebuild(
            dir,
            &mut segments,
            replay_from_max,
            high_watermark,
            now_ms,
            config.producer_id_expiration_ms,
        )?;
        for file in written {
            file.sync_data()?;
        }
        if replayed > 0 {
            tracing::info!(dir = %dir.display(), batches = replayed, from = replayed_from, producers = producers.len(),
                recovered_from = ?recovered_from, high_watermark, "producer state rebuilt from the log");
        }
        let log_start_offset = segments[0].base_offset;
        // The partition directory's own entry: after an unclean stop (a new directory has
        // no clean-shutdown marker either) it may not be on the disk yet, and a power cut
        // would take the directory with every fsynced record in it. The first flush
        // fsyncs the parent too (deferred, not here: a burst of new partitions shares
        // the group-commit rounds' fsyncs instead of paying one each).
        let unsynced_files = match dir.parent().filter(|p| !clean && !p.as_os_str().is_empty()) {
            Some(parent) => vec![SyncTarget::Path(parent.to_path_buf())],
            None => Vec::new(),
        };
        // Tombstone horizons are not kept across a restart: a compacted log gets a pass
        // once delete.retention.ms has passed again, so tombstones whose horizon passed
        // meanwhile go even when nothing new comes in.
        let clean_horizon_ms = config.compact.then(|| now_ms.saturating_add(config.delete_retention_ms));
        let mut log = PartitionLog {
            instance: LOG_INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            dir: dir.to_path_buf(),
            config,
            segments,
            recovery_point,
            checkpointed_recovery_point: checkpoint.unwrap_or(0),
            first_unflushed_append_ms: (recovery_point < log_end_offset).then_some(now_ms),
            dir_changes: u64::from(!clean),
            dir_synced_changes: 0,
            unsynced_files,
            truncated_below: None,
            truncated_at_change: 0,
            deleted_segments: Vec::new(),
            cleaner_checkpoint: cleaner::read_checkpoint(dir).unwrap_or(0),
            clean_horizon_ms,
            last_clean_ms: None,
            cleaner_leftovers: Vec::new(),
            offline: None,
            pending_writes: VecDeque::new(),
            next_write_id: 0,
            leader_epochs,
            producers,
            producer_id_bound: None,
            txn_verifications: HashMap::new(),
            next_verification_guard: 1,
            log_start_offset,
        };
        log.load_log_start_offset()?;
        // Recovery read the rolled segments; a restart of thousands of partitions keeps
        // only their active files (the rest open again when read).
        let last = log.segments.len() - 1;
        log.segments[..last].iter().for_each(Segment::close_file);
        Ok(log)
    }

    fn check_online(&self) -> Result<(), LogError> {
        match &self.offline {
            Some(reason) => Err(LogError::Offline(reason.clone())),
            None => Ok(()),
        }
    }

    /// Take the log offline for good; returns the error to hand back. Logged once, when
    /// the log goes offline; later failures only return the first reason.
    fn go_offline(&mut self, reason: String) -> LogError {
        if self.offline.is_none() {
            tracing::error!(dir = %self.dir.display(), %reason, "partition log goes offline (KAFKA_STORAGE_ERROR until restart)");
        }
        LogError::Offline(self.offline.get_or_insert(reason).clone())
    }

    fn offline_on_err<T>(&mut self, context: &str, r: std::io::Result<T>) -> Result<T, LogError> {
        r.map_err(|e| self.go_offline_io(context, &e, false))
    }

    /// `go_offline` for an I/O error; one that means the disk failed goes to the log dir
    /// failure hook too.
    fn go_offline_io(&mut self, context: &str, e: &std::io::Error, fsync: bool) -> LogError {
        let reason = io_err_string(context, e);
        let error = self.go_offline(reason.clone());
        if disk_failed(e, fsync) {
            if let Some(hook) = DIR_FAILURE_HOOK.get() {
                hook(&self.dir, &reason);
            }
        }
        error
    }

    fn active(&self) -> &Segment {
        self.segments.last().expect("a log always has an active segment")
    }

    fn active_mut(&mut self) -> &mut Segment {
        self.segments.last_mut().expect("a log always has an active segment")
    }

    /// Validate every batch in `records` (a produce request's record set: one or more
    /// magic-2 batches), then assign offsets (rewriting baseOffset in place, and
    /// maxTimestamp + attributes for LogAppendTime, recomputing the CRC then), and write
    /// them. Nothing is written if any batch is invalid. Does not fsync.
    ///
    /// `partitionLeaderEpoch` is stored as the producer sent it (-1 from the Java client,
    /// 0 from librdkafka); a value >= 0 still feeds the leader epoch cache, as it would on
    /// a rebuild from the headers or on a follower copying the batch. So a producer can
    /// plant any epoch here: a replicated partition's leader must use the
    /// `*_with_leader_epoch` forms, which overwrite the field as Kafka's leader does.
    pub fn append(&mut self, records: &mut [u8], now_ms: i64) -> Result<AppendInfo, LogError> {
        let (info, write) = self.append_deferred(records, now_ms)?;
        let result = write.file.write_all_at(records, write.position);
        self.write_done(write.id, result)?;
        Ok(info)
    }

    /// `append_deferred` for a record set the caller cannot change (a shared request
    /// buffer): nothing is copied but the 61-byte batch headers. Returns, per batch,
    /// (position in `records`, size, the header to write in place of the original);
    /// the caller writes each patched header followed by the rest of its batch.
    pub fn append_shared(
        &mut self,
        records: &[u8],
        now_ms: i64,
    ) -> Result<(AppendInfo, PendingWrite, Vec<HeaderPatch>), LogError> {
        self.append_inner(records, None, now_ms, TxnVerification::Off)
    }

    /// `append_shared`, also stamping `partitionLeaderEpoch` = `leader_epoch` into every
    /// patched header (the field is outside the CRC): the leader's produce path.
    pub fn append_shared_with_leader_epoch(
        &mut self,
        records: &[u8],
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<(AppendInfo, PendingWrite, Vec<HeaderPatch>), LogError> {
        self.append_inner(records, Some(leader_epoch), now_ms, TxnVerification::Off)
    }

    /// `append_shared_with_leader_epoch` for a client's Produce, with the transaction
    /// verification of KIP-890 part 1 (`TxnVerification`).
    pub fn append_produced(
        &mut self,
        records: &[u8],
        leader_epoch: i32,
        now_ms: i64,
        verification: TxnVerification,
    ) -> Result<(AppendInfo, PendingWrite, Vec<HeaderPatch>), LogError> {
        self.append_inner(records, Some(leader_epoch), now_ms, verification)
    }

    /// Append one end-of-transaction marker (`batch::encode_marker`'s control batch), as
    /// the transaction coordinator's WriteTxnMarkers asks the leader to (Kafka's
    /// `AppendOrigin.COORDINATOR`): its producer's epoch must not be older than the
    /// partition's (from `transaction_version` 2, must be newer: `check_marker`), nor its
    /// coordinator epoch older than the last marker's. Stamps the base offset and
    /// `leader_epoch`; the caller writes as for `append_shared`.
    pub fn append_marker_shared(
        &mut self,
        records: &[u8],
        leader_epoch: i32,
        now_ms: i64,
        transaction_version: i8,
    ) -> Result<(AppendInfo, PendingWrite, Vec<HeaderPatch>), LogError> {
        self.check_online()?;
        let (h, size) = batch::check_structure(records, records.len())?;
        let marker = (size == records.len()).then(|| batch::control_marker(records, &h)).flatten();
        let Some(marker) = marker.filter(|_| h.producer_id >= 0) else {
            return Err(LogError::InvalidRecord("not one end-of-transaction marker".into()));
        };
        let (id, epoch) = (crate::model::ProducerId(h.producer_id), crate::model::ProducerEpoch(h.producer_epoch));
        self.producers.check_marker(id, epoch, marker.coordinator_epoch, transaction_version)?;
        let base_offset = self.log_end_offset().0;
        let header = batch::patched_header(records, base_offset, Some(leader_epoch), None);
        let stored = BatchHeader::parse(&header);
        let write = self.place(records, &[(0, stored)], now_ms)?;
        let info = AppendInfo {
            base_offset: Offset(base_offset),
            last_offset: Offset(stored.last_offset()),
            log_append_time_ms: -1,
            record_count: 1,
            bytes: size,
        };
        Ok((info, write, vec![HeaderPatch { position: 0, size, header }]))
    }

    /// The last stable offset under `high_watermark` (see `ProducerStates`): what a
    /// read_committed consumer may read.
    /// Never below the log start (Kafka's rule: retention or DeleteRecords may have
    /// removed an open transaction's first records).
    pub fn last_stable_offset(&mut self, high_watermark: Offset) -> Offset {
        self.producers.last_stable_offset(high_watermark.0);
        self.stable_offset(high_watermark)
    }

    /// `last_stable_offset` without forgetting ended transactions (a read-only view).
    pub fn stable_offset(&self, high_watermark: Offset) -> Offset {
        let start = self.log_start_offset().0;
        let stable = self.producers.stable_offset(high_watermark.0).max(start);
        Offset(stable.min(high_watermark.0.max(start)))
    }

    /// The aborted transactions a read_committed fetch from `fetch_offset` that returned
    /// `plan` must be told of (Kafka's `collectAbortedTransactions`): those ending at or
    /// after `fetch_offset` that start below the end of what was read. Segments are
    /// searched from the fetch offset's on, until an entry shows that every transaction
    /// starting below that end had ended (its last stable offset is beyond it).
    pub fn aborted_txns(&self, fetch_offset: Offset, plan: &ReadPlan) -> Vec<txn_index::AbortedTxn> {
        if plan.length_bytes == 0 {
            return Vec::new();
        }
        let Some(seg) = self.segments.iter().find(|s| s.base_offset == plan.segment_base_offset.0) else {
            return Vec::new();
        };
        let end = plan.position_bytes + plan.length_bytes;
        let upper = match seg.header_at(end, seg.size_bytes) {
            Ok(Some(h)) => h.base_offset,
            _ => seg.next_offset,
        };
        let first = self.segments.partition_point(|s| s.next_offset <= fetch_offset.0);
        let mut found = Vec::new();
        for seg in &self.segments[first..] {
            for e in seg.txn_index.overlapping(fetch_offset.0, upper) {
                found.push(*e);
            }
            if seg.txn_index.entries().iter().any(|e| e.last_stable_offset > upper) {
                break;
            }
        }
        found
    }

    /// `append`, except that the caller writes the bytes (the broker submits them to
    /// io_uring, coalescing appends that arrive together): validate, assign offsets,
    /// rewrite the headers in `records` and index them, and return where `records` must
    /// be written. Until `write_done` reports the write, reads, flushes and the
    /// recovery point stop before it.
    pub fn append_deferred(&mut self, records: &mut [u8], now_ms: i64) -> Result<(AppendInfo, PendingWrite), LogError> {
        let (info, write, patches) = self.append_inner(records, None, now_ms, TxnVerification::Off)?;
        apply_patches(records, &patches);
        Ok((info, write))
    }

    /// Which opening of the log this is (unique in the process; taken once per open, so
    /// no data core contends for it).
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// Report the outcome of a deferred append's write. A failure takes the log offline.
    pub fn write_done(&mut self, id: u64, result: std::io::Result<()>) -> Result<(), LogError> {
        if let Err(e) = result {
            return Err(self.go_offline_io("append write", &e, false));
        }
        let entry = self.pending_writes.iter_mut().find(|w| w.id == id);
        assert!(entry.is_some(), "write_done for unknown write {id}");
        if let Some(w) = entry {
            w.done = true;
        }
        while self.pending_writes.front().is_some_and(|w| w.done) {
            self.pending_writes.pop_front();
        }
        Ok(())
    }

    /// Offsets below this are in the file (every earlier deferred write finished).
    pub fn written_end_offset(&self) -> Offset {
        let leo = self.log_end_offset().0;
        let written = self.pending_writes.iter().find(|w| !w.done).map(|w| w.start_offset).unwrap_or(leo);
        assert!(written <= leo, "written end {written} beyond the log end {leo}");
        Offset(written)
    }

    /// The bytes of `seg` that are in the file.
    fn written_size(&self, seg: &Segment) -> u64 {
        self.pending_writes
            .iter()
            .filter(|w| !w.done && w.segment_base == seg.base_offset)
            .map(|w| w.start_pos)
            .min()
            .unwrap_or(seg.size_bytes)
    }

    pub fn has_pending_writes(&self) -> bool {
        !self.pending_writes.is_empty()
    }

    /// `append`, also stamping `partitionLeaderEpoch` = `leader_epoch` into every batch
    /// (what Kafka's leader does). The log does not fence: the caller checked that it
    /// leads in `leader_epoch`. An epoch older than the cache's latest is stamped but
    /// starts nothing in the cache.
    pub fn append_with_leader_epoch(
        &mut self,
        records: &mut [u8],
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendInfo, LogError> {
        let (info, write, patches) = self.append_inner(records, Some(leader_epoch), now_ms, TxnVerification::Off)?;
        apply_patches(records, &patches);
        let result = write.file.write_all_at(records, write.position);
        self.write_done(write.id, result)?;
        Ok(info)
    }

    /// KIP-890 part 1 for a transactional batch of `producer_id` at `epoch`: nothing to
    /// check while its transaction at this epoch is open here; otherwise the coordinator
    /// must have said the partition is in it (`TxnVerification::Verified` with the guard
    /// handed out for this producer and epoch, no marker since but one that bumped the
    /// producer to this very epoch). Under transaction version 2 a client starts its next
    /// transaction at E+1 while the marker (at E+1) of the last one, open here at E, may
    /// still be on its way: that batch is not part of the open transaction.
    fn check_txn_verification(
        &mut self,
        producer_id: i64,
        epoch: i16,
        verification: TxnVerification,
    ) -> Result<(), LogError> {
        let open = self
            .producers
            .get(crate::model::ProducerId(producer_id))
            .is_some_and(|e| e.current_txn_first_offset >= 0 && e.epoch.0 == epoch);
        match verification {
            TxnVerification::Off => Ok(()),
            _ if open => Ok(()),
            TxnVerification::Unverified => {
                let guard = match self.txn_verifications.get(&producer_id) {
                    Some((guard, e)) if *e == epoch => *guard,
                    _ => {
                        if self.txn_verifications.len() >= limits::partition_producers_max
                            && !self.txn_verifications.contains_key(&producer_id)
                        {
                            // The oldest check goes: its batch is refused and retried.
                            if let Some(oldest) =
                                self.txn_verifications.iter().min_by_key(|(_, (g, _))| *g).map(|(id, _)| *id)
                            {
                                self.txn_verifications.remove(&oldest);
                            }
                        }
                        let guard = self.next_verification_guard;
                        self.next_verification_guard += 1;
                        self.txn_verifications.insert(producer_id, (guard, epoch));
                        guard
                    }
                };
                Err(LogError::TxnVerificationNeeded { producer_id, producer_epoch: epoch, guard })
            }
            TxnVerification::Verified(guard) => match self.txn_verifications.get(&producer_id) {
                Some((g, e)) if *g == guard && *e == epoch => Ok(()),
                _ => Err(LogError::TxnVerificationStale { producer_id }),
            },
        }
    }

    fn append_inner(
        &mut self,
        records: &[u8],
        leader_epoch: Option<i32>,
        now_ms: i64,
        verification: TxnVerification,
    ) -> Result<(AppendInfo, PendingWrite, Vec<HeaderPatch>), LogError> {
        self.check_online()?;
        let batch_bytes_max = self.config.max_message_bytes.min(limits::message_bytes_max) as usize;
        let batches = validate_record_set(records, batch_bytes_max)?;
        // Idempotent producers: a retry is answered with its original offsets, a stale
        // epoch or a sequence gap refused; nothing is appended then.
        let mut producer_batches = Vec::new();
        for (_, h) in &batches {
            // Markers come from the transaction coordinator only (`append_marker_shared`).
            if h.attributes & batch::ATTR_CONTROL != 0 {
                return Err(LogError::InvalidRecord("a client may not produce control batches".into()));
            }
            if h.attributes & batch::ATTR_TRANSACTIONAL != 0 && h.producer_id < 0 {
                return Err(LogError::InvalidRecord("a transactional batch without a producer id".into()));
            }
            producer_batches.extend(producers::producer_batch(h));
        }
        if self.config.compact {
            let mut keyless = Vec::new();
            let mut index_base = 0i32;
            for (pos, h) in &batches {
                check_keyed(&records[*pos..*pos + h.size_bytes() as usize], h, index_base, &mut keyless)?;
                index_base = index_base.saturating_add(h.records_count.max(0));
            }
            if !keyless.is_empty() {
                return Err(keyless_records_refused(&self.dir, keyless));
            }
        }
        let (before, after) = (self.config.timestamp_before_max_ms, self.config.timestamp_after_max_ms);
        if self.config.timestamp_type == TimestampType::CreateTime && (before < i64::MAX || after < i64::MAX) {
            for (pos, h) in &batches {
                check_timestamps(&records[*pos..*pos + h.size_bytes() as usize], h, now_ms, before, after)?;
            }
        }
        if !producer_batches.is_empty() {
            let verdict = self.producers.check(&producer_batches, self.producer_id_bound).inspect_err(|e| {
                // What this replica remembers of the producer, to tell a client's gap
                // from a lost update of the broker's own state.
                if let crate::txn::producer_state::ProducerStateError::OutOfOrderSequence { producer_id, .. } = e {
                    tracing::warn!(dir = %self.dir.display(), producer = producer_id.0,
                        remembered = ?self.producers.get(*producer_id), log_end_offset = self.log_end_offset().0,
                        pending_writes = self.pending_writes.len(), "sequence gap: the producer's state here");
                }
            })?;
            if let Verdict::Duplicate(m) = verdict {
                return Err(LogError::DuplicateBatch(AppendInfo {
                    base_offset: Offset(m.first_offset()),
                    last_offset: Offset(m.last_offset),
                    log_append_time_ms: -1,
                    record_count: (m.offset_delta + 1) as u32,
                    bytes: 0,
                }));
            }
        }
        if let Some(b) = producer_batches.iter().find(|b| b.transactional) {
            self.check_txn_verification(b.producer_id.0, b.epoch.0, verification)?;
        }
        let record_count: i64 = batches.iter().map(|(_, h)| h.records_count as i64).sum();
        let base_offset = self.log_end_offset().0;
        let last_offset = base_offset + record_count - 1;

        let log_append_time = self.config.timestamp_type == TimestampType::LogAppendTime;
        let mut next = base_offset;
        let mut stored = Vec::with_capacity(batches.len());
        let mut patches = Vec::with_capacity(batches.len());
        for (pos, original) in &batches {
            let (pos, size) = (*pos, original.size_bytes() as usize);
            let b = &records[pos..pos + size];
            let header = batch::patched_header(b, next, leader_epoch, log_append_time.then_some(now_ms));
            let h = BatchHeader::parse(&header);
            next = h.last_offset() + 1;
            stored.push((pos, h));
            patches.push(HeaderPatch { position: pos, size, header });
        }
        assert_eq!(next, last_offset + 1);

        let write = self.place(records, &stored, now_ms)?;
        let info = AppendInfo {
            base_offset: Offset(base_offset),
            last_offset: Offset(last_offset),
            log_append_time_ms: if log_append_time { now_ms } else { -1 },
            record_count: record_count as u32,
            bytes: records.len(),
        };
        Ok((info, write, patches))
    }

    /// A follower's append: `records` are batches exactly as the leader stored them
    /// (offsets assigned, CRCs valid, `partitionLeaderEpoch` stamped), written here byte
    /// for byte. Each batch is validated as a produced one (CRC32C, magic 2, lengths,
    /// record counts), against the broker-wide `limits::message_bytes_max` rather than
    /// the topic's `max.message.bytes` (the leader already accepted it; Kafka's follower
    /// ignores the record size too). The first batch must start at the log end offset
    /// (`OffsetOutOfRange` with `offset` = its base offset otherwise: a gap or an
    /// overlap) and each next one right after the previous (`InvalidRecord` otherwise).
    /// Nothing is written if anything is refused. Indexes, segment rolls and the leader
    /// epoch cache follow as for a leader append. `log_append_time_ms` in the answer is
    /// -1: the leader's timestamps are kept as they are. Does not fsync.
    pub fn append_replicated(&mut self, records: &[u8], now_ms: i64) -> Result<AppendInfo, LogError> {
        let (info, write) = self.append_replicated_deferred(records, now_ms)?;
        let result = write.file.write_all_at(records, write.position);
        self.write_done(write.id, result)?;
        Ok(info)
    }

    /// `append_replicated` where the caller writes `records`, unchanged (no header is
    /// patched), at the returned position, then reports `write_done` (the io_uring path,
    /// as for `append_deferred` / `append_shared`).
    pub fn append_replicated_deferred(
        &mut self,
        records: &[u8],
        now_ms: i64,
    ) -> Result<(AppendInfo, PendingWrite), LogError> {
        self.check_online()?;
        let batches = validate_replicated_set(records, limits::message_bytes_max as usize)?;
        let log_end_offset = self.log_end_offset().0;
        let mut expected = log_end_offset;
        for (i, (_, h)) in batches.iter().enumerate() {
            if h.base_offset < expected && i == 0 {
                return Err(LogError::OffsetOutOfRange {
                    offset: h.base_offset,
                    log_start_offset: self.log_start_offset().0,
                    log_end_offset,
                });
            }
            if h.base_offset < expected {
                return Err(LogError::InvalidRecord(format!(
                    "replicated batch {i} starts at offset {} where {expected} or later was expected",
                    h.base_offset
                )));
            }
            expected = h.last_offset() + 1;
        }
        let record_count: i64 = batches.iter().map(|(_, h)| h.records_count as i64).sum();
        let write = self.place(records, &batches, now_ms)?;
        let info = AppendInfo {
            base_offset: Offset(batches[0].1.base_offset),
            last_offset: Offset(expected - 1),
            log_append_time_ms: -1,
            record_count: record_count as u32,
            bytes: records.len(),
        };
        Ok((info, write))
    }

    /// Take in a validated record set whose batches, as they will be stored, are
    /// `batches` (position in the set, header), contiguous from the log end offset: roll
    /// if due, record new leader epochs (the checkpoint is saved before the bytes are
    /// written), register the pending write and index the batches. Returns where to
    /// write the set.
    /// Markers end their producer's transaction; an aborted one goes into the active
    /// segment's transaction index (written now, fsynced with the segment).
    fn place(
        &mut self,
        records: &[u8],
        batches: &[(usize, BatchHeader)],
        now_ms: i64,
    ) -> Result<PendingWrite, LogError> {
        let total_bytes = records.len();
        assert!(total_bytes as u64 <= u32::MAX as u64 / 2, "record set too large for one segment");
        let (Some((_, first)), Some((_, last))) = (batches.first(), batches.last()) else {
            panic!("placing an empty record set");
        };
        let base_offset = first.base_offset;
        let last_offset = last.last_offset();
        // A follower copying a compacted leader may skip offsets; nothing goes back.
        assert!(base_offset >= self.log_end_offset().0, "appends continue the log");
        if self.should_roll(total_bytes as u64, last_offset, now_ms) {
            self.roll()?;
        }
        // Before any state changes: a file that cannot be opened now (no descriptor
        // left) refuses the append, retriably, and leaves the log as it was.
        let file = self.active().file()?;
        // Leader, follower and recovery alike: the same batches give the same state.
        for (pos, h) in batches {
            if let Some(b) = producers::producer_batch(h) {
                self.producers.apply(&b, h.last_offset());
                continue;
            }
            let bytes = &records[*pos..*pos + h.size_bytes() as usize];
            let Some(marker) = (h.producer_id >= 0).then(|| batch::control_marker(bytes, h)).flatten() else {
                continue;
            };
            // A marker ends what a verification was for, unless it bumps the producer to
            // the verified epoch (transaction version 2: the next transaction was
            // verified at E+1 before the last one's marker at E+1 landed), as Kafka.
            let bumps_to_verified = self.txn_verifications.get(&h.producer_id).is_some_and(|(_, e)| {
                *e == h.producer_epoch
                    && self.producers.get(crate::model::ProducerId(h.producer_id)).is_some_and(|p| p.epoch.0 < *e)
            });
            if !bumps_to_verified {
                self.txn_verifications.remove(&h.producer_id);
            }
            let txn = self.producers.apply_marker(
                crate::model::ProducerId(h.producer_id),
                crate::model::ProducerEpoch(h.producer_epoch),
                marker.commit,
                marker.coordinator_epoch,
                h.base_offset,
                h.max_timestamp,
            );
            if let Some(aborted) = producers::aborted_entry(&txn) {
                let r = self.active_mut().txn_index.push(aborted);
                self.offline_on_err("append: transaction index", r)?;
            }
        }

        let mut epochs_changed = false;
        for (_, h) in batches {
            epochs_changed |= self.leader_epochs.assign_if_newer(h.partition_leader_epoch, h.base_offset);
        }
        if epochs_changed {
            self.save_leader_epochs("append: leader-epoch-checkpoint", last_offset + 1)?;
        }

        let interval = self.config.index_interval_bytes;
        let write_pos = self.active().size_bytes;
        let id = self.next_write_id;
        self.next_write_id += 1;
        let segment_base = self.active().base_offset;
        self.pending_writes.push_back(PendingAppend {
            id,
            segment_base,
            start_pos: write_pos,
            start_offset: self.log_end_offset().0,
            done: false,
        });
        let write = PendingWrite { log: self.instance, id, file, position: write_pos };
        let seg = self.active_mut();
        for (pos, h) in batches {
            seg.note_batch(write_pos + *pos as u64, h, interval);
        }
        seg.size_bytes += total_bytes as u64;
        if seg.first_batch_time_ms.is_none() {
            seg.first_batch_time_ms = Some(now_ms);
        }
        assert_eq!(seg.next_offset, last_offset + 1);
        self.first_unflushed_append_ms.get_or_insert(now_ms);
        Ok(write)
    }

    /// Replace `leader-epoch-checkpoint` after a change of the cache, checking it against
    /// the log (`log_end_offset` as it is, or is about to be). No fsync here (this runs on
    /// the data core): the next flush fsyncs the file before the recovery point passes
    /// the change, and open reconciles the checkpoint with the recovered tail
    /// (`open_leader_epochs`). A failure takes the log offline.
    fn save_leader_epochs(&mut self, context: &str, log_end_offset: i64) -> Result<(), LogError> {
        check_leader_epochs(&self.leader_epochs, self.log_start_offset().0, log_end_offset);
        let path = self.dir.join(leader_epoch::CHECKPOINT_FILE);
        let r = crate::model::write_file_replacing(&path, self.leader_epochs.encode().as_bytes());
        self.offline_on_err(context, r)?;
        self.replaced_unsynced(path);
        Ok(())
    }

    /// A small file was replaced (written and renamed) without an fsync: the next flush
    /// syncs it (by path: whatever replaced it since is what must be durable) and the
    /// directory. No descriptor is held meanwhile.
    fn replaced_unsynced(&mut self, path: PathBuf) {
        self.owe_sync(SyncTarget::Path(path));
        self.dir_changes += 1;
    }

    /// The next flush round syncs `target` (once, however often it is owed).
    fn owe_sync(&mut self, target: SyncTarget) {
        if !self.unsynced_files.contains(&target) {
            self.unsynced_files.push(target);
        }
    }

    /// The latest leader epoch the log knows of (None before any batch carried one).
    pub fn latest_epoch(&self) -> Option<i32> {
        self.leader_epochs.latest_epoch()
    }

    /// The leader epoch `offset` was written in (the cache's entry covering it).
    pub fn epoch_for_offset(&self, offset: Offset) -> Option<i32> {
        self.leader_epochs.epoch_for_offset(offset.0)
    }

    /// The leader epoch cache: (epoch, start offset) entries, both strictly increasing.
    pub fn epoch_entries(&self) -> &[EpochEntry] {
        self.leader_epochs.entries()
    }

    /// The answer to OffsetForLeaderEpoch (KIP-101/KIP-279): the largest known epoch <=
    /// `requested_epoch` and the offset where it ended (the next epoch's start, or the
    /// log end offset for the latest epoch); `(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)`,
    /// i.e. (-1, -1), when the log cannot tell (a newer epoch than any known, an empty
    /// cache, -1 asked). See `LeaderEpochCache::end_offset_for` for the older-than-all case.
    pub fn end_offset_for_epoch(&self, requested_epoch: i32) -> (i32, i64) {
        self.leader_epochs.end_offset_for(requested_epoch, self.log_end_offset().0)
    }

    /// A new leader in `leader_epoch` records that its epoch starts at the log end
    /// offset, before its first append in that epoch (Kafka's `Partition.makeLeader`), so
    /// that OffsetForLeaderEpoch answers for older epochs end where it took over. No-op
    /// unless `leader_epoch` is newer than the latest known. As in Kafka, such an entry
    /// with no batch behind it does not survive a reopen (the cache is cut to the log).
    pub fn assign_leader_epoch(&mut self, leader_epoch: i32) -> Result<(), LogError> {
        self.check_online()?;
        let log_end_offset = self.log_end_offset().0;
        if self.leader_epochs.assign_if_newer(leader_epoch, log_end_offset) {
            self.save_leader_epochs("assign leader epoch: leader-epoch-checkpoint", log_end_offset)?;
        }
        Ok(())
    }

    fn should_roll(&self, extra_bytes: u64, last_offset: i64, now_ms: i64) -> bool {
        let seg = self.active();
        if seg.is_empty() {
            return false;
        }
        let segment_bytes = self.config.segment_bytes.min(u32::MAX as u64 / 2);
        seg.size_bytes + extra_bytes > segment_bytes
            || seg.first_batch_time_ms.is_some_and(|t| now_ms.saturating_sub(t) >= self.config.segment_ms)
            || seg.index.is_full()
            || seg.time_index.is_full()
            || last_offset - seg.base_offset > u32::MAX as i64
    }

    fn roll(&mut self) -> Result<(), LogError> {
        let next = self.log_end_offset().0;
        // The producer state of every batch below the new segment (Kafka's roll),
        // fsynced by the flush the roll makes due (a snapshot lost to a power loss only
        // means a longer replay from an older one at open).
        let path = producers::snapshot_path(&self.dir, next);
        let r = crate::model::write_file_replacing(&path, &self.producers.encode_snapshot());
        self.offline_on_err("roll: producer state snapshot", r)?;
        self.replaced_unsynced(path);
        let r = self.active_mut().become_inactive();
        self.offline_on_err("roll: trim indexes", r)?;
        // The trimmed indexes join the next round even when the recovery point already
        // passed the segment (its last batch flushed before this roll): a round syncs a
        // segment's indexes only while it holds unflushed batches, so those rolled at a
        // round's edge stayed at their unsynced length, and a power cut tore them.
        for target in [self.active().index.sync_target(), self.active().time_index.sync_target()] {
            self.owe_sync(target);
        }
        let r = Segment::create(&self.dir, next, self.config.segment_index_bytes);
        let seg = self.offline_on_err("roll: create segment", r)?;
        self.segments.push(seg);
        self.dir_changes += 1;
        Ok(())
    }

    /// Plan a read of at most `max_bytes` (at least one whole batch is returned even if it
    /// is larger, as Kafka does, when `min_one_batch`), from `offset`, below `upper`.
    /// Reads stop at the end of a segment. A batch whose last offset reaches `upper` is
    /// not returned.
    pub fn read(
        &self,
        offset: Offset,
        max_bytes: usize,
        upper: Offset,
        min_one_batch: bool,
    ) -> Result<ReadPlan, LogError> {
        self.check_online()?;
        let (start, end) = (self.log_start_offset().0, self.log_end_offset().0);
        let offset = offset.0;
        if offset < start || offset > end {
            return Err(LogError::OffsetOutOfRange { offset, log_start_offset: start, log_end_offset: end });
        }
        let mut i = self.segments.partition_point(|s| s.base_offset <= offset).saturating_sub(1);
        // A segment that ends below the offset (a cleaned one may end early, or hold
        // nothing) is passed over: the read starts at the next batch, wherever it is.
        while i + 1 < self.segments.len() && self.segments[i].next_offset <= offset {
            i += 1;
        }
        let upper = upper.min(self.written_end_offset());
        let corrupt = |seg: &Segment, stop: segment::ScanStop| {
            LogError::Corrupt(format!("segment {} at {}: {}", seg.base_offset, stop.position_bytes, stop.reason))
        };
        let (seg, position, found) = loop {
            let seg = &self.segments[i];
            if offset >= upper.0 || offset >= seg.next_offset {
                let empty = ReadPlan {
                    file: seg.file()?,
                    segment_base_offset: Offset(seg.base_offset),
                    position_bytes: seg.size_bytes,
                    length_bytes: 0,
                };
                return Ok(empty);
            }
            let (position, found) = seg.position_of(offset).map_err(|stop| corrupt(seg, stop))?;
            if found.is_none() && i + 1 < self.segments.len() {
                i += 1;
                continue;
            }
            break (seg, position, found);
        };
        let written_size = self.written_size(seg);
        let corrupt = |stop: segment::ScanStop| corrupt(seg, stop);
        // Where the readable bytes end: the segment's written end when `upper` is at or
        // past it, else the start of the batch holding `upper` (an index lookup and a
        // short scan). No batch header between is read.
        let written_end = seg.next_offset.min(self.written_end_offset().0);
        let limit = if upper.0 >= written_end {
            written_size
        } else {
            seg.position_of(upper.0).map_err(corrupt)?.0.min(written_size)
        };
        let available = limit.saturating_sub(position);
        let mut length = available;
        if available > max_bytes as u64 {
            // Cut at the last batch boundary within max_bytes: from the last indexed
            // batch at or below it, walk the few headers up to it.
            let cut_max = position + max_bytes as u64;
            let from = u32::try_from(cut_max)
                .ok()
                .and_then(|p| seg.index.lookup_position(p))
                .map_or(position, |(_, p)| (p as u64).max(position));
            let mut pos = from;
            while let Some(h) = seg.header_at(pos, limit).map_err(corrupt)? {
                if pos + h.size_bytes() > cut_max {
                    break;
                }
                pos += h.size_bytes();
            }
            length = pos - position;
            if length == 0 && min_one_batch {
                // KIP-74: the first batch whole, however large.
                length = found.map_or(0, |h| h.size_bytes().min(available));
            }
        }
        Ok(ReadPlan {
            file: seg.file()?,
            segment_base_offset: Offset(seg.base_offset),
            position_bytes: position,
            length_bytes: length,
        })
    }

    pub fn log_start_offset(&self) -> Offset {
        debug_assert!(self.segments[0].base_offset <= self.log_start_offset);
        Offset(self.log_start_offset)
    }

    pub fn log_end_offset(&self) -> Offset {
        Offset(self.active().next_offset)
    }

    /// The offset below which data is known durable.
    pub fn recovery_point(&self) -> Offset {
        Offset(self.recovery_point)
    }

    /// ListOffsets by timestamp: the first offset whose record timestamp >= `ts_ms`, with
    /// that timestamp; None when no such record. Exact, as in Kafka, for uncompressed and
    /// compressed batches (decompressed up to batch::TIMESTAMP_SEARCH_DECOMPRESSED_BYTES_MAX;
    /// a batch past that, or unreadable, gives its base offset and max timestamp); for a
    /// LogAppendTime batch, where every record has the batch's time, its base offset.
    pub fn offset_for_timestamp(&self, ts_ms: i64) -> Result<Option<(Offset, i64)>, LogError> {
        self.check_online()?;
        let mut buf = Vec::new();
        for seg in &self.segments {
            if seg.max_timestamp_ms < ts_ms || seg.is_empty() {
                continue;
            }
            let from = match seg.time_index.lookup_time_below(ts_ms) {
                Some((_, rel)) => seg.base_offset + rel as i64 + 1,
                None => seg.base_offset,
            };
            if from >= seg.next_offset {
                continue;
            }
            let corrupt = |stop: segment::ScanStop| {
                LogError::Corrupt(format!("segment {} at {}: {}", seg.base_offset, stop.position_bytes, stop.reason))
            };
            let (mut pos, _) = seg.position_of(from).map_err(corrupt)?;
            let written_size = self.written_size(seg);
            while let Some(h) = seg.header_at(pos, written_size).map_err(corrupt)? {
                // Records below the log start (DeleteRecords) are not found, as in Kafka.
                if h.max_timestamp >= ts_ms && h.last_offset() >= self.log_start_offset {
                    if !h.is_log_append_time() {
                        buf.resize(h.size_bytes() as usize, 0);
                        seg.file()?.read_exact_at(&mut buf, pos)?;
                        if let Some((offset, ts)) = batch::find_record_by_timestamp(&buf, &h, ts_ms) {
                            return Ok(Some((Offset(offset.max(self.log_start_offset)), ts)));
                        }
                    }
                    return Ok(Some((Offset(h.base_offset.max(self.log_start_offset)), h.max_timestamp)));
                }
                pos += h.size_bytes();
            }
        }
        Ok(None)
    }

    /// ListOffsets MAX_TIMESTAMP (-3, KIP-734): the record with the largest timestamp, as
    /// (offset, timestamp, the leader epoch of its batch when known); None for an empty log.
    /// As Kafka's `UnifiedLog.fetchOffsetByTimestamp`: the first segment holding the largest
    /// max timestamp, in it the first batch whose max timestamp is that, in that batch the
    /// first record carrying it (decompressed as `offset_for_timestamp` does; a LogAppendTime
    /// batch, or one that cannot be read, gives its base offset). So of several records
    /// sharing the largest timestamp, the earliest wins, and inside a compressed batch the
    /// record is found even when it is not the batch's last. Like Kafka, segments below the
    /// log start (DeleteRecords) still count; the caller bounds the answer by what a
    /// consumer may read.
    pub fn offset_for_max_timestamp(&self) -> Result<Option<(Offset, i64, Option<i32>)>, LogError> {
        self.check_online()?;
        let mut best: Option<&Segment> = None;
        for seg in &self.segments {
            if best.is_none_or(|b| seg.max_timestamp_ms > b.max_timestamp_ms) {
                best = Some(seg);
            }
        }
        let Some(seg) = best.filter(|s| !s.is_empty()) else { return Ok(None) };
        let corrupt = |stop: segment::ScanStop| {
            LogError::Corrupt(format!("segment {} at {}: {}", seg.base_offset, stop.position_bytes, stop.reason))
        };
        if seg.offset_of_max_timestamp >= self.written_end_offset().0 {
            // Its batch is still being written: not readable yet, as Kafka's HW bound says too.
            return Ok(None);
        }
        // The segment keeps the first batch to reach its max (by last offset): start there.
        let (mut pos, _) = seg.position_of(seg.offset_of_max_timestamp).map_err(corrupt)?;
        let written_size = self.written_size(seg);
        let mut buf = Vec::new();
        while let Some(h) = seg.header_at(pos, written_size).map_err(corrupt)? {
            if h.max_timestamp == seg.max_timestamp_ms {
                let epoch = (h.partition_leader_epoch >= 0).then_some(h.partition_leader_epoch);
                if !h.is_log_append_time() {
                    buf.resize(h.size_bytes() as usize, 0);
                    seg.file()?.read_exact_at(&mut buf, pos)?;
                    if let Some((offset, ts)) = batch::find_record_by_timestamp(&buf, &h, h.max_timestamp) {
                        return Ok(Some((Offset(offset), ts, epoch)));
                    }
                }
                return Ok(Some((Offset(h.base_offset), h.max_timestamp, epoch)));
            }
            pos += h.size_bytes();
        }
        Ok(None)
    }

    /// True when the flush policy (flush.messages / flush.ms) says an fsync is due, or a
    /// rolled segment is not durable yet.
    pub fn flush_due(&self, now_ms: i64) -> bool {
        if self.offline.is_some() {
            return false;
        }
        let unflushed = self.log_end_offset().0 - self.recovery_point;
        let by_count = unflushed > 0 && unflushed as u64 >= self.config.flush_messages;
        let by_time = unflushed > 0
            && self.first_unflushed_append_ms.is_some_and(|t| now_ms.saturating_sub(t) >= self.config.flush_ms);
        let rolled = self.segments[..self.segments.len() - 1].iter().any(|s| s.next_offset > self.recovery_point);
        by_count || by_time || rolled
    }

    /// Everything written so far that is not yet durable: the offset a flush must cover.
    pub fn unflushed_end(&self) -> Offset {
        self.written_end_offset()
    }

    /// fdatasync the active segment (and any rolled unsynced ones). Blocking; the broker
    /// calls it off the data core. A failure takes the log offline for good.
    pub fn flush(&mut self) -> Result<(), LogError> {
        self.check_online()?;
        let handle = self.flush_handle();
        let result = handle.sync();
        self.mark_flushed(handle.flushed, result).map(|_| ())
    }

    /// A handle to do the fdatasync on another thread (group commit): the files to sync
    /// (segments above the recovery point, small files replaced since the last handle,
    /// then the directory if it changed) and what they cover; then
    /// `mark_flushed(handle.flushed, result)`. One handle at a time.
    pub fn flush_handle(&mut self) -> FlushHandle {
        self.truncated_below = None;
        let dir_dirty = self.dir_changes != self.dir_synced_changes;
        let last = self.segments.len() - 1;
        let mut files = Vec::new();
        for (i, seg) in self.segments.iter().enumerate() {
            if seg.next_offset > self.recovery_point || (i == last && dir_dirty) {
                files.extend(seg.sync_files(i != last));
            }
        }
        files.append(&mut self.unsynced_files);
        if dir_dirty {
            files.push(SyncTarget::Path(self.dir.clone()));
        }
        FlushHandle { files, flushed: Flushed { upto: self.written_end_offset(), dir_changes: self.dir_changes } }
    }

    /// Record a flush round's outcome. Returns the offset below which the round made
    /// the log durable: its `upto`, lowered to a truncation made while it ran (the
    /// records the new ones replaced at those offsets were what it synced).
    pub fn mark_flushed(&mut self, flushed: Flushed, result: std::io::Result<()>) -> Result<Offset, LogError> {
        self.check_online()?;
        if let Err(e) = result {
            return Err(self.go_offline_io("fdatasync", &e, true));
        }
        let mut upto = flushed.upto.0.min(self.written_end_offset().0);
        if let Some(t) = self.truncated_below.take() {
            upto = upto.min(t);
        }
        self.recovery_point = self.recovery_point.max(upto);
        self.dir_synced_changes = self.dir_synced_changes.max(flushed.dir_changes);
        if self.recovery_point >= self.log_end_offset().0 {
            self.first_unflushed_append_ms = None;
        }
        let (done, rp) = (self.checkpointed_recovery_point, self.recovery_point);
        if self.segments.iter().any(|s| s.base_offset > done && s.base_offset <= rp) {
            if let Err(e) = write_checkpoint(&self.dir, rp, false, false) {
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not write the recovery point");
            } else {
                self.checkpointed_recovery_point = rp;
                // Written after the round (a checkpoint the kernel wrote back before the
                // segments it covers would claim bytes a power cut can take), so the next
                // round syncs it and the directory. Until then a cut finds the one before:
                // stale, so safe, and at most a segment or two to recover. Left unsynced,
                // a cut found an empty file (a new inode's data is not durable through
                // the directory's fsync) and recovered the whole log from offset 0.
                self.replaced_unsynced(self.dir.join(RECOVERY_POINT_FILE));
            }
        }
        Ok(Offset(upto))
    }

    /// Roll if segment.bytes / segment.ms say so (also checked on append).
    pub fn maybe_roll(&mut self, now_ms: i64) -> Result<(), LogError> {
        self.check_online()?;
        if self.should_roll(1, self.log_end_offset().0, now_ms) {
            self.roll()?;
        }
        Ok(())
    }

    /// Delete whole expired segments (retention.ms / retention.bytes), never the active
    /// one. Returns the number of segments deleted.
    pub fn enforce_retention(&mut self, now_ms: i64) -> Result<usize, LogError> {
        self.check_online()?;
        let mut deleted = self.delete_segments_below_log_start()?;
        if self.config.delete && self.config.retention_ms >= 0 {
            while self.segments.len() > 1 && self.written_size(&self.segments[0]) == self.segments[0].size_bytes {
                let seg = &self.segments[0];
                let largest_ms = if seg.max_timestamp_ms >= 0 {
                    seg.max_timestamp_ms
                } else {
                    file_mtime_ms(&seg.log_path).unwrap_or(now_ms)
                };
                if now_ms.saturating_sub(largest_ms) <= self.config.retention_ms {
                    break;
                }
                self.delete_oldest_segment()?;
                deleted += 1;
            }
        }
        if self.config.delete && self.config.retention_bytes >= 0 {
            let mut excess = self.size_bytes() as i64 - self.config.retention_bytes;
            while self.segments.len() > 1
                && excess >= self.segments[0].size_bytes as i64
                && self.written_size(&self.segments[0]) == self.segments[0].size_bytes
            {
                excess -= self.segments[0].size_bytes as i64;
                self.delete_oldest_segment()?;
                deleted += 1;
            }
        }
        self.log_start_offset = self.log_start_offset.max(self.segments[0].base_offset);
        self.recovery_point = self.recovery_point.max(self.log_start_offset().0);
        if deleted > 0 {
            let start = self.log_start_offset().0;
            self.producers.remove_before(start);
            let r = producers::delete_snapshots_outside(&self.dir, start, i64::MAX);
            self.offline_on_err("retention: delete producer snapshots", r)?;
        }
        if self.leader_epochs.truncate_from_start(self.log_start_offset().0) {
            let end = self.log_end_offset().0;
            self.save_leader_epochs("retention: leader-epoch-checkpoint", end)?;
        }
        Ok(deleted)
    }

    /// The oldest segment leaves the log: its files are renamed `*.deleted` here and
    /// unlinked by whoever takes it from `take_deleted_segments` (closing the last file
    /// of a large segment frees its blocks, which may take a while: not on a data core).
    fn delete_oldest_segment(&mut self) -> Result<(), LogError> {
        let mut seg = self.segments.remove(0);
        let r = seg.rename_deleted();
        self.deleted_segments.push(DeletedSegment(seg));
        self.offline_on_err("retention: rename segment", r)?;
        self.dir_changes += 1;
        Ok(())
    }

    /// The newest segment leaves the log (truncation), renamed `*.deleted` like
    /// retention's.
    fn retire_newest_segment(&mut self, context: &str) -> Result<(), LogError> {
        let mut seg = self.segments.pop().expect("a segment to retire");
        let r = seg.rename_deleted();
        self.deleted_segments.push(DeletedSegment(seg));
        self.offline_on_err(context, r)?;
        self.dir_changes += 1;
        Ok(())
    }

    /// Replace the recovery point file with `recovery_point`, no fsync (the next flush
    /// syncs it and the directory).
    fn replace_recovery_point(&mut self, context: &str) -> Result<(), LogError> {
        let path = self.dir.join(RECOVERY_POINT_FILE);
        let r = crate::model::write_file_replacing(&path, checkpoint_text(self.recovery_point).as_bytes());
        self.offline_on_err(context, r)?;
        self.replaced_unsynced(path);
        self.checkpointed_recovery_point = self.recovery_point;
        Ok(())
    }

    /// Whether the last truncation (`truncate_to`, `truncate_fully_and_start_at`) is
    /// durable: a flush has synced the cut segment, the recovery point, the epoch
    /// checkpoint and the directory since. Appending past the cut waits for it.
    pub fn truncation_durable(&self) -> bool {
        self.dir_synced_changes >= self.truncated_at_change
    }

    /// Small files replaced or a directory changed since the last flush: a flush is
    /// owed even with nothing new to sync in the segments (the shard's tick queues one).
    pub fn sync_owed(&self) -> bool {
        !self.unsynced_files.is_empty() || self.dir_changes != self.dir_synced_changes
    }

    /// `compression.type` other than `producer`: the record set with every batch in
    /// another codec re-encoded in the topic's (Kafka recompresses on the broker too).
    /// None when nothing needs it. This costs CPU on the data core: the default,
    /// `producer`, stores batches as they come.
    pub fn recompress(&self, records: &[u8]) -> Result<Option<Vec<u8>>, LogError> {
        let Some(codec) = self.config.compression else { return Ok(None) };
        let mut out: Option<Vec<u8>> = None;
        let mut pos = 0;
        while pos < records.len() {
            let (h, size) = batch::check_structure(&records[pos..], limits::message_bytes_max as usize)?;
            let whole = &records[pos..pos + size];
            match cleaner::recompress_batch(whole, &h, codec).map_err(LogError::InvalidRecord)? {
                Some(rebuilt) => {
                    out.get_or_insert_with(|| records[..pos].to_vec()).extend_from_slice(&rebuilt);
                }
                None => {
                    if let Some(o) = out.as_mut() {
                        o.extend_from_slice(whole);
                    }
                }
            }
            pos += size;
        }
        Ok(out)
    }

    /// Plan a cleaning pass when `cleanup.policy` has `compact` and one is due: the
    /// rolled segments wholly below the cleanable end (the active segment's base, the
    /// recovery point, the high watermark, and `min.compaction.lag.ms`) hold more than
    /// `min.cleanable.dirty.ratio` dirty bytes (above the cleaner checkpoint), or the
    /// oldest dirty one is older than `max.compaction.lag.ms`, or a tombstone's delete
    /// horizon has passed. Cheap (in-memory sizes only): the shard asks on its tick.
    /// The caller runs `cleaner::run(&job)` off the data core, then `install_cleaned`.
    pub fn clean_job(
        &mut self,
        now_ms: i64,
        high_watermark: Offset,
        settings: &CleanerSettings,
    ) -> Option<cleaner::CleanJob> {
        if !self.config.compact || self.offline.is_some() {
            return None;
        }
        // Nothing at or above the last stable offset is cleaned (an open transaction's
        // records may still be aborted).
        let stable = self.last_stable_offset(high_watermark).0;
        let end = self.active().base_offset.min(self.recovery_point).min(stable);
        let lag_cut = now_ms.saturating_sub(self.config.min_compaction_lag_ms);
        let rolled = &self.segments[..self.segments.len() - 1];
        let n = rolled
            .iter()
            .take_while(|s| {
                s.next_offset <= end
                    && self.written_size(s) == s.size_bytes
                    && (self.config.min_compaction_lag_ms <= 0 || s.max_timestamp_ms <= lag_cut)
            })
            .count();
        if n == 0 {
            return None;
        }
        let segs = &self.segments[..n];
        let dirty_from = self.cleaner_checkpoint.max(segs[0].base_offset);
        let total: u64 = segs.iter().map(|s| s.size_bytes).sum();
        let dirty: u64 = segs.iter().filter(|s| s.next_offset > dirty_from).map(|s| s.size_bytes).sum();
        let by_ratio = dirty > 0 && dirty as f64 >= self.config.min_cleanable_dirty_ratio * total as f64;
        let max_lag = self.config.max_compaction_lag_ms;
        let by_lag = dirty > 0
            && segs
                .iter()
                .find(|s| s.next_offset > dirty_from)
                .and_then(|s| s.first_batch_time_ms)
                .is_some_and(|t| now_ms.saturating_sub(t) >= max_lag);
        let by_horizon = self.clean_horizon_ms.is_some_and(|t| now_ms >= t);
        if !(by_ratio || by_lag || by_horizon) {
            return None;
        }
        // A file that cannot be opened now (no descriptor left): a later tick tries.
        let files = segs.iter().map(|s| s.file().ok()).collect::<Option<Vec<_>>>()?;
        Some(cleaner::CleanJob {
            dir: self.dir.clone(),
            segments: segs
                .iter()
                .zip(files)
                .map(|(s, log)| cleaner::SegmentFile {
                    base_offset: s.base_offset,
                    id: s.id,
                    next_offset: s.next_offset,
                    size_bytes: s.size_bytes,
                    log,
                    aborted: s.txn_index.entries().to_vec(),
                })
                .collect(),
            aborted: self.segments.iter().flat_map(|s| s.txn_index.entries().iter().copied()).collect(),
            dirty_from,
            now_ms,
            delete_retention_ms: self.config.delete_retention_ms,
            segment_bytes: self.config.segment_bytes,
            index_interval_bytes: self.config.index_interval_bytes,
            segment_index_bytes: self.config.segment_index_bytes,
            batch_bytes_max: limits::message_bytes_max as usize,
            live_producers: self.producers.live(),
            log_end_batch: (n == rolled.len() && self.active().is_empty()).then(|| self.log_end_offset().0 - 1),
            map_bytes_max: settings.map_bytes_max,
            io_bytes_per_second: settings.io_bytes_per_second,
            cancel: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        })
    }

    /// Swap a finished pass's cleaned segments in (renames only: cheap enough for the
    /// data core; the next flush syncs the directory). A group whose segments are no
    /// longer the ones the pass read (retention or a truncation came first) is dropped
    /// and its files left for `take_cleaner_leftovers`. For each group, in this order:
    /// `<base>.log.cleaned` -> `<base>.log.swap` (the swap is decided: an open finishes
    /// it, `cleaner::finish_swaps`), `<base>.txnindex.cleaned` (if the pass wrote one)
    /// over `<base>.txnindex`, the other replaced segments -> `*.deleted`, the
    /// cleaned indexes over `<base>.index` / `<base>.timeindex`, `<base>.log.swap` over
    /// `<base>.log`. Readers holding a replaced segment's file keep reading it. The
    /// cleaner checkpoint moves to where the pass's key map stopped, unless a group was
    /// dropped (its records still wait for a pass).
    pub fn install_cleaned(&mut self, outcome: cleaner::CleanOutcome) -> Result<CleanInstalled, LogError> {
        self.check_online()?;
        let mut done = CleanInstalled::default();
        for g in outcome.groups {
            let at = self.segments.iter().position(|s| s.base_offset == g.base_offset);
            let intact = at.filter(|&i| {
                i + g.replaces.len() < self.segments.len()
                    && g.replaces.iter().enumerate().all(|(k, (base, id))| {
                        let s = &self.segments[i + k];
                        s.base_offset == *base && s.id == *id && self.written_size(s) == s.size_bytes
                    })
            });
            let Some(i) = intact else {
                self.cleaner_leftovers.push(g.base_offset);
                done.groups_discarded += 1;
                continue;
            };
            let n = g.replaces.len();
            let base = g.base_offset;
            let [log_cleaned, index_cleaned, time_cleaned] = cleaner::cleaned_paths(&self.dir, base);
            let log_path = self.dir.join(segment::file_name(base, ".log"));
            let mut swap = log_path.clone().into_os_string();
            swap.push(cleaner::SWAP_SUFFIX);
            let r = std::fs::rename(&log_cleaned, &swap);
            self.offline_on_err("clean: rename to .swap", r)?;
            // The group's aborted transactions only once the swap is decided: the cleaned
            // `.txnindex` lacks the transactions whose batches the pass removed, which
            // the old segments still hold (an open finishes this rename with the swap).
            let txn_cleaned = cleaner::cleaned_txn_index_path(&self.dir, base);
            if txn_cleaned.exists() {
                let r = std::fs::rename(&txn_cleaned, self.dir.join(segment::file_name(base, ".txnindex")));
                self.offline_on_err("clean: rename the cleaned .txnindex", r)?;
            }
            for _ in 1..n {
                let mut seg = self.segments.remove(i + 1);
                done.bytes_before += seg.size_bytes;
                let r = seg.rename_deleted();
                self.deleted_segments.push(DeletedSegment(seg));
                self.offline_on_err("clean: rename a replaced segment", r)?;
            }
            let r = std::fs::rename(&index_cleaned, self.dir.join(segment::file_name(base, ".index")))
                .and_then(|()| std::fs::rename(&time_cleaned, self.dir.join(segment::file_name(base, ".timeindex"))))
                .and_then(|()| std::fs::rename(&swap, &log_path));
            self.offline_on_err("clean: swap the cleaned segment in", r)?;
            self.dir_changes += 1;
            let r = Segment::open(&self.dir, base);
            let (mut seg, bad_index) = self.offline_on_err("clean: open the cleaned segment", r)?;
            if bad_index || seg.load_trusting_indexes().is_err() {
                return Err(self.go_offline(format!("clean: the cleaned segment {base} does not match its index")));
            }
            // The old first segment's files were replaced by the renames: dropped, not
            // deleted (its names are the new segment's now).
            let old = std::mem::replace(&mut self.segments[i], seg);
            done.bytes_before += old.size_bytes;
            done.bytes_after += self.segments[i].size_bytes;
            done.segments_replaced += n;
            done.segments_written += 1;
        }
        if done.groups_discarded == 0 && outcome.cleaned_to > self.cleaner_checkpoint {
            self.cleaner_checkpoint = outcome.cleaned_to;
            let (topic, partition) = topic_partition_of(&self.dir);
            let text = cleaner::checkpoint_text(&topic, partition, self.cleaner_checkpoint);
            let path = self.dir.join(cleaner::CHECKPOINT_FILE);
            let r = crate::model::write_file_replacing(&path, text.as_bytes());
            self.offline_on_err("clean: cleaner-offset-checkpoint", r)?;
            self.replaced_unsynced(path);
        }
        self.clean_horizon_ms = outcome.next_horizon_ms;
        self.last_clean_ms = Some(outcome.now_ms);
        Ok(done)
    }

    /// For a compacted log: the dirty ratio of its rolled segments (bytes above the
    /// cleaner checkpoint over all) and when a pass was last installed.
    pub fn cleaner_state(&self) -> Option<(f64, Option<i64>)> {
        if !self.config.compact {
            return None;
        }
        let rolled = &self.segments[..self.segments.len() - 1];
        let total: u64 = rolled.iter().map(|s| s.size_bytes).sum();
        let dirty: u64 = rolled.iter().filter(|s| s.next_offset > self.cleaner_checkpoint).map(|s| s.size_bytes).sum();
        let ratio = if total == 0 { 0.0 } else { dirty as f64 / total as f64 };
        Some((ratio, self.last_clean_ms))
    }

    /// The cleaner checkpoint: offsets below it have been through a pass's key map.
    pub fn cleaner_checkpoint(&self) -> Offset {
        Offset(self.cleaner_checkpoint)
    }

    /// `.cleaned` files of passes `install_cleaned` dropped, to unlink off the core.
    pub fn take_cleaner_leftovers(&mut self) -> Vec<PathBuf> {
        let dir = self.dir.clone();
        self.cleaner_leftovers.drain(..).flat_map(|base| cleaner::cleaned_paths(&dir, base)).collect()
    }

    /// Segments retention removed from the log, to unlink (`DeletedSegment::remove`),
    /// off the data core.
    pub fn take_deleted_segments(&mut self) -> Vec<DeletedSegment> {
        std::mem::take(&mut self.deleted_segments)
    }

    /// Remove every record at or above `offset` (whole batches: a batch that holds
    /// `offset` goes entirely). Below the log start, the log restarts empty at `offset`.
    /// The leader epoch cache forgets every epoch starting at or after the new log end
    /// (a follower cutting its divergent suffix, KIP-101); the recovery point and the
    /// written end offset (the high watermark of a single replica) are clamped to it.
    ///
    /// No fsync here (a follower's fetcher calls it on the data core): the cut, the
    /// lowered recovery point and the epoch checkpoint are in the page cache when it
    /// returns (a kill -9 keeps them), segments above the cut are renamed `*.deleted`
    /// (`take_deleted_segments`), and the next flush makes it all durable
    /// (`truncation_durable`); the fetcher waits for that flush before it appends past
    /// the cut, so that a power loss never finds new bytes below a stale recovery point.
    ///
    /// Refused, by panicking, while any append is still being written
    /// (`has_pending_writes()`): an in-flight write could land past the cut, and the cut
    /// is found by reading headers that may not be in the file yet. The caller
    /// (`Shard::replica_truncate`, for the follower's fetcher) refuses until they are.
    ///
    /// `high_watermark`: the replica's, before the cut. The producer state is rebuilt
    /// from a snapshot at or below it and the cut (`producers::rebuild`).
    pub fn truncate_to(&mut self, offset: Offset, high_watermark: Offset) -> Result<(), LogError> {
        self.check_online()?;
        assert!(self.pending_writes.is_empty(), "truncate with appends still being written");
        let offset = offset.0;
        if offset >= self.log_end_offset().0 {
            // No record goes, but an epoch recorded as starting at the log end (a leader
            // that appended nothing) does: a follower appends the new leader's batches
            // there, maybe of older epochs (found by tests/replication_sim.rs).
            let end = self.log_end_offset().0;
            if self.leader_epochs.truncate_from_end(offset.min(end)) {
                self.save_leader_epochs("truncate: leader-epoch-checkpoint", end)?;
            }
            return Ok(());
        }
        let interval = self.config.index_interval_bytes;
        // Below the first segment (not below a log start moved inside it): as Kafka.
        if offset < self.segments[0].base_offset {
            while !self.segments.is_empty() {
                self.retire_newest_segment("truncate: rename segment")?;
            }
            let r = Segment::create(&self.dir, offset, self.config.segment_index_bytes);
            let seg = self.offline_on_err("truncate: create segment", r)?;
            self.segments.push(seg);
            self.log_start_offset = offset;
            self.recovery_point = offset;
        } else {
            while self.segments.len() > 1 && self.active().base_offset > offset {
                self.retire_newest_segment("truncate: rename segment")?;
            }
            let index_bytes = self.config.segment_index_bytes;
            let seg = self.active_mut();
            let r = seg.truncate_to(offset, interval).and_then(|_| seg.make_active(index_bytes));
            self.offline_on_err("truncate", r)?;
            // A log start moved inside the log (start_offset.rs) never passes its end.
            self.log_start_offset = self.log_start_offset.min(offset);
        }
        let end = self.log_end_offset().0;
        let active = self.active().log_sync_target();
        self.unsynced_files.push(active);
        if self.leader_epochs.truncate_from_end(end) {
            self.save_leader_epochs("truncate: leader-epoch-checkpoint", end)?;
        }
        self.recovery_point = self.recovery_point.min(end);
        self.replace_recovery_point("truncate: checkpoint")?;
        // Producer state as the shorter log leaves it (Kafka's `truncateAndReload`):
        // snapshots past the new end go, the rest is replayed from the newest one at or
        // below the high watermark. No clock here: nothing expires on a truncation (the
        // shard's tick expires).
        let r = producers::rebuild(&self.dir, &mut self.segments, i64::MAX, high_watermark.0, 0, i64::MAX);
        let producers::Rebuilt { states: producers, written, .. } =
            self.offline_on_err("truncate: producer state", r)?;
        self.producers = producers;
        self.txn_verifications.clear();
        self.unsynced_files.extend(written.into_iter().map(SyncTarget::File));
        self.truncated_below = Some(self.truncated_below.map_or(end, |t| t.min(end)));
        self.truncated_at_change = self.dir_changes;
        if self.recovery_point >= end {
            self.first_unflushed_append_ms = None;
        }
        Ok(())
    }

    /// Drop the whole log and start it, empty, at `offset` (Kafka's
    /// `truncateFullyAndStartAt`): a follower whose log ends below its leader's log start
    /// (retention removed what it would fetch next) has nothing the leader still has, so
    /// it starts over where the leader's log starts. Segments, producer snapshots and
    /// leader epochs all go (the epochs come back with the leader's batches); the old
    /// segments are renamed `*.deleted`, and the new segment, the emptied epoch
    /// checkpoint and the recovery point become durable with the next flush, as after
    /// `truncate_to`. A crash half way leaves either the old log (the follower fetches,
    /// is out of range again, and starts over again) or an empty one at `offset` or at
    /// 0 (it fetches from there).
    pub fn truncate_fully_and_start_at(&mut self, offset: Offset) -> Result<(), LogError> {
        self.check_online()?;
        assert!(self.pending_writes.is_empty(), "truncate with appends still being written");
        let offset = offset.0;
        while !self.segments.is_empty() {
            self.retire_newest_segment("start over: rename segment")?;
        }
        let r = producers::delete_snapshots_outside(&self.dir, i64::MAX, i64::MAX);
        self.offline_on_err("start over: producer snapshots", r)?;
        let r = Segment::create(&self.dir, offset, self.config.segment_index_bytes);
        let seg = self.offline_on_err("start over: create segment", r)?;
        self.segments.push(seg);
        self.dir_changes += 1;
        self.log_start_offset = offset;
        self.leader_epochs.truncate_from_end(i64::MIN); // every epoch goes
        self.save_leader_epochs("start over: leader-epoch-checkpoint", offset)?;
        self.producers = ProducerStates::new();
        self.txn_verifications.clear();
        self.recovery_point = offset;
        self.replace_recovery_point("start over: checkpoint")?;
        self.truncated_below = Some(offset);
        self.truncated_at_change = self.dir_changes;
        self.first_unflushed_append_ms = None;
        Ok(())
    }

    /// Every producer's state (DescribeProducers).
    pub fn producer_states(&self) -> &ProducerStates {
        &self.producers
    }

    /// Ids at or above `bound` were never issued (from the cluster metadata).
    pub fn set_producer_id_bound(&mut self, bound: Option<i64>) {
        self.producer_id_bound = bound;
    }

    /// Forget producers idle past `producer.id.expiration.ms`. Returns how many.
    pub fn expire_producers(&mut self, now_ms: i64) -> usize {
        self.producers.expire(now_ms, self.config.producer_id_expiration_ms)
    }

    /// Replace the topic config (alter-configs); takes effect on the next append/roll.
    pub fn set_config(&mut self, config: LogConfig) {
        self.config = config;
    }

    /// Flush, trim indexes, write the clean-shutdown marker.
    ///
    /// Order, each step durable before the next exists: the segments (and a directory
    /// that a roll or retention changed) and both indexes of the active segment are
    /// fdatasynced; then the recovery point (renamed over the old one) and the marker are
    /// created and one directory fsync makes both durable. A crash before that fsync
    /// leaves no marker (full recovery above the old recovery point) or a marker,
    /// possibly empty, whose presence is all that counts. The recovery point's bytes are
    /// fdatasynced before its rename: the next start removes the marker, and a power cut
    /// after it, before any roll writes the point again, found an empty file and
    /// recovered the whole log (safe, but a full read). Five fsyncs at most for an
    /// unflushed log (eight before: 1,000 partitions took 12.6 s to stop).
    pub fn close(mut self) -> Result<(), LogError> {
        self.check_online()?;
        assert!(self.pending_writes.is_empty(), "close with appends still being written");
        let r = self.active_mut().become_inactive();
        self.offline_on_err("close: trim indexes", r)?;
        self.flush()?;
        let r = self.active().index.sync().and_then(|_| self.active().time_index.sync());
        self.offline_on_err("close: sync indexes", r)?;
        let r = producers::write_snapshot(&self.dir, self.log_end_offset().0, &self.producers);
        self.offline_on_err("close: producer state snapshot", r)?;
        let r = write_checkpoint(&self.dir, self.log_end_offset().0, true, false)
            .and_then(|_| std::fs::write(self.dir.join(CLEAN_SHUTDOWN_FILE), format!("{FORMAT_VERSION}\n")))
            .and_then(|_| File::open(&self.dir)?.sync_all());
        self.offline_on_err("close: marker", r)?;
        Ok(())
    }

    /// Close the log and move its directory aside for removal (topic deletion): one
    /// rename here; the caller removes the returned directory off the data core.
    pub fn delete(self) -> Result<PathBuf, LogError> {
        let dir = self.dir.clone();
        drop(self);
        Ok(move_to_trash(&dir)?)
    }

    /// Close the `.log` files of segments not used since the last call (see
    /// `segment::log_files_sweep_due`); how many closed.
    pub fn close_idle_files(&self) -> usize {
        self.segments.iter().filter(|s| s.close_file_if_idle()).count()
    }

    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size_bytes).sum()
    }

    /// Base offsets of the segments, oldest first (the last is the active one).
    pub fn segment_base_offsets(&self) -> Vec<Offset> {
        self.segments.iter().map(|s| Offset(s.base_offset)).collect()
    }

    /// Why the log is offline, if it is.
    pub fn offline_reason(&self) -> Option<&str> {
        self.offline.as_deref()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// A segment retention removed from its log, its files renamed `*.deleted`.
pub struct DeletedSegment(Segment);

impl DeletedSegment {
    /// Unlink its files and close them. Blocking: run it off the data core.
    pub fn remove(self) -> std::io::Result<()> {
        self.0.delete_files()
    }
}

/// Files to fdatasync for a group commit, and what that makes durable.
pub struct FlushHandle {
    pub files: Vec<SyncTarget>,
    pub flushed: Flushed,
}

impl FlushHandle {
    /// fdatasync every file, in order (the directory last). Blocking.
    pub fn sync(&self) -> std::io::Result<()> {
        self.files.iter().try_for_each(SyncTarget::sync)
    }
}

/// Out of file descriptors, a sync by path tries its open this many times, this far
/// apart (a second in all), before the flush fails.
const SYNC_OPEN_RETRIES: u32 = 50;
const SYNC_OPEN_RETRY_MS: u64 = 20;

/// A file a flush makes durable: one the log holds open (a segment's `.log`, a
/// transaction index), or one it keeps no descriptor for (index files, replaced small
/// files, the partition directory), opened by path on the syncing thread. A path that
/// is gone has nothing left to make durable (retention removed the segment, or the
/// file was replaced and its replacement is synced by the same path).
#[derive(Debug, Clone)]
pub enum SyncTarget {
    File(Arc<File>),
    Path(PathBuf),
}

impl PartialEq for SyncTarget {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (SyncTarget::File(a), SyncTarget::File(b)) => Arc::ptr_eq(a, b),
            (SyncTarget::Path(a), SyncTarget::Path(b)) => a == b,
            _ => false,
        }
    }
}

impl SyncTarget {
    /// fdatasync (a directory: fsync). Blocking. Linux reports a writeback error that
    /// no descriptor has seen yet to the first fsync after it, through a descriptor
    /// opened later too (errseq, since 4.16), so syncing by path loses no error.
    /// Out of file descriptors (EMFILE, ENFILE), the open is tried again for up to a
    /// second (this runs on a blocking thread) before the error is the flush's: a
    /// failed flush takes the log offline.
    pub fn sync(&self) -> std::io::Result<()> {
        match self {
            SyncTarget::File(f) => f.sync_data(),
            SyncTarget::Path(p) => {
                let mut tries = 0;
                let f = loop {
                    match File::open(p) {
                        Ok(f) => break f,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                        Err(e)
                            if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
                                && tries < SYNC_OPEN_RETRIES =>
                        {
                            tries += 1;
                            std::thread::sleep(std::time::Duration::from_millis(SYNC_OPEN_RETRY_MS));
                        }
                        Err(e) => return Err(e),
                    }
                };
                if f.metadata()?.is_dir() {
                    f.sync_all()
                } else {
                    f.sync_data()
                }
            }
        }
    }
}

/// What a flush made durable, for `mark_flushed`: the offsets below `upto` and the
/// first `dir_changes` directory changes.
#[derive(Debug, Clone, Copy)]
pub struct Flushed {
    pub upto: Offset,
    dir_changes: u64,
}

fn file_mtime_ms(path: &Path) -> Option<i64> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    Some(modified.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64)
}

/// How a deleted partition's directory name ends once moved aside (Kafka's
/// `<topic>-<partition>.<id>-delete`): never a partition directory (those end in digits).
pub const DELETED_DIR_SUFFIX: &str = "-delete";
/// A directory name's longest length on the file systems a data dir lives on.
const file_name_bytes_max: usize = 255;

/// Rename a partition directory to `<name>.<random id>-delete` beside it (the name cut
/// to fit `file_name_bytes_max`), to be removed later: a rename is quick and atomic,
/// and the partition's name is free at once for a topic created again.
/// `<topic>-<partition>` from a partition directory's name (for Kafka's checkpoint
/// formats, which name both).
fn topic_partition_of(dir: &Path) -> (String, i32) {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match name.rsplit_once('-') {
        Some((topic, p)) => (topic.to_string(), p.parse().unwrap_or(0)),
        None => (name.to_string(), 0),
    }
}

pub fn move_to_trash(dir: &Path) -> std::io::Result<PathBuf> {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("partition");
    let id = uuid::Uuid::new_v4().simple().to_string();
    let keep = file_name_bytes_max - 1 - id.len() - DELETED_DIR_SUFFIX.len();
    // Partition directory names are ASCII (Kafka's topic name rule).
    let prefix = name.get(..name.len().min(keep)).unwrap_or("partition");
    let trash = dir.with_file_name(format!("{prefix}.{id}{DELETED_DIR_SUFFIX}"));
    std::fs::rename(dir, &trash)?;
    Ok(trash)
}

/// Whether a data-dir entry is a deleted partition's directory waiting for removal.
pub fn is_trash_dir_name(name: &str) -> bool {
    name.ends_with(DELETED_DIR_SUFFIX) && name.contains('.')
}

pub fn checkpoint_text(offset: i64) -> String {
    let body = format!("{FORMAT_VERSION} {offset}");
    format!("{body} {}\n", crc32c::crc32c(body.as_bytes()))
}

/// The recovery point, or None when the file is missing or does not check out.
fn read_checkpoint(dir: &Path) -> Option<i64> {
    let text = std::fs::read(dir.join(RECOVERY_POINT_FILE)).ok()?;
    if text.len() > 64 {
        return None;
    }
    let text = std::str::from_utf8(&text).ok()?;
    let mut parts = text.trim_end().split(' ');
    let (version, offset, _crc) = (parts.next()?, parts.next()?, parts.next()?);
    if version != FORMAT_VERSION.to_string() {
        return None;
    }
    let offset: i64 = offset.parse().ok()?;
    (checkpoint_text(offset) == text && offset >= 0).then_some(offset)
}

/// Write via a temporary file and rename. With `sync_file`, the file is fdatasynced
/// before the rename; with `sync_dir`, the directory after it.
fn write_checkpoint(dir: &Path, offset: i64, sync_file: bool, sync_dir: bool) -> std::io::Result<()> {
    let tmp = dir.join(format!("{RECOVERY_POINT_FILE}.tmp"));
    {
        let f = File::create(&tmp)?;
        f.write_all_at(checkpoint_text(offset).as_bytes(), 0)?;
        if sync_file {
            f.sync_data()?;
        }
    }
    std::fs::rename(&tmp, dir.join(RECOVERY_POINT_FILE))?;
    if sync_dir {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The leader epoch cache at open: the checkpoint (absent = empty; unreadable = rebuilt
/// from the batch headers of `segments`), reconciled with the segments recovered from
/// `recovered_from` on, cut to the log's offsets, given `leader_epoch` at the log end (a
/// leader's new epoch), saved (durably: open runs off the data core) if that changed it.
///
/// Why the checkpoint is not trusted whole after a crash: the running log replaces it
/// without an fsync (`save_leader_epochs`) and a flush fsyncs it before the recovery
/// point passes what it describes, so after a power loss it may lack the epochs of the
/// unflushed tail, or still hold an epoch that a truncation removed there; never
/// anything wrong below the recovery point, and every recovered segment starts at or
/// below it. So an entry starting in the recovered tail stands only if the batches there
/// carry its epoch (batches stamped -1 cannot tell); the first that does not goes, with
/// every later one (a truncation cuts suffixes). Then the tail's epochs are replayed with
/// the append rule (Kafka's recovery does the same with `LogSegment.recover`). This
/// relies on a log's batches carrying non-decreasing epochs: a leader stamps its own,
/// the newest its log knows, and a follower copies a leader's log after truncating
/// where the two diverged.
fn open_leader_epochs(
    dir: &Path,
    segments: &[Segment],
    recovered_from: Option<i64>,
    leader_epoch: Option<i32>,
) -> Result<LeaderEpochCache, LogError> {
    let loaded = match LeaderEpochCache::load(dir) {
        Ok(cache) => Some(cache),
        Err(reason) => {
            tracing::warn!(dir = %dir.display(), %reason,
                "unreadable leader-epoch-checkpoint; rebuilding it from the batch headers");
            None
        }
    };
    let mut cache = match (&loaded, recovered_from) {
        (None, _) => {
            let mut cache = LeaderEpochCache::default();
            for (base, epoch) in epoch_runs(dir, segments) {
                cache.assign_if_newer(epoch, base);
            }
            cache
        }
        (Some(cache), None) => cache.clone(),
        (Some(cache), Some(from)) => {
            let tail = &segments[segments.partition_point(|s| s.base_offset < from)..];
            let runs = epoch_runs(dir, tail);
            let epoch_at = |offset: i64| runs.iter().rev().find(|(base, _)| *base <= offset).map(|&(_, e)| e);
            let mut cache = cache.clone();
            let stale = cache.entries().iter().find(|e| {
                e.start_offset >= from && epoch_at(e.start_offset).is_some_and(|got| got >= 0 && got != e.epoch)
            });
            if let Some(stale) = stale.copied() {
                tracing::info!(dir = %dir.display(), epoch = stale.epoch, start_offset = stale.start_offset,
                    "leader-epoch-checkpoint names an epoch the recovered batches do not carry; cut there");
                cache.truncate_from_end(stale.start_offset);
            }
            for (base, epoch) in runs {
                cache.assign_if_newer(epoch, base);
            }
            cache
        }
    };
    let log_start_offset = segments[0].base_offset;
    let log_end_offset = segments[segments.len() - 1].next_offset;
    cache.truncate_from_end(log_end_offset);
    cache.truncate_from_start(log_start_offset);
    if let Some(epoch) = leader_epoch {
        cache.assign_if_newer(epoch, log_end_offset);
    }
    if loaded.as_ref() != Some(&cache) {
        cache.save(dir)?;
    }
    check_leader_epochs(&cache, log_start_offset, log_end_offset);
    Ok(cache)
}

/// The `partitionLeaderEpoch` of every batch header of `segments` (already recovered or
/// trusted), in order, as runs: (base offset of the first batch of a run, its epoch),
/// one entry per change of epoch.
fn epoch_runs(dir: &Path, segments: &[Segment]) -> Vec<(i64, i32)> {
    let mut runs: Vec<(i64, i32)> = Vec::new();
    for seg in segments {
        let mut pos = 0;
        loop {
            match seg.header_at(pos, seg.size_bytes) {
                Ok(Some(h)) => {
                    if runs.last().is_none_or(|&(_, epoch)| epoch != h.partition_leader_epoch) {
                        runs.push((h.base_offset, h.partition_leader_epoch));
                    }
                    pos += h.size_bytes();
                }
                Ok(None) => break,
                Err(stop) => {
                    tracing::warn!(dir = %dir.display(), segment = seg.base_offset, position = stop.position_bytes,
                        reason = %stop.reason, "leader epoch scan stopped early in a segment");
                    break;
                }
            }
        }
    }
    runs
}

/// Every epoch starts inside the log: `log_start_offset <= start <= log_end_offset` (an
/// epoch a new leader assigned at its log end has no batch yet).
fn check_leader_epochs(cache: &LeaderEpochCache, log_start_offset: i64, log_end_offset: i64) {
    let entries = cache.entries();
    if let (Some(first), Some(last)) = (entries.first(), entries.last()) {
        assert!(
            first.start_offset >= log_start_offset && last.start_offset <= log_end_offset,
            "leader epochs {entries:?} outside the log [{log_start_offset}, {log_end_offset}]"
        );
    }
}

/// Validate every batch of a record set: structure (CRC32C, magic 2, lengths against
/// `batch_bytes_max`), semantics, and at most `append_batches_max` batches. Returns each
/// batch's position in `records` and its header as given.
/// A follower's record set: the batches as the leader stored them, which after cleaning
/// may hold fewer records than offsets (none, for a producer's last batch: Kafka's
/// empty batch). Checked as a produced set otherwise.
fn validate_replicated_set(records: &[u8], batch_bytes_max: usize) -> Result<Vec<(usize, BatchHeader)>, LogError> {
    validate_batches(records, batch_bytes_max, |h| {
        if h.records_count < 0 || h.last_offset_delta < 0 || h.records_count as i64 > h.last_offset_delta as i64 + 1 {
            return Err(LogError::InvalidRecord(format!(
                "recordsCount {} with lastOffsetDelta {}",
                h.records_count, h.last_offset_delta
            )));
        }
        let mut as_produced = *h;
        as_produced.records_count = h.last_offset_delta + 1;
        if h.attributes & cleaner::ATTR_DELETE_HORIZON != 0 {
            // KIP-534: the base timestamp holds the delete horizon, not a record's time.
            as_produced.base_timestamp = batch::NO_TIMESTAMP;
        }
        if h.attributes & batch::ATTR_CONTROL != 0 {
            // Markers carry a producer id and epoch but no sequence.
            as_produced.base_sequence = as_produced.base_sequence.max(0);
        }
        batch::check_semantics(&as_produced)
    })
}

/// Records without a key cannot go to a compacted log (Kafka's INVALID_RECORD: "Compacted
/// topic cannot accept message without key").
/// A compacted topic's records must have keys: the indexes (from `index_base`, the
/// records of earlier batches of the request) of those without one go to `keyless`. A
/// batch whose records cannot be read is refused whole.
fn check_keyed(whole: &[u8], h: &BatchHeader, index_base: i32, keyless: &mut Vec<i32>) -> Result<(), LogError> {
    let unreadable = || LogError::InvalidRecord("compacted topic: the batch's records cannot be read".into());
    let (inflated, _) = cleaner::batch_records(whole, h).ok_or_else(unreadable)?;
    let bytes = inflated.as_deref().unwrap_or(&whole[batch::HEADER_BYTES..]);
    let records = cleaner::parse_records(bytes, h).ok_or_else(unreadable)?;
    for (i, r) in records.iter().enumerate() {
        if r.key.is_none() {
            keyless.push(index_base.saturating_add(i32::try_from(i).unwrap_or(i32::MAX)));
        }
    }
    Ok(())
}

/// Records refused with their reasons (KIP-467), reported as Kafka's LogValidator does:
/// one error per keyless record, the message naming how many there are.
fn keyless_records_refused(dir: &std::path::Path, keyless: Vec<i32>) -> LogError {
    let partition = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let why = format!("Compacted topic cannot accept message without key in topic partition {partition}.");
    LogError::InvalidRecords {
        message: format!(
            "One or more records have been rejected due to {} record errors in total: {why}",
            keyless.len()
        ),
        record_errors: keyless.into_iter().map(|i| (i, why.clone())).collect(),
    }
}

/// Kafka's KIP-937 check: every record's timestamp within [now - before, now + after]
/// (a batch whose records cannot be read is refused as INVALID_RECORD).
fn check_timestamps(whole: &[u8], h: &BatchHeader, now_ms: i64, before: i64, after: i64) -> Result<(), LogError> {
    let unreadable = || LogError::InvalidRecord("the batch's records cannot be read".into());
    let (inflated, _) = cleaner::batch_records(whole, h).ok_or_else(unreadable)?;
    let bytes = inflated.as_deref().unwrap_or(&whole[batch::HEADER_BYTES..]);
    for r in cleaner::parse_records(bytes, h).ok_or_else(unreadable)? {
        if r.timestamp < now_ms.saturating_sub(before) || r.timestamp > now_ms.saturating_add(after) {
            return Err(LogError::InvalidTimestamp(format!(
                "timestamp {} of offset delta {} is out of range [{}, {}] (message.timestamp.before.max.ms / \
                 after.max.ms)",
                r.timestamp,
                r.offset - h.base_offset,
                now_ms.saturating_sub(before),
                now_ms.saturating_add(after)
            )));
        }
    }
    Ok(())
}

fn validate_record_set(records: &[u8], batch_bytes_max: usize) -> Result<Vec<(usize, BatchHeader)>, LogError> {
    validate_batches(records, batch_bytes_max, batch::check_semantics)
}

fn validate_batches(
    records: &[u8],
    batch_bytes_max: usize,
    semantics: impl Fn(&BatchHeader) -> Result<(), LogError>,
) -> Result<Vec<(usize, BatchHeader)>, LogError> {
    if records.is_empty() {
        return Err(LogError::Corrupt("empty record set".into()));
    }
    let mut batches = Vec::new();
    let mut pos = 0;
    while pos < records.len() {
        if batches.len() == append_batches_max {
            return Err(LogError::InvalidRecord(format!("more than {append_batches_max} batches in one record set")));
        }
        let (h, size) = batch::check_structure(&records[pos..], batch_bytes_max)?;
        semantics(&h)?;
        batches.push((pos, h));
        pos += size;
    }
    Ok(batches)
}
