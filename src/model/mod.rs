//! Newtypes for ids and offsets, and every named limit in one place.
//!
//! Sizes carry `_bytes`, times `_ms`; limits end in `_max`.

use std::fmt;

/// A Kafka offset: the position of a record in a partition log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(pub i64);

impl Offset {
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The index of one core-pinned executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(pub usize);

/// A broker's node id (`--node-id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BrokerId(pub i32);

/// A producer id (Kafka's `producerId`): issued by InitProducerId, carried in every
/// batch of an idempotent producer. -1 (`ProducerId::NONE`) in a plain producer's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProducerId(pub i64);

impl ProducerId {
    pub const NONE: ProducerId = ProducerId(-1);
}

impl fmt::Display for ProducerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A producer epoch (Kafka's `producerEpoch`): bumped to fence an older incarnation of
/// the same producer id. -1 (`ProducerEpoch::NONE`) when there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProducerEpoch(pub i16);

impl ProducerEpoch {
    pub const NONE: ProducerEpoch = ProducerEpoch(-1);
}

impl fmt::Display for ProducerEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A topic name and a partition index.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self { topic: topic.into(), partition }
    }

    /// The partition's directory name: `<topic>-<partition>`, as Kafka names it.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Named limits. Everything read from the network or from disk is checked against one
/// of these before it is trusted.
#[allow(non_upper_case_globals)]
pub mod limits {
    /// `socket.request.max.bytes`: the largest request frame accepted (Kafka: 100 MiB).
    pub const request_frame_bytes_max: usize = 100 * 1024 * 1024;
    /// Requests a client may have in flight on one connection before we stop reading.
    pub const connection_in_flight_max: usize = 16;
    /// Kafka's `max.message.bytes` default: the largest record batch a topic accepts.
    pub const message_bytes_default: u32 = 1_048_588;
    /// The largest `max.message.bytes` a topic may configure (a batch length is
    /// an i32 on the wire and an index position is a u32 on disk).
    pub const message_bytes_max: u32 = 256 * 1024 * 1024;
    /// Partitions one topic may have.
    pub const topic_partitions_max: i32 = 100_000;
    /// Kafka's topic name length limit.
    pub const topic_name_bytes_max: usize = 249;
    /// A cross-shard channel's capacity.
    pub const shard_channel_depth_max: usize = 1024;
    /// Array elements one request may hold, all arrays together (Kafka has no such
    /// limit; frames are already capped by `request_frame_bytes_max`). Bounds the memory
    /// a decoded request takes, whatever its shape: ~64 bytes a decoded element.
    pub const request_array_elements_max: u64 = 256 * 1024;
    /// Array elements one response from a peer may hold (a Metadata answer for 100,000
    /// partitions of RF 3 holds ~700,000).
    pub const response_array_elements_max: u64 = 8 * 1024 * 1024;
    /// Bytes one Fetch response may carry when the client asks for more.
    pub const fetch_response_bytes_max: usize = 64 * 1024 * 1024;
    /// iovecs one writev may carry: Linux's IOV_MAX (UIO_MAXIOV); more is EINVAL.
    pub const writev_iovecs_max: usize = 1024;
    /// Bytes one writev may carry: Linux's MAX_RW_COUNT (INT_MAX rounded down to a
    /// 4 KiB page); the kernel writes no more in one call.
    pub const writev_bytes_max: usize = 0x7fff_f000;
    /// `max.connections` default: connections the broker holds (Kafka: unbounded).
    pub const connections_max_default: usize = 10_000;
    /// `max.connections.per.ip` default: connections from one client IP (Kafka:
    /// unbounded; followers open one connection per partition they follow).
    pub const connections_per_ip_max_default: usize = 1_000;
    /// `connections.max.idle.ms` default (Kafka's): a connection that sends nothing for
    /// this long, with no request of its own in flight, is closed.
    pub const connection_idle_ms_max_default: u64 = 600_000;
    /// `queued.max.request.bytes` default: bytes all requests being read or handled may
    /// reserve (Kafka: unbounded); a frame reserves its declared length before its body
    /// is read. A frame declared longer is refused.
    pub const queued_request_bytes_max_default: usize = 512 * 1024 * 1024;
    /// Bytes a request frame's buffer starts with; a longer frame's buffer doubles as
    /// its bytes arrive, so a frame declared long but sent slowly (or never) holds
    /// only about what arrived.
    pub const frame_read_initial_bytes_max: usize = 1024 * 1024;
    /// Partitions named in one summary log line (the rest are counted).
    pub const log_line_partitions_max: usize = 8;
    /// How long startup waits for a listener no process owns (a killed broker's socket,
    /// still being torn down) to leave the listen port before it gives up.
    pub const lingering_listener_wait_ms: u64 = 10_000;
    /// Batches remembered per producer id and partition for duplicate detection
    /// (Kafka's `NUM_BATCHES_TO_RETAIN`; clients keep at most 5 requests in flight).
    pub const producer_batches_max: usize = 5;
    /// Producer ids handed out per block written to `/latest_producer_id_block`
    /// (Kafka's `PRODUCER_ID_BLOCK_SIZE`).
    pub const producer_id_block_size_max: i64 = 1000;
    /// Entries one producer-state `.snapshot` file may hold before it is refused as
    /// corrupt (a snapshot is untrusted input on recovery).
    pub const producer_snapshot_entries_max: usize = 1_000_000;
    /// Producer ids one partition tracks; beyond this the oldest (by last timestamp)
    /// is forgotten first, as expiry would (a client then looks unknown: accepted).
    pub const partition_producers_max: usize = 100_000;
    /// Kafka's `producer.id.expiration.ms` default: 1 day.
    pub const producer_id_expiration_ms_default: i64 = 86_400_000;
    /// Threads one shard opens (recovers) or closes its partition logs with, at start
    /// and at a clean stop (Kafka: `num.recovery.threads.per.data.dir`). The work is
    /// mostly waiting for fsyncs and reads, which the file system batches when many are
    /// in flight: 1,000 partitions closed one by one took 12.6 s on the 2-core VM, ~2 s
    /// with 32 threads (16: ~2.5 s; 64 did no better and loaded the machine).
    pub const log_recovery_threads_max: usize = 32;
    /// Threads in each shard's blocking pool (glommio's `spawn_blocking`), unbound to
    /// any CPU: fsync rounds, checkpoint writes, log opens, group-load reads and trash
    /// removal. More than one, so that a slow job (a load's read from a cold disk, a
    /// burst of opens) never holds back the fsync round that acks wait for.
    pub const shard_blocking_threads: usize = 4;
    /// `disk.free.min.bytes` default: below this much free space produce is refused
    /// (Redpanda's `storage_min_free_bytes` is 5 GiB; Kafka has no such setting).
    pub const disk_free_min_bytes_default: u64 = 1024 * 1024 * 1024;
    /// `disk.free.min.percent` default: ... or below this share of the file system.
    pub const disk_free_min_percent_default: u32 = 1;
    /// How often the free space of the data dir's file system is read (statvfs).
    pub const disk_check_interval_ms: u64 = 1_000;
    /// The metadata reserve (`spate-meta/reserve`): space held back while the disk has
    /// room and given up when it is full, so that startup and admin requests (topic
    /// deletion, config changes) can still write the metadata store and checkpoints.
    /// The larger of this and twice the store file.
    pub const metadata_reserve_bytes_min: u64 = 8 * 1024 * 1024;
}

/// `f` applied to every item on up to `threads_max` scoped threads (plain std threads:
/// no runtime); results in the order of `items`. For blocking work (opening,
/// recovering, closing logs) that must not run on a data core.
pub fn parallel_map<T: Send, R: Send>(items: Vec<T>, threads_max: usize, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let n = items.len();
    let threads = threads_max.clamp(1, n.max(1));
    if threads == 1 {
        return items.into_iter().map(f).collect();
    }
    let queue = std::sync::Mutex::new(items.into_iter().enumerate().collect::<Vec<_>>());
    let results = std::sync::Mutex::new(Vec::with_capacity(n));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let next = queue.lock().unwrap_or_else(|p| p.into_inner()).pop();
                let Some((i, item)) = next else { break };
                let r = f(item);
                results.lock().unwrap_or_else(|p| p.into_inner()).push((i, r));
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    assert_eq!(results.len(), n, "parallel_map lost an item");
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Replace `path` with `data` so that a crash leaves the old or the new contents, never
/// a mix: a temporary file beside it, fsynced, renamed over it, then the directory
/// fsynced. For small metadata files (checkpoints, snapshots, the embedded store).
pub fn write_file_atomically(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = temporary_beside(path);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

fn temporary_beside(path: &std::path::Path) -> std::path::PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::path::PathBuf::from(tmp)
}

/// Replace `path` with `data` without waiting for the disk: a temporary file beside
/// it, written, renamed over it. Page-cache work only (no fsync), so a data core may
/// do it; readers and a kill -9 see the old or the new contents. Returns the new file,
/// which the caller fsyncs later (then the directory) for the contents to survive a
/// power loss; until then a power loss may leave the old contents or an empty or torn
/// file, which the reader must tell apart (checksums or a strict parse).
pub fn write_file_replacing(path: &std::path::Path, data: &[u8]) -> std::io::Result<std::fs::File> {
    use std::io::Write;
    let tmp = temporary_beside(path);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    std::fs::rename(&tmp, path)?;
    Ok(f)
}

/// SplitMix64: small and seedable. For spreads (replica placement) and seeded
/// simulations, never for secrets.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
