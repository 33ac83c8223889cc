//! The group state machine (Kafka's classic protocol), and the coordinator that holds
//! every group of the shard: a group of the consumer protocol (KIP-848) keeps its
//! members in `consumer::ConsumerGroup` (`Group::consumer`), its offsets here.
//!
//! States, as Kafka names them:
//!   Empty --join--> PreparingRebalance --all joined or rebalance timeout--> CompletingRebalance
//!   CompletingRebalance --leader's SyncGroup--> Stable
//!   Stable / CompletingRebalance --member joins, leaves, changes protocols or times out--> PreparingRebalance
//!   PreparingRebalance --no members left--> Empty
//! Invariants: a member awaits at most one join and one sync answer; `generation` only
//! grows; the leader is a member whenever the group is CompletingRebalance or Stable.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use futures::channel::oneshot;

use super::consumer::{
    ConsumerGroup, ConsumerGroupConfig, ConsumerGroupDescription, ConsumerHeartbeat, ConsumerHeartbeatResponse,
    ConsumerRefusal, TopicsImage,
};
use super::consumer_records::ConsumerRecord;
use super::records::{self, StoredGroup, StoredMember, StoredOffset};
use super::txn_offsets::TxnOffsets;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    #[error("UNKNOWN_MEMBER_ID")]
    UnknownMemberId,
    #[error("ILLEGAL_GENERATION")]
    IllegalGeneration,
    #[error("REBALANCE_IN_PROGRESS")]
    RebalanceInProgress,
    #[error("FENCED_INSTANCE_ID")]
    FencedInstanceId,
    #[error("MEMBER_ID_REQUIRED")]
    MemberIdRequired,
    #[error("INCONSISTENT_GROUP_PROTOCOL")]
    InconsistentGroupProtocol,
    #[error("INVALID_SESSION_TIMEOUT")]
    InvalidSessionTimeout,
    #[error("GROUP_ID_NOT_FOUND")]
    GroupIdNotFound,
    #[error("NON_EMPTY_GROUP")]
    NonEmptyGroup,
    #[error("GROUP_SUBSCRIBED_TO_TOPIC")]
    GroupSubscribedToTopic,
    #[error("OFFSET_METADATA_TOO_LARGE")]
    OffsetMetadataTooLarge,
    #[error("INVALID_GROUP_ID")]
    InvalidGroupId,
    #[error("GROUP_MAX_SIZE_REACHED")]
    GroupMaxSizeReached,
    /// OffsetFetch with `require_stable`: an open transaction holds an offset for the
    /// partition (KIP-447).
    #[error("UNSTABLE_OFFSET_COMMIT")]
    UnstableOffsetCommit,
    /// KIP-848: a heartbeat's member epoch is neither the member's nor its previous one.
    #[error("FENCED_MEMBER_EPOCH")]
    FencedMemberEpoch,
    /// KIP-848: OffsetCommit/OffsetFetch v9 with another epoch than the member's.
    #[error("STALE_MEMBER_EPOCH")]
    StaleMemberEpoch,
    #[error("UNRELEASED_INSTANCE_ID")]
    UnreleasedInstanceId,
    #[error("UNSUPPORTED_ASSIGNOR")]
    UnsupportedAssignor,
    #[error("INVALID_REGULAR_EXPRESSION")]
    InvalidRegularExpression,
    #[error("INVALID_REQUEST")]
    InvalidRequest,
    /// KIP-848: a consumer-protocol member committing with OffsetCommit below v9.
    #[error("UNSUPPORTED_VERSION")]
    UnsupportedVersion,
}

#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// group.initial.rebalance.delay.ms (Kafka: 3000)
    pub initial_rebalance_delay_ms: i64,
    /// group.min.session.timeout.ms (6000) and group.max.session.timeout.ms (1800000)
    pub session_timeout_min_ms: i32,
    pub session_timeout_max_ms: i32,
    /// offsets.retention.minutes (7 days), in ms
    pub offsets_retention_ms: i64,
    /// offset.metadata.max.bytes (4096)
    pub offset_metadata_bytes_max: usize,
    /// group.max.size
    pub group_members_max: usize,
    /// group.consumer.*: groups of the consumer protocol (KIP-848).
    pub consumer: ConsumerGroupConfig,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            initial_rebalance_delay_ms: 3000,
            session_timeout_min_ms: 6000,
            session_timeout_max_ms: 1_800_000,
            offsets_retention_ms: 7 * 24 * 3600 * 1000,
            offset_metadata_bytes_max: 4096,
            group_members_max: 1000,
            consumer: ConsumerGroupConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// An answer now, or later (when the rebalance or the leader's assignment comes).
pub enum Deferred<T> {
    Now(T),
    Later(oneshot::Receiver<T>),
}

#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub group_id: String,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub client_id: String,
    pub client_host: String,
    /// JoinGroup v4+: a new dynamic member must first learn its id (KIP-394).
    pub require_known_member_id: bool,
    /// JoinGroup v8+ (KIP-800): why the client joins, logged with the rebalance it starts.
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct JoinResponse {
    pub error: Option<GroupError>,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Only the leader gets the members: (member id, instance id, metadata).
    pub members: Vec<(String, Option<String>, Bytes)>,
    /// KIP-814 (JoinGroup v9): the leader is a static member that rejoined a stable
    /// group; it keeps its role (watching the metadata) but runs no assignment.
    pub skip_assignment: bool,
}

impl JoinResponse {
    fn error(e: GroupError, member_id: &str) -> Self {
        Self { error: Some(e), generation_id: -1, member_id: member_id.to_string(), ..Default::default() }
    }
}

#[derive(Debug, Clone)]
pub struct SyncRequest {
    pub group_id: String,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignments: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone, Default)]
pub struct SyncResponse {
    pub error: Option<GroupError>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncResponse {
    fn error(e: GroupError) -> Self {
        Self { error: Some(e), ..Default::default() }
    }
}

/// A member as DescribeGroups shows it.
#[derive(Debug, Clone)]
pub struct MemberDescription {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// What DescribeGroups and ConsumerGroupDescribe find: a group of either protocol.
#[derive(Debug, Clone)]
pub enum Described {
    Classic(GroupDescription),
    Consumer(ConsumerGroupDescription),
}

impl Described {
    /// The description of a classic group (None for a consumer group).
    pub fn classic(self) -> Option<GroupDescription> {
        match self {
            Described::Classic(d) => Some(d),
            Described::Consumer(_) => None,
        }
    }
}

/// A group as ListGroups shows it.
#[derive(Debug, Clone)]
pub struct ListedGroup {
    pub group_id: String,
    pub protocol_type: String,
    pub state: &'static str,
    /// ListGroups v5: "classic" or "consumer".
    pub group_type: &'static str,
}

#[derive(Debug, Clone)]
pub struct GroupDescription {
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
}

struct Member {
    id: String,
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    protocol_type: String,
    protocols: Vec<(String, Bytes)>,
    session_timeout_ms: i32,
    rebalance_timeout_ms: i32,
    assignment: Bytes,
    last_heartbeat_ms: i64,
    awaiting_join: Option<oneshot::Sender<JoinResponse>>,
    awaiting_sync: Option<oneshot::Sender<SyncResponse>>,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|(n, _)| n == protocol).map(|(_, m)| m.clone()).unwrap_or_default()
    }
}

struct Group {
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    /// In join order: the first member becomes leader when a leader is needed.
    members: Vec<Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, with when they expire.
    pending_member_ids: HashMap<String, i64>,
    rebalance_deadline_ms: i64,
    initial_delay_until_ms: Option<i64>,
    state_timestamp_ms: i64,
    offsets: BTreeMap<(String, i32), Committed>,
    /// Join phases completed since this coordinator took the group.
    rebalances: u64,
    /// Some: a group of the consumer protocol (KIP-848), whose members and assignments
    /// live there; the classic fields above stay empty (state Empty). The offsets are
    /// the group's whichever its protocol.
    consumer: Option<ConsumerGroup>,
}

impl Group {
    fn new(now_ms: i64) -> Self {
        Self {
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: Vec::new(),
            pending_member_ids: HashMap::new(),
            rebalance_deadline_ms: 0,
            initial_delay_until_ms: None,
            state_timestamp_ms: now_ms,
            offsets: BTreeMap::new(),
            rebalances: 0,
            consumer: None,
        }
    }

    /// No members of either protocol.
    fn is_empty(&self) -> bool {
        self.members.is_empty() && self.consumer.as_ref().is_none_or(ConsumerGroup::is_empty)
    }

    fn member(&self, id: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    fn member_mut(&mut self, id: &str) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.id == id)
    }

    fn by_instance(&self, instance: &str) -> Option<usize> {
        self.members.iter().position(|m| m.instance_id.as_deref() == Some(instance))
    }

    /// FENCED_INSTANCE_ID when a static member's id is not the one we know for its
    /// instance; UNKNOWN_MEMBER_ID when the member is unknown.
    fn check_member(&self, member_id: &str, instance: Option<&str>) -> Result<usize, GroupError> {
        if let Some(instance) = instance {
            if let Some(i) = self.by_instance(instance) {
                return if self.members[i].id == member_id { Ok(i) } else { Err(GroupError::FencedInstanceId) };
            }
        }
        self.members.iter().position(|m| m.id == member_id).ok_or(GroupError::UnknownMemberId)
    }

    fn set_state(&mut self, state: GroupState, now_ms: i64) {
        self.state = state;
        self.state_timestamp_ms = now_ms;
    }

    /// Protocols every member supports, chosen by each member's first preference.
    fn select_protocol(&self) -> Option<String> {
        let first = self.members.first()?;
        let candidates: Vec<&String> = first
            .protocols
            .iter()
            .map(|(n, _)| n)
            .filter(|n| self.members.iter().all(|m| m.protocols.iter().any(|(p, _)| p == *n)))
            .collect();
        let mut best: Option<(&String, usize)> = None;
        for c in &candidates {
            let votes = self
                .members
                .iter()
                .filter(|m| m.protocols.iter().map(|(n, _)| n).find(|n| candidates.contains(n)) == Some(*c))
                .count();
            if best.map(|(_, v)| votes > v).unwrap_or(true) {
                best = Some((c, votes));
            }
        }
        best.map(|(c, _)| c.clone())
    }

    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocols.is_empty();
        }
        if self.protocol_type.as_deref().is_some_and(|t| t != protocol_type) {
            return false;
        }
        protocols.iter().any(|(n, _)| self.members.iter().all(|m| m.protocols.iter().any(|(p, _)| p == n)))
    }

    fn join_response_for(&self, member_id: &str) -> JoinResponse {
        let protocol = self.protocol.clone().unwrap_or_default();
        let leader = self.leader.clone().unwrap_or_default();
        let members = if leader == member_id {
            self.members.iter().map(|m| (m.id.clone(), m.instance_id.clone(), m.metadata_for(&protocol))).collect()
        } else {
            Vec::new()
        };
        JoinResponse {
            error: None,
            generation_id: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader,
            member_id: member_id.to_string(),
            members,
            skip_assignment: false,
        }
    }

    fn stored(&self) -> StoredGroup {
        StoredGroup {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            current_state_timestamp_ms: self.state_timestamp_ms,
            members: self
                .members
                .iter()
                .map(|m| StoredMember {
                    member_id: m.id.clone(),
                    group_instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata_for(self.protocol.as_deref().unwrap_or("")),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }
}

/// A committed offset, with the base offset of the batch that holds its record (a
/// committed transactional offset replaces it only if its record is later in the log).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Committed {
    value: StoredOffset,
    record_offset: i64,
}

/// A record the caller must append to the group's `__consumer_offsets` partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRecord {
    pub group_id: String,
    pub key: Bytes,
    pub value: Option<Bytes>,
}

/// One partition's offset to commit.
#[derive(Debug, Clone)]
pub struct OffsetCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
}

/// A group as the metrics endpoint shows it.
#[derive(Debug, Clone)]
pub struct GroupStatus {
    pub group_id: String,
    /// Kafka's state name: a classic group's, or a consumer group's (KIP-848: Empty,
    /// Assigning, Reconciling, Stable).
    pub state: &'static str,
    pub members: usize,
    /// (topic, partition, committed offset)
    pub committed: Vec<(String, i32, i64)>,
}

#[derive(Default)]
pub struct GroupCoordinator {
    config: GroupConfig,
    groups: HashMap<String, Group>,
    pending_records: Vec<PendingRecord>,
    /// Transactional offsets waiting for their transaction's marker.
    txn: TxnOffsets,
    /// Join phases completed by groups since removed (live groups count their own).
    retired_rebalances: u64,
}

impl GroupCoordinator {
    pub fn new(config: GroupConfig) -> Self {
        Self {
            config,
            groups: HashMap::new(),
            pending_records: Vec::new(),
            txn: TxnOffsets::new(),
            retired_rebalances: 0,
        }
    }

    /// Join phases completed since start (a monotonic counter).
    pub fn rebalances(&self) -> u64 {
        self.retired_rebalances
            + self.groups.values().map(|g| g.rebalances + g.consumer.as_ref().map_or(0, |c| c.rebalances)).sum::<u64>()
    }

    pub fn status(&self) -> Vec<GroupStatus> {
        let mut v: Vec<GroupStatus> = self
            .groups
            .iter()
            .map(|(id, g)| GroupStatus {
                group_id: id.clone(),
                state: g.consumer.as_ref().map_or(g.state.name(), ConsumerGroup::state_name),
                members: g.members.len() + g.consumer.as_ref().map_or(0, ConsumerGroup::members),
                committed: g.offsets.iter().map(|((t, p), o)| (t.clone(), *p, o.value.offset)).collect(),
            })
            .collect();
        v.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        v
    }

    /// Forget the groups that `__consumer_offsets` partition `partition` (of
    /// `partitions`) holds: this broker no longer leads it. Joins and syncs waiting in
    /// those groups are dropped, so their requests are answered NOT_COORDINATOR and the
    /// clients look for the new coordinator, which loads the groups from the log.
    /// Returns how many groups were dropped.
    pub fn unload_partition(&mut self, partition: i32, partitions: i32) -> usize {
        let held = |g: &str| super::offsets_partition_for(g, partitions) == partition;
        let gone: Vec<String> = self.groups.keys().filter(|g| held(g)).cloned().collect();
        for id in &gone {
            if let Some(g) = self.groups.remove(id) {
                self.retired_rebalances += g.rebalances;
            }
        }
        self.txn.forget_groups(held);
        self.discard_pending_records(partition, partitions);
        gone.len()
    }

    /// Drop the records not yet written for the groups of offsets partition `partition`
    /// (after loading it: restored groups write nothing until they are touched).
    pub fn discard_pending_records(&mut self, partition: i32, partitions: i32) {
        self.pending_records.retain(|r| super::offsets_partition_for(&r.group_id, partitions) != partition);
    }

    /// Whether records wait to be appended (`take_pending_records`).
    pub fn has_pending_records(&self) -> bool {
        !self.pending_records.is_empty()
    }

    /// Records produced since the last call, to append to `__consumer_offsets`.
    pub fn take_pending_records(&mut self) -> Vec<PendingRecord> {
        std::mem::take(&mut self.pending_records)
    }

    fn persist_group(&mut self, group_id: &str) {
        let Some(g) = self.groups.get(group_id) else { return };
        if g.consumer.is_some() {
            // Not yet stored (issue 47): its members rejoin after a coordinator move.
            return;
        }
        let value = records::group_value(&g.stored());
        self.pending_records.push(PendingRecord {
            group_id: group_id.to_string(),
            key: records::group_key(group_id),
            value: Some(value),
        });
    }

    pub fn join(&mut self, req: JoinRequest, now_ms: i64, new_member_id: String) -> Deferred<JoinResponse> {
        if req.group_id.is_empty() {
            return Deferred::Now(JoinResponse::error(GroupError::InvalidGroupId, &req.member_id));
        }
        if req.session_timeout_ms < self.config.session_timeout_min_ms
            || req.session_timeout_ms > self.config.session_timeout_max_ms
        {
            return Deferred::Now(JoinResponse::error(GroupError::InvalidSessionTimeout, &req.member_id));
        }
        if !req.member_id.is_empty() && !self.groups.contains_key(&req.group_id) {
            return Deferred::Now(JoinResponse::error(GroupError::UnknownMemberId, &req.member_id));
        }
        let delay_ms = self.config.initial_rebalance_delay_ms;
        let members_max = self.config.group_members_max;
        let group_id = req.group_id.clone();
        let g = self.groups.entry(req.group_id.clone()).or_insert_with(|| Group::new(now_ms));
        match &g.consumer {
            // A classic member cannot join a consumer group that has members (Kafka 4.4
            // can, with group.consumer.migration.policy: not yet in Spate).
            Some(c) if !c.is_empty() => {
                return Deferred::Now(JoinResponse::error(GroupError::InconsistentGroupProtocol, &req.member_id));
            }
            // An empty consumer group becomes a classic one; its offsets stay.
            Some(_) => g.consumer = None,
            None => {}
        }
        if !g.supports(&req.protocol_type, &req.protocols) {
            return Deferred::Now(JoinResponse::error(GroupError::InconsistentGroupProtocol, &req.member_id));
        }
        let (tx, rx) = oneshot::channel();

        if req.member_id.is_empty() {
            if let Some(instance) = req.group_instance_id.as_deref() {
                if let Some(i) = g.by_instance(instance) {
                    // A static member came back under a new member id: fence the old one.
                    let old = &mut g.members[i];
                    let old_id = std::mem::replace(&mut old.id, new_member_id.clone());
                    if let Some(w) = old.awaiting_join.take() {
                        let _ = w.send(JoinResponse::error(GroupError::FencedInstanceId, &old_id));
                    }
                    if let Some(w) = old.awaiting_sync.take() {
                        let _ = w.send(SyncResponse::error(GroupError::FencedInstanceId));
                    }
                    let same_protocols = old.protocols == req.protocols;
                    old.protocols = req.protocols.clone();
                    old.session_timeout_ms = req.session_timeout_ms;
                    old.rebalance_timeout_ms = req.rebalance_timeout_ms;
                    old.client_id = req.client_id.clone();
                    old.client_host = req.client_host.clone();
                    old.last_heartbeat_ms = now_ms;
                    if g.leader.as_deref() == Some(old_id.as_str()) {
                        g.leader = Some(new_member_id.clone());
                    }
                    tracing::info!(group = %group_id, instance, old_member = %old_id, member = %new_member_id, "static member rejoined");
                    if same_protocols && g.state == GroupState::Stable {
                        // No rebalance: it gets its previous assignment at SyncGroup. A
                        // leader is told to skip the assignment (KIP-814, v9; older
                        // clients run it, and SyncGroup applies what they send).
                        let mut resp = g.join_response_for(&new_member_id);
                        resp.skip_assignment = resp.leader == new_member_id;
                        self.persist_group(&group_id);
                        return Deferred::Now(resp);
                    }
                    let m = g.member_mut(&new_member_id).expect("just renamed");
                    m.awaiting_join = Some(tx);
                    let why = join_reason("static member rejoined", &req.reason);
                    Self::prepare_rebalance(g, now_ms, delay_ms, &group_id, &why);
                    Self::maybe_complete_join(g, now_ms, &group_id);
                    return Deferred::Later(rx);
                }
            } else if req.require_known_member_id {
                g.pending_member_ids.insert(new_member_id.clone(), now_ms + req.session_timeout_ms as i64);
                return Deferred::Now(JoinResponse::error(GroupError::MemberIdRequired, &new_member_id));
            }
            if g.members.len() >= members_max {
                return Deferred::Now(JoinResponse::error(GroupError::GroupMaxSizeReached, &new_member_id));
            }
            Self::add_member(g, &req, new_member_id, tx, now_ms, delay_ms, &group_id);
            return Deferred::Later(rx);
        }

        // A member id was given.
        match g.check_member(&req.member_id, req.group_instance_id.as_deref()) {
            Ok(i) => {
                let m = &mut g.members[i];
                let same_protocols = m.protocols == req.protocols;
                m.protocols = req.protocols.clone();
                m.session_timeout_ms = req.session_timeout_ms;
                m.rebalance_timeout_ms = req.rebalance_timeout_ms;
                m.last_heartbeat_ms = now_ms;
                let is_leader = g.leader.as_deref() == Some(req.member_id.as_str());
                match g.state {
                    GroupState::PreparingRebalance => {
                        if let Some(w) = g.members[i].awaiting_join.replace(tx) {
                            let _ = w.send(JoinResponse::error(GroupError::RebalanceInProgress, &req.member_id));
                        }
                        Self::maybe_complete_join(g, now_ms, &group_id);
                        Deferred::Later(rx)
                    }
                    GroupState::CompletingRebalance | GroupState::Stable
                        if same_protocols && (g.state == GroupState::CompletingRebalance || !is_leader) =>
                    {
                        Deferred::Now(g.join_response_for(&req.member_id))
                    }
                    _ => {
                        g.members[i].awaiting_join = Some(tx);
                        let why = join_reason("member rejoined with new metadata", &req.reason);
                        Self::prepare_rebalance(g, now_ms, delay_ms, &group_id, &why);
                        Self::maybe_complete_join(g, now_ms, &group_id);
                        Deferred::Later(rx)
                    }
                }
            }
            Err(GroupError::UnknownMemberId) if g.pending_member_ids.remove(&req.member_id).is_some() => {
                if g.members.len() >= members_max {
                    return Deferred::Now(JoinResponse::error(GroupError::GroupMaxSizeReached, &req.member_id));
                }
                Self::add_member(g, &req, req.member_id.clone(), tx, now_ms, delay_ms, &group_id);
                Deferred::Later(rx)
            }
            Err(e) => Deferred::Now(JoinResponse::error(e, &req.member_id)),
        }
    }

    fn add_member(
        g: &mut Group,
        req: &JoinRequest,
        id: String,
        tx: oneshot::Sender<JoinResponse>,
        now_ms: i64,
        delay_ms: i64,
        group_id: &str,
    ) {
        tracing::info!(group = group_id, member = %id, instance = ?req.group_instance_id, "member joining");
        if g.members.is_empty() {
            g.protocol_type = Some(req.protocol_type.clone());
        }
        g.members.push(Member {
            id,
            instance_id: req.group_instance_id.clone(),
            client_id: req.client_id.clone(),
            client_host: req.client_host.clone(),
            protocol_type: req.protocol_type.clone(),
            protocols: req.protocols.clone(),
            session_timeout_ms: req.session_timeout_ms,
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            assignment: Bytes::new(),
            last_heartbeat_ms: now_ms,
            awaiting_join: Some(tx),
            awaiting_sync: None,
        });
        // A new member during the initial delay pushes it back (bounded by the
        // rebalance timeout), so members starting together land in one generation.
        if let Some(until) = g.initial_delay_until_ms.as_mut() {
            *until = (now_ms + delay_ms).min(g.rebalance_deadline_ms);
        }
        let why = join_reason("member joined", &req.reason);
        Self::prepare_rebalance(g, now_ms, delay_ms, group_id, &why);
        Self::maybe_complete_join(g, now_ms, group_id);
    }

    fn prepare_rebalance(g: &mut Group, now_ms: i64, delay_ms: i64, group_id: &str, reason: &str) {
        if g.state == GroupState::PreparingRebalance {
            return;
        }
        if g.state == GroupState::CompletingRebalance {
            for m in g.members.iter_mut() {
                if let Some(w) = m.awaiting_sync.take() {
                    let _ = w.send(SyncResponse::error(GroupError::RebalanceInProgress));
                }
            }
        }
        let rebalance_timeout_ms = g.members.iter().map(|m| m.rebalance_timeout_ms as i64).max().unwrap_or(0);
        g.rebalance_deadline_ms = now_ms + rebalance_timeout_ms;
        g.initial_delay_until_ms =
            if g.state == GroupState::Empty { Some((now_ms + delay_ms).min(g.rebalance_deadline_ms)) } else { None };
        tracing::info!(group = group_id, generation = g.generation, reason, "preparing rebalance");
        g.set_state(GroupState::PreparingRebalance, now_ms);
    }

    /// Finish the join phase once every member rejoined (after the initial delay), or
    /// the rebalance timeout passed (dropping those who did not rejoin).
    fn maybe_complete_join(g: &mut Group, now_ms: i64, group_id: &str) {
        if g.state != GroupState::PreparingRebalance {
            return;
        }
        if g.initial_delay_until_ms.is_some_and(|t| now_ms < t) {
            return;
        }
        let all_joined = g.members.iter().all(|m| m.awaiting_join.is_some());
        if !all_joined && now_ms < g.rebalance_deadline_ms {
            return;
        }
        let before = g.members.len();
        g.members.retain(|m| {
            let keep = m.awaiting_join.is_some();
            if !keep {
                tracing::info!(group = group_id, member = %m.id, "removing member that did not rejoin in time");
            }
            keep
        });
        let _ = before;
        g.generation += 1;
        g.rebalances += 1;
        g.initial_delay_until_ms = None;
        if g.members.is_empty() {
            g.protocol = None;
            g.leader = None;
            g.set_state(GroupState::Empty, now_ms);
            tracing::info!(group = group_id, generation = g.generation, "group is empty");
            return;
        }
        g.protocol = g.select_protocol();
        g.protocol_type = Some(g.members[0].protocol_type.clone());
        if g.leader.as_ref().is_none_or(|l| g.member(l).is_none()) {
            g.leader = Some(g.members[0].id.clone());
        }
        g.set_state(GroupState::CompletingRebalance, now_ms);
        tracing::info!(
            group = group_id, generation = g.generation, protocol = ?g.protocol, members = g.members.len(),
            leader = ?g.leader, "rebalance: join complete"
        );
        let ids: Vec<String> = g.members.iter().map(|m| m.id.clone()).collect();
        for id in ids {
            let resp = g.join_response_for(&id);
            let m = g.member_mut(&id).expect("member");
            m.last_heartbeat_ms = now_ms;
            if let Some(w) = m.awaiting_join.take() {
                let _ = w.send(resp);
            }
        }
    }

    pub fn sync(&mut self, req: SyncRequest, now_ms: i64) -> Deferred<SyncResponse> {
        let Some(g) = self.groups.get_mut(&req.group_id) else {
            return Deferred::Now(SyncResponse::error(GroupError::UnknownMemberId));
        };
        let i = match g.check_member(&req.member_id, req.group_instance_id.as_deref()) {
            Ok(i) => i,
            Err(e) => return Deferred::Now(SyncResponse::error(e)),
        };
        if req.generation_id != g.generation {
            return Deferred::Now(SyncResponse::error(GroupError::IllegalGeneration));
        }
        if req.protocol_type.as_ref().is_some_and(|t| Some(t) != g.protocol_type.as_ref())
            || req.protocol_name.as_ref().is_some_and(|p| Some(p) != g.protocol.as_ref())
        {
            return Deferred::Now(SyncResponse::error(GroupError::InconsistentGroupProtocol));
        }
        g.members[i].last_heartbeat_ms = now_ms;
        let is_leader = g.leader.as_deref() == Some(req.member_id.as_str());
        match g.state {
            GroupState::Empty => Deferred::Now(SyncResponse::error(GroupError::UnknownMemberId)),
            GroupState::PreparingRebalance => Deferred::Now(SyncResponse::error(GroupError::RebalanceInProgress)),
            GroupState::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                g.members[i].awaiting_sync = Some(tx);
                if is_leader {
                    Self::apply_assignments(g, &req.assignments);
                    g.set_state(GroupState::Stable, now_ms);
                    tracing::info!(group = %req.group_id, generation = g.generation, "rebalance: group stable");
                    let (pt, pn) = (g.protocol_type.clone(), g.protocol.clone());
                    for m in g.members.iter_mut() {
                        if let Some(w) = m.awaiting_sync.take() {
                            let _ = w.send(SyncResponse {
                                error: None,
                                protocol_type: pt.clone(),
                                protocol_name: pn.clone(),
                                assignment: m.assignment.clone(),
                            });
                        }
                    }
                    let group_id = req.group_id.clone();
                    self.persist_group(&group_id);
                }
                Deferred::Later(rx)
            }
            GroupState::Stable => {
                if is_leader && !req.assignments.is_empty() {
                    // A static leader that rejoined recomputed the assignment.
                    Self::apply_assignments(g, &req.assignments);
                }
                Deferred::Now(SyncResponse {
                    error: None,
                    protocol_type: g.protocol_type.clone(),
                    protocol_name: g.protocol.clone(),
                    assignment: g.members[i].assignment.clone(),
                })
            }
        }
    }

    fn apply_assignments(g: &mut Group, assignments: &[(String, Bytes)]) {
        for m in g.members.iter_mut() {
            m.assignment = assignments.iter().find(|(id, _)| *id == m.id).map(|(_, a)| a.clone()).unwrap_or_default();
        }
    }

    pub fn heartbeat(
        &mut self,
        group_id: &str,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
        now_ms: i64,
    ) -> Result<(), GroupError> {
        let g = self.groups.get_mut(group_id).ok_or(GroupError::UnknownMemberId)?;
        let i = g.check_member(member_id, instance)?;
        if g.state == GroupState::Empty {
            return Err(GroupError::UnknownMemberId);
        }
        if generation != g.generation {
            return Err(GroupError::IllegalGeneration);
        }
        g.members[i].last_heartbeat_ms = now_ms;
        match g.state {
            GroupState::PreparingRebalance => Err(GroupError::RebalanceInProgress),
            _ => Ok(()),
        }
    }

    /// LeaveGroup for one or more members (v3+ batches them). The answer per member.
    pub fn leave(
        &mut self,
        group_id: &str,
        members: &[(String, Option<String>)],
        now_ms: i64,
    ) -> Result<Vec<Result<(), GroupError>>, GroupError> {
        let delay_ms = self.config.initial_rebalance_delay_ms;
        let g = self.groups.get_mut(group_id).ok_or(GroupError::UnknownMemberId)?;
        let mut results = Vec::with_capacity(members.len());
        let mut removed = false;
        for (member_id, instance) in members {
            let found = match instance {
                Some(inst) => match g.by_instance(inst) {
                    Some(i) if member_id.is_empty() || g.members[i].id == *member_id => Ok(i),
                    Some(_) => Err(GroupError::FencedInstanceId),
                    None => Err(GroupError::UnknownMemberId),
                },
                None => g.members.iter().position(|m| m.id == *member_id).ok_or(GroupError::UnknownMemberId),
            };
            match found {
                Ok(i) => {
                    let m = g.members.remove(i);
                    tracing::info!(group = group_id, member = %m.id, "member left");
                    Self::answer_removed(m);
                    removed = true;
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if removed {
            Self::after_removal(g, now_ms, delay_ms, group_id, "member left");
            // The membership changed: the stored record must not bring the member back
            // after a restart.
            self.persist_group(group_id);
        }
        Ok(results)
    }

    fn answer_removed(m: Member) {
        if let Some(w) = m.awaiting_join {
            let _ = w.send(JoinResponse::error(GroupError::UnknownMemberId, &m.id));
        }
        if let Some(w) = m.awaiting_sync {
            let _ = w.send(SyncResponse::error(GroupError::UnknownMemberId));
        }
    }

    fn after_removal(g: &mut Group, now_ms: i64, delay_ms: i64, group_id: &str, reason: &str) {
        match g.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                Self::prepare_rebalance(g, now_ms, delay_ms, group_id, reason);
                Self::maybe_complete_join(g, now_ms, group_id);
            }
            GroupState::PreparingRebalance => Self::maybe_complete_join(g, now_ms, group_id),
            GroupState::Empty => {}
        }
    }

    /// Timers: session expiry, rebalance completion, pending member ids, offset expiry.
    pub fn tick(&mut self, now_ms: i64) {
        let delay_ms = self.config.initial_rebalance_delay_ms;
        let retention_ms = self.config.offsets_retention_ms;
        let mut tombstones = Vec::new();
        let mut persist = Vec::new();
        let mut dead = Vec::new();
        let mut consumer_records = Vec::new();
        for (group_id, g) in self.groups.iter_mut() {
            if let Some(c) = g.consumer.as_mut() {
                let was_empty = c.is_empty();
                for (member, why) in c.tick(now_ms) {
                    tracing::info!(group = %group_id, member = %member, why, "consumer group member removed");
                }
                if c.is_empty() && !was_empty {
                    // Offsets retention counts from when the group emptied.
                    g.state_timestamp_ms = now_ms;
                }
                for r in c.take_records(group_id) {
                    let (key, value) = r.encode();
                    consumer_records.push(PendingRecord { group_id: group_id.clone(), key, value });
                }
            }
            g.pending_member_ids.retain(|_, until| *until > now_ms);
            let mut expired = Vec::new();
            g.members.retain(|m| {
                let alive = m.awaiting_join.is_some()
                    || m.awaiting_sync.is_some()
                    || now_ms - m.last_heartbeat_ms <= m.session_timeout_ms as i64;
                if !alive {
                    expired.push(m.id.clone());
                }
                alive
            });
            for id in &expired {
                tracing::info!(group = %group_id, member = %id, "member session expired");
            }
            if !expired.is_empty() {
                Self::after_removal(g, now_ms, delay_ms, group_id, "member session expired");
                persist.push(group_id.clone());
            }
            let gen_before = g.generation;
            Self::maybe_complete_join(g, now_ms, group_id);
            if g.generation != gen_before && g.state == GroupState::Empty {
                persist.push(group_id.clone());
            }
            // Offsets of an empty group expire offsets.retention.minutes after the group
            // emptied (or after their commit, whichever is later).
            if g.state == GroupState::Empty && g.is_empty() {
                let expired_offsets: Vec<(String, i32)> = g
                    .offsets
                    .iter()
                    .filter(|(_, o)| now_ms - o.value.commit_timestamp_ms.max(g.state_timestamp_ms) > retention_ms)
                    .map(|(k, _)| k.clone())
                    .collect();
                for (topic, partition) in expired_offsets {
                    g.offsets.remove(&(topic.clone(), partition));
                    tombstones.push(PendingRecord {
                        group_id: group_id.clone(),
                        key: records::offset_key(group_id, &topic, partition),
                        value: None,
                    });
                }
                // A group whose only offsets wait in a transaction stays for its marker.
                if g.offsets.is_empty()
                    && g.is_empty()
                    && g.pending_member_ids.is_empty()
                    && !self.txn.has_group(group_id)
                {
                    dead.push(group_id.clone());
                }
            }
        }
        for id in dead {
            // Keep the group record's last word: a tombstone, so a reload forgets it.
            if self.groups.get(&id).is_some_and(|g| g.generation > 0) {
                tombstones.push(PendingRecord { group_id: id.clone(), key: records::group_key(&id), value: None });
            }
            if self.groups.get(&id).is_some_and(|g| g.consumer.is_some()) {
                tombstones.extend(Self::consumer_group_tombstones(&id));
            }
            if let Some(g) = self.groups.remove(&id) {
                self.retired_rebalances += g.rebalances;
            }
        }
        self.pending_records.extend(consumer_records);
        self.pending_records.extend(tombstones);
        for id in persist {
            if self.groups.contains_key(&id) {
                self.persist_group(&id);
            }
        }
    }

    /// Check an OffsetCommit before its records are appended. Simple (standalone)
    /// consumers commit with generation -1 and no member id to a group with no members.
    pub fn validate_commit(
        &self,
        group_id: &str,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
    ) -> Result<(), GroupError> {
        if group_id.is_empty() {
            return Err(GroupError::InvalidGroupId);
        }
        let Some(g) = self.groups.get(group_id) else {
            return if generation < 0 { Ok(()) } else { Err(GroupError::IllegalGeneration) };
        };
        if let Some(c) = &g.consumer {
            return Self::validate_consumer_member(c, member_id, generation, GroupError::StaleMemberEpoch);
        }
        if generation < 0 && member_id.is_empty() {
            return if g.members.is_empty() { Ok(()) } else { Err(GroupError::UnknownMemberId) };
        }
        g.check_member(member_id, instance)?;
        if generation != g.generation {
            return Err(GroupError::IllegalGeneration);
        }
        match g.state {
            // As Kafka: a member of the current generation may still commit while the
            // next rebalance is being prepared (it learns of it from its heartbeat), so
            // what it processed before revoking its partitions is not re-delivered.
            // Between join and sync it has no assignment to commit for.
            GroupState::CompletingRebalance => Err(GroupError::RebalanceInProgress),
            GroupState::PreparingRebalance | GroupState::Stable | GroupState::Empty => Ok(()),
        }
    }

    /// The records an OffsetCommit appends. Partitions whose metadata is too large get
    /// an error and no record.
    pub fn commit_records(
        &self,
        group_id: &str,
        offsets: &[OffsetCommit],
        now_ms: i64,
    ) -> (Vec<PendingRecord>, Vec<Result<(), GroupError>>) {
        let mut recs = Vec::new();
        let mut results = Vec::with_capacity(offsets.len());
        for o in offsets {
            if o.metadata.len() > self.config.offset_metadata_bytes_max {
                results.push(Err(GroupError::OffsetMetadataTooLarge));
                continue;
            }
            let value = StoredOffset {
                offset: o.offset,
                leader_epoch: o.leader_epoch,
                metadata: o.metadata.clone(),
                commit_timestamp_ms: now_ms,
            };
            recs.push(PendingRecord {
                group_id: group_id.to_string(),
                key: records::offset_key(group_id, &o.topic, o.partition),
                value: Some(records::offset_value(&value)),
            });
            results.push(Ok(()));
        }
        (recs, results)
    }

    /// Replay `bytes`, whole batches read at `from` from offsets partition `partition`
    /// (of `partitions`) during a load, in log order, as Kafka's loader does:
    /// - a data batch's keyed records are decoded and applied (one that does not decode
    ///   is skipped and logged); in a transactional batch the offset records wait for the
    ///   batch's producer's marker (`apply_txn_record`);
    /// - a control batch's marker (`log::batch::control_marker`) commits or drops its
    ///   producer's pending offsets in this partition (`complete_txn`).
    ///
    /// Offsets still pending at the end stay pending: their transaction is open.
    /// Returns the offset after the last batch, and how many records were applied and
    /// skipped; an error when the bytes are not well-formed batches (the load stops
    /// there). The bytes come from disk: every length is checked before use
    /// (`check_batches_records` first, then the decoders' own bounds).
    pub fn replay_batches(
        &mut self,
        bytes: Vec<u8>,
        from: crate::model::Offset,
        partition: i32,
        partitions: i32,
        now_ms: i64,
    ) -> Result<(crate::model::Offset, usize, usize), String> {
        use crate::log::batch::{control_marker, BatchHeader, ATTR_CONTROL, ATTR_TRANSACTIONAL};
        crate::log::batch::check_batches_records(&bytes).map_err(|e| e.to_string())?;
        let bytes = Bytes::from(bytes);
        let (mut next, mut loaded, mut skipped) = (from, 0, 0);
        let mut pos = 0;
        while pos < bytes.len() {
            // Whole batches, each of its stated size (checked above).
            let h = BatchHeader::parse(&bytes[pos..]);
            let size = h.size_bytes() as usize;
            assert!(size > 0 && pos + size <= bytes.len(), "check_batches_records passed a short batch");
            let mut batch = bytes.slice(pos..pos + size);
            pos += size;
            next = next.max(crate::model::Offset(h.last_offset() + 1));
            if h.attributes & ATTR_CONTROL != 0 {
                match control_marker(&batch, &h) {
                    Some(marker) => {
                        self.complete_txn(partition, partitions, h.producer_id, marker.commit);
                        loaded += 1;
                    }
                    None => {
                        skipped += 1;
                        tracing::warn!(offset = h.base_offset, "skipping a control batch that holds no marker");
                    }
                }
                continue;
            }
            let transactional = h.attributes & ATTR_TRANSACTIONAL != 0;
            let set = kafka_protocol::records::RecordBatchDecoder::decode(&mut batch).map_err(|e| e.to_string())?;
            for r in set.records {
                let Some(key) = r.key else { continue };
                match records::decode(&key, r.value.as_ref()) {
                    Ok(rec) => {
                        if transactional {
                            self.apply_txn_record(rec, h.producer_id, h.base_offset, now_ms);
                        } else {
                            self.apply_record(rec, h.base_offset, now_ms);
                        }
                        loaded += 1;
                    }
                    Err(e) => {
                        skipped += 1;
                        tracing::warn!(offset = r.offset, error = %e, "skipping offsets record");
                    }
                }
            }
        }
        Ok((next, loaded, skipped))
    }

    /// Apply records once they are in the log (in the batch at `record_offset`):
    /// commits, and replay at load time.
    pub fn apply_record(&mut self, record: records::OffsetsRecord, record_offset: i64, now_ms: i64) {
        match record {
            records::OffsetsRecord::Offset { group, topic, partition, value } => match value {
                Some(value) => {
                    self.groups
                        .entry(group)
                        .or_insert_with(|| Group::new(now_ms))
                        .offsets
                        .insert((topic, partition), Committed { value, record_offset });
                }
                None => {
                    if let Some(g) = self.groups.get_mut(&group) {
                        g.offsets.remove(&(topic, partition));
                    }
                }
            },
            records::OffsetsRecord::Consumer(rec) => {
                let group = rec.group().to_string();
                if let ConsumerRecord::GroupEpoch { epoch: None, .. } = rec {
                    // The consumer group was deleted; its offsets have their own tombstones.
                    if let Some(g) = self.groups.get_mut(&group) {
                        g.consumer = None;
                        if g.offsets.is_empty() && g.members.is_empty() && !self.txn.has_group(&group) {
                            self.groups.remove(&group);
                        }
                    }
                    return;
                }
                let g = self.groups.entry(group).or_insert_with(|| Group::new(now_ms));
                g.consumer.get_or_insert_with(ConsumerGroup::default).replay(rec, now_ms, &self.config.consumer);
            }
            records::OffsetsRecord::Group { group, value } => match value {
                None => {
                    if let Some(g) = self.groups.get_mut(&group) {
                        g.members.clear();
                        g.set_state(GroupState::Empty, now_ms);
                    }
                }
                Some(stored) => {
                    let g = self.groups.entry(group).or_insert_with(|| Group::new(now_ms));
                    // Only loads rebuild membership; live groups already hold it.
                    if !g.members.iter().any(|m| m.awaiting_join.is_some() || m.awaiting_sync.is_some()) {
                        Self::restore(g, stored, now_ms);
                    }
                }
            },
        }
    }

    /// Check a TxnOffsetCommit before its records are appended, as Kafka's
    /// `validateTransactionalOffsetCommit` and `validateOffsetCommit(isTransactional)`:
    /// - a group that does not exist takes generation -1 (a producer that gave no group
    ///   metadata; the group is created, empty, when its offsets are written) and answers
    ///   ILLEGAL_GENERATION to any other;
    /// - generation -1 commits to an empty group;
    /// - a request that names a member (v3+: a member id, an instance id or a
    ///   generation) must name a current member (FENCED_INSTANCE_ID for a static
    ///   member's old id, UNKNOWN_MEMBER_ID) of the current generation
    ///   (ILLEGAL_GENERATION) — KIP-447's fencing of zombie producers;
    /// - one that names none (v0-v2 carry no member) commits whatever the group's state.
    ///
    /// Unlike OffsetCommit, a group completing a rebalance does not refuse it.
    pub fn validate_txn_commit(
        &self,
        group_id: &str,
        member_id: &str,
        instance: Option<&str>,
        generation: i32,
    ) -> Result<(), GroupError> {
        if group_id.is_empty() {
            return Err(GroupError::InvalidGroupId);
        }
        let Some(g) = self.groups.get(group_id) else {
            return if generation < 0 { Ok(()) } else { Err(GroupError::IllegalGeneration) };
        };
        if let Some(c) = &g.consumer {
            // TxnOffsetCommit carries the member epoch as its generation; Kafka answers a
            // stale one ILLEGAL_GENERATION there (the producer's CommitFailedException).
            return Self::validate_consumer_member(c, member_id, generation, GroupError::IllegalGeneration);
        }
        if generation < 0 && g.state == GroupState::Empty {
            return Ok(());
        }
        if generation >= 0 || !member_id.is_empty() || instance.is_some() {
            g.check_member(member_id, instance)?;
            if generation != g.generation {
                return Err(GroupError::IllegalGeneration);
            }
        }
        Ok(())
    }

    /// A commit (or a fetch) in a consumer group (KIP-848): without a member (epoch -1)
    /// only while the group has no members (the admin client, a standalone consumer);
    /// else from a member at its current epoch (`stale` otherwise).
    fn validate_consumer_member(
        c: &ConsumerGroup,
        member_id: &str,
        epoch: i32,
        stale: GroupError,
    ) -> Result<(), GroupError> {
        if epoch < 0 && c.is_empty() {
            return Ok(());
        }
        match c.member_epoch(member_id) {
            None => Err(GroupError::UnknownMemberId),
            Some(e) if e != epoch => Err(stale),
            Some(_) => Ok(()),
        }
    }

    /// Kafka refuses an OffsetCommit below v9 (no member epoch) from a member of a
    /// consumer group (UNSUPPORTED_VERSION): its generation field would be read as an
    /// epoch it does not carry.
    pub fn check_commit_version(&self, group_id: &str, member_id: &str, member_epochs: bool) -> Result<(), GroupError> {
        let consumer_member = self
            .groups
            .get(group_id)
            .and_then(|g| g.consumer.as_ref())
            .is_some_and(|c| c.member_epoch(member_id).is_some());
        if consumer_member && !member_epochs {
            return Err(GroupError::UnsupportedVersion);
        }
        Ok(())
    }

    /// OffsetFetch v9's member check (KIP-848): a fetch that names a member of a
    /// consumer group must come at its epoch. Without a member id and epoch (the admin
    /// client, older clients), and in classic groups, nothing is checked.
    pub fn validate_fetch(&self, group_id: &str, member: Option<(&str, i32)>) -> Result<(), GroupError> {
        let Some((member_id, epoch)) = member else { return Ok(()) };
        match self.groups.get(group_id).and_then(|g| g.consumer.as_ref()) {
            Some(c) => match c.member_epoch(member_id) {
                None => Err(GroupError::UnknownMemberId),
                Some(e) if e != epoch => Err(GroupError::StaleMemberEpoch),
                Some(_) => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// ConsumerGroupHeartbeat (KIP-848). A classic group with members is not a consumer
    /// group (GROUP_ID_NOT_FOUND, as Kafka answers without a migration policy); an empty
    /// one becomes one, offsets kept. A heartbeat for a group this coordinator does not
    /// know (it was not stored before a coordinator move) is answered UNKNOWN_MEMBER_ID:
    /// the member rejoins.
    pub fn consumer_heartbeat(
        &mut self,
        req: &ConsumerHeartbeat,
        topics: &dyn TopicsImage,
        now_ms: i64,
        new_member_id: &str,
    ) -> Result<ConsumerHeartbeatResponse, ConsumerRefusal> {
        let group_id = req.group_id.as_str();
        let unknown = || {
            Err((GroupError::UnknownMemberId, format!("Member {} is not a member of group {group_id}.", req.member_id)))
        };
        match self.groups.get_mut(group_id) {
            Some(g) if g.consumer.is_some() => {}
            Some(g) if !g.members.is_empty() || !g.pending_member_ids.is_empty() => {
                return Err((GroupError::GroupIdNotFound, format!("Group {group_id} is not a consumer group.")));
            }
            Some(g) if req.member_epoch == 0 => {
                if g.generation > 0 {
                    // The classic group's last metadata goes: a reload must not bring it back.
                    self.pending_records.push(PendingRecord {
                        group_id: group_id.to_string(),
                        key: records::group_key(group_id),
                        value: None,
                    });
                }
                g.generation = 0;
                g.protocol = None;
                g.protocol_type = None;
                g.leader = None;
                g.consumer = Some(ConsumerGroup::default());
                tracing::info!(group = group_id, "empty classic group converted to the consumer protocol");
            }
            Some(_) => return unknown(),
            None if req.member_epoch == 0 && !group_id.is_empty() => {
                let mut g = Group::new(now_ms);
                g.consumer = Some(ConsumerGroup::default());
                self.groups.insert(group_id.to_string(), g);
            }
            None if group_id.is_empty() => {
                return Err((GroupError::InvalidRequest, "GroupId can't be empty.".to_string()));
            }
            None => return unknown(),
        }
        let g = self.groups.get_mut(group_id).expect("present");
        let c = g.consumer.as_mut().expect("a consumer group");
        let was_empty = c.is_empty();
        let epoch_before = c.group_epoch();
        let r = c.heartbeat(&self.config.consumer, req, topics, now_ms, new_member_id);
        if c.group_epoch() != epoch_before {
            tracing::info!(group = group_id, member = %req.member_id, member_epoch = req.member_epoch,
                group_epoch = c.group_epoch(), "consumer group epoch bumped");
        }
        if c.is_empty() && !was_empty {
            g.state_timestamp_ms = now_ms;
        }
        #[cfg(debug_assertions)]
        c.check_invariants();
        let recs = c.take_records(group_id);
        self.push_consumer_records(group_id, recs);
        r
    }

    fn push_consumer_records(&mut self, group_id: &str, recs: Vec<ConsumerRecord>) {
        for r in recs {
            let (key, value) = r.encode();
            self.pending_records.push(PendingRecord { group_id: group_id.to_string(), key, value });
        }
    }

    /// Apply a record of `producer_id`'s transactional batch at `record_offset` (once
    /// appended, or at load): an offset waits for the producer's marker, in a group
    /// created empty if it is new (Kafka creates the group of a standalone producer's
    /// commit); a tombstone (Kafka's loader honours them; TxnOffsetCommit writes none)
    /// drops the producer's pending offset; a group record applies at once.
    pub fn apply_txn_record(
        &mut self,
        record: records::OffsetsRecord,
        producer_id: i64,
        record_offset: i64,
        now_ms: i64,
    ) {
        match record {
            records::OffsetsRecord::Offset { group, topic, partition, value: Some(value) } => {
                self.groups.entry(group.clone()).or_insert_with(|| Group::new(now_ms));
                self.txn.add(producer_id, (group, topic, partition), value, record_offset);
            }
            records::OffsetsRecord::Offset { group, topic, partition, value: None } => {
                self.txn.remove(producer_id, &(group, topic, partition))
            }
            group => self.apply_record(group, record_offset, now_ms),
        }
    }

    /// `producer_id`'s transaction marker is in offsets partition `partition` (of
    /// `partitions`): with COMMIT its pending offsets of that partition's groups become
    /// their committed offsets, except where the committed offset's record is later in
    /// the log (a non-transactional commit made after the transactional one stays);
    /// with ABORT they are dropped. The epoch is not compared: Kafka completes a
    /// producer's pending offsets whatever the marker's epoch. Returns how many pending
    /// offsets the marker completed.
    pub fn complete_txn(&mut self, partition: i32, partitions: i32, producer_id: i64, commit: bool) -> usize {
        let done = self.txn.complete(producer_id, |g| super::offsets_partition_for(g, partitions) == partition);
        let completed = done.len();
        if commit {
            for ((group, topic, p), pending) in done {
                // Pending offsets leave with their group (deleted, unloaded), and a group
                // with pending offsets does not expire: it is here.
                let Some(g) = self.groups.get_mut(&group) else { continue };
                let key = (topic, p);
                if g.offsets.get(&key).is_none_or(|c| c.record_offset < pending.record_offset) {
                    g.offsets.insert(key, Committed { value: pending.value, record_offset: pending.record_offset });
                }
            }
        }
        completed
    }

    /// Producers with offsets waiting for their marker in offsets partition `partition`
    /// (of `partitions`), ascending.
    pub fn txn_producers(&self, partition: i32, partitions: i32) -> Vec<i64> {
        self.txn.producers(|g| super::offsets_partition_for(g, partitions) == partition)
    }

    fn restore(g: &mut Group, s: StoredGroup, now_ms: i64) {
        g.generation = g.generation.max(s.generation);
        g.protocol_type = if s.protocol_type.is_empty() { None } else { Some(s.protocol_type.clone()) };
        g.protocol = s.protocol.clone();
        g.leader = s.leader.clone();
        g.members = s
            .members
            .into_iter()
            .map(|m| Member {
                id: m.member_id,
                instance_id: m.group_instance_id,
                client_id: m.client_id,
                client_host: m.client_host,
                protocol_type: s.protocol_type.clone(),
                protocols: vec![(s.protocol.clone().unwrap_or_default(), m.subscription)],
                session_timeout_ms: m.session_timeout_ms,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                assignment: m.assignment,
                // Members get a full session to come back after a coordinator move.
                last_heartbeat_ms: now_ms,
                awaiting_join: None,
                awaiting_sync: None,
            })
            .collect();
        let state = if g.members.is_empty() { GroupState::Empty } else { GroupState::Stable };
        g.state = state;
        g.state_timestamp_ms = if s.current_state_timestamp_ms > 0 { s.current_state_timestamp_ms } else { now_ms };
    }

    /// OffsetFetch: committed offsets of a group; all of them when `partitions` is None.
    /// Offsets waiting in an open transaction are not shown; with `require_stable`
    /// (OffsetFetch v7+, KIP-447: read_committed consumers) a partition that has one is
    /// answered UNSTABLE_OFFSET_COMMIT instead, and the client retries.
    pub fn fetch_offsets(
        &self,
        group_id: &str,
        partitions: Option<&[(String, i32)]>,
        require_stable: bool,
    ) -> Vec<(String, i32, Result<Option<StoredOffset>, GroupError>)> {
        let g = self.groups.get(group_id);
        let answer = |topic: &str, partition: i32, committed: Option<&Committed>| {
            if require_stable && self.txn.is_pending(group_id, topic, partition) {
                Err(GroupError::UnstableOffsetCommit)
            } else {
                Ok(committed.map(|c| c.value.clone()))
            }
        };
        match partitions {
            Some(list) => list
                .iter()
                .map(|(t, p)| (t.clone(), *p, answer(t, *p, g.and_then(|g| g.offsets.get(&(t.clone(), *p))))))
                .collect(),
            None => g
                .map(|g| g.offsets.iter().map(|((t, p), c)| (t.clone(), *p, answer(t, *p, Some(c)))).collect())
                .unwrap_or_default(),
        }
    }

    pub fn list(&self) -> Vec<ListedGroup> {
        let mut v: Vec<_> = self
            .groups
            .iter()
            .map(|(id, g)| match &g.consumer {
                Some(c) => ListedGroup {
                    group_id: id.clone(),
                    protocol_type: "consumer".to_string(),
                    state: c.state_name(),
                    group_type: "consumer",
                },
                None => ListedGroup {
                    group_id: id.clone(),
                    protocol_type: g.protocol_type.clone().unwrap_or_default(),
                    state: g.state.name(),
                    group_type: "classic",
                },
            })
            .collect();
        v.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        v
    }

    pub fn describe(&self, group_id: &str) -> Option<Described> {
        let g = self.groups.get(group_id)?;
        if let Some(c) = &g.consumer {
            return Some(Described::Consumer(c.describe()));
        }
        let protocol = g.protocol.clone().unwrap_or_default();
        let stable = matches!(g.state, GroupState::Stable | GroupState::CompletingRebalance);
        Some(Described::Classic(GroupDescription {
            state: g.state,
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol: if stable { protocol.clone() } else { String::new() },
            members: g
                .members
                .iter()
                .map(|m| MemberDescription {
                    member_id: m.id.clone(),
                    group_instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: if stable { m.metadata_for(&protocol) } else { Bytes::new() },
                    assignment: if g.state == GroupState::Stable { m.assignment.clone() } else { Bytes::new() },
                })
                .collect(),
        }))
    }

    /// DeleteGroups: only an empty group can go; its offsets go with it.
    pub fn delete_group(&mut self, group_id: &str) -> Result<(), GroupError> {
        let g = self.groups.get(group_id).ok_or(GroupError::GroupIdNotFound)?;
        if g.state != GroupState::Empty || !g.is_empty() {
            return Err(GroupError::NonEmptyGroup);
        }
        let g = self.groups.remove(group_id).expect("present");
        self.retired_rebalances += g.rebalances;
        // As Kafka's classic coordinator: offsets waiting in a transaction go with the
        // group (their marker finds nothing).
        self.txn.forget_groups(|g| g == group_id);
        for (topic, partition) in g.offsets.keys() {
            self.pending_records.push(PendingRecord {
                group_id: group_id.to_string(),
                key: records::offset_key(group_id, topic, *partition),
                value: None,
            });
        }
        if g.consumer.is_some() {
            self.pending_records.extend(Self::consumer_group_tombstones(group_id));
        } else {
            self.pending_records.push(PendingRecord {
                group_id: group_id.to_string(),
                key: records::group_key(group_id),
                value: None,
            });
        }
        tracing::info!(group = group_id, "group deleted");
        Ok(())
    }

    /// The records that delete an (empty) consumer group, as Kafka writes them: its
    /// target assignment epoch, then its group epoch.
    fn consumer_group_tombstones(group_id: &str) -> Vec<PendingRecord> {
        [
            ConsumerRecord::TargetEpoch { group: group_id.to_string(), epoch: None },
            ConsumerRecord::GroupEpoch { group: group_id.to_string(), epoch: None },
        ]
        .into_iter()
        .map(|r| {
            let (key, value) = r.encode();
            PendingRecord { group_id: group_id.to_string(), key, value }
        })
        .collect()
    }

    /// OffsetDelete: refused for topics the (non-empty) group is subscribed to.
    pub fn delete_offsets(
        &mut self,
        group_id: &str,
        partitions: &[(String, i32)],
        subscribed: impl Fn(&[u8], &str) -> bool,
    ) -> Result<Vec<Result<(), GroupError>>, GroupError> {
        let g = self.groups.get_mut(group_id).ok_or(GroupError::GroupIdNotFound)?;
        let protocol = g.protocol.clone().unwrap_or_default();
        let mut results = Vec::with_capacity(partitions.len());
        for (topic, partition) in partitions {
            let in_use = (g.state != GroupState::Empty
                && g.members.iter().any(|m| subscribed(&m.metadata_for(&protocol), topic)))
                || g.consumer.as_ref().is_some_and(|c| c.subscribes_to(topic));
            if in_use {
                results.push(Err(GroupError::GroupSubscribedToTopic));
                continue;
            }
            if g.offsets.remove(&(topic.clone(), *partition)).is_some() {
                self.pending_records.push(PendingRecord {
                    group_id: group_id.to_string(),
                    key: records::offset_key(group_id, topic, *partition),
                    value: None,
                });
            }
            results.push(Ok(()));
        }
        Ok(results)
    }
}

/// The rebalance reason of a join: what the coordinator saw, and the client's own
/// (JoinGroup v8's Reason), as Kafka logs them.
fn join_reason(what: &str, client: &Option<String>) -> String {
    match client {
        Some(r) => format!("{what}; client reason: {r}"),
        None => what.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct OneTopic;

    impl TopicsImage for OneTopic {
        fn topic(&self, name: &str) -> Option<(uuid::Uuid, i32)> {
            (name == "t").then_some((uuid::Uuid::from_u128(9), 2))
        }
        fn matching(&self, _: &regex::Regex) -> Vec<String> {
            Vec::new()
        }
        fn generation(&self) -> u64 {
            1
        }
    }

    /// A consumer group (KIP-848) as the other group APIs see it: commits and fetches
    /// at the member's epoch, OffsetCommit below v9 refused from its members, classic
    /// members kept out, listed and described as a consumer group.
    #[test]
    fn a_consumer_group_seen_by_the_other_group_apis() {
        let mut c = GroupCoordinator::new(GroupConfig::default());
        let hb = ConsumerHeartbeat {
            group_id: "cg".into(),
            member_id: "m".into(),
            member_epoch: 0,
            instance_id: None,
            rack_id: None,
            rebalance_timeout_ms: 1000,
            subscribed_topic_names: Some(vec!["t".into()]),
            subscribed_topic_regex: None,
            server_assignor: None,
            owned: Some(Default::default()),
            client_id: "c".into(),
            client_host: "h".into(),
        };
        assert_eq!(c.consumer_heartbeat(&hb, &OneTopic, 0, "x").expect("join").member_epoch, 1);
        assert_eq!(c.validate_commit("cg", "m", None, 1), Ok(()));
        assert_eq!(c.validate_commit("cg", "m", None, 0), Err(GroupError::StaleMemberEpoch));
        assert_eq!(c.validate_commit("cg", "other", None, 1), Err(GroupError::UnknownMemberId));
        assert_eq!(c.validate_commit("cg", "", None, -1), Err(GroupError::UnknownMemberId), "the group has members");
        assert_eq!(c.check_commit_version("cg", "m", false), Err(GroupError::UnsupportedVersion));
        assert_eq!(c.check_commit_version("cg", "m", true), Ok(()));
        assert_eq!(c.check_commit_version("cg", "", false), Ok(()), "not a member: the usual checks decide");
        assert_eq!(c.validate_fetch("cg", Some(("m", 0))), Err(GroupError::StaleMemberEpoch));
        assert_eq!(c.validate_fetch("cg", Some(("m", 1))), Ok(()));
        assert_eq!(c.validate_fetch("cg", None), Ok(()));
        assert_eq!(c.validate_txn_commit("cg", "m", None, 0), Err(GroupError::IllegalGeneration));
        match c.join(join_req("cg", "", None), 0, "j".into()) {
            Deferred::Now(r) => assert_eq!(r.error, Some(GroupError::InconsistentGroupProtocol)),
            Deferred::Later(_) => panic!("a classic member joined a consumer group"),
        }
        let listed = c.list();
        assert_eq!((listed[0].group_type, listed[0].state), ("consumer", "Stable"));
        assert!(matches!(c.describe("cg"), Some(Described::Consumer(_))));
        assert_eq!(c.delete_group("cg"), Err(GroupError::NonEmptyGroup));
    }

    fn join_req(group: &str, member: &str, instance: Option<&str>) -> JoinRequest {
        JoinRequest {
            group_id: group.into(),
            member_id: member.into(),
            group_instance_id: instance.map(String::from),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            require_known_member_id: true,
            reason: None,
        }
    }

    fn now<T>(d: Deferred<T>) -> T {
        match d {
            Deferred::Now(t) => t,
            Deferred::Later(_) => panic!("expected an immediate answer"),
        }
    }

    fn later<T>(d: Deferred<T>) -> oneshot::Receiver<T> {
        match d {
            Deferred::Later(rx) => rx,
            Deferred::Now(_) => panic!("expected a deferred answer"),
        }
    }

    fn ready<T>(rx: &mut oneshot::Receiver<T>) -> Option<T> {
        rx.try_recv().expect("not cancelled")
    }

    /// Two members join (KIP-394 first), the rebalance completes after the initial
    /// delay, the leader assigns, both are stable; then one times out and the survivor
    /// is told to rejoin.
    #[test]
    fn join_sync_heartbeat_expiry() {
        let mut c = GroupCoordinator::new(GroupConfig::default());
        let r1 = now(c.join(join_req("g", "", None), 0, "m1".into()));
        assert_eq!(r1.error, Some(GroupError::MemberIdRequired));
        let mut j1 = later(c.join(join_req("g", "m1", None), 10, "x".into()));
        let r2 = now(c.join(join_req("g", "", None), 20, "m2".into()));
        assert_eq!(r2.member_id, "m2");
        let mut j2 = later(c.join(join_req("g", "m2", None), 30, "x".into()));
        c.tick(1000);
        assert!(ready(&mut j1).is_none(), "initial delay holds the join");
        c.tick(3100);
        let a1 = ready(&mut j1).unwrap();
        let a2 = ready(&mut j2).unwrap();
        assert_eq!((a1.generation_id, a2.generation_id), (1, 1));
        assert_eq!(a1.leader, "m1");
        assert_eq!(a1.members.len(), 2);
        assert!(a2.members.is_empty());
        assert_eq!(a1.protocol_name.as_deref(), Some("range"));

        let sync = |m: &str, assign: Vec<(String, Bytes)>| SyncRequest {
            group_id: "g".into(),
            member_id: m.into(),
            group_instance_id: None,
            generation_id: 1,
            protocol_type: Some("consumer".into()),
            protocol_name: Some("range".into()),
            assignments: assign,
        };
        let mut s2 = later(c.sync(sync("m2", vec![]), 3200));
        assert!(ready(&mut s2).is_none(), "follower waits for the leader");
        let mut s1 = later(c.sync(
            sync("m1", vec![("m1".into(), Bytes::from_static(b"a1")), ("m2".into(), Bytes::from_static(b"a2"))]),
            3300,
        ));
        assert_eq!(&ready(&mut s1).unwrap().assignment[..], b"a1");
        assert_eq!(&ready(&mut s2).unwrap().assignment[..], b"a2");
        assert_eq!(c.describe("g").and_then(Described::classic).unwrap().state, GroupState::Stable);
        assert!(!c.take_pending_records().is_empty(), "group metadata persisted");

        assert_eq!(c.heartbeat("g", "m1", None, 1, 5000), Ok(()));
        assert_eq!(c.heartbeat("g", "m1", None, 0, 5000), Err(GroupError::IllegalGeneration));
        assert_eq!(c.heartbeat("g", "nobody", None, 1, 5000), Err(GroupError::UnknownMemberId));
        // m2 stops heartbeating; after its session timeout m1 is told to rebalance.
        c.tick(13_400);
        assert_eq!(c.heartbeat("g", "m1", None, 1, 13_400), Err(GroupError::RebalanceInProgress));
        let mut j1 = later(c.join(join_req("g", "m1", None), 13_500, "x".into()));
        let a = ready(&mut j1).unwrap();
        assert_eq!(a.generation_id, 2);
        assert_eq!(a.members.len(), 1);
    }

    #[test]
    fn static_member_rejoins_without_rebalance_and_old_id_is_fenced() {
        let mut c = GroupCoordinator::new(GroupConfig { initial_rebalance_delay_ms: 50, ..Default::default() });
        let mut j1 = later(c.join(join_req("g", "", Some("i1")), 0, "m1".into()));
        let mut j2 = later(c.join(join_req("g", "", Some("i2")), 0, "m2".into()));
        c.tick(60);
        let (a1, a2) = (ready(&mut j1).unwrap(), ready(&mut j2).unwrap());
        let leader = a1.leader.clone();
        assert_eq!(a2.leader, leader);
        let follower = if leader == "m1" { ("m2", "i2") } else { ("m1", "i1") };
        let s = SyncRequest {
            group_id: "g".into(),
            member_id: leader.clone(),
            group_instance_id: Some(if leader == "m1" { "i1" } else { "i2" }.into()),
            generation_id: 1,
            protocol_type: None,
            protocol_name: None,
            assignments: vec![("m1".into(), Bytes::from_static(b"p0")), ("m2".into(), Bytes::from_static(b"p1"))],
        };
        let _ = c.sync(s, 2);
        // The follower restarts: same instance id, new member id, same generation.
        let r = now(c.join(join_req("g", "", Some(follower.1)), 100, "m9".into()));
        assert_eq!(r.generation_id, 1, "no rebalance");
        assert_eq!(r.member_id, "m9");
        assert!(!r.skip_assignment && r.members.is_empty(), "a follower is no leader");
        assert_eq!(c.describe("g").and_then(Described::classic).unwrap().state, GroupState::Stable);
        assert_eq!(c.heartbeat("g", follower.0, Some(follower.1), 1, 101), Err(GroupError::FencedInstanceId));
        assert_eq!(c.heartbeat("g", &leader, None, 1, 101), Ok(()));
        // The leader restarts: still the leader, told to skip the assignment (KIP-814),
        // with the members (it watches their subscriptions); still no rebalance.
        let instance = if leader == "m1" { "i1" } else { "i2" };
        let r = now(c.join(join_req("g", "", Some(instance)), 110, "m10".into()));
        assert_eq!((r.generation_id, r.leader.as_str(), r.skip_assignment), (1, "m10", true));
        assert_eq!(r.members.len(), 2);
        assert_eq!(c.describe("g").and_then(Described::classic).unwrap().state, GroupState::Stable);
    }

    /// Leadership of an offsets partition moved away: its groups go (a waiting join is
    /// answered by the dropped channel: NOT_COORDINATOR), other partitions' stay.
    #[test]
    fn unloading_a_partition_drops_only_its_groups_and_their_waiters() {
        let parts = 50;
        let (a, b) = ("my-group", "other-group");
        assert_ne!(super::super::offsets_partition_for(a, parts), super::super::offsets_partition_for(b, parts));
        let mut c = GroupCoordinator::new(GroupConfig::default());
        let (recs, _) = c.commit_records(
            b,
            &[OffsetCommit { topic: "t".into(), partition: 0, offset: 5, leader_epoch: -1, metadata: "".into() }],
            1,
        );
        for r in recs {
            c.apply_record(records::decode(&r.key, r.value.as_ref()).unwrap(), 0, 1);
        }
        let _ = now(c.join(join_req(a, "", None), 0, "m1".into()));
        let mut waiting = later(c.join(join_req(a, "m1", None), 10, "x".into()));
        assert_eq!(c.unload_partition(super::super::offsets_partition_for(a, parts), parts), 1);
        assert!(waiting.try_recv().is_err(), "the waiting join's sender was dropped");
        assert!(c.describe(a).is_none());
        assert!(c.take_pending_records().iter().all(|r| r.group_id != a), "nothing left to write for it");
        assert_eq!(c.fetch_offsets(b, None, false)[0].2.clone().unwrap().map(|o| o.offset), Some(5));
    }

    #[test]
    fn commits_validate_and_reload_from_records() {
        let mut c = GroupCoordinator::new(GroupConfig::default());
        assert_eq!(c.validate_commit("simple", "", None, -1), Ok(()));
        let (recs, res) = c.commit_records(
            "simple",
            &[OffsetCommit { topic: "t".into(), partition: 0, offset: 42, leader_epoch: -1, metadata: "x".into() }],
            7,
        );
        assert_eq!(res, vec![Ok(())]);
        let mut reloaded = GroupCoordinator::new(GroupConfig::default());
        for r in recs {
            let rec = records::decode(&r.key, r.value.as_ref()).unwrap();
            c.apply_record(rec.clone(), 0, 7);
            reloaded.apply_record(rec, 0, 7);
        }
        for co in [&c, &reloaded] {
            let got = co.fetch_offsets("simple", Some(&[("t".into(), 0), ("t".into(), 1)]), true);
            assert_eq!(got[0].2.as_ref().unwrap().as_ref().unwrap().offset, 42);
            assert_eq!(got[1].2, Ok(None));
        }
        // Offsets of an empty group expire after the retention.
        c.tick(7 + 7 * 24 * 3600 * 1000 + 1);
        assert!(c.fetch_offsets("simple", None, false).is_empty());
        assert!(c.take_pending_records().iter().any(|r| r.value.is_none()), "tombstone written");
    }

    /// A group emptied by LeaveGroup must reload as Empty, not with the departed member
    /// (found by tests/test_groups.py: a restart brought the member back).
    #[test]
    fn leave_is_persisted() {
        let mut c = GroupCoordinator::new(GroupConfig { initial_rebalance_delay_ms: 0, ..Default::default() });
        let mut j1 = later(c.join(join_req("g", "", Some("i1")), 0, "m1".into()));
        c.tick(1);
        ready(&mut j1).unwrap();
        c.leave("g", &[("m1".into(), None)], 5).unwrap();
        let mut reloaded = GroupCoordinator::new(GroupConfig::default());
        for r in c.take_pending_records() {
            reloaded.apply_record(records::decode(&r.key, r.value.as_ref()).unwrap(), 0, 10);
        }
        let d = reloaded.describe("g").and_then(Described::classic).unwrap();
        assert_eq!(d.state, GroupState::Empty);
        assert!(d.members.is_empty());
    }

    /// Kafka lets a member of the current generation commit while the next rebalance
    /// is prepared; refusing it made eager consumers re-read what they had processed.
    #[test]
    fn commit_allowed_while_preparing_rebalance() {
        let mut c = GroupCoordinator::new(GroupConfig { initial_rebalance_delay_ms: 0, ..Default::default() });
        let mut j1 = later(c.join(join_req("g", "", Some("i1")), 0, "m1".into()));
        c.tick(1);
        let gen = ready(&mut j1).unwrap().generation_id;
        let _ = c.sync(
            SyncRequest {
                group_id: "g".into(),
                member_id: "m1".into(),
                group_instance_id: Some("i1".into()),
                generation_id: gen,
                protocol_type: None,
                protocol_name: None,
                assignments: vec![],
            },
            2,
        );
        let _ = c.join(join_req("g", "", Some("i2")), 3, "m2".into());
        assert_eq!(c.describe("g").and_then(Described::classic).unwrap().state, GroupState::PreparingRebalance);
        assert_eq!(c.validate_commit("g", "m1", Some("i1"), gen), Ok(()));
    }

    #[test]
    fn leave_triggers_rebalance_and_empty_group_can_be_deleted() {
        let mut c = GroupCoordinator::new(GroupConfig { initial_rebalance_delay_ms: 0, ..Default::default() });
        let mut j1 = later(c.join(join_req("g", "", Some("i1")), 0, "m1".into()));
        c.tick(1);
        ready(&mut j1).unwrap();
        assert_eq!(c.delete_group("g"), Err(GroupError::NonEmptyGroup));
        let r = c.leave("g", &[(String::new(), Some("i1".into())), ("ghost".into(), None)], 5).unwrap();
        assert_eq!(r, vec![Ok(()), Err(GroupError::UnknownMemberId)]);
        assert_eq!(c.describe("g").and_then(Described::classic).unwrap().state, GroupState::Empty);
        assert_eq!(c.delete_group("g"), Ok(()));
        assert_eq!(c.delete_group("g"), Err(GroupError::GroupIdNotFound));
    }
}
