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

// Cluster ids and epochs. Each is its own type so that a broker id cannot be passed
// where a leader epoch is expected; they become plain integers only at the wire (Kafka
// requests and responses: `.0` or `From`) and in persisted documents, where serde writes
// each exactly as the integer it wraps (`#[serde(transparent)]`), so the ZooKeeper
// layout, the snapshot cache and the checkpoints are unchanged. `Debug` prints the bare
// integer too, so an ISR reads `[1, 2, 3]` in log lines and error messages, as before.

/// A broker's node id (`--node-id`; Kafka's `node.id` / `broker.id`). `NodeId::NONE`
/// (-1) is Kafka's "no broker": a partition without a leader, a request from a consumer.
/// (The `kafka_protocol` crate's own `BrokerId` is the wire type.)
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub i32);

impl NodeId {
    pub const NONE: NodeId = NodeId(-1);

    pub fn get(self) -> i32 {
        self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A partition's leader epoch (KIP-101): +1 at every leader change, stamped into each
/// batch the leader writes. `LeaderEpoch::UNDEFINED` (-1) is Kafka's UNDEFINED_EPOCH: no
/// epoch known, or (a request's current leader epoch) none to check (KIP-320).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct LeaderEpoch(pub i32);

impl LeaderEpoch {
    pub const UNDEFINED: LeaderEpoch = LeaderEpoch(-1);

    pub fn get(self) -> i32 {
        self.0
    }

    /// The epoch after this one. Panics at `i32::MAX` (an epoch never wraps).
    pub fn next(self) -> LeaderEpoch {
        LeaderEpoch(self.0.checked_add(1).expect("leader epoch overflow"))
    }
}

impl fmt::Display for LeaderEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for LeaderEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A partition epoch (KIP-497, KIP-841): the version of a partition's leader and ISR,
/// +1 on every change of either; an AlterPartition names the one it was based on and is
/// refused if it is not the current one (INVALID_UPDATE_VERSION). ZooKeeper-era Kafka
/// called it the state znode's version.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct PartitionEpoch(pub i32);

impl PartitionEpoch {
    pub fn get(self) -> i32 {
        self.0
    }

    /// The epoch after this one. Panics at `i32::MAX` (an epoch never wraps).
    pub fn next(self) -> PartitionEpoch {
        PartitionEpoch(self.0.checked_add(1).expect("partition epoch overflow"))
    }
}

impl fmt::Display for PartitionEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for PartitionEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A broker epoch (KIP-903): the coordinator's number for one registration of a broker,
/// growing with every registration in the cluster, so a restarted broker has a newer one.
/// Sent in a follower's Fetch (ReplicaEpoch) and in AlterPartition (NewIsrWithEpochs).
/// `BrokerEpoch::NONE` (-1) is Kafka's "not known or not sent": not checked.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct BrokerEpoch(pub i64);

impl BrokerEpoch {
    pub const NONE: BrokerEpoch = BrokerEpoch(-1);

    pub fn get(self) -> i64 {
        self.0
    }

    /// The epoch after this one (the next registration's).
    pub fn next(self) -> BrokerEpoch {
        BrokerEpoch(self.0.checked_add(1).expect("broker epoch overflow"))
    }
}

impl fmt::Display for BrokerEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for BrokerEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

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

/// Kafka's internal topics (its `Topic.isInternal`): the groups' offsets and the
/// transactions' state, marked internal in Metadata and DescribeTopicPartitions.
/// (`__share_group_state` joins them with share groups, issue 48.)
pub fn is_internal_topic(name: &str) -> bool {
    name == crate::group::OFFSETS_TOPIC || name == crate::txn::TXN_TOPIC
}

/// Named limits. Everything read from the network or from disk is checked against one
/// of these before it is trusted.
#[allow(non_upper_case_globals)]
pub mod limits {
    /// File descriptors the segment files' budget leaves to the broker's own files and
    /// sockets besides connections (peers, the coordinator, files opened for a moment
    /// to sync or replace them, io_uring, eventfds).
    pub const broker_descriptors_reserved: usize = 1_000;
    /// The longest wait before a partition whose log failed to open is tried again
    /// (the first retry comes after 1 s, then twice as long each time).
    pub const open_retry_backoff_ms_max: i64 = 30_000;
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
    /// glibc malloc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD for the broker (set once at
    /// start, `main.rs`): a request body up to this size comes from the heap, and a heap
    /// keeps up to this much free memory rather than handing it back to the kernel. With
    /// glibc's defaults a 128 KiB Produce body was a fresh mmap, or heap memory trimmed
    /// and faulted in again, on every request: 36,000-164,000 page faults per GB
    /// produced, each page zeroed by the kernel and written again (bench/README.md,
    /// "Cost per GB"). 32 MiB is the most glibc takes for the mmap threshold.
    pub const malloc_reuse_bytes: usize = 32 * 1024 * 1024;
    /// A connection's read-ahead buffer: one socket read takes up to this many bytes, so
    /// a small request's length prefix and body come in one system call. Held for the
    /// connection's life (10,000 connections: 160 MiB); bytes read ahead of a frame are
    /// not yet reserved from `queued.max.request.bytes`, at most this many per connection.
    pub const connection_read_ahead_bytes: usize = 16 * 1024;
    /// The largest PEM file (keystore, truststore) a TLS listener reads.
    pub const tls_pem_file_bytes_max: usize = 4 * 1024 * 1024;
    /// The most PBKDF2 iterations an encrypted private key (`ssl.key.password`) may ask
    /// for: its file chooses them, and each costs the reload thread time (openssl's
    /// default is 2,048; 10 million take seconds).
    pub const tls_key_pbkdf2_iterations_max: u32 = 10_000_000;
    /// The most memory scrypt may take (128 x N x r x p bytes) to open an encrypted
    /// private key; scrypt allocates it at once, so a key file could ask for more than
    /// the machine has.
    pub const tls_key_scrypt_bytes_max: u64 = 256 * 1024 * 1024;
    /// The buffer a TLS connection copies a fetched file range through.
    pub const tls_file_copy_chunk_bytes: usize = 256 * 1024;
    /// How often the TLS watcher looks at the keystore and truststore files for changes.
    pub const tls_reload_check_interval_ms: u64 = 5_000;
    /// The most listeners a broker may have, and a BrokerRegistration may carry (more
    /// is refused with INVALID_REQUEST): each is kept in the registry and the broker's
    /// znode, and answered in every Metadata's lookup of its listener.
    pub const broker_listeners_max: usize = 64;
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
    /// removal. More than a round's sync jobs (`group_commit_sync_jobs_max`), so that a
    /// slow job (a load's read from a cold disk, a burst of opens) never holds back the
    /// fsync round that acks wait for.
    pub const shard_blocking_threads: usize = 8;
    /// A group-commit round's partitions are split over at most this many blocking-pool
    /// jobs, which fdatasync at once (each partition's files in order, in one job):
    /// concurrent fdatasyncs share the file system's journal commits and keep the disk's
    /// queue full, where one after another each waits for its own (closing 1,000
    /// partitions: see `log_recovery_threads_max`).
    pub const group_commit_sync_jobs_max: usize = 6;
    const _: () = assert!(group_commit_sync_jobs_max < shard_blocking_threads, "a pool thread stays free of fsyncs");
    /// ACL entries one resource pattern's document (`/kafka-acl/<type>/<name>`) may hold;
    /// a longer stored document is refused as corrupt, a CreateAcls past it is refused.
    pub const acl_entries_per_resource_max: usize = 10_000;
    /// ACL bindings in the whole cluster (every pattern's entries together).
    pub const acl_bindings_max: usize = 100_000;
    /// ACL change notifications kept (`/kafka-acl-changes`, `/kafka-acl-extended-changes`):
    /// the oldest are removed past this (Kafka removes them after 15 minutes).
    pub const acl_change_notifications_max: usize = 100;
    /// Authorizer log lines (denials) per shard per second; more are counted, and the
    /// count is logged with the next line that gets through.
    pub const authorizer_log_lines_per_second_max: u32 = 20;
    /// `disk.free.min.bytes` default: below this much free space produce is refused
    /// (Redpanda's `storage_min_free_bytes` is 5 GiB; Kafka has no such setting).
    pub const disk_free_min_bytes_default: u64 = 1024 * 1024 * 1024;
    /// `disk.free.min.percent` default: ... or below this share of the file system.
    pub const disk_free_min_percent_default: u32 = 1;
    /// How often the kernel's dirty page-cache counters are read (/proc/vmstat) to decide
    /// whether appends may be written on the shard itself (see `shard::append_ring`).
    pub const writeback_check_interval_ms: u64 = 10;
    /// Appends are written on the shard only while dirty plus writeback pages stay this far
    /// below the point where the kernel starts throttling writers (its "freerun" ceiling,
    /// halfway between the background and the foreground dirty thresholds): what the
    /// producers of a machine can dirty between two readings, with room to spare.
    pub const writeback_headroom_bytes: u64 = 256 * 1024 * 1024;
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

/// `create_dir_all`, then each directory it made is made durable: its parent is fsynced
/// (a directory's entry is not on the disk until its parent is; a power cut loses it and
/// everything below it, fsynced or not). Blocking: for start-up, not per partition.
pub fn create_dir_all_durably(path: &std::path::Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(path);
    while let Some(p) = at.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        missing.push(p);
        at = p.parent();
    }
    std::fs::create_dir_all(path)?;
    for made in missing.iter().rev() {
        if let Some(parent) = made.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(parent)?.sync_all()?;
        }
    }
    Ok(())
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
/// do it; readers and a kill -9 see the old or the new contents. The caller fsyncs the
/// file later by its path (then the directory) for the contents to survive a power
/// loss; until then a power loss may leave the old contents or an empty or torn file,
/// which the reader must tell apart (checksums or a strict parse).
pub fn write_file_replacing(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = temporary_beside(path);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Persisted documents (the snapshot cache, the embedded store) hold these as the
    /// integers they replaced: serde must write and read the bare integer, map keys too.
    #[test]
    fn ids_and_epochs_serialize_as_the_integers_they_wrap() {
        let json = serde_json::to_string(&(NodeId(3), LeaderEpoch(7), PartitionEpoch(-1), BrokerEpoch(1 << 40)));
        assert_eq!(json.unwrap(), "[3,7,-1,1099511627776]");
        let back: (NodeId, LeaderEpoch, PartitionEpoch, BrokerEpoch) =
            serde_json::from_str("[3,7,-1,1099511627776]").unwrap();
        assert_eq!(back, (NodeId(3), LeaderEpoch(7), PartitionEpoch(-1), BrokerEpoch(1 << 40)));
        let by_id = std::collections::BTreeMap::from([(NodeId(2), 5), (NodeId(10), 6)]);
        assert_eq!(serde_json::to_string(&by_id).unwrap(), r#"{"2":5,"10":6}"#);
        let back: std::collections::BTreeMap<NodeId, i32> = serde_json::from_str(r#"{"2":5,"10":6}"#).unwrap();
        assert_eq!(back, by_id);
    }

    /// Log lines and error messages read as they did with plain integers.
    #[test]
    fn ids_and_epochs_print_as_integers() {
        assert_eq!(format!("{} {:?}", NodeId(1), vec![NodeId(1), NodeId::NONE]), "1 [1, -1]");
        assert_eq!(format!("{} {:?}", LeaderEpoch(4), Some(LeaderEpoch::UNDEFINED)), "4 Some(-1)");
        assert_eq!(format!("{} {:?}", PartitionEpoch(2), BrokerEpoch::NONE), "2 -1");
        assert_eq!(
            (LeaderEpoch(4).next(), PartitionEpoch(2).next(), BrokerEpoch(8).next()),
            (LeaderEpoch(5), PartitionEpoch(3), BrokerEpoch(9))
        );
    }
}
