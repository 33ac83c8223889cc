//! One core's partitions.
//!
//! A `Shard` owns the partition logs whose owner is its core (`owner_shard`), and only
//! it touches them. Work for a partition arrives as a `PartitionOp`, either from a
//! connection on the same core or over the channel mesh from another core; the owner
//! executes it synchronously (appends land in the page cache) and answers with a
//! `PartitionReply`. Nothing here knows the async runtime: waits (fetch long-polls,
//! group commit) are handed back as `futures` oneshot receivers.
//!
//! Invariant: `execute` is only ever called with partitions this shard owns (asserted).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use std::os::unix::fs::FileExt;

use futures::channel::oneshot;

pub mod append_ring;
mod groups;
mod log_start;
mod replica;
mod txns;
pub use append_ring::{AppendRing, Completed, StagedWrite};
pub use groups::{
    group_partition, DescribeFilter, GroupLoad, GroupLoadStep, GroupOp, GroupReply, OffsetList, TxnCommitRefusal,
};
pub use log_start::{LogStartMove, LogStartWait};
pub use replica::{load_hw_checkpoints, FetcherStart, IsrOutcome, ReplicaState, HW_CHECKPOINT_PREFIX};
pub use txns::{is_txn_partition, txn_partition, TxnLoad, TxnMarkers, TxnOp, TxnReply, TxnWrite};

use crate::coordinator::owner::Metadata;
use crate::coordinator::registry::Hosting;
use crate::coordinator::view::ClusterView;
use crate::group::{GroupConfig, GroupCoordinator};
use crate::log::{AppendInfo, FlushHandle, Flushed, LogError, PartitionLog};
use crate::model::{BrokerEpoch, LeaderEpoch, NodeId, Offset, ShardId, TopicPartition};
use crate::replication::{AppendRefusal, FetchRefusal, FollowerFetchError};

/// Which shard owns a partition: a stable hash of the topic name, then partitions of one
/// topic round-robin over the shards. A partition index off the wire may be negative (a
/// hostile Fetch): it wraps to some shard, which answers that it has no such partition.
pub fn owner_shard(tp: &TopicPartition, nr_shards: usize) -> ShardId {
    assert!(nr_shards > 0);
    let h = crc32c::crc32c(tp.topic.as_bytes()) as u64;
    ShardId((h.wrapping_add(tp.partition as u64) % nr_shards as u64) as usize)
}

/// Parse a partition directory name `<topic>-<partition>`.
pub fn parse_partition_dir(name: &str) -> Option<TopicPartition> {
    let (topic, p) = name.rsplit_once('-')?;
    let partition: i32 = p.parse().ok()?;
    if topic.is_empty() || partition < 0 || p.starts_with('+') {
        return None;
    }
    Some(TopicPartition::new(topic, partition))
}

#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("unknown topic or partition {0}")]
    UnknownTopicOrPartition(TopicPartition),
    /// The partition exists, but this broker does not lead it.
    #[error("this broker is not the leader of {0}")]
    NotLeader(TopicPartition),
    /// The request's leader epoch is older than the partition's (KIP-320).
    #[error("leader epoch {request} of {tp} is fenced: current is {current}")]
    FencedLeaderEpoch { tp: TopicPartition, request: LeaderEpoch, current: LeaderEpoch },
    /// The request's leader epoch is newer than this broker knows.
    #[error("leader epoch {request} of {tp} is unknown: current is {current}")]
    UnknownLeaderEpoch { tp: TopicPartition, request: LeaderEpoch, current: LeaderEpoch },
    /// acks=all, and fewer in-sync replicas than min.insync.replicas.
    #[error("{tp}: {isr} in-sync replicas, min.insync.replicas is {min}")]
    NotEnoughReplicas { tp: TopicPartition, isr: usize, min: usize },
    /// A follower's fetch from an incarnation older than one the leader has seen (KIP-903).
    #[error("{tp}: fetch from broker {replica} with broker epoch {broker_epoch}, older than {current}")]
    StaleBrokerEpoch { tp: TopicPartition, replica: NodeId, broker_epoch: BrokerEpoch, current: BrokerEpoch },
    /// A follower's truncation asked while appends this broker made as leader are still
    /// being written (io_uring): the fetcher backs off and truncates again.
    #[error("{0}: appends still being written; truncating later")]
    WritesInFlight(TopicPartition),
    #[error("{0}")]
    Log(#[from] LogError),
}

/// ListOffsets' special timestamps (Kafka's `ListOffsetsRequest` constants).
pub mod list_offsets {
    pub const LATEST_TIMESTAMP: i64 = -1;
    pub const EARLIEST_TIMESTAMP: i64 = -2;
    /// KIP-734, ListOffsets v7+: the record with the largest timestamp.
    pub const MAX_TIMESTAMP: i64 = -3;
    /// KIP-405, v8+: the first offset in local storage.
    pub const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
    /// KIP-1005, v9+: the highest offset in remote storage.
    pub const LATEST_TIERED_TIMESTAMP: i64 = -5;
    /// KIP-1023, v11+: the first offset not yet uploaded to remote storage.
    pub const EARLIEST_PENDING_UPLOAD_TIMESTAMP: i64 = -6;

    /// The first ListOffsets version that may ask for `timestamp`; None for a negative
    /// one that no version defines (Kafka answers both UNSUPPORTED_VERSION).
    pub fn first_version(timestamp: i64) -> Option<i16> {
        match timestamp {
            0.. | LATEST_TIMESTAMP | EARLIEST_TIMESTAMP => Some(0),
            MAX_TIMESTAMP => Some(7),
            EARLIEST_LOCAL_TIMESTAMP => Some(8),
            LATEST_TIERED_TIMESTAMP => Some(9),
            EARLIEST_PENDING_UPLOAD_TIMESTAMP => Some(11),
            _ => None,
        }
    }
}

/// A request for the owner of one partition.
#[derive(Debug)]
pub enum PartitionOp {
    /// Append a produce request's record set. `durable` asks for an fsync before the ack.
    /// `records` is a slice of the request frame: it is written as it arrived, with
    /// only the batch headers replaced (no copy).
    Produce {
        tp: TopicPartition,
        records: bytes::Bytes,
        now_ms: i64,
        durable: bool,
        acks: i16,
        /// KIP-890 part 1 for a transactional batch (`crate::log::TxnVerification`).
        verification: crate::log::TxnVerification,
    },
    /// WriteTxnMarkers: append the transaction coordinator's end-of-transaction marker
    /// for `producer_id` (acks=all: answered as a Produce whose `replicated` waits for
    /// the high watermark).
    WriteMarker {
        tp: TopicPartition,
        producer_id: i64,
        producer_epoch: i16,
        coordinator_epoch: i32,
        commit: bool,
        now_ms: i64,
        /// WriteTxnMarkers v2's TransactionVersion (0 below v2).
        transaction_version: i8,
    },
    /// Read whole batches from `offset`, at most `max_bytes` (but at least one batch when
    /// `min_one_batch`).
    /// `replica`: the fetching follower's broker id, `NodeId::NONE` (-1) for a consumer
    /// (who reads only below the high watermark); `current_leader_epoch`:
    /// `LeaderEpoch::UNDEFINED` or the epoch the fetcher believes current (KIP-320);
    /// `replica_epoch`: the follower's broker epoch
    /// (`replication::NO_BROKER_EPOCH` when it sends none; KIP-903);
    /// `replica_log_start`: the follower's log start offset (-1: none sent).
    /// `read_committed`: a consumer's isolation level 1, which reads only below the
    /// last stable offset and is told of the aborted transactions in what it read.
    Fetch {
        read_committed: bool,
        tp: TopicPartition,
        offset: Offset,
        max_bytes: usize,
        min_one_batch: bool,
        replica: NodeId,
        replica_epoch: BrokerEpoch,
        replica_log_start: i64,
        current_leader_epoch: LeaderEpoch,
        now_ms: i64,
    },
    /// ListOffsets: a timestamp, or one of the `list_offsets` sentinels (latest is the
    /// last stable offset when `read_committed`).
    ListOffset { tp: TopicPartition, timestamp_ms: i64, current_leader_epoch: LeaderEpoch, read_committed: bool },
    /// Wake me when what I may read passes `offset` (the log end for a follower, the
    /// high watermark for a consumer, the last stable offset for a read_committed one).
    WaitForData { tp: TopicPartition, offset: Offset, replica: bool, read_committed: bool },
    /// OffsetForLeaderEpoch: the end offset of `leader_epoch` in the leader's log.
    EpochEndOffset { tp: TopicPartition, current_leader_epoch: LeaderEpoch, leader_epoch: LeaderEpoch },
    /// The topic is gone from the registry: close this partition's log and move its
    /// directory aside, to be removed off the core (`take_trash`).
    DeletePartition { tp: TopicPartition },
    /// The topic's config changed in the registry: apply it to the open log.
    RefreshConfig { tp: TopicPartition },
    /// DescribeProducers: the leader's producer state.
    DescribeProducers { tp: TopicPartition },
    /// DeleteRecords: move the leader's log start offset to `offset` (-1: the high
    /// watermark), durably, then answer (`log_start.rs`).
    DeleteRecords { tp: TopicPartition, offset: i64 },
    /// DeleteRecords, second step: answer once the low watermark (the smallest log start
    /// over the live replicas) reaches `offset` (`log_start.rs`).
    AwaitLowWatermark { tp: TopicPartition, offset: i64 },
    /// DescribeLogDirs: this replica's size and offsets, if its log is open.
    DescribeLog { tp: TopicPartition },
}

impl PartitionOp {
    pub fn tp(&self) -> &TopicPartition {
        match self {
            PartitionOp::Produce { tp, .. }
            | PartitionOp::WriteMarker { tp, .. }
            | PartitionOp::Fetch { tp, .. }
            | PartitionOp::ListOffset { tp, .. }
            | PartitionOp::WaitForData { tp, .. }
            | PartitionOp::EpochEndOffset { tp, .. }
            | PartitionOp::DeletePartition { tp }
            | PartitionOp::RefreshConfig { tp }
            | PartitionOp::DescribeProducers { tp }
            | PartitionOp::DeleteRecords { tp, .. }
            | PartitionOp::AwaitLowWatermark { tp, .. }
            | PartitionOp::DescribeLog { tp } => tp,
        }
    }
}

/// What a shard tells the metrics endpoint about its partitions and groups (published
/// once a second, so a scrape never touches a shard).
#[derive(Debug, Clone, Default)]
pub struct ShardStatus {
    pub partitions: Vec<PartitionStatus>,
    pub groups: Vec<crate::group::GroupStatus>,
    pub rebalances: u64,
    pub cleaner: CleanerTotals,
    pub txns: TxnCoordinatorStatus,
}

/// The transaction coordinator on this shard: transactional ids by state (Kafka's
/// TransactionState ids, 0-7), when the oldest open transaction began, and how many
/// transactions it aborted for their timeout since start.
#[derive(Debug, Clone, Copy, Default)]
pub struct TxnCoordinatorStatus {
    pub by_state: [u64; 8],
    pub oldest_open_start_ms: Option<i64>,
    pub timed_out: u64,
}

/// The append ring's counts since start: appends written and the writev calls that
/// carried them (their ratio is the coalescing), of those written on the shard,
/// write-behind calls, and drop-behind calls with the bytes they covered.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppendWriteCounts {
    pub appends: u64,
    pub writes: u64,
    pub inline: u64,
    pub write_behind_calls: u64,
    pub drop_behind_calls: u64,
    pub drop_behind_bytes: u64,
}

/// What this shard's log cleaner did since start.
#[derive(Debug, Clone, Copy, Default)]
pub struct CleanerTotals {
    pub passes: u64,
    pub errors: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_removed: u64,
}

#[derive(Debug, Clone)]
pub struct PartitionStatus {
    pub tp: TopicPartition,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    pub size_bytes: u64,
    pub offline: bool,
    /// Led here, with fewer in-sync replicas than replicas.
    pub under_replicated: bool,
    /// Led here: the high watermark.
    pub high_watermark: Option<i64>,
    /// Led here: the last stable offset (below it every transaction has ended).
    pub last_stable_offset: Option<i64>,
    /// Transactions open in this replica.
    pub open_transactions: usize,
    /// Compacted: the dirty ratio and when the last cleaning pass was installed.
    pub cleaner: Option<(f64, Option<i64>)>,
}

#[derive(Debug)]
pub struct FetchData {
    pub high_watermark: Offset,
    /// Where the data this fetch could read ends: the high watermark for consumers, the
    /// written log end for followers. A fetch waiting for more (min_bytes) waits for
    /// the partition to grow past it.
    pub readable_end: Offset,
    pub log_start_offset: Offset,
    pub last_stable_offset: Offset,
    /// read_committed only: the aborted transactions overlapping what was read.
    pub aborted: Option<Vec<crate::log::txn_index::AbortedTxn>>,
    pub records: FetchRecords,
}

/// A fetch's record bytes: copied, or a file range for the connection's shard to send
/// straight from the page cache (the range is immutable: segments are append-only).
#[derive(Debug)]
pub enum FetchRecords {
    Copied(Vec<u8>),
    File(crate::log::ReadPlan),
}

impl FetchRecords {
    pub fn len(&self) -> usize {
        match self {
            FetchRecords::Copied(v) => v.len(),
            FetchRecords::File(plan) => plan.length_bytes as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Resolves when an fsync covering the append completed (Err: the log went offline).
/// For an fsync wait, a dropped sender (Canceled) means a follower's truncation took
/// the records away before any round synced them (`replica::drop_truncated_waiters`).
pub type DurableWait = oneshot::Receiver<Result<(), String>>;
/// acks=all: resolves when the high watermark passes the batch (Err: a Kafka error
/// code, NOT_ENOUGH_REPLICAS_AFTER_APPEND or NOT_LEADER_OR_FOLLOWER).
pub type ReplicatedWait = oneshot::Receiver<Result<(), i16>>;

#[derive(Debug)]
pub enum PartitionReply {
    /// `written` resolves when the bytes are in the file (io_uring), `durable` when an
    /// fsync covers them; the ack waits for both.
    Produced {
        info: AppendInfo,
        log_start_offset: Offset,
        written: Option<DurableWait>,
        durable: Option<DurableWait>,
        /// acks=all: resolves when the high watermark passes the batch.
        replicated: Option<ReplicatedWait>,
        /// An idempotent producer's retry of a batch already in the log: `info` holds
        /// the original offsets and nothing was appended.
        duplicate: bool,
    },
    EpochEnd {
        leader_epoch: i32,
        end_offset: i64,
    },
    Fetched(FetchData),
    Offset {
        offset: Offset,
        timestamp_ms: i64,
        /// The leader epoch of `offset` (-1 when unknown).
        leader_epoch: i32,
    },
    Waiting(oneshot::Receiver<()>),
    /// Done, nothing to report (delete, config refresh).
    Done,
    /// Every producer's state in the partition, by producer id.
    Producers(Vec<ProducerSummary>),
    /// DeleteRecords: resolves with the new log start once it is durable and applied.
    LogStartMoving(LogStartWait),
    /// DeleteRecords' second step: resolves with the low watermark once it is reached.
    LowWatermarkReached(LogStartWait),
    /// DescribeLogDirs: the replica's segment bytes, log end and high watermark.
    LogDescribed {
        size_bytes: u64,
        log_end_offset: i64,
        high_watermark: i64,
    },
}

/// One producer as DescribeProducers shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerSummary {
    pub producer_id: crate::model::ProducerId,
    pub epoch: crate::model::ProducerEpoch,
    pub last_sequence: i32,
    pub last_timestamp_ms: i64,
    pub coordinator_epoch: i32,
    pub current_txn_start_offset: i64,
}

struct Partition {
    log: PartitionLog,
    /// The replica machine: leader, follower or neither (from the registry; refreshed on
    /// every change), the high watermark, min.insync.replicas and the acks=all waiters.
    replica: replica::Replica,
    /// Fetch long-polls waiting for the log end offset to move.
    data_waiters: Vec<oneshot::Sender<()>>,
    /// Produce acks waiting for an fsync that covers their last offset (dropped when a
    /// truncation removes that offset).
    durable_waiters: Vec<(Offset, oneshot::Sender<Result<(), String>>)>,
    /// Produce acks waiting for their io_uring write, by write id.
    write_waiters: Vec<(u64, oneshot::Sender<Result<(), String>>)>,
}

/// An fsync to run off the data core for group commit: every dirty partition's files.
/// What the data core moved aside for removal on the blocking pool
/// (`server::remove_trash`).
#[derive(Default)]
pub struct Trash {
    /// Deleted partitions' directories (`log::move_to_trash`).
    pub dirs: Vec<PathBuf>,
    /// Segments retention removed, renamed `*.deleted`.
    pub segments: Vec<crate::log::DeletedSegment>,
    /// Files to unlink: cleaned segments a pass wrote that were not swapped in.
    pub files: Vec<PathBuf>,
}

impl Trash {
    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty() && self.segments.is_empty() && self.files.is_empty()
    }
}

/// One cleaning pass to run off the data core (`log::cleaner::run`), then hand back to
/// `Shard::clean_done`.
pub struct CleanTask {
    pub tp: TopicPartition,
    /// The log the pass was planned on (a reopened or recreated one refuses it).
    pub instance: u64,
    pub job: crate::log::cleaner::CleanJob,
}

pub struct FlushBatch {
    pub items: Vec<(TopicPartition, FlushHandle)>,
}

pub struct Shard {
    id: ShardId,
    nr_shards: usize,
    data_dir: PathBuf,
    /// Where cluster metadata is published, and the view this shard acts on (taken
    /// when the generation moves, in `sync_registry`).
    metadata: Arc<Metadata>,
    view: Arc<ClusterView>,
    broker_topic_defaults: BTreeMap<String, String>,
    partitions: HashMap<TopicPartition, Partition>,
    /// The partitions that may hold durable waiters (every one that does is here; one
    /// whose waiters are gone may linger until the next round takes its batch). Group
    /// commit looks only at these: a scan of every partition on each append's wakeup
    /// cost the shard O(partitions) per Produce (bench/README.md, "Many partitions").
    durable_waiting: HashSet<TopicPartition>,
    groups: GroupCoordinator,
    /// log.cleaner.*; None: log.cleaner.enable=false.
    cleaner: Option<crate::log::CleanerSettings>,
    /// A cleaning pass is running on the blocking pool (one per shard at a time), and
    /// the flag that stops it.
    cleaning: bool,
    clean_cancel: Option<Arc<std::sync::atomic::AtomicBool>>,
    cleaner_totals: CleanerTotals,
    /// Fetches of at least this many bytes are sent from the file (zero-copy).
    zero_copy_bytes_min: u64,
    /// Appends go through this io_uring ring; without one they are written in place.
    ring: Option<AppendRing>,
    /// The view generation this shard last acted on.
    seen_generation: u64,
    /// This broker's id.
    local_broker: NodeId,
    /// replica.lag.time.max.ms
    replica_lag_time_max_ms: i64,
    /// Follower partitions that need a fetcher (taken by the runtime).
    fetcher_starts: Vec<replica::FetcherStart>,
    /// Roles taken since the last summary line (`log_roles_taken`).
    roles_taken: replica::RolesTaken,
    /// High watermarks read at start from the checkpoint files, and what this shard
    /// last wrote to its own.
    hw_at_start: HashMap<TopicPartition, i64>,
    hw_checkpointed: Vec<(TopicPartition, i64)>,
    /// Producer ids at or above this were never issued (from the registry).
    producer_id_bound: Option<i64>,
    /// producer.id.expiration.ms (broker-wide).
    producer_id_expiration_ms: i64,
    /// `--fsync always`: the broker's own writes (transaction state records, markers)
    /// wait for a group-commit round as produce does.
    fsync_always: bool,
    /// The logs were handed over for a clean close: nothing may open them again.
    closing: bool,
    /// Partitions newly hosted here whose logs are being opened off the data core
    /// (`take_open_jobs`, `install_opened_later`); requests for them meanwhile get
    /// NOT_LEADER_OR_FOLLOWER, which clients retry.
    /// With each, what waits for it (see `Opening`).
    opening: HashMap<TopicPartition, Opening>,
    open_queue: Vec<OpenJob>,
    /// Hosted partitions whose log failed to open (out of file descriptors, a disk
    /// error): opened again with backoff by the housekeeping tick, not at every request
    /// for them (which are refused with the error meanwhile).
    open_failures: HashMap<TopicPartition, OpenFailure>,
    /// Deleted partitions' directories and retention's segments, moved aside, to remove
    /// off the data core (`take_trash`).
    trash: Trash,
    /// `__consumer_offsets` partitions whose groups are being loaded from the log, off
    /// the data core (`groups::GroupLoad`), by partition number; their group requests
    /// are answered COORDINATOR_LOAD_IN_PROGRESS meanwhile.
    group_loads: HashMap<i32, groups::GroupLoadState>,
    /// Loads to start (taken by the runtime, `take_group_loads`).
    group_load_queue: Vec<groups::GroupLoad>,
    next_group_load_id: u64,
    /// Log start moves asked for, written and applied in rounds (`log_start.rs`).
    log_start_moves: log_start::LogStartMoves,
    /// DeleteRecords answers waiting for their partition's low watermark (`log_start.rs`).
    low_watermark_waits: log_start::LowWatermarkWaits,
    /// The transaction coordinator for the ids of the `__transaction_state` partitions
    /// this shard owns and this broker leads (`txns.rs`), and those partitions.
    txns: crate::txn::coordinator::TxnCoordinator,
    txn_partitions: HashMap<i32, txns::TxnPartition>,
    txn_load_queue: Vec<txns::TxnLoad>,
    next_txn_load_id: u64,
    /// Markers to send again after a load (taken by the runtime).
    txn_resumes: Vec<txns::TxnMarkers>,
    /// transaction.max.timeout.ms
    txn_max_timeout_ms: i32,
    /// Transactions aborted for their timeout since start.
    txn_timeouts: u64,
}

impl Shard {
    pub fn new(
        id: ShardId,
        nr_shards: usize,
        data_dir: PathBuf,
        metadata: Arc<Metadata>,
        broker_topic_defaults: BTreeMap<String, String>,
        group_config: GroupConfig,
    ) -> Self {
        let view = metadata.view();
        let local_broker = view.local_broker_id();
        Self {
            // Act on the view at the first operation or tick.
            seen_generation: 0,
            local_broker,
            replica_lag_time_max_ms: crate::replication::REPLICA_LAG_TIME_MAX_MS_DEFAULT,
            fetcher_starts: Vec::new(),
            roles_taken: replica::RolesTaken::default(),
            hw_at_start: replica::load_hw_checkpoints(&data_dir),
            hw_checkpointed: Vec::new(),
            producer_id_bound: None,
            producer_id_expiration_ms: crate::model::limits::producer_id_expiration_ms_default,
            fsync_always: false,
            closing: false,
            opening: Default::default(),
            open_queue: Vec::new(),
            open_failures: HashMap::new(),
            durable_waiting: HashSet::new(),
            trash: Trash::default(),
            group_loads: HashMap::new(),
            group_load_queue: Vec::new(),
            next_group_load_id: 0,
            log_start_moves: Default::default(),
            low_watermark_waits: Default::default(),
            txns: crate::txn::coordinator::TxnCoordinator::new(crate::txn::coordinator::TRANSACTION_MAX_TIMEOUT_MS),
            txn_partitions: HashMap::new(),
            txn_load_queue: Vec::new(),
            next_txn_load_id: 0,
            txn_resumes: Vec::new(),
            txn_max_timeout_ms: crate::txn::coordinator::TRANSACTION_MAX_TIMEOUT_MS,
            txn_timeouts: 0,
            id,
            nr_shards,
            data_dir,
            metadata,
            view,
            broker_topic_defaults,
            partitions: HashMap::new(),
            cleaner: Some(crate::log::CleanerSettings::default()),
            cleaning: false,
            clean_cancel: None,
            cleaner_totals: CleanerTotals::default(),
            groups: GroupCoordinator::new(group_config),
            zero_copy_bytes_min: u64::MAX,
            ring: None,
        }
    }

    pub fn set_append_ring(&mut self, ring: AppendRing) {
        self.ring = Some(ring);
    }

    /// Submit staged appends and collect finished ones: each write reported to its log,
    /// its ack released, fetch long-polls woken. Returns (progress made, writes still in
    /// flight).
    pub fn process_io(&mut self) -> (bool, bool) {
        let Some(ring) = self.ring.as_mut() else { return (false, false) };
        let mut done = ring.submit();
        done.extend(ring.reap());
        let in_flight = ring.has_in_flight();
        let progress = !done.is_empty();
        self.complete_writes(done);
        (progress, in_flight)
    }

    /// Write-behind or drop-behind requests (`AppendRing::with_write_behind`,
    /// `with_drop_behind`) in flight, no append.
    pub fn has_background_in_flight(&self) -> bool {
        self.ring.as_ref().is_some_and(|r| r.has_background_in_flight())
    }

    pub fn has_io_work(&self) -> bool {
        self.ring.as_ref().is_some_and(|r| !r.is_idle())
    }

    /// What the append ring did since start (`AppendWriteCounts`).
    pub fn append_write_counts(&self) -> AppendWriteCounts {
        self.ring
            .as_ref()
            .map(|r| AppendWriteCounts {
                appends: r.appends_written,
                writes: r.writes_submitted,
                inline: r.writes_inline,
                write_behind_calls: r.write_behind_calls,
                drop_behind_calls: r.drop_behind_calls,
                drop_behind_bytes: r.drop_behind_bytes_total,
            })
            .unwrap_or_default()
    }

    fn complete_writes(&mut self, done: Vec<append_ring::Completed>) {
        for c in done {
            // Deleted meanwhile, or deleted and created again under the same name (its
            // write ids start over): the write was for a log that is gone.
            let Some(p) = self.partitions.get_mut(&c.tp).filter(|p| p.log.instance() == c.log) else { continue };
            // The log says once that it went offline; every failed write answers its ack.
            let outcome = p.log.write_done(c.write_id, c.result).map_err(|e| e.to_string());
            if let Some(i) = p.write_waiters.iter().position(|(id, _)| *id == c.write_id) {
                let (_, w) = p.write_waiters.swap_remove(i);
                let _ = w.send(outcome);
            }
            for w in p.data_waiters.drain(..) {
                let _ = w.send(());
            }
            replica::advance_hw(p);
        }
    }

    /// log.cleaner.* (None: log.cleaner.enable=false, nothing is compacted).
    pub fn set_cleaner(&mut self, settings: Option<crate::log::CleanerSettings>) {
        self.cleaner = settings;
    }

    /// The next cleaning pass, if none is running and a compacted partition is due
    /// (`PartitionLog::clean_job`). The caller runs it on the blocking pool and hands the
    /// result to `clean_done`.
    pub fn take_clean_task(&mut self, now_ms: i64) -> Option<CleanTask> {
        let settings = self.cleaner?;
        if self.cleaning || self.closing {
            return None;
        }
        for (tp, p) in self.partitions.iter_mut() {
            let hw = replica::high_watermark(p);
            if let Some(job) = p.log.clean_job(now_ms, hw, &settings) {
                self.cleaning = true;
                self.clean_cancel = Some(job.cancel.clone());
                return Some(CleanTask { tp: tp.clone(), instance: p.log.instance(), job });
            }
        }
        None
    }

    /// A pass came back: swap its segments in (`install_cleaned`), or, when it failed
    /// or its log is gone, leave its files to the trash.
    pub fn clean_done(
        &mut self,
        tp: &TopicPartition,
        instance: u64,
        result: std::io::Result<crate::log::cleaner::CleanOutcome>,
    ) {
        self.cleaning = false;
        self.clean_cancel = None;
        let p = self.partitions.get_mut(tp).filter(|p| p.log.instance() == instance);
        match (result, p) {
            (Ok(outcome), Some(p)) => {
                let (stats, elapsed, dir) = (outcome.stats, outcome.elapsed, p.log.dir().to_path_buf());
                let cleaned_to = outcome.cleaned_to;
                let t = &mut self.cleaner_totals;
                t.passes += 1;
                t.bytes_read += stats.bytes_read;
                t.bytes_written += stats.bytes_written;
                t.records_removed += stats.records_removed;
                let groups: Vec<i64> = outcome.groups.iter().map(|g| g.base_offset).collect();
                match p.log.install_cleaned(outcome) {
                    Ok(done) => tracing::info!(partition = %tp, cleaned_to, segments_replaced = done.segments_replaced,
                        segments_written = done.segments_written, groups_discarded = done.groups_discarded,
                        bytes_before = done.bytes_before, bytes_after = done.bytes_after,
                        bytes_read = stats.bytes_read, bytes_written = stats.bytes_written,
                        records_removed = stats.records_removed, tombstones_removed = stats.tombstones_removed,
                        elapsed_ms = elapsed.as_millis() as u64, "log cleaner pass"),
                    Err(e) => {
                        self.cleaner_totals.errors += 1;
                        tracing::error!(partition = %tp, error = %e, "cannot swap cleaned segments in");
                        for base in groups {
                            self.trash.files.extend(crate::log::cleaner::cleaned_paths(&dir, base));
                        }
                    }
                }
                self.trash.files.extend(p.log.take_cleaner_leftovers());
            }
            (Ok(outcome), None) => {
                // The partition moved or was deleted meanwhile: nothing to swap into.
                for g in outcome.groups {
                    let dir = self.data_dir.join(tp.dir_name());
                    self.trash.files.extend(crate::log::cleaner::cleaned_paths(&dir, g.base_offset));
                }
            }
            (Err(e), _) if e.kind() == std::io::ErrorKind::Interrupted => {
                tracing::info!(partition = %tp, "log cleaner pass cancelled: the broker is stopping")
            }
            (Err(e), _) => {
                self.cleaner_totals.errors += 1;
                tracing::warn!(partition = %tp, error = %e, "log cleaner pass failed; retried later")
            }
        }
    }

    /// The broker is stopping: a cleaning pass in flight ends at its next batch, so the
    /// close does not wait for it.
    pub fn cancel_cleaning(&self) {
        if let Some(c) = &self.clean_cancel {
            c.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// producer.id.expiration.ms: idle producer ids are forgotten after this long.
    pub fn set_producer_id_expiration_ms(&mut self, ms: i64) {
        self.producer_id_expiration_ms = ms;
    }

    /// `--fsync always`: transaction state records and markers are answered only once
    /// an fsync covers them, as produce and offset commits are (their handlers ask).
    pub fn set_fsync_always(&mut self, on: bool) {
        self.fsync_always = on;
    }

    /// A topic's log config, with the broker-wide settings the log also needs.
    fn log_config_of(&self, meta: &crate::coordinator::registry::TopicMeta) -> crate::log::LogConfig {
        let mut config = meta.configs.log_config(&self.broker_topic_defaults);
        config.producer_id_expiration_ms = self.producer_id_expiration_ms;
        config
    }

    pub fn set_zero_copy_bytes_min(&mut self, bytes: u64) {
        self.zero_copy_bytes_min = bytes;
    }

    pub fn id(&self) -> ShardId {
        self.id
    }

    fn owns(&self, tp: &TopicPartition) -> bool {
        owner_shard(tp, self.nr_shards) == self.id
    }

    /// At startup: open (and so recover) every partition this shard owns, and finish the
    /// deletion of partitions whose topic is no longer registered. Opens on this thread
    /// pool; the server runs `open_jobs`/`open_logs`/`install_opened` instead, so a data
    /// core never blocks on recovery.
    pub fn open_existing(&mut self, now_ms: i64) -> std::io::Result<()> {
        let jobs = self.open_jobs()?;
        let opened = open_logs(jobs, now_ms);
        self.install_opened(opened, now_ms);
        Ok(())
    }

    /// Startup, step 1: the partitions on disk this shard owns and still hosts, with
    /// their configs; removes those of deleted topics.
    pub fn open_jobs(&mut self) -> std::io::Result<Vec<OpenJob>> {
        let mut owned = Vec::new();
        for entry in std::fs::read_dir(&self.data_dir)? {
            let entry = entry?;
            if !entry.file_type()?.is_dir() {
                continue;
            }
            // Deleted before a stop, not removed yet: shard 0 finishes the job.
            if self.id.0 == 0 && entry.file_name().to_str().is_some_and(crate::log::is_trash_dir_name) {
                self.trash.dirs.push(entry.path());
                continue;
            }
            let Some(tp) = entry.file_name().to_str().and_then(parse_partition_dir) else {
                continue;
            };
            if self.owns(&tp) {
                owned.push(tp);
            }
        }
        owned.sort();
        let mut jobs = Vec::new();
        for tp in owned {
            let known = self.view.has_metadata();
            match self.open_config(&tp) {
                Ok((config, min_insync)) => {
                    let dir = self.data_dir.join(tp.dir_name());
                    let leader_epoch = self.leader_epoch_here(&tp);
                    let high_watermark = self.checkpointed_hw(&tp);
                    jobs.push(OpenJob { tp, dir, config, min_insync, leader_epoch, high_watermark });
                }
                Err(PartitionError::UnknownTopicOrPartition(_)) if known => {
                    tracing::info!(shard = self.id.0, partition = %tp, "removing partition of a deleted topic");
                    self.trash.dirs.push(crate::log::move_to_trash(&self.data_dir.join(tp.dir_name()))?);
                }
                Err(PartitionError::UnknownTopicOrPartition(_)) => {
                    tracing::info!(shard = self.id.0, partition = %tp, "partition kept until cluster metadata arrives");
                }
                Err(e) => {
                    tracing::error!(shard = self.id.0, partition = %tp, error = %e, "cannot open partition")
                }
            }
        }
        Ok(jobs)
    }

    /// Startup, step 3: take the logs `open_logs` opened.
    pub fn install_opened(&mut self, opened: Vec<(OpenJob, Result<PartitionLog, LogError>)>, now_ms: i64) {
        let count = self.install(opened, now_ms);
        tracing::info!(shard = self.id.0, partitions = count, "opened the partitions on disk");
        self.log_roles_taken();
    }

    /// Deleted partitions' directories and retention's segments to remove, off the
    /// data core.
    pub fn take_trash(&mut self) -> Trash {
        std::mem::take(&mut self.trash)
    }

    /// Queue behind `tp`'s log being opened: resolves once it is installed (or failed).
    /// None when it is not being opened.
    pub fn wait_opened(&mut self, tp: &TopicPartition) -> Option<futures::channel::oneshot::Receiver<()>> {
        let opening = self.opening.get_mut(tp)?;
        let (tx, rx) = futures::channel::oneshot::channel();
        opening.waiters.push(tx);
        Some(rx)
    }

    /// Whether `tp`'s log is being opened off the data core: an operation on it must
    /// be parked (`park`), not executed.
    pub fn parks(&mut self, tp: &TopicPartition) -> bool {
        self.sync_registry();
        self.opening.contains_key(tp)
    }

    /// Park `op` (its partition's log is being opened, see `parks`): it runs, in arrival
    /// order, as soon as the log is installed, and is answered on `reply`.
    pub fn park(&mut self, op: PartitionOp, reply: PartitionReplySender) {
        match self.opening.get_mut(op.tp()) {
            Some(opening) => opening.parked.push((op, reply)),
            None => {
                debug_assert!(false, "parked {} whose log is not being opened", op.tp());
                let _ = reply.send(self.execute(op));
            }
        }
    }

    /// Logs of newly hosted partitions, to open off the data core (`open_logs`) and hand
    /// back to `install_opened_later`.
    pub fn take_open_jobs(&mut self) -> Vec<OpenJob> {
        std::mem::take(&mut self.open_queue)
    }

    /// Take logs opened for `take_open_jobs`. The metadata may have moved meanwhile (a
    /// topic deleted, a leader changed): the next `sync_registry` looks at everything
    /// again.
    pub fn install_opened_later(&mut self, opened: Vec<(OpenJob, Result<PartitionLog, LogError>)>, now_ms: i64) {
        let waiting: Vec<Opening> = opened.iter().filter_map(|(job, _)| self.opening.remove(&job.tp)).collect();
        if !self.closing {
            self.install(opened, now_ms);
            self.seen_generation = 0;
            self.sync_registry();
        }
        // else handed over for a clean close already: these just-created logs are
        // dropped unclosed, and recovered (empty) at the next start; what waited gets
        // the shutting-down error.
        for opening in waiting {
            for (op, reply) in opening.parked {
                let _ = reply.send(self.execute(op));
            }
            for w in opening.waiters {
                let _ = w.send(());
            }
        }
    }

    fn install(&mut self, opened: Vec<(OpenJob, Result<PartitionLog, LogError>)>, now_ms: i64) -> usize {
        let mut count = 0usize;
        let mut still_failing: Option<(usize, TopicPartition, u32, String)> = None;
        for (job, log) in opened {
            match log {
                Ok(log) => {
                    count += 1;
                    if let Some(failed) = self.open_failures.remove(&job.tp) {
                        tracing::info!(shard = self.id.0, partition = %job.tp, failed_attempts = failed.attempts,
                            "opened partition");
                    } else {
                        tracing::debug!(shard = self.id.0, partition = %job.tp, "opened partition");
                    }
                    self.insert_partition(&job.tp, log, job.min_insync, now_ms);
                }
                Err(e) => {
                    let failure = self.open_failures.entry(job.tp.clone()).or_default();
                    failure.failed(e.to_string(), now_ms);
                    if failure.attempts == 1 {
                        tracing::error!(shard = self.id.0, partition = %job.tp, error = %e,
                            retry_in_ms = failure.retry_at_ms - now_ms, "cannot open partition");
                    } else {
                        let (n, ..) = still_failing.get_or_insert((0, job.tp.clone(), failure.attempts, e.to_string()));
                        *n += 1;
                    }
                }
            }
        }
        // Retries that fail again are said once per round, not once per partition.
        if let Some((n, tp, attempts, error)) = still_failing {
            tracing::warn!(shard = self.id.0, partitions = n, first = %tp, attempts, %error,
                "partitions still cannot be opened; retrying with backoff");
        }
        count
    }

    /// The log config and min.insync.replicas of a partition this broker hosts.
    fn open_config(&self, tp: &TopicPartition) -> Result<(crate::log::LogConfig, usize), PartitionError> {
        let reg = &self.view;
        let hosting = reg.hosting(&tp.topic, tp.partition);
        match reg.get(&tp.topic) {
            Some(meta) if tp.partition >= 0 && tp.partition < meta.partitions => match hosting {
                Hosting::Elsewhere => Err(PartitionError::NotLeader(tp.clone())),
                _ => Ok((self.log_config_of(meta), self.min_insync_of(meta))),
            },
            _ => Err(PartitionError::UnknownTopicOrPartition(tp.clone())),
        }
    }

    /// The high watermark of `tp` in this broker's checkpoint before it started (0 when
    /// none): what a restarted replica starts from, and the bound on the producer-state
    /// snapshot its log is rebuilt from (`PartitionLog::open_leading`).
    fn checkpointed_hw(&self, tp: &TopicPartition) -> i64 {
        self.hw_at_start.get(tp).copied().unwrap_or(0)
    }

    fn insert_partition(&mut self, tp: &TopicPartition, mut log: PartitionLog, min_insync: usize, now_ms: i64) {
        log.set_producer_id_bound(self.producer_id_bound);
        // The high watermark this broker knew before it stopped (never above the log).
        let follower_hw = self.checkpointed_hw(tp).min(log.log_end_offset().0);
        self.partitions.insert(
            tp.clone(),
            Partition {
                log,
                replica: replica::Replica::new(follower_hw, min_insync),
                data_waiters: Vec::new(),
                durable_waiters: Vec::new(),
                write_waiters: Vec::new(),
            },
        );
        self.refresh_role(tp, now_ms);
    }

    fn partition_mut(&mut self, tp: &TopicPartition, now_ms: i64) -> Result<&mut Partition, PartitionError> {
        if !self.partitions.contains_key(tp) {
            if self.closing {
                return Err(PartitionError::Log(LogError::Offline("the broker is shutting down".into())));
            }
            if self.opening.contains_key(tp) {
                return Err(PartitionError::NotLeader(tp.clone()));
            }
            if let Some(failed) = self.open_failures.get(tp) {
                // The housekeeping tick opens it again when its backoff is over.
                return Err(PartitionError::Log(LogError::Offline(format!("cannot open the log: {}", failed.error))));
            }
            let (config, min_insync) = self.open_config(tp)?;
            let high_watermark = self.checkpointed_hw(tp);
            let log =
                PartitionLog::open_leading(&self.data_dir.join(tp.dir_name()), config, now_ms, None, high_watermark)?;
            self.insert_partition(tp, log, min_insync, now_ms);
        }
        Ok(self.partitions.get_mut(tp).expect("just inserted"))
    }

    /// Write an append the log placed (the patched headers, then each batch's bytes from
    /// `records`), by io_uring when the ring is on, else now; and say what the answer
    /// waits for: the write, an fsync (`durable` or a due flush), the high watermark
    /// (acks=all).
    fn write_appended(
        &mut self,
        tp: TopicPartition,
        records: bytes::Bytes,
        (info, write, patches): (AppendInfo, crate::log::PendingWrite, Vec<crate::log::HeaderPatch>),
        durable: bool,
        acks: i16,
        now_ms: i64,
    ) -> Result<PartitionReply, PartitionError> {
        let use_ring = self.ring.is_some();
        let p = self.partitions.get_mut(&tp).expect("the partition just appended");
        // Each batch goes out as its new header, then its bytes from the request.
        let mut parts = Vec::with_capacity(2 * patches.len());
        for patch in &patches {
            parts.push(bytes::Bytes::copy_from_slice(&patch.header));
            parts.push(records.slice(patch.position + patch.header.len()..patch.position + patch.size));
        }
        let written = if use_ring {
            let (tx, rx) = oneshot::channel();
            p.write_waiters.push((write.id, tx));
            Some((rx, write, parts))
        } else {
            let mut position = write.position;
            let mut result = Ok(());
            for part in &parts {
                result = write.file.write_all_at(part, position);
                if result.is_err() {
                    break;
                }
                position += part.len() as u64;
            }
            p.log.write_done(write.id, result)?;
            for w in p.data_waiters.drain(..) {
                let _ = w.send(());
            }
            replica::advance_hw(p);
            None
        };
        // acks=all: answered once the high watermark covers the batch (at once with
        // a single in-sync replica, as soon as its write is done).
        let replicated = (acks == -1).then(|| {
            let (tx, rx) = oneshot::channel();
            replica::wait_for_hw(p, info.last_offset, tx);
            rx
        });
        let durable = if durable || p.log.flush_due(now_ms) {
            let (tx, rx) = oneshot::channel();
            p.durable_waiters.push((info.last_offset, tx));
            note_durable_waiting(&mut self.durable_waiting, &tp);
            Some(rx)
        } else {
            None
        };
        let log_start_offset = p.log.log_start_offset();
        let written = written.map(|(rx, write, parts)| {
            let ring = self.ring.as_mut().expect("checked above");
            ring.stage(StagedWrite {
                tp,
                log: write.log,
                write_id: write.id,
                file: write.file,
                position: write.position,
                parts,
            });
            rx
        });
        Ok(PartitionReply::Produced { info, log_start_offset, written, durable, replicated, duplicate: false })
    }

    /// Run one operation on a partition this shard owns.
    pub fn execute(&mut self, op: PartitionOp) -> Result<PartitionReply, PartitionError> {
        assert!(self.owns(op.tp()), "shard {} got {} owned by another shard", self.id.0, op.tp());
        self.sync_registry();
        // Only the leader appends and serves reads.
        let led = match &op {
            PartitionOp::Produce { tp, now_ms, .. } | PartitionOp::WriteMarker { tp, now_ms, .. } => {
                Some((tp, *now_ms, LeaderEpoch::UNDEFINED))
            }
            PartitionOp::Fetch { tp, current_leader_epoch, .. }
            | PartitionOp::EpochEndOffset { tp, current_leader_epoch, .. } => Some((tp, 0, *current_leader_epoch)),
            PartitionOp::ListOffset { tp, current_leader_epoch, .. } => Some((tp, 0, *current_leader_epoch)),
            PartitionOp::DescribeProducers { tp }
            | PartitionOp::DeleteRecords { tp, .. }
            | PartitionOp::AwaitLowWatermark { tp, .. } => Some((tp, 0, LeaderEpoch::UNDEFINED)),
            _ => None,
        };
        if let Some((tp, now_ms, epoch)) = led {
            replica::leader_of(self.partition_mut(tp, now_ms)?, tp, epoch)?;
        }
        match op {
            PartitionOp::Produce { tp, records, now_ms, durable, acks, verification } => {
                let p = self.partition_mut(&tp, now_ms)?;
                let epoch = p.replica.may_append(acks == -1).map_err(|e| match e {
                    AppendRefusal::NotLeader => PartitionError::NotLeader(tp.clone()),
                    AppendRefusal::NotEnoughReplicas { isr, min } => {
                        PartitionError::NotEnoughReplicas { tp: tp.clone(), isr, min }
                    }
                })?;
                // compression.type other than `producer`: batches in the topic's codec.
                let records = match p.log.recompress(&records)? {
                    Some(rebuilt) => bytes::Bytes::from(rebuilt),
                    None => records,
                };
                // The leader stamps its epoch into every batch (KIP-101).
                let (info, write, patches) = match p.log.append_produced(&records, epoch.0, now_ms, verification) {
                    Err(LogError::DuplicateBatch(info)) => {
                        // A producer's retry: its original offsets, once a consumer could
                        // read them (and the in-sync replicas have them, for acks=all),
                        // and, where this write would have waited for an fsync, once one
                        // covers the original (still unsynced if its own ack is pending).
                        let readable = replica::high_watermark(p);
                        let replicated = (acks == -1 || info.last_offset >= readable).then(|| {
                            let (tx, rx) = oneshot::channel();
                            replica::wait_for_hw(p, info.last_offset, tx);
                            rx
                        });
                        let unsynced = info.last_offset >= p.log.recovery_point();
                        let durable = ((durable || p.log.flush_due(now_ms)) && unsynced).then(|| {
                            let (tx, rx) = oneshot::channel();
                            p.durable_waiters.push((info.last_offset, tx));
                            rx
                        });
                        let log_start_offset = p.log.log_start_offset();
                        if durable.is_some() {
                            note_durable_waiting(&mut self.durable_waiting, &tp);
                        }
                        return Ok(PartitionReply::Produced {
                            info,
                            log_start_offset,
                            written: None,
                            durable,
                            replicated,
                            duplicate: true,
                        });
                    }
                    other => other?,
                };
                self.write_appended(tp, records, (info, write, patches), durable, acks, now_ms)
            }
            PartitionOp::WriteMarker {
                tp,
                producer_id,
                producer_epoch,
                coordinator_epoch,
                commit,
                now_ms,
                transaction_version,
            } => {
                let p = self.partition_mut(&tp, now_ms)?;
                let epoch = p.replica.may_append(true).map_err(|e| match e {
                    AppendRefusal::NotLeader => PartitionError::NotLeader(tp.clone()),
                    AppendRefusal::NotEnoughReplicas { isr, min } => {
                        PartitionError::NotEnoughReplicas { tp: tp.clone(), isr, min }
                    }
                })?;
                let marker = crate::log::batch::ControlMarker { commit, coordinator_epoch };
                let records =
                    bytes::Bytes::from(crate::log::batch::encode_marker(producer_id, producer_epoch, marker, now_ms));
                let appended = p.log.append_marker_shared(&records, epoch.0, now_ms, transaction_version)?;
                if tp.topic == crate::group::OFFSETS_TOPIC {
                    self.offsets_txn_marker(&tp, producer_id, producer_epoch, commit);
                }
                let durable = self.fsync_always;
                self.write_appended(tp, records, appended, durable, -1, now_ms)
            }
            PartitionOp::Fetch {
                read_committed,
                tp,
                offset,
                max_bytes,
                min_one_batch,
                replica,
                replica_epoch,
                replica_log_start,
                current_leader_epoch,
                now_ms,
            } => {
                let zero_copy_bytes_min = self.zero_copy_bytes_min;
                let p = self.partition_mut(&tp, now_ms)?;
                let written = p.log.written_end_offset();
                if replica.get() >= 0 {
                    // A follower's fetch offset is its log end offset.
                    let before = replica::leader_hw(p);
                    let fetched = p.replica.on_follower_fetch(
                        current_leader_epoch,
                        replica,
                        replica_epoch,
                        offset.0,
                        written.0,
                        now_ms,
                    );
                    match fetched {
                        Ok((_, answers)) => {
                            p.replica.on_follower_log_start(replica, replica_log_start);
                            let wake = replica::hw_moved(p, before);
                            replica::deliver(p, answers, wake);
                        }
                        Err(FetchRefusal::Role(e)) => return Err(replica::role_error(&tp, e)),
                        Err(FetchRefusal::Follower(FollowerFetchError::NotReplica)) => {
                            return Err(PartitionError::NotLeader(tp))
                        }
                        Err(FetchRefusal::Follower(FollowerFetchError::StaleBrokerEpoch { broker_epoch, current })) => {
                            return Err(PartitionError::StaleBrokerEpoch { tp, replica, broker_epoch, current })
                        }
                    }
                }
                let high_watermark = replica::high_watermark(p);
                let last_stable_offset = p.log.last_stable_offset(high_watermark);
                // Followers read up to the log end, consumers below the high watermark,
                // read_committed ones below the last stable offset.
                let upper = match (replica.get() >= 0, read_committed) {
                    (true, _) => written,
                    (false, false) => high_watermark,
                    (false, true) => last_stable_offset,
                };
                let plan = p.log.read(offset, max_bytes, upper, min_one_batch)?;
                let aborted = (read_committed && replica.get() < 0).then(|| p.log.aborted_txns(offset, &plan));
                let records = if plan.length_bytes == 0 {
                    FetchRecords::Copied(Vec::new())
                } else if plan.length_bytes >= zero_copy_bytes_min {
                    FetchRecords::File(plan)
                } else {
                    FetchRecords::Copied(plan.read_to_vec().map_err(LogError::Io)?)
                };
                let fetched = FetchData {
                    high_watermark,
                    readable_end: upper,
                    log_start_offset: p.log.log_start_offset(),
                    last_stable_offset,
                    aborted,
                    records,
                };
                if replica.get() >= 0 {
                    // The follower's log start may have let a DeleteRecords complete.
                    self.check_low_watermarks(Some(&tp));
                }
                Ok(PartitionReply::Fetched(fetched))
            }
            PartitionOp::ListOffset { tp, timestamp_ms: spec, read_committed, .. } => {
                use list_offsets::*;
                let p = self.partition_mut(&tp, 0)?;
                let hw = replica::high_watermark(p);
                // What a consumer may read: a record found by timestamp at or past it is not
                // answered (offset -1), as Kafka bounds it (Partition.fetchOffsetForTimestamp).
                let last_fetchable = if read_committed { p.log.last_stable_offset(hw) } else { hw };
                let bounded = |found: Option<(Offset, i64, Option<i32>)>| found.filter(|f| f.0 < last_fetchable);
                let found = match spec {
                    // No tiered storage: the log start is also the local log start.
                    EARLIEST_TIMESTAMP | EARLIEST_LOCAL_TIMESTAMP => {
                        let start = p.log.log_start_offset();
                        Some((start, -1, p.log.epoch_for_offset(start)))
                    }
                    // "Latest" is the high watermark: what a consumer can read (appends still
                    // being written are not); for read_committed, the last stable offset.
                    LATEST_TIMESTAMP => Some((last_fetchable, -1, p.log.latest_epoch())),
                    MAX_TIMESTAMP => bounded(p.log.offset_for_max_timestamp()?),
                    // Kafka with remote storage disabled: offset -1, epoch -1, no error.
                    LATEST_TIERED_TIMESTAMP | EARLIEST_PENDING_UPLOAD_TIMESTAMP => None,
                    ts => bounded(p.log.offset_for_timestamp(ts)?.map(|(o, t)| (o, t, p.log.epoch_for_offset(o)))),
                };
                // As Kafka: the leader's epoch for "latest", else the epoch the offset was
                // written in (-1 when unknown), which a consumer validates its position
                // against after a leader change (KIP-320).
                let (offset, timestamp_ms, leader_epoch) = found.unwrap_or((Offset(-1), -1, None));
                Ok(PartitionReply::Offset { offset, timestamp_ms, leader_epoch: leader_epoch.unwrap_or(-1) })
            }
            PartitionOp::EpochEndOffset { tp, leader_epoch, .. } => {
                let p = self.partition_mut(&tp, 0)?;
                let (leader_epoch, end_offset) = p.log.end_offset_for_epoch(leader_epoch.0);
                Ok(PartitionReply::EpochEnd { leader_epoch, end_offset })
            }
            PartitionOp::WaitForData { tp, offset, replica, read_committed } => {
                let p = self.partition_mut(&tp, 0)?;
                let (tx, rx) = oneshot::channel();
                // The last stable offset moves only with the high watermark (a marker
                // counts once the HW passes it), so the HW's waiters serve both.
                let readable = match (replica, read_committed) {
                    (true, _) => p.log.written_end_offset(),
                    (false, false) => replica::high_watermark(p),
                    (false, true) => {
                        let hw = replica::high_watermark(p);
                        p.log.last_stable_offset(hw)
                    }
                };
                if readable > offset {
                    let _ = tx.send(());
                } else {
                    p.data_waiters.retain(|w| !w.is_canceled());
                    p.data_waiters.push(tx);
                }
                Ok(PartitionReply::Waiting(rx))
            }
            PartitionOp::DescribeProducers { tp } => {
                let p = self.partition_mut(&tp, 0)?;
                let producers = p
                    .log
                    .producer_states()
                    .entries()
                    .into_iter()
                    .map(|(producer_id, e)| ProducerSummary {
                        producer_id,
                        epoch: e.epoch,
                        last_sequence: e.last_seq(),
                        last_timestamp_ms: e.last_timestamp_ms,
                        coordinator_epoch: e.coordinator_epoch,
                        current_txn_start_offset: e.current_txn_first_offset,
                    })
                    .collect();
                Ok(PartitionReply::Producers(producers))
            }
            PartitionOp::DeleteRecords { tp, offset } => {
                Ok(PartitionReply::LogStartMoving(self.delete_records(&tp, offset)?))
            }
            PartitionOp::AwaitLowWatermark { tp, offset } => {
                Ok(PartitionReply::LowWatermarkReached(self.await_low_watermark(&tp, offset)))
            }
            PartitionOp::DescribeLog { tp } => {
                let p = self.partitions.get(&tp).ok_or(PartitionError::UnknownTopicOrPartition(tp))?;
                Ok(PartitionReply::LogDescribed {
                    size_bytes: p.log.size_bytes(),
                    log_end_offset: p.log.log_end_offset().0,
                    high_watermark: replica::high_watermark(p).0,
                })
            }
            PartitionOp::RefreshConfig { tp } => {
                self.refresh_view();
                let config = self.view.get(&tp.topic).map(|m| self.log_config_of(m));
                if let (Some(config), Some(p)) = (config, self.partitions.get_mut(&tp)) {
                    p.log.set_config(config);
                }
                Ok(PartitionReply::Done)
            }
            PartitionOp::DeletePartition { tp } => {
                if let Some(p) = self.partitions.remove(&tp) {
                    // A deleted topic's slots are given back once three quarters are
                    // empty (each holds a whole `Partition`), not kept for good.
                    if self.partitions.len() < self.partitions.capacity() / 4 {
                        self.partitions.shrink_to_fit();
                    }
                    for (_, w) in p.durable_waiters {
                        let _ = w.send(Err(format!("partition {tp} deleted")));
                    }
                    self.trash.dirs.push(p.log.delete()?);
                } else {
                    let dir = self.data_dir.join(tp.dir_name());
                    match crate::log::move_to_trash(&dir) {
                        Ok(trash) => self.trash.dirs.push(trash),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(PartitionError::Log(LogError::Io(e))),
                    }
                }
                Ok(PartitionReply::Done)
            }
        }
    }

    /// Housekeeping on a timer: roll by segment.ms, retention, flush.ms.
    pub fn tick(&mut self, now_ms: i64, run_retention: bool) {
        if crate::log::segment::log_files_sweep_due() {
            let closed: usize = self.partitions.values().map(|p| p.log.close_idle_files()).sum();
            tracing::debug!(
                shard = self.id.0,
                closed,
                open = crate::log::segment::log_files_open(),
                "closed idle segment files"
            );
        }
        let mut retry = false;
        for f in self.open_failures.values_mut().filter(|f| !f.due && f.retry_at_ms <= now_ms) {
            f.due = true;
            retry = true;
        }
        if retry {
            self.seen_generation = 0; // a full pass queues the failed opens that are due
        }
        self.sync_registry();
        // A follower's broker died, or leadership moved: DeleteRecords waits settle.
        self.check_low_watermarks(None);
        for (tp, p) in self.partitions.iter_mut() {
            // Group commit looks only at `durable_waiting`: a waiter outside it would
            // never be released.
            debug_assert!(
                p.durable_waiters.is_empty() || self.durable_waiting.contains(tp),
                "{tp} holds durable waiters but is not in durable_waiting"
            );
            if p.log.offline_reason().is_some() {
                continue; // said once when it went offline; nothing to roll, retain or flush
            }
            if let Err(e) = p.log.maybe_roll(now_ms) {
                tracing::error!(partition = %tp, error = %e, "segment roll failed");
            }
            if run_retention {
                match p.log.enforce_retention(now_ms) {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(partition = %tp, segments = n, log_start_offset = %p.log.log_start_offset(), "retention deleted segments")
                    }
                    Err(e) => tracing::error!(partition = %tp, error = %e, "retention failed"),
                }
            }
            if run_retention {
                let expired = p.log.expire_producers(now_ms);
                if expired > 0 {
                    tracing::info!(partition = %tp, producers = expired, "expired idle producer ids");
                }
            }
            // Segments retention or a truncation renamed away: unlinked off the core.
            self.trash.segments.extend(p.log.take_deleted_segments());
            if p.durable_waiters.is_empty() && (p.log.flush_due(now_ms) || p.log.sync_owed()) {
                // flush.ms elapsed (or a checkpoint or snapshot was replaced, or a roll
                // left a segment above the recovery point) with nobody waiting: queue a
                // flush all the same. The waiter names the last written offset (-1 when
                // none), as an ack names its last record: naming the end offset itself
                // made it wait for the next append, so an idle partition never flushed
                // (and a compacted one never had its last rolled segment cleaned).
                let (tx, _rx) = oneshot::channel();
                p.durable_waiters.push((Offset(p.log.unflushed_end().0 - 1), tx));
                note_durable_waiting(&mut self.durable_waiting, tp);
            }
        }
    }

    /// A flush round that makes `tp`'s last truncation durable, when it is not yet
    /// (`PartitionLog::truncation_durable`): a follower's fetcher awaits it, then asks
    /// again (a round already running when it was queued may not cover it), before it
    /// appends past the cut.
    pub fn truncation_flush(&mut self, tp: &TopicPartition) -> Option<oneshot::Receiver<Result<(), String>>> {
        let p = self.partitions.get_mut(tp)?;
        if p.log.truncation_durable() || p.log.offline_reason().is_some() {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        // Below every offset: taken by the next round whatever it covers.
        p.durable_waiters.push((Offset(-1), tx));
        note_durable_waiting(&mut self.durable_waiting, tp);
        Some(rx)
    }

    /// True when some partition has acks (or a flush policy) waiting for an fsync.
    pub fn has_flush_work(&self) -> bool {
        self.durable_waiting.iter().any(|tp| self.partitions.get(tp).is_some_and(Self::flushable))
    }

    /// Some ack waits for an fsync, and the data it needs is already written.
    fn flushable(p: &Partition) -> bool {
        let written = p.log.written_end_offset();
        p.durable_waiters.iter().any(|(offset, _)| *offset < written)
    }

    /// Group commit, step 1: collect what one fdatasync round must cover.
    pub fn take_flush_batch(&mut self) -> FlushBatch {
        let partitions = &mut self.partitions;
        self.durable_waiting.retain(|tp| partitions.get(tp).is_some_and(|p| !p.durable_waiters.is_empty()));
        let items = self
            .durable_waiting
            .iter()
            .filter_map(|tp| {
                let p = partitions.get_mut(tp)?;
                Self::flushable(p).then(|| (tp.clone(), p.log.flush_handle()))
            })
            .collect();
        FlushBatch { items }
    }

    /// Group commit, step 2: record the outcome and release every ack it covers.
    pub fn complete_flush(&mut self, results: Vec<(TopicPartition, Flushed, std::io::Result<()>)>) {
        for (tp, flushed, result) in results {
            let Some(p) = self.partitions.get_mut(&tp) else {
                continue;
            };
            // The round covered offsets below `upto` (the written end when it was
            // taken, lowered to a truncation made meanwhile: records appended again
            // at those offsets were not synced); a waiter holds the last offset it
            // needs synced. A failed fsync takes the log offline, which it logs once.
            let outcome = p.log.mark_flushed(flushed, result).map_err(|e| e.to_string());
            let upto = outcome.as_ref().map_or(Offset(i64::MAX), |upto| *upto);
            let outcome = outcome.map(|_| ());
            let waiters = std::mem::take(&mut p.durable_waiters);
            for (offset, w) in waiters {
                if outcome.is_err() || offset < upto {
                    let _ = w.send(outcome.clone());
                } else {
                    p.durable_waiters.push((offset, w));
                }
            }
            if p.durable_waiters.is_empty() {
                self.durable_waiting.remove(&tp);
            }
        }
    }

    pub fn status(&self) -> ShardStatus {
        let mut partitions: Vec<PartitionStatus> = self
            .partitions
            .iter()
            .map(|(tp, p)| PartitionStatus {
                tp: tp.clone(),
                log_start_offset: p.log.log_start_offset().0,
                log_end_offset: p.log.log_end_offset().0,
                size_bytes: p.log.size_bytes(),
                offline: p.log.offline_reason().is_some(),
                under_replicated: p.replica.leader_state().is_some_and(|l| l.isr().len() < l.replicas().len()),
                high_watermark: p.replica.leader_state().map(|l| l.high_watermark()),
                last_stable_offset: p.replica.leader_state().map(|l| p.log.stable_offset(Offset(l.high_watermark())).0),
                open_transactions: p.log.producer_states().ongoing_count(),
                cleaner: p.log.cleaner_state(),
            })
            .collect();
        partitions.sort_by(|a, b| a.tp.cmp(&b.tp));
        ShardStatus {
            partitions,
            groups: self.groups.status(),
            rebalances: self.groups.rebalances(),
            cleaner: self.cleaner_totals,
            txns: self.txn_status(),
        }
    }

    /// Clean shutdown: close every log (flush, trim indexes, clean-shutdown marker).
    /// The server runs `take_logs_for_close` + `close_logs` instead, off the data core.
    pub fn close_all(&mut self) {
        close_logs(self.take_logs_for_close());
    }

    /// Clean shutdown, step 1: finish the writes in flight, answer every waiter, and
    /// hand over the logs (the shard hosts nothing afterwards).
    pub fn take_logs_for_close(&mut self) -> Vec<(TopicPartition, PartitionLog)> {
        if let Some(ring) = self.ring.as_mut() {
            let done = ring.drain_blocking();
            self.complete_writes(done);
        }
        self.closing = true;
        self.partitions.drain().map(|(tp, p)| (tp, p.log)).collect()
    }
}

/// Where an operation's answer goes.
pub type PartitionReplySender = futures::channel::oneshot::Sender<Result<PartitionReply, PartitionError>>;

/// A hosted partition whose log failed to open, and when to try again.
#[derive(Debug, Default)]
struct OpenFailure {
    attempts: u32,
    retry_at_ms: i64,
    /// The tick found the backoff over: the next registry pass queues the open.
    due: bool,
    error: String,
}

impl OpenFailure {
    /// The first retry after 1 s, doubling to at most `open_retry_backoff_ms_max`.
    fn failed(&mut self, error: String, now_ms: i64) {
        self.attempts += 1;
        let backoff = (1_000i64 << (self.attempts - 1).min(10)).min(crate::model::limits::open_retry_backoff_ms_max);
        self.retry_at_ms = now_ms + backoff;
        self.due = false;
        self.error = error;
    }
}

/// What waits for a partition's log to be opened off the data core.
#[derive(Default)]
struct Opening {
    /// Operations, in arrival order: run in that order as soon as the log is installed,
    /// before anything that arrives later, so pipelined requests keep their order.
    parked: Vec<(PartitionOp, PartitionReplySender)>,
    /// Others to wake then (group operations on `__consumer_offsets`).
    waiters: Vec<futures::channel::oneshot::Sender<()>>,
}

/// A partition log to open at startup (`Shard::open_jobs`).
pub struct OpenJob {
    pub tp: TopicPartition,
    pub dir: PathBuf,
    pub config: crate::log::LogConfig,
    pub min_insync: usize,
    /// The epoch this broker leads the partition in, if it does (recorded at open).
    pub leader_epoch: Option<LeaderEpoch>,
    /// The high watermark checkpointed before the restart (0: none).
    pub high_watermark: i64,
}

/// Startup, step 2 (blocking; run it off the data core): open and recover the logs, up
/// to `log_recovery_threads_max` at once.
pub fn open_logs(jobs: Vec<OpenJob>, now_ms: i64) -> Vec<(OpenJob, Result<PartitionLog, LogError>)> {
    crate::model::parallel_map(jobs, crate::model::limits::log_recovery_threads_max, |job| {
        let log = PartitionLog::open_leading(
            &job.dir,
            job.config.clone(),
            now_ms,
            job.leader_epoch.map(|e| e.0),
            job.high_watermark,
        );
        (job, log)
    })
}

/// Clean shutdown, step 2 (blocking; run it off the data core): close the logs (flush,
/// trim indexes, clean-shutdown marker), up to `log_recovery_threads_max` at once. A log
/// that fails to close gets no marker and is recovered at the next start.
pub fn close_logs(logs: Vec<(TopicPartition, PartitionLog)>) {
    crate::model::parallel_map(logs, crate::model::limits::log_recovery_threads_max, |(tp, log)| {
        if let Err(e) = log.close() {
            tracing::error!(partition = %tp, error = %e, "close failed");
        }
    });
}

/// Record that `tp` holds a durable waiter (`Shard::durable_waiting`), cloning its name
/// only the first time.
fn note_durable_waiting(waiting: &mut HashSet<TopicPartition>, tp: &TopicPartition) {
    if !waiting.contains(tp) {
        waiting.insert(tp.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_dirs_parse() {
        assert_eq!(parse_partition_dir("orders-3"), Some(TopicPartition::new("orders", 3)));
        assert_eq!(parse_partition_dir("my-topic-0"), Some(TopicPartition::new("my-topic", 0)));
        assert_eq!(parse_partition_dir("spate-meta"), None);
        assert_eq!(parse_partition_dir("-1"), None);
        assert_eq!(parse_partition_dir("a-+1"), None);
    }

    #[test]
    fn partitions_of_a_topic_spread_over_shards() {
        let owners: std::collections::HashSet<_> =
            (0..8).map(|p| owner_shard(&TopicPartition::new("t", p), 2)).collect();
        assert_eq!(owners.len(), 2);
    }

    /// A negative partition index from a hostile Fetch once overflowed the hash's sum
    /// (a panic with overflow checks on: test_hostile_frames.py's mutated requests under
    /// the `ci` profile); it maps to a shard like any other.
    #[test]
    fn a_negative_partition_from_the_wire_still_has_an_owner() {
        for p in [-1, -2, i32::MIN] {
            assert!(owner_shard(&TopicPartition::new("t", p), 3).0 < 3);
        }
    }
}
