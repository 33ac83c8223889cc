//! Replicas on their owner shard: the role of each hosted partition (leader, follower or
//! neither) as the registry says, the leader's high watermark and ISR bookkeeping
//! (`replication::LeaderState`), acks=all waiters, and the operations a follower's
//! fetcher (a task on this same shard) performs on its log.

use futures::channel::oneshot;

use crate::coordinator::registry::Hosting;
use crate::model::{LeaderEpoch, NodeId, Offset, TopicPartition};
use crate::protocol::error_code;
use crate::replication::{
    AckError, Answers, FollowerLog, FollowerStep, IsrProposal, LeaderState, OutOfRange, RoleError,
};

pub use crate::replication::{IsrOutcome, Role};

use super::{Partition, PartitionError, Shard};

/// What answers an acks=all produce: NONE, or the error code.
pub type AckSender = oneshot::Sender<Result<(), i16>>;

/// The replica machine of a partition on this broker.
pub type Replica = crate::replication::Replica<AckSender>;

/// A follower partition whose fetcher must (re)start: its leader or epoch changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetcherStart {
    pub tp: TopicPartition,
    pub leader: NodeId,
    pub leader_epoch: LeaderEpoch,
}

/// What a fetcher needs to know about its follower log.
pub type ReplicaState = FollowerLog;

pub(super) fn role_error(tp: &TopicPartition, e: RoleError) -> PartitionError {
    match e {
        RoleError::NotLeader => PartitionError::NotLeader(tp.clone()),
        RoleError::FencedLeaderEpoch { request, current } => {
            PartitionError::FencedLeaderEpoch { tp: tp.clone(), request, current }
        }
        RoleError::UnknownLeaderEpoch { request, current } => {
            PartitionError::UnknownLeaderEpoch { tp: tp.clone(), request, current }
        }
    }
}

/// The leader state of `p`, checked against a request's `current_leader_epoch`
/// (`LeaderEpoch::UNDEFINED`: no check) as KIP-320 says.
pub fn leader_of<'a>(
    p: &'a mut Partition,
    tp: &TopicPartition,
    current_leader_epoch: LeaderEpoch,
) -> Result<&'a mut LeaderState, PartitionError> {
    p.replica.leader(current_leader_epoch).map_err(|e| role_error(tp, e))
}

/// What consumers may read up to: the leader's high watermark, or what a follower was
/// told.
pub fn high_watermark(p: &Partition) -> Offset {
    let written = p.log.written_end_offset().0;
    let hw = p.replica.high_watermark(written);
    assert!(hw <= written || p.replica.leader_state().is_none(), "high watermark {hw} above the leader's log end");
    Offset(hw)
}

/// Send the machine's answers to the acks=all produces; `wake`: wake the fetch
/// long-polls too (what they may read moved).
pub fn deliver(p: &mut Partition, answers: Answers<AckSender>, wake: bool) {
    for (w, result) in answers {
        let _ = w.send(result.map_err(|e| match e {
            AckError::NotEnoughReplicasAfterAppend => error_code::NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            AckError::NotLeader => error_code::NOT_LEADER_OR_FOLLOWER,
        }));
    }
    if wake {
        for w in p.data_waiters.drain(..) {
            let _ = w.send(());
        }
    }
}

/// The leader's high watermark (None: not leading), to tell whether an event moved it.
pub fn leader_hw(p: &Partition) -> Option<i64> {
    p.replica.leader_state().map(|l| l.high_watermark())
}

/// Whether the leader's high watermark moved from `before` (or leadership was taken).
pub fn hw_moved(p: &Partition, before: Option<i64>) -> bool {
    match (before, leader_hw(p)) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(b), Some(a)) => a > b,
    }
}

/// After the leader's log grew: recompute the high watermark, release what it covers.
pub fn advance_hw(p: &mut Partition) {
    let answers = p.replica.on_appended(p.log.written_end_offset().0);
    let leading = p.replica.leader_state().is_some();
    deliver(p, answers, leading);
}

/// An acks=all produce ending at `last` waits for the high watermark.
pub fn wait_for_hw(p: &mut Partition, last: Offset, w: AckSender) {
    let answers = p.replica.wait_for_high_watermark(last.0, w, p.log.written_end_offset().0);
    let leading = p.replica.leader_state().is_some();
    deliver(p, answers, leading);
}

/// Roles a shard took since its last summary line: counts, and the first
/// `limits::log_line_partitions_max` partitions by name ("t-0:leader").
#[derive(Default)]
pub struct RolesTaken {
    pub leading: usize,
    pub following: usize,
    pub named: Vec<String>,
}

impl RolesTaken {
    fn note(&mut self, tp: &TopicPartition, leading: bool) {
        if leading {
            self.leading += 1;
        } else {
            self.following += 1;
        }
        if self.named.len() < crate::model::limits::log_line_partitions_max {
            self.named.push(format!("{tp}:{}", if leading { "leader" } else { "follower" }));
        }
    }
}

impl Shard {
    pub fn set_replica_lag_time_max_ms(&mut self, ms: i64) {
        self.replica_lag_time_max_ms = ms;
    }

    /// min.insync.replicas of a topic: its own config, else the dynamic broker config
    /// (this broker's, else the cluster-wide default), else the static default.
    pub(super) fn min_insync_of(&self, meta: &crate::coordinator::registry::TopicMeta) -> usize {
        let key = "min.insync.replicas";
        meta.configs
            .overrides
            .get(key)
            .or_else(|| meta.configs.dynamic_defaults.get(key).map(|(v, _)| v))
            .or_else(|| self.broker_topic_defaults.get(key))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(1)
            .max(1)
    }

    /// Take the newest published view, when its generation moved (one atomic load when
    /// it did not).
    pub(super) fn refresh_view(&mut self) {
        if self.metadata.generation() != self.view.generation() {
            self.view = self.metadata.view();
        }
    }

    /// Act on metadata changes (a cheap atomic load when there are none): queue the logs
    /// of newly hosted partitions to be opened off the core (`take_open_jobs`), set each
    /// open one's role (leader, follower, offline), apply config changes, and remove
    /// partitions whose topic is gone.
    pub fn sync_registry(&mut self) {
        self.log_roles_taken();
        self.refresh_view();
        if self.view.generation() == self.seen_generation {
            return;
        }
        self.seen_generation = self.view.generation();
        let now_ms = crate::server::now_ms();
        let (gone, hosted) = {
            let reg = self.view.clone();
            self.producer_id_bound = reg.producer_id_bound();
            // Partitions of deleted topics, and replicas a reassignment moved off this
            // broker (Kafka's StopReplica with deletion).
            let gone: Vec<(TopicPartition, Hosting)> = self
                .partitions
                .keys()
                .filter_map(|tp| {
                    let hosting = reg.hosting(&tp.topic, tp.partition);
                    (reg.has_metadata() && matches!(hosting, Hosting::Unknown | Hosting::Elsewhere))
                        .then(|| (tp.clone(), hosting))
                })
                .collect();
            let mut hosted = Vec::new();
            for (name, meta) in reg.topics() {
                for p in 0..meta.partitions {
                    let tp = TopicPartition::new(name.as_str(), p);
                    if self.owns(&tp) && reg.hosting(name, p) != Hosting::Elsewhere {
                        hosted.push((tp, self.log_config_of(meta), self.min_insync_of(meta)));
                    }
                }
            }
            (gone, hosted)
        };
        // A failed open of a partition no longer hosted here is not retried.
        let reg = self.view.clone();
        self.open_failures.retain(|tp, _| {
            reg.hosting(&tp.topic, tp.partition) != Hosting::Elsewhere
                && reg.get(&tp.topic).is_some_and(|m| tp.partition >= 0 && tp.partition < m.partitions)
        });
        for (tp, hosting) in gone {
            if hosting == Hosting::Elsewhere {
                tracing::info!(shard = self.id.0, partition = %tp, "replica reassigned away: removing it");
            } else {
                tracing::info!(shard = self.id.0, partition = %tp, "topic deleted: removing the partition");
            }
            self.leave_partition(&tp);
            if let Err(e) = self.execute(super::PartitionOp::DeletePartition { tp: tp.clone() }) {
                tracing::error!(partition = %tp, error = %e, "cannot remove the partition");
            }
        }
        let producer_id_bound = self.producer_id_bound;
        for (tp, config, min_insync) in hosted {
            if !self.partitions.contains_key(&tp) {
                // Newly hosted: its log is created or recovered off the data core (a
                // directory fsync at least), then installed with its role.
                let backing_off = self.open_failures.get(&tp).is_some_and(|f| !f.due);
                if !self.closing && !self.opening.contains_key(&tp) && !backing_off {
                    self.opening.insert(tp.clone(), Default::default());
                    let leader_epoch = self.leader_epoch_here(&tp);
                    let dir = self.data_dir.join(tp.dir_name());
                    let high_watermark = self.checkpointed_hw(&tp);
                    self.open_queue.push(super::OpenJob { tp, dir, config, min_insync, leader_epoch, high_watermark });
                }
                continue;
            }
            match self.partition_mut(&tp, now_ms) {
                Ok(p) => {
                    p.log.set_config(config);
                    p.log.set_producer_id_bound(producer_id_bound);
                    p.replica.set_min_insync(min_insync);
                }
                Err(e) => {
                    tracing::error!(partition = %tp, error = %e, "cannot open a hosted partition");
                    continue;
                }
            }
            self.refresh_role(&tp, now_ms);
        }
        self.log_roles_taken();
    }

    /// Before a hosted partition is removed: produces waiting for acks=all fail with
    /// NOT_LEADER_OR_FOLLOWER (their client retries on the new leader), and a group or
    /// transaction partition it led is unloaded.
    fn leave_partition(&mut self, tp: &TopicPartition) {
        let Some(p) = self.partitions.get_mut(tp) else { return };
        let leading = p.replica.leader_state().is_some();
        let answers = p.replica.fail_waiters();
        deliver(p, answers, true);
        if leading && tp.topic == crate::group::OFFSETS_TOPIC {
            self.unload_group_partition(tp);
        } else if leading && tp.topic == crate::txn::TXN_TOPIC {
            self.unload_txn_partition(tp);
        }
    }

    /// One INFO line for the roles taken since the last one (a start takes one per
    /// partition: 50 for `__consumer_offsets` alone), naming the first few partitions;
    /// each partition's own line is DEBUG.
    pub(super) fn log_roles_taken(&mut self) {
        let taken = std::mem::take(&mut self.roles_taken);
        if taken.leading == 0 && taken.following == 0 {
            return;
        }
        tracing::info!(
            shard = self.id.0, leading = taken.leading, following = taken.following,
            partitions = %taken.named.join(" "),
            more = (taken.leading + taken.following).saturating_sub(taken.named.len()),
            "partition roles taken"
        );
    }

    /// The leader epoch of `tp` if the registry says this broker leads it now.
    pub(super) fn leader_epoch_here(&self, tp: &TopicPartition) -> Option<LeaderEpoch> {
        let reg = &self.view;
        reg.partition(&tp.topic, tp.partition)
            .filter(|(replicas, s)| reg.may_take_roles(replicas.len()) && s.leader == self.local_broker)
            .map(|(_, s)| s.leader_epoch)
    }

    /// Set `tp`'s role from the registry's partition state. For a `__consumer_offsets`
    /// partition, taking the leadership loads its groups and losing it drops them; for a
    /// `__transaction_state` partition, its transactional ids.
    pub(super) fn refresh_role(&mut self, tp: &TopicPartition, now_ms: i64) {
        let was_leading = self.partitions.get(tp).is_some_and(|p| p.replica.leader_state().is_some());
        self.set_role(tp, now_ms);
        let offsets = tp.topic == crate::group::OFFSETS_TOPIC;
        if !offsets && tp.topic != crate::txn::TXN_TOPIC {
            return;
        }
        let leading = self.partitions.get(tp).is_some_and(|p| p.replica.leader_state().is_some());
        match (was_leading, leading, offsets) {
            (false, true, true) => self.load_group_partition(tp, now_ms),
            (true, false, true) => self.unload_group_partition(tp),
            (false, true, false) => self.load_txn_partition(tp),
            (true, false, false) => self.unload_txn_partition(tp),
            _ => {}
        }
    }

    fn set_role(&mut self, tp: &TopicPartition, now_ms: i64) {
        let state = {
            let reg = &self.view;
            reg.partition(&tp.topic, tp.partition)
                .filter(|(replicas, _)| reg.may_take_roles(replicas.len()))
                .map(|(replicas, s)| (replicas.to_vec(), s.clone()))
        };
        let (me, lag_ms) = (self.local_broker, self.replica_lag_time_max_ms);
        let Some(p) = self.partitions.get_mut(tp) else { return };
        let (written, log_start) = (p.log.written_end_offset().0, p.log.log_start_offset().0);
        let before = leader_hw(p);
        let change = p.replica.on_partition_state(
            me,
            state.as_ref().map(|(replicas, s)| (replicas.as_slice(), s)),
            written,
            log_start,
            now_ms,
            lag_ms,
        );
        if let Some(epoch) = change.record_leader_epoch {
            if let Err(e) = p.log.assign_leader_epoch(epoch.0) {
                tracing::error!(partition = %tp, error = %e, "cannot record the new leader epoch");
            }
        }
        let wake = hw_moved(p, before) || (change.took_role && p.replica.leader_state().is_some());
        deliver(p, change.answers, wake);
        if let Some((leader, leader_epoch)) = change.start_fetcher {
            self.fetcher_starts.push(FetcherStart { tp: tp.clone(), leader, leader_epoch });
        }
        if change.took_role {
            match p.replica.role() {
                Role::Leader(l) => {
                    tracing::debug!(partition = %tp, leader_epoch = %l.leader_epoch(), isr = ?l.isr(), "leading");
                    self.roles_taken.note(tp, true);
                }
                Role::Follower(f) => {
                    tracing::debug!(partition = %tp, leader = %f.leader, leader_epoch = %f.leader_epoch, "following");
                    self.roles_taken.note(tp, false);
                }
                Role::None => {}
            }
        }
    }

    /// Follower partitions whose fetcher must start (the runtime spawns them).
    pub fn take_fetcher_starts(&mut self) -> Vec<FetcherStart> {
        std::mem::take(&mut self.fetcher_starts)
    }

    /// Whether `tp` is still followed from `leader` in `leader_epoch` (a fetcher stops
    /// when not).
    pub fn follows(&self, tp: &TopicPartition, leader: NodeId, leader_epoch: LeaderEpoch) -> bool {
        self.partitions.get(tp).is_some_and(|p| p.replica.follows(leader, leader_epoch))
    }

    pub fn replica_state(&self, tp: &TopicPartition) -> Option<ReplicaState> {
        let p = self.partitions.get(tp)?;
        Some(ReplicaState {
            log_end_offset: p.log.log_end_offset().0,
            high_watermark: high_watermark(p).0,
            log_start_offset: p.log.log_start_offset().0,
            latest_epoch: p.log.latest_epoch().map(LeaderEpoch),
        })
    }

    /// This log's own end offset for `epoch` (KIP-279 truncation).
    pub fn local_epoch_end(&self, tp: &TopicPartition, epoch: LeaderEpoch) -> i64 {
        self.partitions.get(tp).map(|p| p.log.end_offset_for_epoch(epoch.0).1).unwrap_or(-1)
    }

    /// `tp` as this shard follows it from `leader` in `leader_epoch`; NOT_LEADER when it
    /// does not (any more): the fetcher's answer is stale.
    fn followed(
        &mut self,
        tp: &TopicPartition,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
    ) -> Result<&mut Partition, PartitionError> {
        if !self.follows(tp, leader, leader_epoch) {
            return Err(PartitionError::NotLeader(tp.clone()));
        }
        Ok(self.partitions.get_mut(tp).expect("follows"))
    }

    /// What the fetcher does next for `tp` (followed from `leader` in `leader_epoch`),
    /// with the log position it acts on; None when it is not followed so any more. A
    /// partition with no leader epochs truncates to its high watermark here and fetches.
    pub fn follower_step(
        &mut self,
        tp: &TopicPartition,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
        now_ms: i64,
    ) -> Option<(FollowerStep, ReplicaState)> {
        let log = self.replica_state(tp)?;
        let step = self.partitions.get_mut(tp)?.replica.follower_mut(leader, leader_epoch)?.step(now_ms, &log);
        if let FollowerStep::TruncateTo(offset) = step {
            if let Err(e) = self.replica_truncate(tp, leader, leader_epoch, offset, true) {
                self.follower_failed(tp, leader, leader_epoch, now_ms, e.to_string());
                return Some((FollowerStep::Wait, log));
            }
            return Some((FollowerStep::Fetch, self.replica_state(tp)?));
        }
        Some((step, log))
    }

    /// The leader's OffsetForLeaderEpoch answer (epoch, end offset) for our `asked`
    /// latest epoch: truncate where the replica machine says (KIP-101, KIP-279).
    pub fn follower_epoch_answer(
        &mut self,
        tp: &TopicPartition,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
        asked: LeaderEpoch,
        answer: (LeaderEpoch, i64),
    ) -> Result<(), PartitionError> {
        let log = self.replica_state(tp).ok_or_else(|| PartitionError::NotLeader(tp.clone()))?;
        let p = self.followed(tp, leader, leader_epoch)?;
        let f = p.replica.follower_mut(leader, leader_epoch).expect("followed");
        let truncation = f.on_epoch_answer(asked, answer, &log, |e| p.log.end_offset_for_epoch(e.0).1);
        self.replica_truncate(tp, leader, leader_epoch, truncation.offset, truncation.done)
    }

    /// A follower truncates to `offset` (by leader epoch, before fetching from a new
    /// leader); `done`: it may fetch after this. Refused (`WritesInFlight`; the fetcher
    /// retries after its backoff) while appends made as leader are still being written.
    pub fn replica_truncate(
        &mut self,
        tp: &TopicPartition,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
        offset: i64,
        done: bool,
    ) -> Result<(), PartitionError> {
        let p = self.followed(tp, leader, leader_epoch)?;
        // Appends made as leader still out in io_uring: cut once they are in the file.
        if p.log.has_pending_writes() {
            return Err(PartitionError::WritesInFlight(tp.clone()));
        }
        if offset < p.log.log_end_offset().0 {
            tracing::info!(partition = %tp, from = p.log.log_end_offset().0, to = offset, "truncating by leader epoch");
        }
        // Always: even with no record to drop, epochs starting at the cut must go.
        let hw = high_watermark(p);
        p.log.truncate_to(Offset(offset), hw)?;
        drop_truncated_waiters(p, offset);
        p.replica.on_truncated(offset);
        p.replica.follower_mut(leader, leader_epoch).expect("followed").on_truncated(done);
        Ok(())
    }

    /// An error on a followed partition alone: it truncates again after the fetch
    /// backoff. Returns whether the error is new (worth a log line).
    pub fn follower_failed(
        &mut self,
        tp: &TopicPartition,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
        now_ms: i64,
        error: String,
    ) -> bool {
        let Some(f) = self.partitions.get_mut(tp).and_then(|p| p.replica.follower_mut(leader, leader_epoch)) else {
            return false;
        };
        f.on_error(now_ms, crate::replication::REPLICA_FETCH_BACKOFF_MS, error)
    }

    /// The follower's fetch offset was out of the leader's range and the leader's log
    /// starts at `leader_log_start`. A follower whose log ends below it (retention on the
    /// leader removed what it would fetch next) drops its log and starts over, empty,
    /// there (Kafka's truncateFullyAndStartAt), then fetches from there; otherwise it must
    /// truncate by epoch again (`OutOfRange::TruncateAgain`, nothing done here).
    pub fn follower_out_of_range(
        &mut self,
        tp: &TopicPartition,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
        leader_log_start: i64,
    ) -> Result<OutOfRange, PartitionError> {
        let log = self.replica_state(tp).ok_or_else(|| PartitionError::NotLeader(tp.clone()))?;
        let p = self.followed(tp, leader, leader_epoch)?;
        let decision =
            p.replica.follower_mut(leader, leader_epoch).expect("followed").on_out_of_range(leader_log_start, &log);
        if let OutOfRange::StartOver(offset) = decision {
            if p.log.has_pending_writes() {
                return Err(PartitionError::WritesInFlight(tp.clone()));
            }
            tracing::warn!(partition = %tp, log_end = log.log_end_offset, leader_log_start = offset,
                "log ends below the leader's log start: starting over at the leader's log start");
            p.log.truncate_fully_and_start_at(Offset(offset))?;
            drop_truncated_waiters(p, 0); // every record went
            p.replica.on_started_over(offset);
        }
        Ok(decision)
    }

    /// A follower appends what it fetched (offsets as the leader assigned them) and learns
    /// the leader's high watermark. Returns the new log end offset.
    pub fn replica_append(
        &mut self,
        tp: &TopicPartition,
        leader: NodeId,
        leader_epoch: LeaderEpoch,
        records: &[u8],
        leader_hw: i64,
        now_ms: i64,
    ) -> Result<i64, PartitionError> {
        let p = self.followed(tp, leader, leader_epoch)?;
        if !records.is_empty() {
            p.log.append_replicated(records, now_ms)?;
        }
        let leo = p.log.log_end_offset().0;
        p.replica.on_fetched(leader_hw, leo);
        p.replica.follower_mut(leader, leader_epoch).expect("followed").on_fetched();
        Ok(leo)
    }

    /// ISR changes due on the partitions this shard leads (sent to the coordinator).
    pub fn isr_proposals(&mut self, now_ms: i64) -> Vec<(TopicPartition, IsrProposal)> {
        let mut out = Vec::new();
        for (tp, p) in self.partitions.iter_mut() {
            if let Some(proposal) = p.replica.isr_change(now_ms) {
                out.push((tp.clone(), proposal));
            }
        }
        out
    }

    /// The coordinator's answer to an ISR change: the committed ISR, a refusal (it
    /// answered with an error: the proposal certainly did not commit), or no answer (it
    /// may have committed: the proposed members keep counting for the HW).
    pub fn isr_result(&mut self, tp: &TopicPartition, proposal: &IsrProposal, result: IsrOutcome) {
        let Some(p) = self.partitions.get_mut(tp) else { return };
        if let IsrOutcome::Committed(isr, _) = &result {
            if p.replica.leader_state().is_some() {
                tracing::info!(partition = %tp, isr = ?isr, "ISR committed");
            }
        }
        let before = leader_hw(p);
        let answers = p.replica.on_isr_result(proposal, result, p.log.written_end_offset().0);
        let wake = hw_moved(p, before);
        deliver(p, answers, wake);
    }
}

/// Kafka's `replication-offset-checkpoint` file, one per shard here (a shard owns its
/// partitions; several files are merged at start, so `--cores` may change between
/// runs): version 0, a count, then `topic partition high_watermark` lines.
pub const HW_CHECKPOINT_PREFIX: &str = "replication-offset-checkpoint";

pub fn encode_hw_checkpoint(entries: &[(TopicPartition, i64)]) -> String {
    let mut out = format!("0\n{}\n", entries.len());
    for (tp, hw) in entries {
        out.push_str(&format!("{} {} {}\n", tp.topic, tp.partition, hw));
    }
    out
}

/// Read every checkpoint file in `data_dir` (unreadable lines are skipped with a
/// warning: a lost high watermark only delays consumers until followers report).
pub fn load_hw_checkpoints(data_dir: &std::path::Path) -> std::collections::HashMap<TopicPartition, i64> {
    let mut out = std::collections::HashMap::new();
    let Ok(entries) = std::fs::read_dir(data_dir) else { return out };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with(HW_CHECKPOINT_PREFIX) || name.ends_with(".tmp") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
        let mut lines = text.lines();
        if lines.next() != Some("0") {
            tracing::warn!(file = name, "unknown high-watermark checkpoint version: ignored");
            continue;
        }
        let _count = lines.next();
        for line in lines {
            let mut parts = line.rsplitn(3, ' ');
            let (Some(hw), Some(p), Some(topic)) = (parts.next(), parts.next(), parts.next()) else { continue };
            if let (Ok(hw), Ok(p)) = (hw.parse::<i64>(), p.parse::<i32>()) {
                let e = out.entry(TopicPartition::new(topic, p)).or_insert(hw);
                *e = (*e).max(hw);
            }
        }
    }
    out
}

/// Acks that wait for an fsync of records a truncation removed (their last offset at
/// or past `cut`) are dropped unanswered, which answers their produce
/// NOT_LEADER_OR_FOLLOWER: left waiting, the first round after the new leader's records
/// filled the same offsets released them as synced (a demoted leader under `--fsync
/// always` acked records it had just thrown away). Waiters below the cut, and those
/// for a flush alone (offset -1), stay.
fn drop_truncated_waiters(p: &mut Partition, cut: i64) {
    p.durable_waiters.retain(|(offset, _)| offset.0 < cut);
}

impl Shard {
    /// The high watermarks to checkpoint, when any changed since the last call: the
    /// file to write and its contents (the caller writes it off the data core). `None`
    /// once the logs were taken for close: the partitions are gone from the shard then,
    /// and an empty checkpoint would erase every high watermark the file holds.
    pub fn hw_checkpoint_due(&mut self) -> Option<(std::path::PathBuf, String)> {
        if self.closing {
            return None;
        }
        let mut entries: Vec<(TopicPartition, i64)> =
            self.partitions.iter().map(|(tp, p)| (tp.clone(), high_watermark(p).0)).collect();
        entries.sort();
        if entries == self.hw_checkpointed {
            return None;
        }
        let text = encode_hw_checkpoint(&entries);
        self.hw_checkpointed = entries;
        Some((self.data_dir.join(format!("{HW_CHECKPOINT_PREFIX}.shard-{}", self.id.0)), text))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::config::TopicConfig;
    use crate::coordinator::controller::Endpoint;
    use crate::coordinator::owner::Metadata;
    use crate::coordinator::registry::{LocalBroker, Registry};
    use crate::coordinator::store::LocalStore;
    use crate::model::ShardId;

    const TOPIC: &str = "replicated";
    const PARTITIONS: i32 = 6;

    fn broker(id: i32) -> LocalBroker {
        LocalBroker { id: NodeId(id), endpoint: Endpoint::new("127.0.0.1", 9090 + id as u16), rack: None, shards: 1 }
    }

    /// Broker 1 runs the coordinator with brokers 2 and 3 registered, and `TOPIC` has
    /// three replicas per partition.
    fn coordinator(dir: &Path) -> Registry {
        let mut r = Registry::open(Box::new(LocalStore::open(dir).unwrap()), broker(1), 1_000).unwrap();
        for id in [2, 3] {
            r.register_remote(broker(id), uuid::Uuid::new_v4(), 1_000).unwrap();
        }
        r.create_replicated(TOPIC, PARTITIONS, 3, TopicConfig::default()).unwrap();
        r
    }

    /// Broker 2 as a restart leaves it: a mirror registry read back from the snapshot
    /// its previous incarnation cached, not registered with the coordinator yet; one
    /// shard on it, its logs opened.
    fn restarted_broker_2(coordinator: &Registry, cache: &Path, data: &Path) -> (Arc<Metadata>, Shard) {
        let json = coordinator.view().snapshot_json().unwrap().1;
        Registry::mirror(broker(2), Some(cache)).apply_snapshot(&json).unwrap();
        let metadata = Metadata::start(Registry::mirror(broker(2), Some(cache))).unwrap();
        let mut shard = Shard::new(
            ShardId(0),
            1,
            data.to_path_buf(),
            metadata.clone(),
            Default::default(),
            crate::group::GroupConfig::default(),
        );
        shard.sync_registry();
        let jobs = shard.take_open_jobs();
        assert_eq!(jobs.len(), PARTITIONS as usize, "broker 2 hosts a replica of every partition");
        shard.install_opened_later(super::super::open_logs(jobs, 1_000), 1_000);
        (metadata, shard)
    }

    fn tps() -> impl Iterator<Item = TopicPartition> {
        (0..PARTITIONS).map(|p| TopicPartition::new(TOPIC, p))
    }

    /// A restarted broker takes no role in a replicated partition from its cached
    /// snapshot (which may name it leader of an epoch whose records it lost in an unclean
    /// stop) until its coordinator link has registered it: `refresh_role` and
    /// `leader_epoch_here` ask `ClusterView::may_take_roles`.
    #[test]
    fn a_restarted_broker_takes_replicated_roles_only_once_registered() {
        let (store, cache, data) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let coordinator = coordinator(store.path());
        let (metadata, mut shard) = restarted_broker_2(&coordinator, cache.path(), data.path());
        let view = metadata.view();
        let leading: Vec<TopicPartition> =
            tps().filter(|tp| view.leader_of(&tp.topic, tp.partition) == Some(NodeId(2))).collect();
        assert!(!leading.is_empty() && leading.len() < PARTITIONS as usize, "broker 2 leads some, follows others");
        for tp in tps() {
            assert!(matches!(shard.partitions[&tp].replica.role(), Role::None), "{tp}: a role before registering");
            assert_eq!(shard.leader_epoch_here(&tp), None, "{tp}");
        }
        assert!(shard.take_fetcher_starts().is_empty(), "no fetcher before registering");

        metadata.write_blocking(|r| r.set_registered());
        shard.sync_registry();
        for tp in tps() {
            let (leader, epoch) = {
                let (_, s) = view.partition(&tp.topic, tp.partition).unwrap();
                (s.leader, s.leader_epoch)
            };
            if leading.contains(&tp) {
                assert!(
                    matches!(shard.partitions[&tp].replica.role(), Role::Leader(l) if l.leader_epoch() == epoch),
                    "{tp}"
                );
                assert_eq!(shard.leader_epoch_here(&tp), Some(epoch));
            } else {
                assert!(shard.follows(&tp, leader, epoch), "{tp} follows {leader} in epoch {epoch}");
            }
        }
        assert_eq!(shard.take_fetcher_starts().len(), PARTITIONS as usize - leading.len());
    }

    /// Broker 2, restarted and registered (`restarted_broker_2`, in `dirs`: store, cache,
    /// data), with a partition it follows: (metadata, shard, partition, leader, epoch).
    fn registered_follower(
        dirs: &[tempfile::TempDir; 3],
    ) -> (Arc<Metadata>, Shard, TopicPartition, NodeId, LeaderEpoch) {
        let coordinator = coordinator(dirs[0].path());
        let (metadata, mut shard) = restarted_broker_2(&coordinator, dirs[1].path(), dirs[2].path());
        metadata.write_blocking(|r| r.set_registered());
        shard.sync_registry();
        let view = metadata.view();
        let (tp, leader, epoch) = tps()
            .find_map(|tp| {
                let (_, s) = view.partition(&tp.topic, tp.partition)?;
                (s.leader != NodeId(2)).then(|| (tp.clone(), s.leader, s.leader_epoch))
            })
            .expect("broker 2 follows a partition");
        (metadata, shard, tp, leader, epoch)
    }

    /// A follower's truncation at its log end still cuts the epoch cache there (an epoch
    /// this broker recorded as leader without appending): `replica_truncate` calls
    /// `PartitionLog::truncate_to` even when no record goes.
    #[test]
    fn a_follower_truncation_at_its_log_end_cuts_the_epoch_started_there() {
        let dirs = [(); 3].map(|_| tempfile::tempdir().unwrap());
        let (_metadata, mut shard, tp, leader, epoch) = registered_follower(&dirs);
        assert!(shard.follows(&tp, leader, epoch));
        // As if this broker had led an older epoch here without appending.
        let log = &mut shard.partitions.get_mut(&tp).unwrap().log;
        log.assign_leader_epoch(epoch.0).unwrap();
        assert_eq!(log.latest_epoch(), Some(epoch.0));
        assert_eq!(shard.local_epoch_end(&tp, epoch), 0);

        shard.replica_truncate(&tp, leader, epoch, 0, true).unwrap();
        let log = &shard.partitions[&tp].log;
        assert_eq!(log.log_end_offset(), Offset(0));
        assert_eq!(log.latest_epoch(), None, "the epoch with no record behind it is cut");
        let saved = crate::log::leader_epoch::LeaderEpochCache::load(log.dir()).unwrap();
        assert!(saved.entries().is_empty(), "and its checkpoint: {:?}", saved.entries());
        assert!(matches!(
            shard.replica_truncate(&tp, leader, epoch.next(), 0, true),
            Err(PartitionError::NotLeader(_))
        ));
    }

    /// KIP-279 with a second round, through the shard and the real log: the follower
    /// holds epochs 0, 1 and 3 (offsets 0, 1, 2); its leader holds epoch 0 up to 1, then
    /// epoch 2 from 1 to 3. Asked for epoch 3, the leader answers epoch 2 ending at 3;
    /// the follower cuts where its own epochs up to 2 end (2), asks again for its new
    /// latest, 1, hears epoch 0 ending at 1, and cuts there: its epoch-1 record was never
    /// the leader's. One round alone would keep it, diverged from the leader at offset 1.
    #[test]
    fn a_follower_asks_again_until_its_log_is_a_prefix_of_the_leaders() {
        let dirs = [(); 3].map(|_| tempfile::tempdir().unwrap());
        let (_metadata, mut shard, tp, leader, epoch) = registered_follower(&dirs);
        let log = &mut shard.partitions.get_mut(&tp).unwrap().log;
        for e in [0, 1, 3] {
            log.append_with_leader_epoch(&mut batch(b"x").to_vec(), e, 1_000).unwrap();
        }
        let step = |shard: &mut Shard| shard.follower_step(&tp, leader, epoch, 1_000).map(|(s, _)| s);
        assert_eq!(step(&mut shard), Some(FollowerStep::AskEpoch { latest_epoch: LeaderEpoch(3) }));
        shard.follower_epoch_answer(&tp, leader, epoch, LeaderEpoch(3), (LeaderEpoch(2), 3)).unwrap();
        assert_eq!(shard.partitions[&tp].log.log_end_offset(), Offset(2));
        assert_eq!(step(&mut shard), Some(FollowerStep::AskEpoch { latest_epoch: LeaderEpoch(1) }), "asks again");
        shard.follower_epoch_answer(&tp, leader, epoch, LeaderEpoch(1), (LeaderEpoch(0), 1)).unwrap();
        assert_eq!(shard.partitions[&tp].log.log_end_offset(), Offset(1));
        assert_eq!(shard.partitions[&tp].log.latest_epoch(), Some(0));
        // A last round confirms (the answer was older than asked and cut something;
        // Kafka stops a round earlier when it holds the epoch answered): nothing more goes.
        assert_eq!(step(&mut shard), Some(FollowerStep::AskEpoch { latest_epoch: LeaderEpoch(0) }));
        shard.follower_epoch_answer(&tp, leader, epoch, LeaderEpoch(0), (LeaderEpoch(0), 1)).unwrap();
        assert_eq!(shard.partitions[&tp].log.log_end_offset(), Offset(1));
        assert_eq!(step(&mut shard), Some(FollowerStep::Fetch));
    }

    /// Broker 2 restarted and registered (in `dirs`: store, cache, data), and a partition
    /// it leads: (coordinator, metadata, shard, partition).
    fn broker_2_leading(dirs: &[tempfile::TempDir; 3]) -> (Registry, Arc<Metadata>, Shard, TopicPartition) {
        let coordinator = coordinator(dirs[0].path());
        let (metadata, mut shard) = restarted_broker_2(&coordinator, dirs[1].path(), dirs[2].path());
        metadata.write_blocking(|r| r.set_registered());
        shard.sync_registry();
        let view = metadata.view();
        let tp = tps().find(|tp| view.leader_of(&tp.topic, tp.partition) == Some(NodeId(2))).expect("broker 2 leads");
        (coordinator, metadata, shard, tp)
    }

    /// Broker 2 shuts down and comes back (a new incarnation): it follows `tp` now.
    /// Returns the leader and epoch it follows.
    fn demote_broker_2(
        coordinator: &mut Registry,
        metadata: &Metadata,
        shard: &mut Shard,
        tp: &TopicPartition,
    ) -> (NodeId, LeaderEpoch) {
        coordinator.unregister_remote(NodeId(2)).unwrap();
        coordinator.register_remote(broker(2), uuid::Uuid::new_v4(), 2_000).unwrap();
        let json = coordinator.view().snapshot_json().unwrap().1;
        metadata.write_blocking(move |r| r.apply_snapshot(&json)).unwrap();
        shard.sync_registry();
        let (leader, epoch) = {
            let view = metadata.view();
            let (_, s) = view.partition(&tp.topic, tp.partition).unwrap();
            (s.leader, s.leader_epoch)
        };
        assert_ne!(leader, NodeId(2));
        assert!(shard.follows(tp, leader, epoch), "{tp} follows {leader} in epoch {epoch}");
        (leader, epoch)
    }

    /// A demoted leader's ack waiting for an fsync (`--fsync always`, acks=1) must not be
    /// released once its record is truncated away: the first round after the new
    /// leader's record filled the same offset released it as synced (found by reading
    /// `complete_flush`; `drop_truncated_waiters` drops it, answered NOT_LEADER).
    #[test]
    fn a_truncated_record_is_never_acked_by_a_round_over_the_new_leaders() {
        let dirs = [(); 3].map(|_| tempfile::tempdir().unwrap());
        let (mut coordinator, metadata, mut shard, tp) = broker_2_leading(&dirs);
        let mut ack = durable_ack(&mut shard, &tp, b"mine");
        // Broker 2 shuts down and comes back before a round ran.
        let (leader, epoch) = demote_broker_2(&mut coordinator, &metadata, &mut shard, &tp);
        // The new leader never had the record: cut, and its own record fills offset 0.
        shard.replica_truncate(&tp, leader, epoch, 0, true).unwrap();
        shard.replica_append(&tp, leader, epoch, &batch(b"theirs"), 0, 2_000).unwrap();
        assert_eq!(shard.partitions[&tp].log.log_end_offset(), Offset(1));
        run_flush_round(&mut shard);
        assert!(
            matches!(ack.try_recv(), Err(oneshot::Canceled)),
            "the truncated record's ack is dropped, not answered as synced"
        );
    }

    /// A demoted leader's follower truncates only once its appends are in the file: a
    /// truncation with an io_uring write still out panicked the shard (the log's
    /// assertion). Now it is refused (the fetcher backs off and truncates again), and
    /// once the write completes it goes through.
    #[test]
    fn a_truncation_waits_for_the_demoted_leaders_writes() {
        let dirs = [(); 3].map(|_| tempfile::tempdir().unwrap());
        let (mut coordinator, metadata, mut shard, tp) = broker_2_leading(&dirs);
        let Ok(ring) = super::super::AppendRing::new() else { return }; // no io_uring here
        shard.set_append_ring(ring);
        let written = match produce(&mut shard, &tp, b"mine", false) {
            super::super::PartitionReply::Produced { written: Some(w), .. } => w,
            _ => panic!("not a ring write"),
        };
        let (leader, epoch) = demote_broker_2(&mut coordinator, &metadata, &mut shard, &tp);
        assert!(
            matches!(shard.replica_truncate(&tp, leader, epoch, 0, true), Err(PartitionError::WritesInFlight(_))),
            "truncated under a write still out"
        );
        assert_eq!(shard.partitions[&tp].log.log_end_offset(), Offset(1), "nothing cut yet");
        drain_ring(&mut shard);
        assert!(matches!(futures::executor::block_on(written), Ok(Ok(()))), "the write completed");
        shard.replica_truncate(&tp, leader, epoch, 0, true).unwrap();
        assert_eq!(shard.partitions[&tp].log.log_end_offset(), Offset(0), "cut once written");
    }

    /// A housekeeping tick while the logs close (a slow close: a large dirty page cache)
    /// must not checkpoint the emptied shard: that erased every high watermark on disk.
    #[test]
    fn no_hw_checkpoint_once_the_logs_are_taken_for_close() {
        let (store, cache, data) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let coordinator = coordinator(store.path());
        let (_metadata, mut shard) = restarted_broker_2(&coordinator, cache.path(), data.path());
        let (_, text) = shard.hw_checkpoint_due().expect("the first checkpoint");
        assert!(text.starts_with(&format!("0\n{PARTITIONS}\n")), "{text}");
        let logs = shard.take_logs_for_close();
        assert_eq!(logs.len(), PARTITIONS as usize);
        assert_eq!(shard.hw_checkpoint_due(), None, "a checkpoint of the emptied shard");
    }

    /// One record batch, as a producer sends it.
    fn batch(value: &'static [u8]) -> bytes::Bytes {
        use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
        let record = crate::protocol::plain_record(
            0,
            -1,
            1_000,
            None,
            Some(bytes::Bytes::from_static(value)),
            Default::default(),
        );
        let mut buf = bytes::BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &[record],
            &RecordEncodeOptions { version: 2, compression: Compression::None },
        )
        .unwrap();
        buf.freeze()
    }

    /// One record produced to `tp` with acks=1, `durable` asking for an fsync wait.
    fn produce(
        shard: &mut Shard,
        tp: &TopicPartition,
        value: &'static [u8],
        durable: bool,
    ) -> super::super::PartitionReply {
        let op = super::super::PartitionOp::Produce {
            tp: tp.clone(),
            records: batch(value),
            now_ms: 1_000,
            durable,
            acks: 1,
            verification: crate::log::TxnVerification::Off,
        };
        shard.execute(op).unwrap()
    }

    /// One record produced to `tp` (no append ring) that waits for an fsync: its wait.
    fn durable_ack(shard: &mut Shard, tp: &TopicPartition, value: &'static [u8]) -> super::super::DurableWait {
        match produce(shard, tp, value, true) {
            super::super::PartitionReply::Produced { durable: Some(d), written: None, .. } => d,
            _ => panic!("no fsync wait, or a ring write"),
        }
    }

    /// One group-commit round, its fsyncs done inline.
    fn run_flush_round(shard: &mut Shard) {
        let round = shard.take_flush_batch();
        let synced = round.items.into_iter().map(|(tp, h)| (tp, h.flushed, h.sync())).collect::<Vec<_>>();
        shard.complete_flush(synced);
    }

    /// Run the append ring until it has nothing in flight (at most about a second).
    fn drain_ring(shard: &mut Shard) {
        for _ in 0..1_000 {
            if !shard.process_io().1 && !shard.has_io_work() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Broker 1 alone, `topic` (one partition) created, and its one shard, logs not opened.
    fn single_broker_shard(store: &Path, data: &Path, topic: &str) -> (Arc<Metadata>, Shard) {
        let mut reg = Registry::open(Box::new(LocalStore::open(store).unwrap()), broker(1), 1_000).unwrap();
        reg.create(topic, 1, TopicConfig::default()).unwrap();
        let metadata = Metadata::start(reg).unwrap();
        let shard = Shard::new(
            ShardId(0),
            1,
            data.to_path_buf(),
            metadata.clone(),
            Default::default(),
            crate::group::GroupConfig::default(),
        );
        (metadata, shard)
    }

    /// A partition whose log fails to open (here its directory's name is taken by a
    /// file; in the field, no file descriptors left) is refused with the error, and
    /// opened again by the housekeeping tick once its backoff is over, not at every
    /// request for it. (It stayed offline for good once out of descriptors.)
    #[test]
    fn a_log_that_failed_to_open_is_opened_again_after_a_backoff() {
        let (store, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (_metadata, mut shard) = single_broker_shard(store.path(), data.path(), "stuck");
        let tp = TopicPartition::new("stuck", 0);
        let blocker = data.path().join(tp.dir_name());
        std::fs::write(&blocker, b"not a directory").unwrap();
        shard.sync_registry();
        let jobs = shard.take_open_jobs();
        assert_eq!(jobs.len(), 1);
        shard.install_opened_later(super::super::open_logs(jobs, 1_000), 1_000);
        assert!(!shard.partitions.contains_key(&tp));
        let op = |now_ms| super::super::PartitionOp::Produce {
            tp: tp.clone(),
            records: batch(b"v"),
            now_ms,
            durable: false,
            acks: 1,
            verification: crate::log::TxnVerification::Off,
        };
        match shard.execute(op(1_100)) {
            Err(PartitionError::Log(crate::log::LogError::Offline(reason))) => {
                assert!(reason.contains("cannot open"), "{reason}")
            }
            other => panic!("a produce to a log that failed to open: {:?}", other.map(|_| ())),
        }
        std::fs::remove_file(&blocker).unwrap();
        shard.tick(1_500, false);
        assert!(shard.take_open_jobs().is_empty(), "retried before its backoff was over");
        shard.tick(2_000, false);
        let jobs = shard.take_open_jobs();
        assert_eq!(jobs.len(), 1, "not retried after its backoff");
        shard.install_opened_later(super::super::open_logs(jobs, 2_000), 2_000);
        assert!(shard.partitions.contains_key(&tp));
        assert!(shard.execute(op(2_100)).is_ok());
    }

    /// A write through the io_uring append ring that completes after its topic was
    /// deleted and created again under the same name belongs to the old log: the new
    /// log (whose write ids start over) must not take it for one of its own. (It did:
    /// `write_done for unknown write 0` panicked a shard in CI's mutated-requests test.)
    #[test]
    fn a_write_completing_after_its_topic_was_recreated_is_not_the_new_logs() {
        let (store, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (metadata, mut shard) = single_broker_shard(store.path(), data.path(), "again");
        let Ok(ring) = super::super::AppendRing::new() else { return }; // no io_uring here
        shard.set_append_ring(ring);
        let open = |shard: &mut Shard| {
            shard.sync_registry();
            let jobs = shard.take_open_jobs();
            assert_eq!(jobs.len(), 1);
            shard.install_opened_later(super::super::open_logs(jobs, 1_000), 1_000);
        };
        open(&mut shard);
        let tp = TopicPartition::new("again", 0);
        let produce = |shard: &mut Shard, value| {
            let op = super::super::PartitionOp::Produce {
                tp: tp.clone(),
                records: batch(value),
                now_ms: 1_000,
                durable: false,
                acks: 1,
                verification: crate::log::TxnVerification::Off,
            };
            match shard.execute(op).unwrap() {
                super::super::PartitionReply::Produced { written: Some(w), .. } => w,
                _ => panic!("not a ring write"),
            }
        };
        let old_write = produce(&mut shard, b"old");
        // Deleted and created again before the ring is run.
        metadata.write_blocking(|r| r.delete("again")).unwrap();
        shard.sync_registry();
        metadata.write_blocking(|r| r.create("again", 1, TopicConfig::default())).unwrap();
        open(&mut shard);
        let new_write = produce(&mut shard, b"new");
        drain_ring(&mut shard);
        assert!(futures::executor::block_on(old_write).is_err(), "the old log's write answered as written");
        assert!(matches!(futures::executor::block_on(new_write), Ok(Ok(()))), "the new log's write");
        assert_eq!(shard.partitions[&tp].log.log_end_offset(), Offset(1), "one record in the new log");
    }

    /// A group-commit round covers the offsets written when it was taken, and releases
    /// only the acks waiting for those: a record appended while the round was out waits
    /// for the next round. (The next record's ack, one offset past the round's end, was
    /// released by it unsynced: `offset <= upto` against an exclusive end.)
    #[test]
    fn an_fsync_round_releases_only_the_acks_it_covers() {
        let (store, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (_metadata, mut shard) = single_broker_shard(store.path(), data.path(), "synced");
        shard.sync_registry();
        let jobs = shard.take_open_jobs();
        shard.install_opened_later(super::super::open_logs(jobs, 1_000), 1_000);
        let tp = TopicPartition::new("synced", 0);
        let sync = |batch: super::super::FlushBatch| {
            batch.items.into_iter().map(|(tp, handle)| (tp, handle.flushed, handle.sync())).collect::<Vec<_>>()
        };
        let mut first = durable_ack(&mut shard, &tp, b"first");
        let round = shard.take_flush_batch();
        assert_eq!(round.items.len(), 1);
        let mut second = durable_ack(&mut shard, &tp, b"second"); // while the round is out
        shard.complete_flush(sync(round));
        assert!(matches!(first.try_recv(), Ok(Some(Ok(())))), "the round's own record");
        assert!(matches!(second.try_recv(), Ok(None)), "released by a round taken before it was written");
        assert!(shard.has_flush_work());
        run_flush_round(&mut shard);
        assert!(matches!(second.try_recv(), Ok(Some(Ok(())))), "the next round's");
        assert!(!shard.has_flush_work());
    }

    /// A round taken before a truncation covers only what stayed below the cut: a
    /// record appended again at a cut offset while the round ran (the broker led again)
    /// waits for the next round. (`complete_flush` compared acks with the round's own
    /// end, so it released that record unsynced.)
    #[test]
    fn a_round_over_a_truncation_releases_no_ack_past_the_cut() {
        let (store, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (_metadata, mut shard) = single_broker_shard(store.path(), data.path(), "cut");
        shard.sync_registry();
        let jobs = shard.take_open_jobs();
        shard.install_opened_later(super::super::open_logs(jobs, 1_000), 1_000);
        let tp = TopicPartition::new("cut", 0);
        let mut kept = durable_ack(&mut shard, &tp, b"kept");
        let mut cut = durable_ack(&mut shard, &tp, b"cut");
        let round = shard.take_flush_batch();
        // While the round runs: a follower's cut at offset 1 (as `replica_truncate`),
        // then, leading again, a new record at offset 1.
        let p = shard.partitions.get_mut(&tp).unwrap();
        p.log.truncate_to(Offset(1), Offset(1)).unwrap();
        drop_truncated_waiters(p, 1);
        let mut again = durable_ack(&mut shard, &tp, b"again");
        assert_eq!(shard.partitions[&tp].log.log_end_offset(), Offset(2));
        let synced = round.items.into_iter().map(|(tp, h)| (tp, h.flushed, h.sync())).collect::<Vec<_>>();
        shard.complete_flush(synced);
        assert!(matches!(kept.try_recv(), Ok(Some(Ok(())))), "below the cut: synced by the round");
        assert!(matches!(cut.try_recv(), Err(oneshot::Canceled)), "cut away");
        assert!(matches!(again.try_recv(), Ok(None)), "released by a round that synced the record it replaced");
        run_flush_round(&mut shard);
        assert!(matches!(again.try_recv(), Ok(Some(Ok(())))), "the next round's");
    }

    #[test]
    fn hw_checkpoints_round_trip_and_merge() {
        let dir = tempfile::tempdir().unwrap();
        let a = vec![(TopicPartition::new("my topic-x", 0), 10), (TopicPartition::new("t", 3), 7)];
        std::fs::write(dir.path().join(format!("{HW_CHECKPOINT_PREFIX}.shard-0")), encode_hw_checkpoint(&a)).unwrap();
        std::fs::write(
            dir.path().join(format!("{HW_CHECKPOINT_PREFIX}.shard-1")),
            encode_hw_checkpoint(&[(TopicPartition::new("t", 3), 9)]),
        )
        .unwrap();
        std::fs::write(dir.path().join(format!("{HW_CHECKPOINT_PREFIX}.shard-2")), "7\n1\nt 0 5\n").unwrap();
        let m = load_hw_checkpoints(dir.path());
        assert_eq!(m.get(&TopicPartition::new("my topic-x", 0)), Some(&10));
        assert_eq!(m.get(&TopicPartition::new("t", 3)), Some(&9), "the highest of the files wins");
        assert_eq!(m.get(&TopicPartition::new("t", 0)), None, "an unknown version is ignored");
        assert_eq!(encode_hw_checkpoint(&a), "0\n2\nmy topic-x 0 10\nt 3 7\n");
    }
}
