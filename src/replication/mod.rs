//! Kafka's ISR replication, as state machines with no I/O: time and offsets in,
//! decisions out. The shard owning a partition feeds them (follower fetches, local
//! appends, coordinator answers, the clock) and carries out what they decide (answer
//! acks, send AlterPartition, truncate a follower's log).
//!
//! Leader side (`LeaderState`), after Kafka's `Partition` / `Replica`:
//! - each follower's log end offset is its last fetch offset; it is *caught up* at a
//!   fetch that reached the leader's log end offset as it was at the previous fetch;
//! - high watermark = min(log end offset) over the *maximal* ISR, the leader included; it
//!   never moves backwards. The maximal ISR (Kafka's `maximalIsr`, KIP-497) is the
//!   committed ISR plus every replica that an ISR change in flight, or one whose fate is
//!   unknown (a lost answer), may have added: the coordinator may already count such a
//!   replica in the ISR and elect it, so it must hold everything below the high watermark;
//! - a follower not caught up for `replica_lag_time_max_ms` leaves the ISR; a replica
//!   whose log end offset reached the high watermark and the start of this leader's
//!   epoch joins it. Both only through the coordinator (AlterPartition): one change in
//!   flight at a time. A replica possibly added stays in the maximal ISR until a committed
//!   state newer than the proposal's partition epoch (or the coordinator's explicit
//!   refusal, `on_isr_change_refused`) settles it. A replica that left the ISR forgets its
//!   log end offset: it rejoins on a fetch made after it left, not on one from before a
//!   restart that lost its unsynced suffix (the coordinator takes a restarted broker out
//!   of every ISR);
//! - broker epochs (KIP-903): each follower's progress carries the broker epoch (its
//!   registration with the coordinator) of the incarnation that fetched. A fetch with a
//!   newer epoch is a restarted follower: its old progress is forgotten before the fetch
//!   counts. A fetch with an older epoch than the one known comes from a dead incarnation
//!   and is refused (Kafka answers NOT_LEADER_OR_FOLLOWER). An ISR proposal names each
//!   member with the epoch its progress was made in, and the coordinator refuses it
//!   (INELIGIBLE_REPLICA) unless that is the member's current registration: so a follower
//!   that restarted while outside the ISR cannot rejoin on its previous incarnation's
//!   offset. `NO_BROKER_EPOCH` (-1: a follower that sends none) is not checked, as in Kafka.
//!
//! Follower side (`truncation_offset`): truncation by leader epoch (KIP-101, KIP-279),
//! never by high watermark.
//!
//! `replica::Replica` wires these into one machine per replica (role, high watermark,
//! acks=all waiters, the follower's fetch decisions); the shard and the replication
//! simulation both drive it.

use std::collections::BTreeMap;

use crate::model::{BrokerEpoch, LeaderEpoch, NodeId, PartitionEpoch};

pub mod replica;

pub use replica::{
    AckError, Answers, AppendRefusal, FetchRefusal, Follower, FollowerLog, FollowerStep, IsrOutcome, OutOfRange,
    Replica, Role, RoleChange, RoleError, Truncation,
};

/// Kafka's `replica.lag.time.max.ms` default.
pub const REPLICA_LAG_TIME_MAX_MS_DEFAULT: i64 = 30_000;
/// Kafka's UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET in OffsetForLeaderEpoch answers.
pub const UNDEFINED_EPOCH: LeaderEpoch = LeaderEpoch::UNDEFINED;
pub const UNDEFINED_OFFSET: i64 = -1;
/// A broker epoch that is not known or not sent (Kafka's -1 in Fetch's ReplicaEpoch and
/// AlterPartition's BrokerEpoch): not checked.
pub const NO_BROKER_EPOCH: BrokerEpoch = BrokerEpoch::NONE;
/// Pause after an error on a followed partition before it truncates and fetches again
/// (Kafka's replica.fetch.backoff.ms).
pub const REPLICA_FETCH_BACKOFF_MS: i64 = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FollowerProgress {
    /// The follower's log end offset (its last fetch offset); -1 before its first fetch.
    leo: i64,
    /// When it was last caught up (ms); 0: never.
    last_caught_up_ms: i64,
    last_fetch_ms: i64,
    /// The leader's log end offset at the follower's previous fetch.
    leader_leo_at_last_fetch: i64,
    /// The broker epoch of the incarnation whose fetches made this progress
    /// (`NO_BROKER_EPOCH`: unknown).
    broker_epoch: BrokerEpoch,
    /// The follower's log start offset as its last fetch said; -1: not known yet.
    log_start: i64,
}

impl FollowerProgress {
    /// A replica the leader has heard nothing from; `last_caught_up_ms` as given.
    fn unknown(last_caught_up_ms: i64) -> Self {
        Self {
            leo: -1,
            last_caught_up_ms,
            last_fetch_ms: 0,
            leader_leo_at_last_fetch: -1,
            broker_epoch: NO_BROKER_EPOCH,
            log_start: -1,
        }
    }
}

/// Why a follower's fetch was refused (no effect on the leader's state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowerFetchError {
    /// The broker is not a replica of the partition.
    NotReplica,
    /// The fetch comes from an incarnation older than one already seen (KIP-903; Kafka
    /// answers NOT_LEADER_OR_FOLLOWER).
    StaleBrokerEpoch { broker_epoch: BrokerEpoch, current: BrokerEpoch },
}

/// An ISR change for the coordinator (AlterPartition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrProposal {
    pub new_isr: Vec<NodeId>,
    /// Each member's broker epoch, in `new_isr`'s order (AlterPartition v3's
    /// NewIsrWithEpochs): the incarnation whose fetches put it there; `NO_BROKER_EPOCH`
    /// for the leader itself and for followers that sent none.
    pub broker_epochs: Vec<BrokerEpoch>,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
}

#[derive(Debug, Clone)]
pub struct LeaderState {
    local_id: NodeId,
    leader_epoch: LeaderEpoch,
    /// Assignment order.
    replicas: Vec<NodeId>,
    /// As committed by the coordinator.
    isr: Vec<NodeId>,
    partition_epoch: PartitionEpoch,
    /// The partition epoch `replicas` were last learnt at (a snapshot; an AlterPartition
    /// answer moves `partition_epoch` without saying what the replicas were).
    replicas_epoch: PartitionEpoch,
    followers: BTreeMap<NodeId, FollowerProgress>,
    high_watermark: i64,
    /// The log end offset when this leader epoch began.
    epoch_start_offset: i64,
    pending: Option<IsrProposal>,
    /// Replicas that a proposal at the current partition epoch may have added to the
    /// coordinator's ISR although we were told it failed (its answer may have been lost):
    /// part of the maximal ISR until a newer committed state shows the truth.
    maybe_added: Vec<NodeId>,
    replica_lag_time_max_ms: i64,
}

impl LeaderState {
    /// This broker became (or stays) leader with `leader_epoch`. `high_watermark` is what
    /// it knew (as a follower, or before a restart); the leader's log end offset is `leo`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        local_id: NodeId,
        leader_epoch: LeaderEpoch,
        replicas: Vec<NodeId>,
        isr: Vec<NodeId>,
        partition_epoch: PartitionEpoch,
        leo: i64,
        high_watermark: i64,
        now_ms: i64,
        replica_lag_time_max_ms: i64,
    ) -> Self {
        let followers = replicas
            .iter()
            .filter(|r| **r != local_id)
            .map(|r| {
                // ISR members get a fresh lag budget from now (Kafka resets caught-up time
                // on leadership change).
                let caught_up = if isr.contains(r) { now_ms } else { 0 };
                (*r, FollowerProgress::unknown(caught_up))
            })
            .collect();
        let mut s = Self {
            local_id,
            leader_epoch,
            replicas,
            isr,
            partition_epoch,
            replicas_epoch: partition_epoch,
            followers,
            high_watermark: high_watermark.min(leo).max(0),
            epoch_start_offset: leo,
            pending: None,
            maybe_added: Vec::new(),
            replica_lag_time_max_ms,
        };
        s.update_high_watermark(leo);
        s
    }

    /// The partition's replicas changed (a reassignment): new ones start with no
    /// progress (outside the ISR, they join it by catching up), gone ones are forgotten.
    fn set_replicas(&mut self, replicas: &[NodeId]) {
        if self.replicas == replicas {
            return;
        }
        self.replicas = replicas.to_vec();
        self.followers.retain(|r, _| replicas.contains(r));
        for r in replicas.iter().filter(|r| **r != self.local_id) {
            self.followers.entry(*r).or_insert(FollowerProgress::unknown(0));
        }
        self.maybe_added.retain(|r| replicas.contains(r));
    }

    pub fn leader_epoch(&self) -> LeaderEpoch {
        self.leader_epoch
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    pub fn isr(&self) -> &[NodeId] {
        &self.isr
    }

    pub fn replicas(&self) -> &[NodeId] {
        &self.replicas
    }

    /// A follower's fetch at `fetch_offset` (its log end offset), made by the incarnation
    /// with `broker_epoch`, while the leader's log end offset is `leader_leo`. Returns the
    /// new high watermark if it moved. Refused, with no effect, from brokers that are not
    /// replicas and from an incarnation older than one already seen (KIP-903); a newer
    /// incarnation's first fetch forgets the progress of the previous one first.
    pub fn on_follower_fetch(
        &mut self,
        replica: NodeId,
        broker_epoch: BrokerEpoch,
        fetch_offset: i64,
        leader_leo: i64,
        now_ms: i64,
    ) -> Result<Option<i64>, FollowerFetchError> {
        let f = self.followers.get_mut(&replica).ok_or(FollowerFetchError::NotReplica)?;
        if broker_epoch != NO_BROKER_EPOCH && f.broker_epoch != NO_BROKER_EPOCH {
            if broker_epoch < f.broker_epoch {
                return Err(FollowerFetchError::StaleBrokerEpoch { broker_epoch, current: f.broker_epoch });
            }
            if broker_epoch > f.broker_epoch {
                // A restarted follower: what its previous incarnation fetched may be gone
                // (the unsynced suffix), and its old fetches prove nothing about the new one.
                f.leo = -1;
                f.leader_leo_at_last_fetch = -1;
                f.last_fetch_ms = 0;
            }
        }
        f.broker_epoch = broker_epoch;
        if fetch_offset >= leader_leo {
            f.last_caught_up_ms = now_ms;
        } else if fetch_offset >= f.leader_leo_at_last_fetch && f.leader_leo_at_last_fetch >= 0 {
            f.last_caught_up_ms = f.last_caught_up_ms.max(f.last_fetch_ms);
        }
        f.leo = fetch_offset;
        f.last_fetch_ms = now_ms;
        f.leader_leo_at_last_fetch = leader_leo;
        Ok(self.update_high_watermark(leader_leo))
    }

    /// A follower's fetch (accepted by `on_follower_fetch`) said its log start offset is
    /// `log_start` (Fetch's LogStartOffset; -1: it sent none). Ignored for non-replicas.
    pub fn on_follower_log_start(&mut self, replica: NodeId, log_start: i64) {
        if let Some(f) = self.followers.get_mut(&replica) {
            f.log_start = log_start;
        }
    }

    /// Kafka's low watermark (`Partition.lowWatermarkIfLeader`): the smallest log start
    /// offset over the leader (`leader_log_start`) and every follower on a live broker
    /// (`live`); a live follower that has not said its log start yet counts as -1. What
    /// DeleteRecords waits for: every live replica has dropped the records below it.
    pub fn low_watermark(&self, leader_log_start: i64, live: impl Fn(NodeId) -> bool) -> i64 {
        self.followers.iter().filter(|(r, _)| live(**r)).map(|(_, f)| f.log_start).fold(leader_log_start, i64::min)
    }

    pub fn is_replica(&self, broker: NodeId) -> bool {
        self.followers.contains_key(&broker)
    }

    /// Whether `replica` is in the maximal ISR: committed, proposed by the change in
    /// flight, or possibly added by one whose answer we did not get.
    fn in_maximal_isr(&self, replica: NodeId) -> bool {
        self.isr.contains(&replica)
            || self.pending.as_ref().is_some_and(|p| p.new_isr.contains(&replica))
            || self.maybe_added.contains(&replica)
    }

    /// Recompute the high watermark (after a local append, or any change) over the
    /// maximal ISR. Returns the new value if it moved forward; it never moves back.
    pub fn update_high_watermark(&mut self, leader_leo: i64) -> Option<i64> {
        let mut hw = leader_leo;
        for r in &self.replicas {
            if *r == self.local_id || !self.in_maximal_isr(*r) {
                continue;
            }
            hw = hw.min(self.followers.get(r).map(|f| f.leo).unwrap_or(-1));
        }
        if hw > self.high_watermark {
            self.high_watermark = hw;
            Some(hw)
        } else {
            None
        }
    }

    /// The ISR change due now, if any and none is in flight: laggards out first, else
    /// caught-up replicas in.
    pub fn isr_change(&mut self, now_ms: i64) -> Option<IsrProposal> {
        if self.pending.is_some() {
            return None;
        }
        let lagging: Vec<NodeId> = self
            .isr
            .iter()
            .copied()
            .filter(|r| *r != self.local_id)
            .filter(|r| {
                self.followers.get(r).is_none_or(|f| now_ms - f.last_caught_up_ms > self.replica_lag_time_max_ms)
            })
            .collect();
        let new_isr: Vec<NodeId> = if !lagging.is_empty() {
            self.isr.iter().copied().filter(|r| !lagging.contains(r)).collect()
        } else {
            let joining: Vec<NodeId> = self
                .followers
                .iter()
                .filter(|(r, f)| {
                    !self.isr.contains(r) && f.leo >= self.high_watermark && f.leo >= self.epoch_start_offset
                })
                .map(|(r, _)| *r)
                .collect();
            if joining.is_empty() {
                return None;
            }
            self.replicas.iter().copied().filter(|r| self.isr.contains(r) || joining.contains(r)).collect()
        };
        let broker_epochs =
            new_isr.iter().map(|r| self.followers.get(r).map_or(NO_BROKER_EPOCH, |f| f.broker_epoch)).collect();
        let proposal = IsrProposal {
            new_isr,
            broker_epochs,
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
        };
        self.pending = Some(proposal.clone());
        Some(proposal)
    }

    /// The coordinator committed an ISR (its answer to our AlterPartition, or a snapshot).
    /// Returns the new high watermark if it moved (a shrink can let it advance).
    ///
    /// A state newer than our partition epoch settles every proposal made at an older one
    /// (the coordinator refuses a proposal whose partition epoch is not its own). The same
    /// epoch again (a snapshot sent for another reason) settles nothing: a proposal in
    /// flight may still be applied, so it keeps counting for the high watermark.
    ///
    /// `replicas` (from a snapshot; an AlterPartition answer has none) are the
    /// partition's replicas at that epoch: a reassignment adds and removes some, and a
    /// replica added starts with no progress. A committed ISR without this broker (a
    /// reassignment that finished with it leaving) is not applied: the snapshot that
    /// follows takes the leadership away.
    pub fn on_isr_committed(
        &mut self,
        isr: Vec<NodeId>,
        partition_epoch: PartitionEpoch,
        leader_leo: i64,
        replicas: Option<&[NodeId]>,
    ) -> Option<i64> {
        if partition_epoch < self.partition_epoch || !isr.contains(&self.local_id) {
            return None; // older than what we have, or not ours to apply
        }
        if let Some(replicas) = replicas {
            self.set_replicas(replicas);
            if partition_epoch > self.replicas_epoch.next() {
                // A snapshot that skips partition epochs hides the replicas between them:
                // a follower may have been reassigned away (deleting its log) and back
                // meanwhile, with the same replica list on both sides, so what it fetched
                // before proves nothing. Kafka's brokers apply every partition change in
                // order and start a replica added back afresh; here each follower outside
                // the new ISR shows again, by fetching, where its log ends. Epochs learnt
                // from AlterPartition answers count as skipped: they carry no replicas
                // (a reassignment that removed a replica can end in one: the replication
                // simulation's seed 477875573592 elected a re-added, empty replica).
                for (r, f) in self.followers.iter_mut() {
                    if !isr.contains(r) {
                        *f = FollowerProgress { broker_epoch: f.broker_epoch, ..FollowerProgress::unknown(0) };
                    }
                }
            }
            self.replicas_epoch = partition_epoch;
        }
        if partition_epoch > self.partition_epoch {
            // A replica that left the ISR (the coordinator takes a restarted broker out)
            // must show again, by fetching, that it caught up: the log end offset we have
            // for it may be from before it lost its unsynced suffix.
            let left: Vec<NodeId> =
                self.replicas.iter().copied().filter(|r| self.in_maximal_isr(*r) && !isr.contains(r)).collect();
            for r in left {
                if let Some(f) = self.followers.get_mut(&r) {
                    f.leo = -1;
                    f.leader_leo_at_last_fetch = -1;
                }
            }
            self.pending = None;
            self.maybe_added.clear();
        } else if self.pending.as_ref().is_some_and(|p| same_members(&p.new_isr, &isr)) {
            self.pending = None;
        }
        self.isr = isr;
        self.partition_epoch = partition_epoch;
        self.update_high_watermark(leader_leo)
    }

    /// The AlterPartition failed without a word from the coordinator (a timeout, a lost
    /// connection): propose again later. The coordinator may have applied it, so the
    /// replicas it added stay in the maximal ISR until a newer committed state arrives.
    pub fn on_isr_change_failed(&mut self) {
        if let Some(p) = self.pending.take() {
            if p.partition_epoch == self.partition_epoch {
                for r in p.new_isr {
                    if !self.isr.contains(&r) && !self.maybe_added.contains(&r) {
                        self.maybe_added.push(r);
                    }
                }
            }
        }
    }

    /// The coordinator answered `proposal` with an error: it did not apply it (Kafka's
    /// INELIGIBLE_REPLICA, INVALID_UPDATE_VERSION, FENCED_LEADER_EPOCH...). If it is still
    /// the change in flight, propose again later; what it would have added leaves the
    /// maximal ISR (unless an earlier proposal whose fate is unknown may have added it).
    /// An answer to an older proposal changes nothing.
    pub fn on_isr_change_refused(&mut self, proposal: &IsrProposal) {
        if self.pending.as_ref() == Some(proposal) {
            self.pending = None;
        }
    }

    pub fn pending_change(&self) -> Option<&IsrProposal> {
        self.pending.as_ref()
    }

    /// Followers' log end offsets (for metrics and tests).
    pub fn follower_leo(&self, replica: NodeId) -> Option<i64> {
        self.followers.get(&replica).map(|f| f.leo)
    }

    /// The broker epoch a follower's progress was made in (for tests).
    pub fn follower_broker_epoch(&self, replica: NodeId) -> Option<BrokerEpoch> {
        self.followers.get(&replica).map(|f| f.broker_epoch)
    }
}

/// Whether two ISRs hold the same replicas (the coordinator keeps its own order).
fn same_members(a: &[NodeId], b: &[NodeId]) -> bool {
    a.len() == b.len() && a.iter().all(|r| b.contains(r))
}

/// Where a follower truncates before fetching from a new leader (KIP-101 / KIP-279).
///
/// `requested_epoch`: the follower's latest epoch (`None`: it has no epochs: keep only
/// what its high watermark proves); `answer`: the leader's
/// OffsetForLeaderEpoch answer (epoch, end offset) for it; `local_end_for`: the
/// follower's own end offset for an epoch (its epoch cache), used when the leader
/// answered with an earlier epoch than asked (KIP-279: the follower may have appended
/// more in that epoch than the leader has, so take the smaller of both ends).
pub fn truncation_offset(
    local_leo: i64,
    local_hw: i64,
    requested_epoch: Option<LeaderEpoch>,
    answer: (LeaderEpoch, i64),
    local_end_for: impl Fn(LeaderEpoch) -> i64,
) -> i64 {
    let Some(requested) = requested_epoch else {
        return local_hw.min(local_leo);
    };
    let (epoch, end) = answer;
    if epoch == UNDEFINED_EPOCH || end == UNDEFINED_OFFSET {
        // The leader knows no epoch at or before ours (Kafka then falls back to the
        // initial fetch offset, the high watermark).
        return local_hw.min(local_leo);
    }
    if epoch == requested {
        end.min(local_leo)
    } else {
        end.min(local_end_for(epoch)).min(local_leo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(ids: &[i32]) -> Vec<NodeId> {
        ids.iter().copied().map(NodeId).collect()
    }

    fn leader(isr: Vec<i32>, leo: i64, now: i64) -> LeaderState {
        LeaderState::new(NodeId(1), LeaderEpoch(5), ids(&[1, 2, 3]), ids(&isr), PartitionEpoch(10), leo, 0, now, 30_000)
    }

    /// Every follower's broker epoch in these tests, unless one restarts.
    const EPOCH: BrokerEpoch = BrokerEpoch(7);

    impl LeaderState {
        /// A fetch from the follower's incarnation with `EPOCH`.
        fn fetch(&mut self, replica: i32, offset: i64, leader_leo: i64, now_ms: i64) -> Option<i64> {
            self.on_follower_fetch(NodeId(replica), EPOCH, offset, leader_leo, now_ms).expect("fetch accepted")
        }

        /// A fetch from `replica`'s incarnation with `broker_epoch`.
        fn fetch_in(
            &mut self,
            replica: i32,
            broker_epoch: BrokerEpoch,
            offset: i64,
            leader_leo: i64,
            now_ms: i64,
        ) -> Result<Option<i64>, FollowerFetchError> {
            self.on_follower_fetch(NodeId(replica), broker_epoch, offset, leader_leo, now_ms)
        }
    }

    #[test]
    fn high_watermark_is_the_minimum_over_the_isr_and_never_moves_back() {
        let mut l = leader(vec![1, 2, 3], 100, 0);
        assert_eq!(l.high_watermark(), 0, "followers have not fetched yet");
        assert_eq!(l.fetch(2, 80, 100, 10), None, "3 has not fetched");
        assert_eq!(l.fetch(3, 60, 100, 10), Some(60));
        assert_eq!(l.fetch(3, 100, 100, 20), Some(80));
        assert_eq!(l.fetch(2, 100, 100, 20), Some(100));
        // A follower that truncated (fetches lower) does not pull the HW back.
        assert_eq!(l.fetch(2, 90, 120, 30), None);
        assert_eq!(l.high_watermark(), 100);
        assert_eq!(l.fetch_in(9, BrokerEpoch(1), 500, 120, 30), Err(FollowerFetchError::NotReplica));
        assert!(!l.is_replica(NodeId(9)));
    }

    #[test]
    fn the_low_watermark_is_the_smallest_log_start_over_the_live_replicas() {
        let mut l = leader(vec![1, 2, 3], 100, 0);
        let all_live = |_: NodeId| true;
        assert_eq!(l.low_watermark(40, all_live), -1, "live followers that said nothing hold it");
        l.fetch(2, 100, 100, 10);
        l.on_follower_log_start(NodeId(2), 40);
        l.fetch(3, 100, 100, 10);
        l.on_follower_log_start(NodeId(3), 25);
        assert_eq!(l.low_watermark(40, all_live), 25);
        // A follower on a broker that is not live does not hold it (Kafka's hasAliveBroker).
        assert_eq!(l.low_watermark(40, |r| r != NodeId(3)), 40);
        l.on_follower_log_start(NodeId(3), 60);
        assert_eq!(l.low_watermark(40, all_live), 40, "never above the leader's own log start");
        l.on_follower_log_start(NodeId(9), 0);
        assert_eq!(l.low_watermark(50, all_live), 40, "a non-replica's word is ignored");
    }

    #[test]
    fn a_single_member_isr_is_its_own_high_watermark() {
        let mut l = leader(vec![1], 100, 0);
        assert_eq!(l.high_watermark(), 100);
        assert_eq!(l.update_high_watermark(150), Some(150));
    }

    #[test]
    fn laggards_leave_and_caught_up_replicas_join_through_the_coordinator() {
        let mut l = leader(vec![1, 2, 3], 100, 0);
        l.fetch(2, 100, 100, 1_000);
        l.fetch(3, 50, 100, 1_000);
        assert_eq!(l.isr_change(20_000), None, "within replica.lag.time.max.ms");
        // Broker 3 keeps fetching but never catches up; 2 stays caught up.
        l.fetch(2, 100, 100, 31_000);
        l.fetch(3, 60, 100, 31_000);
        let p = l.isr_change(31_000).expect("3 lags");
        assert_eq!((p.new_isr.clone(), p.partition_epoch), (ids(&[1, 2]), PartitionEpoch(10)));
        assert_eq!(l.isr_change(31_000), None, "one change in flight at a time");
        assert_eq!(l.high_watermark(), 60, "HW over the committed ISR until the change commits");
        assert_eq!(l.on_isr_committed(ids(&[1, 2]), PartitionEpoch(11), 100, None), Some(100));
        // 3 catches up: reaches the HW and the epoch start offset.
        l.fetch(3, 100, 100, 32_000);
        let p = l.isr_change(32_000).expect("3 is back");
        assert_eq!((p.new_isr, p.partition_epoch), (ids(&[1, 2, 3]), PartitionEpoch(11)));
        l.on_isr_change_failed();
        assert!(l.isr_change(32_000).is_some(), "proposed again after a failure");
    }

    #[test]
    fn a_snapshot_that_skips_partition_epochs_forgets_the_progress_outside_the_isr() {
        // Found by tests/replication_sim.rs (seed 843 with reassignment moves): broker 3
        // was reassigned away (deleting its log) and back between two snapshots the
        // leader saw, with 3 a replica in both; the leader proposed it into the ISR on
        // what it had fetched before, and a later election made it leader with an empty
        // log.
        let mut l = leader(vec![1, 2], 100, 0);
        l.fetch(2, 100, 100, 1_000);
        l.fetch(3, 100, 100, 1_000);
        let p = l.isr_change(1_000).expect("3 caught up");
        l.on_isr_change_refused(&p);
        l.on_follower_log_start(NodeId(3), 0);
        // The next snapshot is one partition epoch on: nothing was missed.
        l.on_isr_committed(ids(&[1, 2]), PartitionEpoch(11), 100, Some(&ids(&[1, 2, 3])));
        assert_eq!(l.isr_change(1_000).expect("3 still caught up").new_isr, ids(&[1, 2, 3]));
        l.on_isr_change_refused(&l.pending_change().cloned().unwrap());
        // Two epochs on: 3 may have left and come back, its progress is gone (its log
        // start too, so DeleteRecords waits for it); ISR members keep theirs.
        l.on_isr_committed(ids(&[1, 2]), PartitionEpoch(13), 100, Some(&ids(&[1, 2, 3])));
        assert_eq!((l.follower_leo(NodeId(3)), l.follower_leo(NodeId(2))), (Some(-1), Some(100)));
        assert_eq!(l.low_watermark(0, |_| true), -1);
        assert_eq!(l.isr_change(1_000), None, "3 has to fetch again first");
        // Its broker epoch stays: a fetch from an older incarnation is still refused.
        assert!(matches!(
            l.fetch_in(3, BrokerEpoch(6), 100, 100, 1_100),
            Err(FollowerFetchError::StaleBrokerEpoch { .. })
        ));
        l.fetch(3, 100, 100, 1_100);
        assert_eq!(l.isr_change(1_100).expect("3 fetched again").new_isr, ids(&[1, 2, 3]));
    }

    #[test]
    fn an_isr_expansion_in_flight_counts_for_the_high_watermark() {
        // Found by tests/replication_sim.rs: the high watermark went past a joining
        // replica's log end while its expansion was in flight; the coordinator committed
        // it, then elected that replica (preferred election, or the leader died), and
        // acknowledged records were gone.
        let mut l = leader(vec![1, 2], 100, 0);
        l.fetch(2, 100, 100, 10);
        l.fetch(3, 100, 100, 10);
        assert_eq!(l.high_watermark(), 100);
        let p = l.isr_change(20).expect("3 caught up");
        assert_eq!(p.new_isr, ids(&[1, 2, 3]));
        // The leader appends; 2 follows, 3 has not fetched yet.
        assert_eq!(l.update_high_watermark(120), None);
        assert_eq!(l.fetch(2, 120, 120, 30), None, "3, maybe in the ISR already, is at 100");
        assert_eq!(l.high_watermark(), 100);
        // A snapshot of the same partition epoch (sent for another reason) settles nothing.
        assert_eq!(l.on_isr_committed(ids(&[1, 2]), PartitionEpoch(10), 120, None), None);
        assert_eq!(l.pending_change(), Some(&p));
        assert_eq!(l.on_isr_committed(ids(&[1, 2, 3]), PartitionEpoch(11), 120, None), None);
        assert_eq!(l.pending_change(), None);
        assert_eq!(l.fetch(3, 120, 120, 40), Some(120));
    }

    #[test]
    fn an_expansion_without_an_answer_counts_until_a_newer_state_settles_it() {
        // Found by tests/replication_sim.rs: the answer to an applied expansion was lost
        // (the leader was cut off from the coordinator), the leader took the timeout for a
        // refusal and let the high watermark pass the new member's log end.
        let mut l = leader(vec![1, 2], 100, 0);
        l.fetch(2, 100, 100, 10);
        l.fetch(3, 100, 100, 10);
        l.isr_change(20).expect("3 caught up");
        l.on_isr_change_failed();
        l.update_high_watermark(120);
        assert_eq!(l.fetch(2, 120, 120, 30), None, "3 may be in the ISR");
        assert!(l.isr_change(40).is_some(), "proposed again");
        l.on_isr_change_failed();
        assert_eq!(
            l.on_isr_committed(ids(&[1, 2]), PartitionEpoch(10), 120, None),
            None,
            "same partition epoch: still unknown"
        );
        // A newer state without 3: the proposal was not applied and cannot be any more.
        assert_eq!(l.on_isr_committed(ids(&[1, 2]), PartitionEpoch(11), 120, None), Some(120));
    }

    #[test]
    fn a_refused_expansion_stops_counting_but_a_stale_refusal_changes_nothing() {
        let mut l = leader(vec![1, 2], 100, 0);
        l.fetch(2, 100, 100, 10);
        l.fetch(3, 100, 100, 10);
        let p = l.isr_change(20).expect("3 caught up");
        let older = IsrProposal { partition_epoch: PartitionEpoch(9), ..p.clone() };
        l.on_isr_change_refused(&older);
        assert_eq!(l.pending_change(), Some(&p), "the answer to another proposal");
        l.update_high_watermark(120);
        assert_eq!(l.fetch(2, 120, 120, 30), None);
        l.on_isr_change_refused(&p);
        assert_eq!(l.pending_change(), None);
        assert_eq!(l.update_high_watermark(120), Some(120), "3 is not in the ISR");
    }

    #[test]
    fn a_replica_that_left_the_isr_rejoins_only_after_fetching_again() {
        // Found by tests/replication_sim.rs: 3 crashed and lost its unsynced suffix; the
        // coordinator took its old incarnation out of the ISR; once it registered again,
        // the leader put it back on the fetch offset it remembered from before the crash,
        // the leader died and 3 was elected without acknowledged records.
        let mut l = leader(vec![1, 2, 3], 100, 0);
        l.fetch(2, 100, 100, 10);
        l.fetch(3, 100, 100, 10);
        assert_eq!(l.high_watermark(), 100);
        assert_eq!(l.on_isr_committed(ids(&[1, 2]), PartitionEpoch(11), 100, None), None);
        assert_eq!(l.follower_leo(NodeId(3)), Some(-1));
        assert_eq!(l.isr_change(20), None, "3 has not fetched since it left");
        l.fetch(3, 0, 100, 30);
        assert_eq!(l.isr_change(40), None, "its log is empty now");
        l.fetch(3, 100, 100, 50);
        assert_eq!(l.isr_change(60).map(|p| p.new_isr), Some(ids(&[1, 2, 3])));
    }

    #[test]
    fn isr_proposals_carry_the_broker_epoch_each_member_fetched_in() {
        let mut l = leader(vec![1, 2], 100, 0);
        l.fetch(2, 100, 100, 10);
        assert_eq!(l.fetch_in(3, BrokerEpoch(8), 100, 100, 10), Ok(None));
        let p = l.isr_change(20).expect("3 caught up");
        assert_eq!(p.new_isr, ids(&[1, 2, 3]));
        assert_eq!(p.broker_epochs, vec![NO_BROKER_EPOCH, EPOCH, BrokerEpoch(8)], "the leader sends none for itself");
    }

    #[test]
    fn a_fetch_from_a_dead_incarnation_is_refused_and_a_new_one_starts_over() {
        // Found by tests/replication_sim.rs (seed 11107): 3, outside the ISR, caught up,
        // crashed and lost its unsynced suffix; the leader kept proposing to add it on the
        // fetch offset of its previous incarnation, and once it registered again the
        // coordinator took the proposal; a preferred election then made 3 leader without
        // committed records. Now the proposal names the old incarnation's broker epoch,
        // which the coordinator refuses, and the new incarnation's fetches start over.
        let mut l = leader(vec![1, 2], 100, 0);
        l.fetch(2, 100, 100, 10);
        l.fetch(3, 100, 100, 10);
        let p = l.isr_change(20).expect("3 caught up");
        assert_eq!(p.broker_epochs, vec![NO_BROKER_EPOCH, EPOCH, EPOCH]);
        // The coordinator refuses it: 3 was fenced, or has registered again since.
        l.on_isr_change_refused(&p);
        // 3's new incarnation (epoch 9) fetches from its empty log.
        assert_eq!(l.fetch_in(3, BrokerEpoch(9), 0, 100, 30), Ok(None));
        assert_eq!((l.follower_leo(NodeId(3)), l.follower_broker_epoch(NodeId(3))), (Some(0), Some(BrokerEpoch(9))));
        assert_eq!(l.isr_change(40), None, "3 must catch up again");
        // A late fetch of the dead incarnation (a long poll answered after the restart).
        assert_eq!(
            l.fetch_in(3, EPOCH, 100, 100, 50),
            Err(FollowerFetchError::StaleBrokerEpoch { broker_epoch: EPOCH, current: BrokerEpoch(9) })
        );
        assert_eq!(l.follower_leo(NodeId(3)), Some(0), "a refused fetch changes nothing");
        assert_eq!(l.fetch_in(3, BrokerEpoch(9), 100, 100, 60), Ok(None));
        let p = l.isr_change(70).expect("3 caught up in its new incarnation");
        assert_eq!(p.broker_epochs, vec![NO_BROKER_EPOCH, EPOCH, BrokerEpoch(9)]);
    }

    #[test]
    fn a_restarted_isr_member_does_not_count_for_the_high_watermark_with_its_old_offset() {
        let mut l = leader(vec![1, 2, 3], 100, 0);
        l.fetch(2, 100, 100, 10);
        l.fetch(3, 90, 100, 10);
        assert_eq!(l.high_watermark(), 90);
        // 3 restarts with 50 records; the coordinator has not taken it out of the ISR yet.
        assert_eq!(l.fetch_in(3, BrokerEpoch(8), 50, 100, 20), Ok(None));
        assert_eq!(l.high_watermark(), 90, "never moves back");
        assert_eq!(l.fetch_in(3, BrokerEpoch(8), 95, 100, 30), Ok(Some(95)));
    }

    #[test]
    fn followers_that_send_no_broker_epoch_are_not_checked() {
        let mut l = leader(vec![1, 2], 100, 0);
        assert_eq!(l.fetch_in(3, NO_BROKER_EPOCH, 100, 100, 10), Ok(None));
        assert_eq!(l.fetch_in(3, EPOCH, 100, 100, 20), Ok(None));
        assert_eq!(l.fetch_in(3, NO_BROKER_EPOCH, 100, 100, 30), Ok(None));
        assert_eq!(l.follower_broker_epoch(NodeId(3)), Some(NO_BROKER_EPOCH));
        l.fetch(2, 100, 100, 30);
        assert_eq!(l.isr_change(40).map(|p| p.broker_epochs), Some(vec![NO_BROKER_EPOCH, EPOCH, NO_BROKER_EPOCH]));
    }

    #[test]
    fn a_follower_that_never_fetches_leaves_the_isr() {
        let mut l = leader(vec![1, 2], 10, 0);
        assert_eq!(l.isr_change(30_001).map(|p| p.new_isr), Some(ids(&[1])));
    }

    #[test]
    fn truncation_follows_epochs_not_the_high_watermark() {
        let e = LeaderEpoch;
        // KIP-101: the follower has [epoch 1: 0..10), HW 5; the leader answers epoch 1 ends
        // at 8: truncate to 8, not to the HW.
        assert_eq!(truncation_offset(10, 5, Some(e(1)), (e(1), 8), |_| 10), 8);
        // The leader has more in our epoch than we do: keep everything.
        assert_eq!(truncation_offset(10, 5, Some(e(1)), (e(1), 12), |_| 10), 10);
        // KIP-279: we are at epoch 3 which the leader never had; it answers epoch 2 ending
        // at 20, and our epoch 2 ended at 15: truncate to 15.
        assert_eq!(truncation_offset(30, 5, Some(e(3)), (e(2), 20), |x| if x == e(2) { 15 } else { 30 }), 15);
        // The leader knows no epoch at or before ours: only what the HW proves.
        assert_eq!(truncation_offset(30, 5, Some(e(3)), (UNDEFINED_EPOCH, UNDEFINED_OFFSET), |_| 30), 5);
        // No epochs at all: only what the HW proves.
        assert_eq!(truncation_offset(30, 5, None, (e(1), 8), |_| 30), 5);
    }
}
