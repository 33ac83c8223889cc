//! Everything one shard's tasks share: its partitions, the mesh to the other shards,
//! the registry and the config. Lives on one core (`Rc`, never sent).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use futures::channel::oneshot;
use glommio::channels::channel_mesh::Senders;

use crate::config::BrokerConfig;
use crate::coordinator::owner::Metadata;
use crate::coordinator::view::ClusterView;
use crate::model::{limits, ShardId, TopicPartition};
use crate::shard::{
    group_partition, owner_shard, GroupOp, GroupReply, PartitionError, PartitionOp, PartitionReply, Shard,
};

use super::metrics::Metrics;

/// Work sent to the shard that owns it, with the way back. A transaction coordinator
/// request (`Txn`) runs in a task of its own on the owner (`server/txn.rs`).
pub enum ShardMessage {
    Partition { op: PartitionOp, reply: oneshot::Sender<Result<PartitionReply, PartitionError>> },
    Group { op: GroupOp, reply: oneshot::Sender<GroupReply> },
    Txn { op: crate::shard::TxnOp, reply: oneshot::Sender<super::txn::TxnOutcome> },
}

/// Client-error log lines per second per shard before they are summarized.
const client_error_logs_per_second_max: u32 = 10;
/// The longest a group operation waits for its `__consumer_offsets` partition's log to
/// be opened off the data core; then it runs (and finds no coordinator there yet).
/// Partition operations are parked instead, and run as soon as the log is installed.
const partition_open_wait_ms_max: u64 = 5_000;
/// How often completions are polled while an append write is still in flight.
const io_poll_interval_us: u64 = 20;
/// How often completions are polled while only write-behind or drop-behind requests are
/// in flight.
const background_poll_interval_ms: u64 = 1;

pub struct ShardContext {
    pub id: ShardId,
    pub nr_shards: usize,
    pub config: Arc<BrokerConfig>,
    /// Cluster metadata: the published view, and the way to change it.
    pub metadata: Arc<Metadata>,
    /// The view this shard's handlers read, until the generation moves. The `Rc` is on
    /// purpose: handing it out touches only this core's count, never the `Arc`'s, which
    /// every shard shares.
    #[allow(clippy::redundant_allocation)]
    view: RefCell<Rc<Arc<ClusterView>>>,
    pub shard: RefCell<Shard>,
    senders: Senders<ShardMessage>,
    pub metrics: Arc<Metrics>,
    pub cluster_id: String,
    /// Requests being handled on this shard's connections.
    pub in_flight: Cell<usize>,
    /// Set once shutdown began: connections stop reading new requests.
    pub stopping: Cell<bool>,
    /// Work sent to glommio's blocking pool and not answered yet (`run_blocking`).
    blocking_in_flight: Cell<usize>,
    flush_notify: RefCell<Option<oneshot::Sender<()>>>,
    log_start_notify: RefCell<Option<oneshot::Sender<()>>>,
    /// Client-error log lines in the current second, and how many were suppressed.
    client_error_log: Cell<(std::time::Instant, u32, u64)>,
    io_notify: RefCell<Option<oneshot::Sender<()>>>,
    /// Incremental fetch sessions (KIP-227) made on this shard's connections.
    pub fetch_sessions: RefCell<super::fetch_sessions::FetchSessions>,
    /// Replication throttle meters of this shard (`server::throttle`).
    pub replication_throttle: RefCell<super::throttle::ReplicationThrottle>,
    /// Connection and request-byte caps, shared by every shard.
    pub admission: Arc<super::admission::Admission>,
    /// Free space on the data dir: produce is refused while it is short.
    pub disk: Arc<super::disk::DiskSpace>,
    /// The replica fetchers of this shard, by source broker (`replication::start_fetchers`).
    pub fetchers: RefCell<HashMap<crate::model::NodeId, super::replication::FetcherPartitions>>,
    /// The authorizer's settings (the ACLs themselves are in the view).
    pub authorizer: Arc<crate::security::acl::AuthorizerConfig>,
    /// Authorizer log lines in the current second, and how many were suppressed.
    pub authorizer_log: Cell<(std::time::Instant, u32, u64)>,
    /// This context, for tasks it starts (it lives in an `Rc` built with `new_cyclic`).
    me: std::rc::Weak<ShardContext>,
}

impl ShardContext {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: ShardId,
        nr_shards: usize,
        config: Arc<BrokerConfig>,
        metadata: Arc<Metadata>,
        shard: Shard,
        senders: Senders<ShardMessage>,
        metrics: Arc<Metrics>,
        cluster_id: String,
        admission: Arc<super::admission::Admission>,
        disk: Arc<super::disk::DiskSpace>,
        me: std::rc::Weak<ShardContext>,
    ) -> Self {
        let authorizer = Arc::new(config.authorizer().expect("validated at startup"));
        Self {
            id,
            nr_shards,
            authorizer,
            authorizer_log: Cell::new((std::time::Instant::now(), 0, 0)),
            config,
            view: RefCell::new(Rc::new(metadata.view())),
            metadata,
            shard: RefCell::new(shard),
            senders,
            metrics,
            cluster_id,
            in_flight: Cell::new(0),
            stopping: Cell::new(false),
            blocking_in_flight: Cell::new(0),
            flush_notify: RefCell::new(None),
            log_start_notify: RefCell::new(None),
            client_error_log: Cell::new((std::time::Instant::now(), 0, 0)),
            io_notify: RefCell::new(None),
            fetch_sessions: RefCell::new(super::fetch_sessions::FetchSessions::new(id.0)),
            replication_throttle: Default::default(),
            admission,
            disk,
            fetchers: RefCell::new(HashMap::new()),
            me,
        }
    }

    /// The cluster metadata as last published: the view held here, or the new one when
    /// the generation moved. No lock, and no shared write unless it moved.
    #[allow(clippy::redundant_allocation)]
    pub fn view(&self) -> Rc<Arc<ClusterView>> {
        let generation = self.metadata.generation();
        let mut view = self.view.borrow_mut();
        if view.generation() != generation {
            *view = Rc::new(self.metadata.view());
        }
        view.clone()
    }

    /// Run `op` on the partition's owner: here, or across the mesh.
    pub async fn call(&self, op: PartitionOp) -> Result<PartitionReply, PartitionError> {
        let owner = owner_shard(op.tp(), self.nr_shards);
        if owner == self.id {
            if self.shard.borrow_mut().parks(op.tp()) {
                let (reply, rx) = oneshot::channel();
                self.shard.borrow_mut().park(op, reply);
                self.start_queued_opens();
                return rx.await.unwrap_or_else(|_| Err(shard_gone(owner)));
            }
            let result = self.shard.borrow_mut().execute(op);
            self.wakeup();
            return result;
        }
        let (reply, rx) = oneshot::channel();
        if self.senders.send_to(owner.0, ShardMessage::Partition { op, reply }).await.is_err() {
            return Err(shard_gone(owner));
        }
        rx.await.unwrap_or_else(|_| Err(shard_gone(owner)))
    }

    /// Run a group operation on the group's coordinator shard (`shard` when the op names
    /// no group). `None` only if that shard is gone (shutting down).
    /// `None` too when this broker does not coordinate the group (see
    /// `group_unavailable_code`).
    pub async fn call_group(&self, op: GroupOp, shard: Option<ShardId>) -> Option<GroupReply> {
        let owner = match op.group_id() {
            Some(g) if !self.coordinates(g) => return None,
            Some(g) => owner_shard(&group_partition(g), self.nr_shards),
            None => shard.unwrap_or(self.id),
        };
        if owner == self.id {
            if let Some(tp) = op.group_id().map(group_partition) {
                self.opened(&tp).await;
            }
            let reply = self.shard.borrow_mut().execute_group(op);
            self.wakeup();
            return Some(reply);
        }
        let (reply, rx) = oneshot::channel();
        if self.senders.send_to(owner.0, ShardMessage::Group { op, reply }).await.is_err() {
            return None;
        }
        rx.await.ok()
    }

    /// Whether this broker coordinates `group`: it leads the group's partition of
    /// `__consumer_offsets`.
    pub fn coordinates(&self, group: &str) -> bool {
        let tp = group_partition(group);
        let reg = self.view();
        reg.leader_of(&tp.topic, tp.partition) == Some(reg.local_broker_id())
    }

    /// The error for a group request `call_group` could not serve (`reply`: what it
    /// answered instead): COORDINATOR_LOAD_IN_PROGRESS while the group's partition is
    /// being loaded here, NOT_COORDINATOR when another broker coordinates the group (the
    /// client asks FindCoordinator again), else COORDINATOR_NOT_AVAILABLE.
    pub fn group_unavailable_code(&self, group: &str, reply: &Option<GroupReply>) -> i16 {
        if matches!(reply, Some(GroupReply::Loading)) {
            crate::protocol::error_code::COORDINATOR_LOAD_IN_PROGRESS
        } else if self.coordinates(group) {
            crate::protocol::error_code::COORDINATOR_NOT_AVAILABLE
        } else {
            crate::protocol::error_code::NOT_COORDINATOR
        }
    }

    /// Wait while `tp`'s log is being opened off this core (a partition newly hosted
    /// here), at most `partition_open_wait_ms_max`: for group operations, which the
    /// shard cannot park. Never blocks the core.
    pub async fn opened(&self, tp: &TopicPartition) {
        let installed = {
            let mut shard = self.shard.borrow_mut();
            shard.sync_registry();
            let Some(installed) = shard.wait_opened(tp) else { return };
            installed
        };
        self.start_queued_opens();
        let timeout = glommio::timer::sleep(std::time::Duration::from_millis(partition_open_wait_ms_max));
        let _ = futures::future::select(installed, Box::pin(timeout)).await;
    }

    /// Start opening the logs `sync_registry` queued (newly hosted partitions, failed
    /// opens whose backoff is over).
    pub fn start_queued_opens(&self) {
        let opens = self.shard.borrow_mut().take_open_jobs();
        if let Some(ctx) = self.me.upgrade() {
            super::replication::start_opens(&ctx, opens);
        }
    }

    /// The group partition whose log a group message must wait for (see `opened`).
    pub fn opening_for(&self, msg: &ShardMessage) -> Option<TopicPartition> {
        let ShardMessage::Group { op, .. } = msg else { return None };
        let tp = group_partition(op.group_id()?);
        self.shard.borrow_mut().parks(&tp).then_some(tp)
    }

    /// Serve work another shard sent us.
    pub fn serve_remote(&self, msg: ShardMessage) {
        match msg {
            ShardMessage::Partition { op, reply } => {
                if self.shard.borrow_mut().parks(op.tp()) {
                    self.shard.borrow_mut().park(op, reply);
                    self.start_queued_opens();
                    return;
                }
                let result = self.shard.borrow_mut().execute(op);
                self.wakeup();
                let _ = reply.send(result);
            }
            ShardMessage::Group { op, reply } => {
                let result = self.shard.borrow_mut().execute_group(op);
                self.wakeup();
                let _ = reply.send(result);
            }
            ShardMessage::Txn { op, reply } => {
                if let Some(me) = self.rc() {
                    super::txn::serve(me, op, reply);
                }
            }
        }
    }

    /// This context as an `Rc`, for tasks it starts.
    pub fn rc(&self) -> Option<std::rc::Rc<ShardContext>> {
        self.me.upgrade()
    }

    /// Send `msg` to shard `to` over the mesh (Err: that shard is gone).
    pub async fn send_to(&self, to: ShardId, msg: ShardMessage) -> Result<(), ()> {
        self.senders.send_to(to.0, msg).await.map_err(|_| ())
    }

    /// Tell the group-commit loop there may be work.
    /// Whether a log line about a misbehaving client may be written now: at most
    /// `client_error_logs_per_second_max` a second per shard, so a flood of bad
    /// connections cannot flood the log (the counters in /metrics count them all).
    pub fn client_error_log_allowed(&self) -> bool {
        let (start, count, suppressed) = self.client_error_log.get();
        let now = std::time::Instant::now();
        if now.duration_since(start) >= std::time::Duration::from_secs(1) {
            if suppressed > 0 {
                tracing::warn!(shard = self.id.0, suppressed, "client error log lines suppressed in the last second");
            }
            self.client_error_log.set((now, 1, 0));
            return true;
        }
        if count < client_error_logs_per_second_max {
            self.client_error_log.set((start, count + 1, suppressed));
            true
        } else {
            self.client_error_log.set((start, count, suppressed + 1));
            false
        }
    }

    /// Tell the append-write and group-commit loops there may be work.
    pub fn wakeup(&self) {
        if let Some(tx) = self.io_notify.borrow_mut().take() {
            let _ = tx.send(());
        }
        self.flush_wakeup();
    }

    fn flush_wakeup(&self) {
        if let Some(tx) = self.flush_notify.borrow_mut().take() {
            let _ = tx.send(());
        }
        if let Some(tx) = self.log_start_notify.borrow_mut().take() {
            let _ = tx.send(());
        }
    }

    /// Appends through the append ring: submit what produce requests staged (all of a
    /// burst in one go, contiguous appends merged into one writev), reap completions,
    /// release acks. Writes done on the shard (the kernel not throttling) are finished at
    /// submit; while any is in flight in io_uring (its workers: ext4 has no
    /// non-blocking buffered write), poll every `io_poll_interval_us`.
    pub async fn append_io_loop(self: Rc<Self>) {
        loop {
            if !self.shard.borrow().has_io_work() {
                let (tx, rx) = oneshot::channel();
                *self.io_notify.borrow_mut() = Some(tx);
                let _ = rx.await;
                continue;
            }
            let (progress, in_flight) = self.shard.borrow_mut().process_io();
            if progress {
                self.flush_wakeup();
                use std::sync::atomic::Ordering::Relaxed;
                let n = self.shard.borrow().append_write_counts();
                let c = self.metrics.shard(self.id);
                c.appends_written.store(n.appends, Relaxed);
                c.append_writes.store(n.writes, Relaxed);
                c.append_writes_inline.store(n.inline, Relaxed);
                c.write_behind_calls.store(n.write_behind_calls, Relaxed);
                c.drop_behind_calls.store(n.drop_behind_calls, Relaxed);
                c.drop_behind_bytes.store(n.drop_behind_bytes, Relaxed);
            }
            if in_flight {
                glommio::timer::sleep(std::time::Duration::from_micros(io_poll_interval_us)).await;
            } else if self.shard.borrow().has_background_in_flight() {
                // Nothing waits on these: reap them at leisure (or with the next appends).
                glommio::timer::sleep(std::time::Duration::from_millis(background_poll_interval_ms)).await;
            }
        }
    }

    /// Run `f` on glommio's blocking pool, counted until it answers: a stopping shard
    /// waits for this work before it closes its logs and its executor ends (glommio 0.9's
    /// blocking thread panics when its answer finds the executor gone, and the work, a
    /// checkpoint write or an fsync round, would race the close).
    pub async fn run_blocking<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        struct Answered<'a>(&'a Cell<usize>);
        impl Drop for Answered<'_> {
            fn drop(&mut self) {
                self.0.set(self.0.get() - 1);
            }
        }
        self.blocking_in_flight.set(self.blocking_in_flight.get() + 1);
        let _answered = Answered(&self.blocking_in_flight);
        glommio::executor().spawn_blocking(f).await
    }

    /// Blocking-pool work started with `run_blocking` and not answered yet.
    pub fn blocking_in_flight(&self) -> usize {
        self.blocking_in_flight.get()
    }

    /// Group commit: while an fdatasync round runs on the blocking pool, new appends
    /// queue up and share the next round. Acks are released only after their round.
    pub async fn group_commit_loop(self: Rc<Self>) {
        loop {
            if !self.shard.borrow().has_flush_work() {
                let (tx, rx) = oneshot::channel();
                *self.flush_notify.borrow_mut() = Some(tx);
                let _ = rx.await;
                continue;
            }
            let batch = self.shard.borrow_mut().take_flush_batch();
            let started = std::time::Instant::now();
            let test_delay = std::time::Duration::from_millis(self.config.test_fsync_delay_ms);
            // The partitions dealt round-robin over up to `group_commit_sync_jobs_max`
            // jobs that fdatasync at the same time; a partition's files stay in one job,
            // in order (its directory last).
            let jobs = batch.items.len().clamp(1, limits::group_commit_sync_jobs_max);
            let mut dealt: Vec<Vec<_>> = (0..jobs).map(|_| Vec::new()).collect();
            for (i, item) in batch.items.into_iter().enumerate() {
                dealt[i % jobs].push(item);
            }
            let syncs = dealt.into_iter().map(|items| {
                self.run_blocking(move || {
                    let results =
                        items.into_iter().map(|(tp, handle)| (tp, handle.flushed, handle.sync())).collect::<Vec<_>>();
                    // Tests only (`--test-fsync-delay-ms`): a slow disk's fsync, on the
                    // blocking thread, before the round's acks are released.
                    if !test_delay.is_zero() {
                        std::thread::sleep(test_delay);
                    }
                    results
                })
            });
            let results = futures::future::join_all(syncs).await.into_iter().flatten().collect();
            self.metrics.record_fsync(self.id, started.elapsed());
            self.shard.borrow_mut().complete_flush(results);
        }
    }
}

impl ShardContext {
    /// Log start moves (DeleteRecords, a follower taking its leader's log start), in
    /// rounds, one at a time: each round's checkpoints are written and fsynced on the
    /// blocking pool, then applied and answered (`shard/log_start.rs`). One round at a
    /// time keeps each partition's checkpoint writes in order.
    pub async fn log_start_loop(self: Rc<Self>) {
        loop {
            if !self.shard.borrow().has_log_start_moves() {
                let (tx, rx) = oneshot::channel();
                *self.log_start_notify.borrow_mut() = Some(tx);
                let _ = rx.await;
                continue;
            }
            let moves = self.shard.borrow_mut().take_log_start_moves();
            if moves.is_empty() {
                continue;
            }
            let files: Vec<(std::path::PathBuf, crate::model::Offset)> =
                moves.iter().map(|m| (m.dir.clone(), m.offset)).collect();
            let results = self
                .run_blocking(move || {
                    files
                        .iter()
                        .map(|(dir, offset)| crate::log::start_offset::write_log_start_checkpoint(dir, *offset))
                        .collect::<Vec<_>>()
                })
                .await;
            self.shard.borrow_mut().complete_log_start_moves(moves.into_iter().zip(results).collect());
        }
    }
}

/// The partition's owner shard is gone (the broker is shutting down). It names the
/// shard, not the partition: `call` keeps no copy of the op's partition for this path.
fn shard_gone(owner: ShardId) -> PartitionError {
    PartitionError::Log(crate::log::LogError::Offline(format!("owner shard {} is shutting down", owner.0)))
}
