//! One replica of a partition as a state machine with no I/O: the broker's role in it
//! (leader, follower or neither, from the coordinator's partition state), the high
//! watermark it serves, its acks=all waiters and, as a follower, what its fetcher does
//! next. Events go in (partition state, a follower's fetch, a local append, an ISR
//! result, an OffsetForLeaderEpoch or Fetch answer, the clock); what the owner must do
//! comes out (record a leader epoch, start a fetcher, answer waiters, truncate, append,
//! start over at the leader's log start). `src/shard` applies it to the log and
//! `src/server` owns the sockets and timers; tests/replication_sim.rs drives this same
//! machine with a model log and a simulated network.
//!
//! `W` is whatever answers an acks=all produce: a channel on the broker, a request id in
//! the simulation.

use crate::coordinator::controller::PartitionState;
use crate::model::{BrokerEpoch, LeaderEpoch, NodeId, PartitionEpoch};

use super::{truncation_offset, FollowerFetchError, IsrProposal, LeaderState};

/// Why an acks=all produce was answered without success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckError {
    /// Written and replicated to the ISR, but the ISR shrank below min.insync.replicas.
    NotEnoughReplicasAfterAppend,
    /// This replica stopped leading before the high watermark covered the batch.
    NotLeader,
}

/// Why a request for the leader was refused (KIP-320 checks included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleError {
    NotLeader,
    /// The request's leader epoch is older than this leader's.
    FencedLeaderEpoch {
        request: LeaderEpoch,
        current: LeaderEpoch,
    },
    /// The request's leader epoch is newer than this leader's (we have not heard yet).
    UnknownLeaderEpoch {
        request: LeaderEpoch,
        current: LeaderEpoch,
    },
}

/// Why a produce was refused before anything was appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendRefusal {
    NotLeader,
    /// acks=all with fewer in-sync replicas than min.insync.replicas.
    NotEnoughReplicas {
        isr: usize,
        min: usize,
    },
}

/// Why a follower's fetch was refused (nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchRefusal {
    Role(RoleError),
    Follower(FollowerFetchError),
}

/// acks=all produces answered, with their outcome.
pub type Answers<W> = Vec<(W, Result<(), AckError>)>;

/// The role of this broker in a partition.
#[derive(Debug)]
pub enum Role {
    Leader(LeaderState),
    Follower(Follower),
    /// Offline (no leader), or not known yet.
    None,
}

/// What a role change asks of the owner.
#[derive(Debug)]
pub struct RoleChange<W> {
    /// Record this leader epoch at the log end (a new leader epoch begins here).
    pub record_leader_epoch: Option<LeaderEpoch>,
    /// Follow (leader, leader epoch): its fetcher must carry this partition.
    pub start_fetcher: Option<(NodeId, LeaderEpoch)>,
    pub answers: Answers<W>,
    /// The role was taken now (false: unchanged, or an ISR update within it).
    pub took_role: bool,
}

impl<W> RoleChange<W> {
    fn none() -> Self {
        Self { record_leader_epoch: None, start_fetcher: None, answers: Vec::new(), took_role: false }
    }
}

/// One replica (see the module comment).
#[derive(Debug)]
pub struct Replica<W> {
    role: Role,
    /// A follower's high watermark, as its leader last told it (also what a broker
    /// restarts with: its checkpoint).
    follower_hw: i64,
    /// The topic's min.insync.replicas.
    min_insync: usize,
    /// acks=all answers waiting for the high watermark to pass their last offset.
    waiters: Vec<(i64, W)>,
}

impl<W> Replica<W> {
    /// A replica with no role yet that knew `high_watermark` (its checkpoint; 0 if none).
    pub fn new(high_watermark: i64, min_insync: usize) -> Self {
        Self { role: Role::None, follower_hw: high_watermark, min_insync: min_insync.max(1), waiters: Vec::new() }
    }

    pub fn role(&self) -> &Role {
        &self.role
    }

    pub fn min_insync(&self) -> usize {
        self.min_insync
    }

    pub fn set_min_insync(&mut self, min_insync: usize) {
        self.min_insync = min_insync.max(1);
    }

    pub fn leader_state(&self) -> Option<&LeaderState> {
        match &self.role {
            Role::Leader(l) => Some(l),
            _ => None,
        }
    }

    pub fn follower(&self) -> Option<&Follower> {
        match &self.role {
            Role::Follower(f) => Some(f),
            _ => None,
        }
    }

    /// What consumers may read up to: the leader's high watermark, or what a follower
    /// was told (never above its log end `log_end`).
    pub fn high_watermark(&self, log_end: i64) -> i64 {
        match &self.role {
            Role::Leader(l) => l.high_watermark(),
            _ => self.follower_hw.min(log_end),
        }
    }

    /// The leader state, checked against a request's `current_leader_epoch`
    /// (`LeaderEpoch::UNDEFINED`, or any negative epoch: no check) as KIP-320 says.
    pub fn leader(&mut self, current_leader_epoch: LeaderEpoch) -> Result<&mut LeaderState, RoleError> {
        let Role::Leader(l) = &mut self.role else { return Err(RoleError::NotLeader) };
        let current = l.leader_epoch();
        if current_leader_epoch.get() >= 0 && current_leader_epoch < current {
            return Err(RoleError::FencedLeaderEpoch { request: current_leader_epoch, current });
        }
        if current_leader_epoch > current {
            return Err(RoleError::UnknownLeaderEpoch { request: current_leader_epoch, current });
        }
        Ok(l)
    }

    /// Whether this replica follows `leader` in `leader_epoch` (a fetcher's answer for
    /// anything else is stale).
    pub fn follows(&self, leader: NodeId, leader_epoch: LeaderEpoch) -> bool {
        matches!(&self.role, Role::Follower(f) if f.leader == leader && f.leader_epoch == leader_epoch)
    }

    /// The follower state for (`leader`, `leader_epoch`), if this replica follows it.
    pub fn follower_mut(&mut self, leader: NodeId, leader_epoch: LeaderEpoch) -> Option<&mut Follower> {
        match &mut self.role {
            Role::Follower(f) if f.leader == leader && f.leader_epoch == leader_epoch => Some(f),
            _ => None,
        }
    }

    /// The coordinator's state of the partition: `Some((replicas, state))`, or `None`
    /// when this broker may take no role in it (unknown, or not registered yet). `me`:
    /// this broker; `log_end`: the leader's written log end; `log_start`: its log start.
    #[allow(clippy::too_many_arguments)]
    pub fn on_partition_state(
        &mut self,
        me: NodeId,
        state: Option<(&[NodeId], &PartitionState)>,
        log_end: i64,
        log_start: i64,
        now_ms: i64,
        replica_lag_time_max_ms: i64,
    ) -> RoleChange<W> {
        let mut change = RoleChange::none();
        let Some((replicas, state)) = state else {
            self.step_down(None, &mut change);
            return change;
        };
        if state.leader == me {
            if let Role::Leader(l) = &mut self.role {
                if l.leader_epoch() == state.leader_epoch {
                    if l.on_isr_committed(state.isr.clone(), state.partition_epoch, log_end, Some(replicas)).is_some() {
                        self.release(&mut change.answers);
                    }
                    return change;
                }
            }
            // This broker leads a new epoch: it starts at the current log end (Kafka's
            // makeLeader), with the high watermark it knew.
            let hw = self.high_watermark(log_end).max(log_start);
            self.role = Role::Leader(LeaderState::new(
                me,
                state.leader_epoch,
                replicas.to_vec(),
                state.isr.clone(),
                state.partition_epoch,
                log_end,
                hw,
                now_ms,
                replica_lag_time_max_ms,
            ));
            change.record_leader_epoch = Some(state.leader_epoch);
            change.took_role = true;
            self.release(&mut change.answers);
        } else if state.leader.get() >= 0 {
            if self.follows(state.leader, state.leader_epoch) {
                return change;
            }
            self.step_down(Some(Follower::new(state.leader, state.leader_epoch)), &mut change);
            change.start_fetcher = Some((state.leader, state.leader_epoch));
            change.took_role = true;
        } else {
            self.step_down(None, &mut change);
        }
        change
    }

    /// Leave the leadership (keeping its high watermark as a follower's) for `follower`
    /// or no role; waiting acks=all produces fail.
    fn step_down(&mut self, follower: Option<Follower>, change: &mut RoleChange<W>) {
        if let Role::Leader(l) = &self.role {
            self.follower_hw = l.high_watermark();
        }
        change.answers.extend(self.fail_waiters());
        self.role = match follower {
            Some(f) => Role::Follower(f),
            None => Role::None,
        };
    }

    /// Answer every waiting acks=all produce with NotLeader (the replica steps down or
    /// closes).
    pub fn fail_waiters(&mut self) -> Answers<W> {
        self.waiters.drain(..).map(|(_, w)| (w, Err(AckError::NotLeader))).collect()
    }

    /// Before an append: the leader epoch to stamp, or why this replica may not append
    /// (`acks_all`: the produce waits for the ISR, which must hold min.insync.replicas).
    pub fn may_append(&self, acks_all: bool) -> Result<LeaderEpoch, AppendRefusal> {
        let Role::Leader(l) = &self.role else { return Err(AppendRefusal::NotLeader) };
        if acks_all && l.isr().len() < self.min_insync {
            return Err(AppendRefusal::NotEnoughReplicas { isr: l.isr().len(), min: self.min_insync });
        }
        Ok(l.leader_epoch())
    }

    /// An acks=all produce whose last offset is `last_offset` waits for the high
    /// watermark to pass it (answered at once if it already has). `log_end`: the
    /// leader's written log end.
    pub fn wait_for_high_watermark(&mut self, last_offset: i64, waiter: W, log_end: i64) -> Answers<W> {
        self.waiters.push((last_offset, waiter));
        self.on_appended(log_end)
    }

    /// The leader's written log end moved to `log_end`: the high watermark may move.
    pub fn on_appended(&mut self, log_end: i64) -> Answers<W> {
        let mut answers = Vec::new();
        if let Role::Leader(l) = &mut self.role {
            l.update_high_watermark(log_end);
            self.release(&mut answers);
        }
        answers
    }

    /// A follower's fetch reached the leader: checked against the request's leader epoch
    /// and the follower's broker epoch, then its progress counts. Returns the high
    /// watermark after it and the produces it released.
    pub fn on_follower_fetch(
        &mut self,
        current_leader_epoch: LeaderEpoch,
        follower: NodeId,
        broker_epoch: BrokerEpoch,
        fetch_offset: i64,
        log_end: i64,
        now_ms: i64,
    ) -> Result<(i64, Answers<W>), FetchRefusal> {
        let l = self.leader(current_leader_epoch).map_err(FetchRefusal::Role)?;
        let moved = l
            .on_follower_fetch(follower, broker_epoch, fetch_offset, log_end, now_ms)
            .map_err(FetchRefusal::Follower)?;
        let hw = l.high_watermark();
        let mut answers = Vec::new();
        if moved.is_some() {
            self.release(&mut answers);
        }
        Ok((hw, answers))
    }

    /// A follower's accepted fetch said its log start offset (see
    /// `LeaderState::on_follower_log_start`); nothing unless this replica leads.
    pub fn on_follower_log_start(&mut self, follower: NodeId, log_start: i64) {
        if let Role::Leader(l) = &mut self.role {
            l.on_follower_log_start(follower, log_start);
        }
    }

    /// The ISR change due now, if this replica leads and one is.
    pub fn isr_change(&mut self, now_ms: i64) -> Option<IsrProposal> {
        match &mut self.role {
            Role::Leader(l) => l.isr_change(now_ms),
            _ => None,
        }
    }

    /// The coordinator's answer to `proposal`: committed (the ISR and its partition
    /// epoch), refused (it certainly did not commit), or unknown (no answer: it may
    /// have).
    pub fn on_isr_result(&mut self, proposal: &IsrProposal, outcome: IsrOutcome, log_end: i64) -> Answers<W> {
        let mut answers = Vec::new();
        let Role::Leader(l) = &mut self.role else { return answers };
        match outcome {
            IsrOutcome::Committed(isr, partition_epoch) => {
                if l.on_isr_committed(isr, partition_epoch, log_end, None).is_some() {
                    self.release(&mut answers);
                }
            }
            IsrOutcome::Refused => l.on_isr_change_refused(proposal),
            IsrOutcome::Unknown => l.on_isr_change_failed(),
        }
        answers
    }

    /// Answer the acks=all produces the high watermark covers: success if the ISR holds
    /// min.insync.replicas, NOT_ENOUGH_REPLICAS_AFTER_APPEND if it shrank below.
    fn release(&mut self, answers: &mut Answers<W>) {
        let Role::Leader(l) = &self.role else { return };
        let hw = l.high_watermark();
        let enough = l.isr().len() >= self.min_insync;
        let mut kept = Vec::with_capacity(self.waiters.len());
        for (last, w) in self.waiters.drain(..) {
            if last < hw {
                answers.push((w, if enough { Ok(()) } else { Err(AckError::NotEnoughReplicasAfterAppend) }));
            } else {
                kept.push((last, w));
            }
        }
        self.waiters = kept;
    }

    /// A follower truncated its log to `offset`.
    pub fn on_truncated(&mut self, offset: i64) {
        self.follower_hw = self.follower_hw.min(offset);
    }

    /// A follower appended what it fetched (its log now ends at `log_end`) and learnt
    /// the leader's high watermark `leader_hw`.
    pub fn on_fetched(&mut self, leader_hw: i64, log_end: i64) {
        self.follower_hw = leader_hw.min(log_end).max(self.follower_hw.min(log_end));
    }

    /// A follower dropped its log and starts over, empty, at the leader's log start
    /// `offset`: everything below it is the leader's to have.
    pub fn on_started_over(&mut self, offset: i64) {
        self.follower_hw = self.follower_hw.max(offset);
    }
}

/// How an AlterPartition ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsrOutcome {
    Committed(Vec<NodeId>, PartitionEpoch),
    /// The coordinator answered with an error.
    Refused,
    /// No answer (unreachable, timed out): it may have committed.
    Unknown,
}

/// A follower's log as its fetcher needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerLog {
    pub log_end_offset: i64,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub latest_epoch: Option<LeaderEpoch>,
}

/// What a follower's fetcher does next for a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowerStep {
    /// Nothing now (after an error, until its backoff ends).
    Wait,
    /// It has no leader epochs: keep only what its high watermark proves, then fetch.
    TruncateTo(i64),
    /// Ask the leader where `latest_epoch` (ours) ends in its log (OffsetForLeaderEpoch).
    AskEpoch { latest_epoch: LeaderEpoch },
    /// Fetch from the log end.
    Fetch,
}

/// Where the leader's OffsetForLeaderEpoch answer leaves a follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncation {
    /// Truncate the log to this offset (at the log end too: an epoch may start there).
    pub offset: i64,
    /// Fetching may start once truncated; false: ask again with the new latest epoch
    /// (the leader answered an earlier epoch than asked: KIP-279).
    pub done: bool,
}

/// What a follower does when its fetch offset is outside the leader's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfRange {
    /// Its log ends below the leader's log start: drop it and start over, empty, there
    /// (Kafka's truncateFullyAndStartAt).
    StartOver(i64),
    /// Its log end is not in the leader's log otherwise: truncate by epoch again (never
    /// throw away what may be committed).
    TruncateAgain,
}

/// A follower's side of a partition: truncation by leader epoch first (KIP-101,
/// KIP-279), never by high watermark, then fetching; an error on the partition pauses it
/// and makes it truncate again.
#[derive(Debug, Clone)]
pub struct Follower {
    pub leader: NodeId,
    pub leader_epoch: LeaderEpoch,
    /// Truncated by leader epoch for this epoch: it may fetch.
    truncated: bool,
    /// After an error: nothing until then (ms).
    retry_at_ms: Option<i64>,
    last_error: String,
}

impl Follower {
    fn new(leader: NodeId, leader_epoch: LeaderEpoch) -> Self {
        Self { leader, leader_epoch, truncated: false, retry_at_ms: None, last_error: String::new() }
    }

    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// What to do next, given the follower's log.
    pub fn step(&self, now_ms: i64, log: &FollowerLog) -> FollowerStep {
        if self.retry_at_ms.is_some_and(|t| now_ms < t) {
            return FollowerStep::Wait;
        }
        if self.truncated {
            return FollowerStep::Fetch;
        }
        match log.latest_epoch {
            Some(latest_epoch) => FollowerStep::AskEpoch { latest_epoch },
            None => FollowerStep::TruncateTo(log.high_watermark.min(log.log_end_offset)),
        }
    }

    /// The leader answered (epoch, end offset) for our `asked` latest epoch; `local_end_for`
    /// gives our own end offset for an epoch. The owner truncates to the offset, then
    /// calls `on_truncated`.
    pub fn on_epoch_answer(
        &self,
        asked: LeaderEpoch,
        answer: (LeaderEpoch, i64),
        log: &FollowerLog,
        local_end_for: impl Fn(LeaderEpoch) -> i64,
    ) -> Truncation {
        let offset = truncation_offset(log.log_end_offset, log.high_watermark, Some(asked), answer, local_end_for);
        let (epoch, _) = answer;
        // KIP-279: when the leader answered an earlier epoch, ask again with our new
        // latest (unless nothing was cut: then our latest is still the one asked).
        let done = epoch == asked || offset >= log.log_end_offset || epoch.get() < 0;
        Truncation { offset, done }
    }

    /// The log was truncated as `Truncation` (or `TruncateTo`) said.
    pub fn on_truncated(&mut self, done: bool) {
        if done {
            self.truncated = true;
            self.retry_at_ms = None;
        }
    }

    /// The partition's fetch succeeded: the next error is news again.
    pub fn on_fetched(&mut self) {
        self.last_error.clear();
    }

    /// An error on this partition alone: it truncates again after `backoff_ms`. Returns
    /// whether the error is new (worth a log line).
    pub fn on_error(&mut self, now_ms: i64, backoff_ms: i64, error: String) -> bool {
        self.truncated = false;
        self.retry_at_ms = Some(now_ms + backoff_ms);
        if self.last_error == error {
            return false;
        }
        self.last_error = error;
        true
    }

    /// The fetch offset was out of the leader's range and the leader's log starts at
    /// `leader_log_start`.
    pub fn on_out_of_range(&self, leader_log_start: i64, log: &FollowerLog) -> OutOfRange {
        if log.log_end_offset < leader_log_start {
            OutOfRange::StartOver(leader_log_start)
        } else {
            OutOfRange::TruncateAgain
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::NO_BROKER_EPOCH;

    const ME: NodeId = NodeId(1);
    const LAG_MS: i64 = 30_000;
    const REPLICAS: [NodeId; 3] = [NodeId(1), NodeId(2), NodeId(3)];

    fn ids(ids: &[i32]) -> Vec<NodeId> {
        ids.iter().copied().map(NodeId).collect()
    }

    fn state(leader: i32, leader_epoch: i32, isr: Vec<i32>, partition_epoch: i32) -> PartitionState {
        PartitionState {
            leader: NodeId(leader),
            leader_epoch: LeaderEpoch(leader_epoch),
            isr: ids(&isr),
            partition_epoch: PartitionEpoch(partition_epoch),
            controller_epoch: 0,
        }
    }

    fn lead(r: &mut Replica<u32>, epoch: i32, isr: Vec<i32>, log_end: i64) -> RoleChange<u32> {
        r.on_partition_state(ME, Some((&REPLICAS, &state(ME.0, epoch, isr, 1))), log_end, 0, 0, LAG_MS)
    }

    /// A fetch from follower `follower` that sends no broker epoch, checked against
    /// `current_leader_epoch`.
    fn fetch(
        r: &mut Replica<u32>,
        current_leader_epoch: i32,
        follower: i32,
        fetch_offset: i64,
        log_end: i64,
        now_ms: i64,
    ) -> Result<(i64, Answers<u32>), FetchRefusal> {
        r.on_follower_fetch(
            LeaderEpoch(current_leader_epoch),
            NodeId(follower),
            NO_BROKER_EPOCH,
            fetch_offset,
            log_end,
            now_ms,
        )
    }

    #[test]
    fn a_new_leader_records_its_epoch_starts_from_the_high_watermark_it_knew_and_answers_when_it_moves() {
        let mut r: Replica<u32> = Replica::new(40, 2);
        let change = lead(&mut r, 3, vec![1, 2], 100);
        assert_eq!(change.record_leader_epoch, Some(LeaderEpoch(3)));
        assert!(change.took_role && change.start_fetcher.is_none());
        assert_eq!(r.high_watermark(100), 40, "the checkpointed high watermark");
        assert!(r.wait_for_high_watermark(99, 7, 100).is_empty(), "2 has not fetched the batch");
        let (hw, answers) = fetch(&mut r, 3, 2, 100, 100, 10).unwrap();
        assert_eq!((hw, answers), (100, vec![(7, Ok(()))]));
        // The same state again changes nothing.
        let again = lead(&mut r, 3, vec![1, 2], 100);
        assert!(!again.took_role && again.record_leader_epoch.is_none());
    }

    #[test]
    fn produces_are_refused_below_min_insync_and_released_with_an_error_after_a_shrink() {
        let mut r: Replica<u32> = Replica::new(0, 2);
        lead(&mut r, 1, vec![1], 0);
        assert_eq!(r.may_append(true), Err(AppendRefusal::NotEnoughReplicas { isr: 1, min: 2 }));
        assert_eq!(r.may_append(false), Ok(LeaderEpoch(1)));
        lead(&mut r, 1, vec![1, 2], 0);
        assert_eq!(r.may_append(true), Ok(LeaderEpoch(1)));
        assert!(r.wait_for_high_watermark(9, 1, 10).is_empty());
        // The coordinator takes 2 out: the high watermark is the leader's log end, but the
        // ISR is below min.insync.replicas.
        let answers = r.on_isr_result(
            &IsrProposal {
                new_isr: ids(&[1]),
                broker_epochs: vec![NO_BROKER_EPOCH],
                leader_epoch: LeaderEpoch(1),
                partition_epoch: PartitionEpoch(1),
            },
            IsrOutcome::Committed(ids(&[1]), PartitionEpoch(2)),
            10,
        );
        assert_eq!(answers, vec![(1, Err(AckError::NotEnoughReplicasAfterAppend))]);
    }

    #[test]
    fn stepping_down_fails_the_waiters_keeps_the_high_watermark_and_starts_a_fetcher() {
        let mut r: Replica<u32> = Replica::new(0, 1);
        lead(&mut r, 1, vec![1, 2], 10);
        fetch(&mut r, 1, 2, 5, 10, 1).unwrap();
        assert_eq!(r.high_watermark(10), 5);
        assert!(r.wait_for_high_watermark(9, 4, 10).is_empty());
        let change = r.on_partition_state(ME, Some((&REPLICAS, &state(2, 2, vec![2], 2))), 10, 0, 5, LAG_MS);
        assert_eq!(change.answers, vec![(4, Err(AckError::NotLeader))]);
        assert_eq!(change.start_fetcher, Some((NodeId(2), LeaderEpoch(2))));
        assert!(r.follows(NodeId(2), LeaderEpoch(2)) && !r.follows(NodeId(2), LeaderEpoch(1)));
        assert_eq!(r.high_watermark(10), 5, "a follower keeps the high watermark it led with");
        assert_eq!(r.leader(LeaderEpoch::UNDEFINED).err(), Some(RoleError::NotLeader));
        // Offline, then unknown: no role.
        r.on_partition_state(ME, Some((&REPLICAS, &state(-1, 3, vec![], 3))), 10, 0, 6, LAG_MS);
        assert!(matches!(r.role(), Role::None));
        r.on_partition_state(ME, None, 10, 0, 6, LAG_MS);
        assert!(matches!(r.role(), Role::None));
    }

    #[test]
    fn requests_are_checked_against_the_leader_epoch() {
        let mut r: Replica<u32> = Replica::new(0, 1);
        lead(&mut r, 5, vec![1], 0);
        assert!(r.leader(LeaderEpoch::UNDEFINED).is_ok() && r.leader(LeaderEpoch(5)).is_ok());
        let (four, five, six) = (LeaderEpoch(4), LeaderEpoch(5), LeaderEpoch(6));
        assert_eq!(r.leader(four).err(), Some(RoleError::FencedLeaderEpoch { request: four, current: five }));
        assert_eq!(r.leader(six).err(), Some(RoleError::UnknownLeaderEpoch { request: six, current: five }));
        assert_eq!(
            fetch(&mut r, 4, 2, 0, 0, 1).err(),
            Some(FetchRefusal::Role(RoleError::FencedLeaderEpoch { request: four, current: five }))
        );
        assert_eq!(fetch(&mut r, 5, 9, 0, 0, 1).err(), Some(FetchRefusal::Follower(FollowerFetchError::NotReplica)));
    }

    fn follower_log(leo: i64, hw: i64, latest_epoch: Option<i32>) -> FollowerLog {
        FollowerLog {
            log_end_offset: leo,
            high_watermark: hw,
            log_start_offset: 0,
            latest_epoch: latest_epoch.map(LeaderEpoch),
        }
    }

    #[test]
    fn a_follower_truncates_by_epoch_before_it_fetches_and_again_after_an_error() {
        let e = LeaderEpoch;
        let mut r: Replica<u32> = Replica::new(0, 1);
        r.on_partition_state(ME, Some((&REPLICAS, &state(2, 4, vec![2, 1], 1))), 50, 0, 0, LAG_MS);
        let log = follower_log(50, 20, Some(3));
        let f = r.follower_mut(NodeId(2), e(4)).unwrap();
        assert_eq!(f.step(0, &log), FollowerStep::AskEpoch { latest_epoch: e(3) });
        // The leader has epoch 3 ending at 40: cut to 40, done.
        let t = f.on_epoch_answer(e(3), (e(3), 40), &log, |_| unreachable!());
        assert_eq!(t, Truncation { offset: 40, done: true });
        f.on_truncated(t.done);
        assert_eq!(f.step(0, &log), FollowerStep::Fetch);
        // An error on the partition: wait, then truncate again.
        assert!(f.on_error(100, 200, "boom".into()));
        assert!(!f.on_error(100, 200, "boom".into()), "the same error is not news");
        assert_eq!(f.step(299, &log), FollowerStep::Wait);
        assert_eq!(f.step(300, &log), FollowerStep::AskEpoch { latest_epoch: e(3) });
        // KIP-279: the leader answers an earlier epoch: cut where both end, ask again.
        let t = f.on_epoch_answer(e(3), (e(2), 30), &log, |x| if x == e(2) { 25 } else { -1 });
        assert_eq!(t, Truncation { offset: 25, done: false });
        f.on_truncated(t.done);
        assert_eq!(f.step(300, &log), FollowerStep::AskEpoch { latest_epoch: e(3) });
        // No epochs at all: keep only the high watermark.
        assert_eq!(f.step(300, &follower_log(50, 20, None)), FollowerStep::TruncateTo(20));
        // The leader knows no epoch at or below ours: the high watermark too.
        assert_eq!(
            f.on_epoch_answer(e(3), (LeaderEpoch::UNDEFINED, -1), &log, |_| -1),
            Truncation { offset: 20, done: true }
        );
    }

    #[test]
    fn a_follower_below_the_leaders_log_start_starts_over_there() {
        let f = Follower::new(NodeId(2), LeaderEpoch(1));
        assert_eq!(f.on_out_of_range(100, &follower_log(40, 40, Some(1))), OutOfRange::StartOver(100));
        assert_eq!(f.on_out_of_range(100, &follower_log(100, 40, Some(1))), OutOfRange::TruncateAgain);
        let mut r: Replica<u32> = Replica::new(10, 1);
        r.on_started_over(100);
        assert_eq!(r.high_watermark(100), 100);
        r.on_truncated(50);
        r.on_fetched(70, 60);
        assert_eq!(r.high_watermark(60), 60, "never above the log end");
    }
}
