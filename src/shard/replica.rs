//! Replicas on their owner shard: the role of each hosted partition (leader, follower or
//! neither) as the registry says, the leader's high watermark and ISR bookkeeping
//! (`replication::LeaderState`), acks=all waiters, and the operations a follower's
//! fetcher (a task on this same shard) performs on its log.

use crate::coordinator::registry::Hosting;
use crate::model::{Offset, TopicPartition};
use crate::protocol::error_code;
use crate::replication::{IsrProposal, LeaderState};

use super::{Partition, PartitionError, Shard};

pub enum Role {
    Leader(LeaderState),
    Follower {
        leader: i32,
        leader_epoch: i32,
    },
    /// Offline (no leader), or not known yet.
    None,
}

/// A follower partition whose fetcher must (re)start: its leader or epoch changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetcherStart {
    pub tp: TopicPartition,
    pub leader: i32,
    pub leader_epoch: i32,
}

/// How an AlterPartition ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsrOutcome {
    Committed(Vec<i32>, i32),
    /// The coordinator answered with an error.
    Refused,
    /// No answer (unreachable, timed out): it may have committed.
    Unknown,
}

/// What a fetcher needs to know about its follower log.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaState {
    pub log_end_offset: i64,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub latest_epoch: Option<i32>,
}

/// The leader state of `p`, checked against a request's `current_leader_epoch` (-1: no
/// check) as KIP-320 says.
pub fn leader_of<'a>(
    p: &'a mut Partition,
    tp: &TopicPartition,
    current_leader_epoch: i32,
) -> Result<&'a mut LeaderState, PartitionError> {
    let Role::Leader(l) = &mut p.role else {
        return Err(PartitionError::NotLeader(tp.clone()));
    };
    let current = l.leader_epoch();
    if current_leader_epoch >= 0 && current_leader_epoch < current {
        return Err(PartitionError::FencedLeaderEpoch { tp: tp.clone(), request: current_leader_epoch, current });
    }
    if current_leader_epoch > current {
        return Err(PartitionError::UnknownLeaderEpoch { tp: tp.clone(), request: current_leader_epoch, current });
    }
    Ok(l)
}

/// What consumers may read up to: the leader's high watermark, or what a follower was
/// told.
pub fn high_watermark(p: &Partition) -> Offset {
    match &p.role {
        Role::Leader(l) => {
            let hw = l.high_watermark();
            assert!(hw <= p.log.written_end_offset().0, "high watermark {hw} above the leader's log end");
            Offset(hw)
        }
        _ => Offset(p.follower_hw.min(p.log.written_end_offset().0)),
    }
}

/// After the leader's log grew: recompute the high watermark, release what it covers.
pub fn advance_hw(p: &mut Partition) {
    let written = p.log.written_end_offset().0;
    if let Role::Leader(l) = &mut p.role {
        l.update_high_watermark(written);
        release_hw_waiters(p);
    }
}

/// Answer the acks=all produces the high watermark now covers, and wake consumers.
pub fn release_hw_waiters(p: &mut Partition) {
    let Role::Leader(l) = &p.role else { return };
    let hw = Offset(l.high_watermark());
    let enough = l.isr().len() >= p.min_insync;
    let waiters = std::mem::take(&mut p.hw_waiters);
    for (last, w) in waiters {
        if last < hw {
            let _ = w.send(if enough { Ok(()) } else { Err(error_code::NOT_ENOUGH_REPLICAS_AFTER_APPEND) });
        } else {
            p.hw_waiters.push((last, w));
        }
    }
    for w in p.data_waiters.drain(..) {
        let _ = w.send(());
    }
}

fn fail_hw_waiters(p: &mut Partition, code: i16) {
    for (_, w) in p.hw_waiters.drain(..) {
        let _ = w.send(Err(code));
    }
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

    pub(super) fn min_insync_of(&self, meta: &crate::coordinator::registry::TopicMeta) -> usize {
        let key = "min.insync.replicas";
        meta.configs
            .overrides
            .get(key)
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
            let gone: Vec<TopicPartition> = self
                .partitions
                .keys()
                .filter(|tp| reg.has_metadata() && reg.hosting(&tp.topic, tp.partition) == Hosting::Unknown)
                .cloned()
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
        for tp in gone {
            tracing::info!(shard = self.id.0, partition = %tp, "topic deleted: removing the partition");
            if let Err(e) = self.execute(super::PartitionOp::DeletePartition { tp: tp.clone() }) {
                tracing::error!(partition = %tp, error = %e, "cannot remove the partition of a deleted topic");
            }
        }
        let producer_id_bound = self.producer_id_bound;
        for (tp, config, min_insync) in hosted {
            if !self.partitions.contains_key(&tp) {
                // Newly hosted: its log is created or recovered off the data core (a
                // directory fsync at least), then installed with its role.
                if !self.closing && !self.opening.contains_key(&tp) {
                    self.opening.insert(tp.clone(), Default::default());
                    let leader_epoch = self.leader_epoch_here(&tp);
                    let dir = self.data_dir.join(tp.dir_name());
                    self.open_queue.push(super::OpenJob { tp, dir, config, min_insync, leader_epoch });
                }
                continue;
            }
            match self.partition_mut(&tp, now_ms) {
                Ok(p) => {
                    p.log.set_config(config);
                    p.log.set_producer_id_bound(producer_id_bound);
                    p.min_insync = min_insync;
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
    pub(super) fn leader_epoch_here(&self, tp: &TopicPartition) -> Option<i32> {
        let reg = &self.view;
        reg.partition(&tp.topic, tp.partition)
            .filter(|(replicas, s)| reg.may_take_roles(replicas.len()) && s.leader == self.local_broker)
            .map(|(_, s)| s.leader_epoch)
    }

    /// Set `tp`'s role from the registry's partition state. For a `__consumer_offsets`
    /// partition, taking the leadership loads its groups and losing it drops them.
    pub(super) fn refresh_role(&mut self, tp: &TopicPartition, now_ms: i64) {
        let was_leading = self.partitions.get(tp).is_some_and(|p| matches!(p.role, Role::Leader(_)));
        self.set_role(tp, now_ms);
        if tp.topic != crate::group::OFFSETS_TOPIC {
            return;
        }
        let leading = self.partitions.get(tp).is_some_and(|p| matches!(p.role, Role::Leader(_)));
        match (was_leading, leading) {
            (false, true) => self.load_group_partition(tp, now_ms),
            (true, false) => self.unload_group_partition(tp),
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
        let Some((replicas, state)) = state else {
            p.role = Role::None;
            fail_hw_waiters(p, error_code::NOT_LEADER_OR_FOLLOWER);
            return;
        };
        let written = p.log.written_end_offset().0;
        if state.leader == me {
            if let Role::Leader(l) = &mut p.role {
                if l.leader_epoch() == state.leader_epoch {
                    if l.on_isr_committed(state.isr.clone(), state.partition_epoch, written).is_some() {
                        release_hw_waiters(p);
                    }
                    return;
                }
            }
            // This broker leads a new epoch: it starts at the current log end (Kafka's
            // makeLeader), with the high watermark it knew.
            if let Err(e) = p.log.assign_leader_epoch(state.leader_epoch) {
                tracing::error!(partition = %tp, error = %e, "cannot record the new leader epoch");
            }
            let hw = high_watermark(p).0.max(p.log.log_start_offset().0);
            p.role = Role::Leader(LeaderState::new(
                me,
                state.leader_epoch,
                replicas,
                state.isr.clone(),
                state.partition_epoch,
                written,
                hw,
                now_ms,
                lag_ms,
            ));
            release_hw_waiters(p);
            tracing::debug!(partition = %tp, leader_epoch = state.leader_epoch, isr = ?state.isr, "leading");
            self.roles_taken.note(tp, true);
        } else if state.leader >= 0 {
            if matches!(p.role, Role::Follower { leader, leader_epoch } if leader == state.leader && leader_epoch == state.leader_epoch)
            {
                return;
            }
            if let Role::Leader(l) = &p.role {
                p.follower_hw = l.high_watermark();
            }
            fail_hw_waiters(p, error_code::NOT_LEADER_OR_FOLLOWER);
            p.role = Role::Follower { leader: state.leader, leader_epoch: state.leader_epoch };
            self.fetcher_starts.push(FetcherStart {
                tp: tp.clone(),
                leader: state.leader,
                leader_epoch: state.leader_epoch,
            });
            tracing::debug!(partition = %tp, leader = state.leader, leader_epoch = state.leader_epoch, "following");
            self.roles_taken.note(tp, false);
        } else {
            if let Role::Leader(l) = &p.role {
                p.follower_hw = l.high_watermark();
            }
            fail_hw_waiters(p, error_code::NOT_LEADER_OR_FOLLOWER);
            p.role = Role::None;
        }
    }

    /// Follower partitions whose fetcher must start (the runtime spawns them).
    pub fn take_fetcher_starts(&mut self) -> Vec<FetcherStart> {
        std::mem::take(&mut self.fetcher_starts)
    }

    /// Whether `tp` is still followed from `leader` in `leader_epoch` (a fetcher stops
    /// when not).
    pub fn follows(&self, tp: &TopicPartition, leader: i32, leader_epoch: i32) -> bool {
        self.partitions.get(tp).is_some_and(
            |p| matches!(p.role, Role::Follower { leader: l, leader_epoch: e } if l == leader && e == leader_epoch),
        )
    }

    pub fn replica_state(&self, tp: &TopicPartition) -> Option<ReplicaState> {
        let p = self.partitions.get(tp)?;
        Some(ReplicaState {
            log_end_offset: p.log.log_end_offset().0,
            high_watermark: high_watermark(p).0,
            log_start_offset: p.log.log_start_offset().0,
            latest_epoch: p.log.latest_epoch(),
        })
    }

    /// This log's own end offset for `epoch` (KIP-279 truncation).
    pub fn local_epoch_end(&self, tp: &TopicPartition, epoch: i32) -> i64 {
        self.partitions.get(tp).map(|p| p.log.end_offset_for_epoch(epoch).1).unwrap_or(-1)
    }

    /// `tp` as this shard follows it from `leader` in `leader_epoch`; NOT_LEADER when it
    /// does not (any more): the fetcher's answer is stale.
    fn followed(
        &mut self,
        tp: &TopicPartition,
        leader: i32,
        leader_epoch: i32,
    ) -> Result<&mut Partition, PartitionError> {
        if !self.follows(tp, leader, leader_epoch) {
            return Err(PartitionError::NotLeader(tp.clone()));
        }
        Ok(self.partitions.get_mut(tp).expect("follows"))
    }

    /// A follower truncates to `offset` (by leader epoch, before fetching from a new
    /// leader).
    pub fn replica_truncate(
        &mut self,
        tp: &TopicPartition,
        leader: i32,
        leader_epoch: i32,
        offset: i64,
    ) -> Result<(), PartitionError> {
        let p = self.followed(tp, leader, leader_epoch)?;
        if offset < p.log.log_end_offset().0 {
            tracing::info!(partition = %tp, from = p.log.log_end_offset().0, to = offset, "truncating by leader epoch");
        }
        // Always: even with no record to drop, epochs starting at the cut must go.
        p.log.truncate_to(Offset(offset))?;
        p.follower_hw = p.follower_hw.min(offset);
        Ok(())
    }

    /// A follower whose log ends below the leader's log start `offset` (retention on the
    /// leader removed what it would fetch next) drops its log and starts over, empty, at
    /// `offset` (Kafka's truncateFullyAndStartAt), then fetches from there.
    pub fn replica_start_at(
        &mut self,
        tp: &TopicPartition,
        leader: i32,
        leader_epoch: i32,
        offset: i64,
    ) -> Result<(), PartitionError> {
        let p = self.followed(tp, leader, leader_epoch)?;
        let end = p.log.log_end_offset().0;
        if offset <= end {
            return Ok(()); // not below the leader's log start: truncation by epoch applies
        }
        tracing::warn!(partition = %tp, log_end = end, leader_log_start = offset,
            "log ends below the leader's log start: starting over at the leader's log start");
        p.log.truncate_fully_and_start_at(Offset(offset))?;
        p.follower_hw = p.follower_hw.max(offset);
        Ok(())
    }

    /// A follower appends what it fetched (offsets as the leader assigned them) and learns
    /// the leader's high watermark. Returns the new log end offset.
    pub fn replica_append(
        &mut self,
        tp: &TopicPartition,
        leader: i32,
        leader_epoch: i32,
        records: &[u8],
        leader_hw: i64,
        now_ms: i64,
    ) -> Result<i64, PartitionError> {
        let p = self.followed(tp, leader, leader_epoch)?;
        if !records.is_empty() {
            p.log.append_replicated(records, now_ms)?;
        }
        let leo = p.log.log_end_offset().0;
        p.follower_hw = leader_hw.min(leo).max(p.follower_hw.min(leo));
        Ok(leo)
    }

    /// ISR changes due on the partitions this shard leads (sent to the coordinator).
    pub fn isr_proposals(&mut self, now_ms: i64) -> Vec<(TopicPartition, IsrProposal)> {
        let mut out = Vec::new();
        for (tp, p) in self.partitions.iter_mut() {
            if let Role::Leader(l) = &mut p.role {
                if let Some(proposal) = l.isr_change(now_ms) {
                    out.push((tp.clone(), proposal));
                }
            }
        }
        out
    }

    /// The coordinator's answer to an ISR change: the committed ISR, a refusal (it
    /// answered with an error: the proposal certainly did not commit), or no answer (it
    /// may have committed: the proposed members keep counting for the HW).
    pub fn isr_result(&mut self, tp: &TopicPartition, proposal: &IsrProposal, result: IsrOutcome) {
        let Some(p) = self.partitions.get_mut(tp) else { return };
        let written = p.log.written_end_offset().0;
        let Role::Leader(l) = &mut p.role else { return };
        match result {
            IsrOutcome::Committed(isr, partition_epoch) => {
                tracing::info!(partition = %tp, isr = ?isr, "ISR committed");
                if l.on_isr_committed(isr, partition_epoch, written).is_some() {
                    release_hw_waiters(p);
                }
            }
            IsrOutcome::Refused => l.on_isr_change_refused(proposal),
            IsrOutcome::Unknown => l.on_isr_change_failed(),
        }
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
        LocalBroker { id, endpoint: Endpoint::new("127.0.0.1", 9090 + id as u16), rack: None, shards: 1 }
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
            tps().filter(|tp| view.leader_of(&tp.topic, tp.partition) == Some(2)).collect();
        assert!(!leading.is_empty() && leading.len() < PARTITIONS as usize, "broker 2 leads some, follows others");
        for tp in tps() {
            assert!(matches!(shard.partitions[&tp].role, Role::None), "{tp}: a role before registering");
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
                assert!(matches!(&shard.partitions[&tp].role, Role::Leader(l) if l.leader_epoch() == epoch), "{tp}");
                assert_eq!(shard.leader_epoch_here(&tp), Some(epoch));
            } else {
                assert!(shard.follows(&tp, leader, epoch), "{tp} follows {leader} in epoch {epoch}");
            }
        }
        assert_eq!(shard.take_fetcher_starts().len(), PARTITIONS as usize - leading.len());
    }

    /// A follower's truncation at its log end still cuts the epoch cache there (an epoch
    /// this broker recorded as leader without appending): `replica_truncate` calls
    /// `PartitionLog::truncate_to` even when no record goes.
    #[test]
    fn a_follower_truncation_at_its_log_end_cuts_the_epoch_started_there() {
        let (store, cache, data) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let coordinator = coordinator(store.path());
        let (metadata, mut shard) = restarted_broker_2(&coordinator, cache.path(), data.path());
        metadata.write_blocking(|r| r.set_registered());
        shard.sync_registry();
        let view = metadata.view();
        let (tp, leader, epoch) = tps()
            .find_map(|tp| {
                let (_, s) = view.partition(&tp.topic, tp.partition)?;
                (s.leader != 2).then(|| (tp.clone(), s.leader, s.leader_epoch))
            })
            .expect("broker 2 follows a partition");
        assert!(shard.follows(&tp, leader, epoch));
        // As if this broker had led an older epoch here without appending.
        let log = &mut shard.partitions.get_mut(&tp).unwrap().log;
        log.assign_leader_epoch(epoch).unwrap();
        assert_eq!(log.latest_epoch(), Some(epoch));
        assert_eq!(shard.local_epoch_end(&tp, epoch), 0);

        shard.replica_truncate(&tp, leader, epoch, 0).unwrap();
        let log = &shard.partitions[&tp].log;
        assert_eq!(log.log_end_offset(), Offset(0));
        assert_eq!(log.latest_epoch(), None, "the epoch with no record behind it is cut");
        let saved = crate::log::leader_epoch::LeaderEpochCache::load(log.dir()).unwrap();
        assert!(saved.entries().is_empty(), "and its checkpoint: {:?}", saved.entries());
        assert!(matches!(shard.replica_truncate(&tp, leader, epoch + 1, 0), Err(PartitionError::NotLeader(_))));
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
