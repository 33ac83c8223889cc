//! Consumer groups of the next-generation protocol (KIP-848, `group.protocol=consumer`):
//! the broker computes the assignment and each member reconciles towards it through its
//! heartbeats.
//!
//! One `ConsumerGroup` lives inside the shard's `GroupCoordinator` (on the shard that
//! owns the group's `__consumer_offsets` partition). It is a state machine: a heartbeat
//! comes in with the cluster's topics (`TopicsImage`) and the time; the answer goes out.
//! No I/O, no clock.
//!
//! Epochs, as Kafka's group coordinator keeps them:
//! - the **group epoch** grows when a member joins, leaves or changes its subscription,
//!   or when the subscribed topics change (created, deleted, more partitions);
//! - the **assignment epoch** is the group epoch the target assignment was computed for;
//!   a heartbeat that finds `group_epoch > assignment_epoch` runs the assignor;
//! - a **member epoch** is the assignment epoch the member has reconciled to.
//!
//! Reconciliation is incremental: a partition leaves its old owner (the owner reports in
//! a heartbeat that it no longer holds it) before it is given to its new one; members
//! keep consuming what they keep. Invariants: a partition is held (assigned or pending
//! revocation) by at most one member (`owners`); a member's epoch never exceeds the
//! assignment epoch; the assignment epoch never exceeds the group epoch.
//!
//! What changes is written to `__consumer_offsets` in Kafka's record schemas
//! (`consumer_records`, taken with `take_records` after each event) and read back by
//! `replay` when a coordinator loads the partition, so a group outlives its
//! coordinator's broker. The subscribed topics' metadata is not stored: the first
//! heartbeat after a load finds it changed and bumps the group epoch once (members move
//! to the new epoch without giving up partitions).
//!
//! Not yet here (issue 47): racks are not used by the assignors, and a classic group is
//! not converted online while it has members.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use uuid::Uuid;

use super::consumer_records::{ConsumerRecord, StoredAssignment, StoredConsumerMember};
use super::GroupError;

/// Partitions by topic id, as the protocol carries them.
pub type TopicPartitions = BTreeMap<Uuid, BTreeSet<i32>>;

/// Member epoch of a member leaving the group (ConsumerGroupHeartbeat).
pub const LEAVE_EPOCH: i32 = -1;
/// Member epoch of a static member leaving for now (it keeps its partitions until its
/// session times out, or its instance id rejoins).
pub const STATIC_LEAVE_EPOCH: i32 = -2;

/// The cluster's topics as the group needs them: taken from the shard's view.
pub trait TopicsImage {
    /// A topic's id and partition count.
    fn topic(&self, name: &str) -> Option<(Uuid, i32)>;
    /// The names of the (non-internal) topics a subscription regex matches.
    fn matching(&self, regex: &regex::Regex) -> Vec<String>;
    /// Changes whenever the set of topics changes: regex resolutions are kept until it
    /// moves.
    fn generation(&self) -> u64;
}

/// `group.consumer.*` broker configs, with Kafka 4.4's names and defaults.
#[derive(Debug, Clone)]
pub struct ConsumerGroupConfig {
    /// group.consumer.session.timeout.ms (45000)
    pub session_timeout_ms: i32,
    /// group.consumer.heartbeat.interval.ms (5000)
    pub heartbeat_interval_ms: i32,
    /// group.consumer.max.size (Integer.MAX_VALUE)
    pub members_max: usize,
    /// group.consumer.assignors ("uniform,range"); the first is the default.
    pub assignors: Vec<String>,
}

impl Default for ConsumerGroupConfig {
    fn default() -> Self {
        Self {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            members_max: i32::MAX as usize,
            assignors: vec![UNIFORM.to_string(), RANGE.to_string()],
        }
    }
}

/// The assignors Spate runs on the broker (Kafka's names).
pub const UNIFORM: &str = "uniform";
pub const RANGE: &str = "range";

/// One ConsumerGroupHeartbeat, decoded. `None` fields mean "unchanged" (the protocol's
/// nulls, and -1 for the rebalance timeout).
#[derive(Debug, Clone)]
pub struct ConsumerHeartbeat {
    pub group_id: String,
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// The partitions the member holds now (null: not reported).
    pub owned: Option<TopicPartitions>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerHeartbeatResponse {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's whole assignment, when it changed or the member asked for it.
    pub assignment: Option<TopicPartitions>,
}

/// An error answered to a heartbeat, with Kafka's message.
pub type ConsumerRefusal = (GroupError, String);

/// Where a member is in its reconciliation (Kafka's MemberState).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Holds its target assignment at the assignment epoch.
    Stable,
    /// Must give up `revoking` first; keeps its epoch until it reports that it did.
    UnrevokedPartitions,
    /// At the assignment epoch, but some target partitions are still held by others.
    UnreleasedPartitions,
}

#[derive(Debug, Clone)]
struct Member {
    id: String,
    instance_id: Option<String>,
    rack_id: Option<String>,
    client_id: String,
    client_host: String,
    /// Sorted, without duplicates.
    topic_names: Vec<String>,
    regex: Option<String>,
    server_assignor: Option<String>,
    rebalance_timeout_ms: i32,
    epoch: i32,
    previous_epoch: i32,
    state: MemberState,
    assigned: TopicPartitions,
    revoking: TopicPartitions,
    session_deadline_ms: i64,
    /// While revoking: the member is removed if it has not revoked by then.
    revocation_deadline_ms: Option<i64>,
}

impl Member {
    fn new(id: String) -> Self {
        Self {
            id,
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            topic_names: Vec::new(),
            regex: None,
            server_assignor: None,
            rebalance_timeout_ms: 0,
            epoch: 0,
            previous_epoch: -1,
            state: MemberState::Stable,
            assigned: TopicPartitions::new(),
            revoking: TopicPartitions::new(),
            session_deadline_ms: 0,
            revocation_deadline_ms: None,
        }
    }

    fn set_epoch(&mut self, epoch: i32) {
        if epoch != self.epoch {
            self.previous_epoch = self.epoch;
            self.epoch = epoch;
        }
    }

    fn stored_member(&self) -> StoredConsumerMember {
        StoredConsumerMember {
            instance_id: self.instance_id.clone(),
            rack_id: self.rack_id.clone(),
            client_id: self.client_id.clone(),
            client_host: self.client_host.clone(),
            topic_names: self.topic_names.clone(),
            regex: self.regex.clone(),
            rebalance_timeout_ms: self.rebalance_timeout_ms,
            server_assignor: self.server_assignor.clone(),
        }
    }

    fn stored_assignment(&self) -> StoredAssignment {
        StoredAssignment {
            member_epoch: self.epoch,
            previous_member_epoch: self.previous_epoch,
            state: match self.state {
                MemberState::Stable => 0,
                MemberState::UnrevokedPartitions => 1,
                MemberState::UnreleasedPartitions => 2,
            },
            assigned: self.assigned.clone(),
            revoking: self.revoking.clone(),
        }
    }
}

/// A member as ConsumerGroupDescribe shows it.
#[derive(Debug, Clone)]
pub struct ConsumerMemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub assignment: TopicPartitions,
    pub target_assignment: TopicPartitions,
}

#[derive(Debug, Clone)]
pub struct ConsumerGroupDescription {
    pub state: &'static str,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub assignor: String,
    pub members: Vec<ConsumerMemberDescription>,
}

/// One KIP-848 consumer group.
#[derive(Debug, Default)]
pub struct ConsumerGroup {
    group_epoch: i32,
    assignment_epoch: i32,
    members: BTreeMap<String, Member>,
    /// Target assignment of each member, computed at `assignment_epoch`.
    target: BTreeMap<String, TopicPartitions>,
    /// Who holds each partition (assigned or pending revocation).
    owners: HashMap<(Uuid, i32), String>,
    /// The subscribed topics as last seen: name -> (id, partitions).
    subscribed: BTreeMap<String, (Uuid, i32)>,
    /// Regex -> (topics generation, matching topic names).
    regexes: HashMap<String, (u64, Vec<String>)>,
    /// The assignor the last target assignment was computed with.
    assignor: String,
    /// Target assignments computed since this coordinator took the group.
    pub(super) rebalances: u64,
    /// What changed since the last `take_records`.
    dirty: Dirty,
    /// Set by `replay`: `owners` is rebuilt from the members before the next event.
    owners_stale: bool,
}

/// The records a group owes the log.
#[derive(Debug, Default)]
struct Dirty {
    epoch: bool,
    target_epoch: bool,
    /// Members whose metadata or current assignment changed.
    members: BTreeSet<String>,
    /// Members whose target changed.
    targets: BTreeSet<String>,
    removed: BTreeSet<String>,
}

impl ConsumerGroup {
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn members(&self) -> usize {
        self.members.len()
    }

    pub fn group_epoch(&self) -> i32 {
        self.group_epoch
    }

    /// Kafka's consumer group states: Empty, Assigning (a new target is owed),
    /// Reconciling (some member is not at the target yet), Stable.
    pub fn state_name(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.group_epoch > self.assignment_epoch {
            "Assigning"
        } else if self.members.values().any(|m| m.epoch != self.assignment_epoch || m.state != MemberState::Stable) {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// The member with this id, if any, at which epoch (OffsetCommit/OffsetFetch v9's
    /// checks).
    pub fn member_epoch(&self, member_id: &str) -> Option<i32> {
        self.members.get(member_id).map(|m| m.epoch)
    }

    /// Whether a member subscribes to `topic` (OffsetDelete refuses those).
    pub fn subscribes_to(&self, topic: &str) -> bool {
        self.members.values().any(|m| self.member_topics(m).any(|t| t == topic))
    }

    fn member_topics<'a>(&'a self, m: &'a Member) -> impl Iterator<Item = &'a str> + 'a {
        let regex = m.regex.as_ref().and_then(|r| self.regexes.get(r)).map(|(_, names)| names.as_slice());
        m.topic_names.iter().map(String::as_str).chain(regex.unwrap_or(&[]).iter().map(String::as_str))
    }

    fn by_instance(&self, instance: &str) -> Option<&Member> {
        self.members.values().find(|m| m.instance_id.as_deref() == Some(instance))
    }

    /// Record that `member` now holds exactly its `assigned` and `revoking` partitions.
    fn set_holdings(&mut self, member: &Member, before: Option<(&TopicPartitions, &TopicPartitions)>) {
        if let Some((assigned, revoking)) = before {
            for (t, ps) in assigned.iter().chain(revoking.iter()) {
                for p in ps {
                    if self.owners.get(&(*t, *p)).is_some_and(|o| *o == member.id) {
                        self.owners.remove(&(*t, *p));
                    }
                }
            }
        }
        for (t, ps) in member.assigned.iter().chain(member.revoking.iter()) {
            for p in ps {
                let previous = self.owners.insert((*t, *p), member.id.clone());
                debug_assert!(
                    previous.as_ref().is_none_or(|o| *o == member.id),
                    "partition {t}:{p} held by {previous:?} and {}",
                    member.id
                );
            }
        }
    }

    fn remove_member(&mut self, member_id: &str) -> Option<Member> {
        let m = self.members.remove(member_id)?;
        self.owners.retain(|_, o| o != member_id);
        self.target.remove(member_id);
        self.group_epoch += 1;
        self.dirty.epoch = true;
        self.dirty.members.remove(member_id);
        self.dirty.targets.remove(member_id);
        self.dirty.removed.insert(member_id.to_string());
        Some(m)
    }

    /// The records that bring the log up to this state since the last call, in the
    /// order Kafka writes them (a removed member's tombstones first; the group epoch
    /// before the target that follows it; the target before the members' assignments).
    pub fn take_records(&mut self, group: &str) -> Vec<ConsumerRecord> {
        let d = std::mem::take(&mut self.dirty);
        let mut out = Vec::new();
        let g = || group.to_string();
        for id in &d.removed {
            out.push(ConsumerRecord::CurrentAssignment { group: g(), member: id.clone(), value: None });
            out.push(ConsumerRecord::TargetMember { group: g(), member: id.clone(), partitions: None });
            out.push(ConsumerRecord::Member { group: g(), member: id.clone(), value: None });
        }
        for id in &d.members {
            if let Some(m) = self.members.get(id) {
                out.push(ConsumerRecord::Member { group: g(), member: id.clone(), value: Some(m.stored_member()) });
            }
        }
        if d.epoch {
            out.push(ConsumerRecord::GroupEpoch { group: g(), epoch: Some(self.group_epoch) });
        }
        for id in &d.targets {
            if let Some(t) = self.target.get(id) {
                out.push(ConsumerRecord::TargetMember { group: g(), member: id.clone(), partitions: Some(t.clone()) });
            }
        }
        if d.target_epoch {
            out.push(ConsumerRecord::TargetEpoch { group: g(), epoch: Some(self.assignment_epoch) });
        }
        for id in &d.members {
            if let Some(m) = self.members.get(id) {
                out.push(ConsumerRecord::CurrentAssignment {
                    group: g(),
                    member: id.clone(),
                    value: Some(m.stored_assignment()),
                });
            }
        }
        out
    }

    /// Apply one record read back from the log (a load). Untrusted: whatever the
    /// records say, the group stays usable (`owners` is rebuilt from the members, a
    /// partition claimed twice going to the first member by id).
    pub fn replay(&mut self, rec: ConsumerRecord, now_ms: i64, config: &ConsumerGroupConfig) {
        self.owners_stale = true;
        match rec {
            ConsumerRecord::GroupEpoch { epoch: Some(e), .. } => self.group_epoch = e,
            ConsumerRecord::TargetEpoch { epoch: Some(e), .. } => self.assignment_epoch = e,
            ConsumerRecord::GroupEpoch { epoch: None, .. }
            | ConsumerRecord::TargetEpoch { epoch: None, .. }
            | ConsumerRecord::PartitionMetadata { .. }
            | ConsumerRecord::CurrentAssignment { value: None, .. } => {}
            ConsumerRecord::Member { member, value: Some(v), .. } => {
                let m = self.members.entry(member.clone()).or_insert_with(|| Member::new(member));
                m.instance_id = v.instance_id;
                m.rack_id = v.rack_id;
                m.client_id = v.client_id;
                m.client_host = v.client_host;
                m.topic_names = v.topic_names;
                m.regex = v.regex;
                m.rebalance_timeout_ms = v.rebalance_timeout_ms;
                m.server_assignor = v.server_assignor;
                m.session_deadline_ms = now_ms + config.session_timeout_ms as i64;
            }
            ConsumerRecord::Member { member, value: None, .. } => {
                self.members.remove(&member);
                self.target.remove(&member);
            }
            ConsumerRecord::TargetMember { member, partitions: Some(p), .. } => {
                self.target.insert(member, p);
            }
            ConsumerRecord::TargetMember { member, partitions: None, .. } => {
                self.target.remove(&member);
            }
            ConsumerRecord::CurrentAssignment { member, value: Some(a), .. } => {
                let m = self.members.entry(member.clone()).or_insert_with(|| Member::new(member));
                m.epoch = a.member_epoch;
                m.previous_epoch = a.previous_member_epoch;
                m.state = match a.state {
                    1 => MemberState::UnrevokedPartitions,
                    2 => MemberState::UnreleasedPartitions,
                    _ => MemberState::Stable,
                };
                m.assigned = a.assigned;
                m.revoking = a.revoking;
                m.revocation_deadline_ms = (m.state == MemberState::UnrevokedPartitions)
                    .then(|| now_ms + m.rebalance_timeout_ms.max(0) as i64);
                m.session_deadline_ms = now_ms + config.session_timeout_ms as i64;
            }
        }
    }

    /// After a load: `owners` from the members' holdings, the epochs made consistent.
    fn settle_after_replay(&mut self) {
        if !self.owners_stale {
            return;
        }
        self.owners_stale = false;
        self.assignment_epoch = self.assignment_epoch.min(self.group_epoch);
        self.owners.clear();
        let assignment_epoch = self.assignment_epoch;
        for m in self.members.values_mut() {
            m.epoch = m.epoch.min(assignment_epoch);
            for set in [&mut m.assigned, &mut m.revoking] {
                for (t, ps) in set.iter_mut() {
                    ps.retain(|p| match self.owners.get(&(*t, *p)) {
                        Some(_) => false,
                        None => {
                            self.owners.insert((*t, *p), m.id.clone());
                            true
                        }
                    });
                }
                set.retain(|_, ps| !ps.is_empty());
            }
        }
    }

    /// Handle one heartbeat. `new_member_id` names a member joining without an id
    /// (ConsumerGroupHeartbeat v0).
    pub fn heartbeat(
        &mut self,
        config: &ConsumerGroupConfig,
        req: &ConsumerHeartbeat,
        topics: &dyn TopicsImage,
        now_ms: i64,
        new_member_id: &str,
    ) -> Result<ConsumerHeartbeatResponse, ConsumerRefusal> {
        validate(config, req)?;
        self.settle_after_replay();
        if req.member_epoch == LEAVE_EPOCH || req.member_epoch == STATIC_LEAVE_EPOCH {
            return self.leave(req);
        }
        let joining = req.member_epoch == 0;
        let member_id = if req.member_id.is_empty() { new_member_id.to_string() } else { req.member_id.clone() };
        // Find the member, or make one.
        let mut replaced: Option<Member> = None;
        let existing: Option<Member> = match &req.instance_id {
            None => self.members.get(&member_id).cloned(),
            Some(instance) => match self.by_instance(instance).cloned() {
                Some(m) if m.id == member_id => Some(m),
                Some(m) if joining => {
                    if m.epoch != STATIC_LEAVE_EPOCH {
                        return Err((
                            GroupError::UnreleasedInstanceId,
                            format!(
                                "Static member {member_id} with instance id {instance} cannot join the group because the instance id is owned by {} member.",
                                m.id
                            ),
                        ));
                    }
                    replaced = Some(m);
                    None
                }
                Some(m) => {
                    return Err((
                        GroupError::FencedInstanceId,
                        format!("Static member {member_id} with instance id {instance} was fenced by member {}.", m.id),
                    ))
                }
                None if joining => None,
                None => return Err((GroupError::UnknownMemberId, format!("Instance id {instance} is unknown."))),
            },
        };
        if existing.is_none() && self.members.len() >= config.members_max && replaced.is_none() {
            return Err((
                GroupError::GroupMaxSizeReached,
                format!("The consumer group has reached its maximum capacity of {} members.", config.members_max),
            ));
        }
        let mut member = match existing {
            Some(m) if joining => {
                // A rejoin: the member abandoned what it held (it was fenced, or
                // restarted with the same id); it reconciles from nothing.
                let mut m = m;
                let before = (m.assigned.clone(), m.revoking.clone());
                m.assigned.clear();
                m.revoking.clear();
                m.state = MemberState::Stable;
                m.revocation_deadline_ms = None;
                m.previous_epoch = m.epoch;
                m.epoch = 0;
                self.set_holdings(&m, Some((&before.0, &before.1)));
                m
            }
            Some(m) => {
                if req.member_epoch > m.epoch
                    || (req.member_epoch < m.epoch
                        && (req.member_epoch != m.previous_epoch
                            || !req.owned.as_ref().is_some_and(|o| is_subset(o, &m.assigned))))
                {
                    let which = if req.member_epoch > m.epoch { "greater" } else { "smaller" };
                    return Err((
                        GroupError::FencedMemberEpoch,
                        format!(
                            "The consumer group member has a {which} member epoch ({}) than the one known by the group coordinator ({}). The member must abandon all its partitions and rejoin.",
                            req.member_epoch, m.epoch
                        ),
                    ));
                }
                m
            }
            None if !joining => {
                return Err((
                    GroupError::UnknownMemberId,
                    format!("Member {member_id} is not a member of group {}.", req.group_id),
                ))
            }
            None => Member::new(member_id.clone()),
        };
        let is_new = !self.members.contains_key(&member.id);
        let stored_before = self.members.get(&member.id).map(|m| (m.stored_assignment(), m.stored_member()));
        let before = (member.topic_names.clone(), member.regex.clone());
        if let Some(i) = &req.instance_id {
            member.instance_id = Some(i.clone());
        }
        if let Some(r) = &req.rack_id {
            member.rack_id = Some(r.clone());
        }
        if req.rebalance_timeout_ms != -1 {
            member.rebalance_timeout_ms = req.rebalance_timeout_ms;
        }
        if let Some(a) = &req.server_assignor {
            member.server_assignor = Some(a.clone());
        }
        if let Some(names) = &req.subscribed_topic_names {
            let mut names = names.clone();
            names.sort();
            names.dedup();
            member.topic_names = names;
        }
        if let Some(regex) = &req.subscribed_topic_regex {
            member.regex = (!regex.is_empty()).then(|| regex.clone());
        }
        member.client_id = req.client_id.clone();
        member.client_host = req.client_host.clone();
        member.session_deadline_ms = now_ms + config.session_timeout_ms as i64;

        let mut bump = is_new && replaced.is_none();
        if (member.topic_names.clone(), member.regex.clone()) != before && !is_new {
            bump = true;
        }
        // A static member taking its instance's place inherits its partitions and its
        // target, without a rebalance.
        if let Some(old) = replaced {
            self.members.remove(&old.id);
            self.dirty.removed.insert(old.id.clone());
            self.dirty.targets.insert(member.id.clone());
            self.owners.retain(|_, o| *o != old.id);
            if let Some(t) = self.target.remove(&old.id) {
                self.target.insert(member.id.clone(), t);
            }
            member.assigned = old.assigned;
            member.revoking = old.revoking;
            member.state = old.state;
            member.epoch = self.assignment_epoch.min(old.previous_epoch.max(0));
            self.set_holdings(&member, None);
        }
        self.members.insert(member.id.clone(), member);
        if let Some(regex) = self.members[&member_id].regex.clone() {
            self.resolve_regex(&regex, topics);
        }
        let subscribed = self.subscription_metadata(topics);
        if subscribed != self.subscribed {
            self.subscribed = subscribed;
            bump = true;
        }
        if bump {
            self.group_epoch += 1;
            self.dirty.epoch = true;
        }
        if self.group_epoch > self.assignment_epoch {
            self.compute_target(config);
        }
        let previous = self.members[&member_id].clone();
        let mut member = previous.clone();
        self.reconcile(&mut member, req.owned.as_ref(), now_ms);
        self.set_holdings(&member, Some((&previous.assigned, &previous.revoking)));
        let changed = member.assigned != previous.assigned || joining;
        if stored_before != Some((member.stored_assignment(), member.stored_member())) {
            self.dirty.members.insert(member_id.clone());
        }
        let response = ConsumerHeartbeatResponse {
            member_id: member.id.clone(),
            member_epoch: member.epoch,
            heartbeat_interval_ms: config.heartbeat_interval_ms,
            assignment: (req.owned.is_some() || changed).then(|| member.assigned.clone()),
        };
        self.members.insert(member_id, member);
        Ok(response)
    }

    fn leave(&mut self, req: &ConsumerHeartbeat) -> Result<ConsumerHeartbeatResponse, ConsumerRefusal> {
        let member_id = match &req.instance_id {
            Some(instance) => match self.by_instance(instance) {
                Some(m) if m.id == req.member_id => m.id.clone(),
                Some(m) => {
                    return Err((
                        GroupError::FencedInstanceId,
                        format!(
                            "Static member {} with instance id {instance} was fenced by member {}.",
                            req.member_id, m.id
                        ),
                    ))
                }
                None => return Err((GroupError::UnknownMemberId, format!("Instance id {instance} is unknown."))),
            },
            None => req.member_id.clone(),
        };
        if !self.members.contains_key(&member_id) {
            return Err((
                GroupError::UnknownMemberId,
                format!("Member {member_id} is not a member of group {}.", req.group_id),
            ));
        }
        if req.member_epoch == STATIC_LEAVE_EPOCH {
            // Kept, partitions and all, until its session ends or its instance rejoins.
            let m = self.members.get_mut(&member_id).expect("checked");
            m.previous_epoch = m.epoch;
            m.epoch = STATIC_LEAVE_EPOCH;
            self.dirty.members.insert(member_id.clone());
        } else {
            self.remove_member(&member_id);
        }
        Ok(ConsumerHeartbeatResponse {
            member_id,
            member_epoch: req.member_epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        })
    }

    fn resolve_regex(&mut self, regex: &str, topics: &dyn TopicsImage) {
        let generation = topics.generation();
        if self.regexes.get(regex).is_some_and(|(g, _)| *g == generation) {
            return;
        }
        // Checked by `validate`.
        let Ok(re) = regex::Regex::new(&anchored(regex)) else { return };
        let mut names = topics.matching(&re);
        names.sort();
        self.regexes.insert(regex.to_string(), (generation, names));
    }

    /// Every subscribed topic that exists, with its id and partition count.
    fn subscription_metadata(&mut self, topics: &dyn TopicsImage) -> BTreeMap<String, (Uuid, i32)> {
        let used: BTreeSet<String> = self.members.values().filter_map(|m| m.regex.clone()).collect();
        self.regexes.retain(|r, _| used.contains(r));
        for r in &used {
            self.resolve_regex(r, topics);
        }
        let mut out = BTreeMap::new();
        for m in self.members.values() {
            for t in self.member_topics(m) {
                if !out.contains_key(t) {
                    if let Some(meta) = topics.topic(t) {
                        out.insert(t.to_string(), meta);
                    }
                }
            }
        }
        out
    }

    /// The assignor the members prefer most (ties: by name), else the default.
    fn preferred_assignor(&self, config: &ConsumerGroupConfig) -> String {
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = &m.server_assignor {
                *votes.entry(a.as_str()).or_default() += 1;
            }
        }
        let best = votes.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(a, _)| a.to_string());
        best.or_else(|| config.assignors.first().cloned()).unwrap_or_else(|| UNIFORM.to_string())
    }

    fn compute_target(&mut self, config: &ConsumerGroupConfig) {
        let assignor = self.preferred_assignor(config);
        let subscriptions: BTreeMap<String, BTreeSet<Uuid>> = self
            .members
            .values()
            .map(|m| {
                let ids = self.member_topics(m).filter_map(|t| self.subscribed.get(t).map(|(id, _)| *id)).collect();
                (m.id.clone(), ids)
            })
            .collect();
        let partitions: BTreeMap<Uuid, i32> = self.subscribed.values().map(|(id, n)| (*id, *n)).collect();
        let target = if assignor == RANGE {
            assign_range(&subscriptions, &partitions)
        } else {
            assign_uniform(&subscriptions, &partitions, &self.target)
        };
        for (id, t) in &target {
            if self.target.get(id) != Some(t) {
                self.dirty.targets.insert(id.clone());
            }
        }
        self.target = target;
        self.dirty.target_epoch = true;
        self.assignor = assignor;
        self.assignment_epoch = self.group_epoch;
        self.rebalances += 1;
    }

    /// Move `m` towards its target (Kafka's CurrentAssignmentBuilder).
    fn reconcile(&self, m: &mut Member, owned: Option<&TopicPartitions>, now_ms: i64) {
        if m.epoch == STATIC_LEAVE_EPOCH {
            return;
        }
        let target_epoch = self.assignment_epoch;
        match m.state {
            MemberState::Stable if m.epoch == target_epoch => {}
            MemberState::Stable | MemberState::UnreleasedPartitions => self.next_assignment(m, m.epoch, owned, now_ms),
            MemberState::UnrevokedPartitions => {
                if owns_any(owned, &m.revoking) {
                    // Still held: recompute against the newest target from everything
                    // the member holds (a partition back in its target is kept).
                    let revoking = std::mem::take(&mut m.revoking);
                    for (t, ps) in revoking {
                        m.assigned.entry(t).or_default().extend(ps);
                    }
                    self.next_assignment(m, m.epoch, owned, now_ms);
                } else {
                    m.revoking.clear();
                    self.next_assignment(m, (m.epoch + 1).min(target_epoch), owned, now_ms);
                }
            }
        }
    }

    fn next_assignment(&self, m: &mut Member, epoch: i32, owned: Option<&TopicPartitions>, now_ms: i64) {
        let empty = TopicPartitions::new();
        let target = self.target.get(&m.id).unwrap_or(&empty);
        let mut kept = TopicPartitions::new();
        let mut revoke = TopicPartitions::new();
        let mut newly = TopicPartitions::new();
        let mut unreleased = false;
        let topics: BTreeSet<Uuid> = target.keys().chain(m.assigned.keys()).copied().collect();
        for t in topics {
            let want = target.get(&t);
            let have = m.assigned.get(&t);
            for p in have.into_iter().flatten() {
                let bucket = if want.is_some_and(|w| w.contains(p)) { &mut kept } else { &mut revoke };
                bucket.entry(t).or_default().insert(*p);
            }
            for p in want.into_iter().flatten() {
                if have.is_some_and(|h| h.contains(p)) {
                    continue;
                }
                if self.owners.get(&(t, *p)).is_none_or(|o| *o == m.id) {
                    newly.entry(t).or_default().insert(*p);
                } else {
                    unreleased = true;
                }
            }
        }
        if !revoke.is_empty() && owns_any(owned, &revoke) {
            m.state = MemberState::UnrevokedPartitions;
            m.set_epoch(epoch);
            m.assigned = kept;
            m.revoking = revoke;
            if m.revocation_deadline_ms.is_none() {
                m.revocation_deadline_ms = Some(now_ms + m.rebalance_timeout_ms.max(0) as i64);
            }
            return;
        }
        for (t, ps) in newly {
            kept.entry(t).or_default().extend(ps);
        }
        m.state = if unreleased { MemberState::UnreleasedPartitions } else { MemberState::Stable };
        m.set_epoch(self.assignment_epoch);
        m.assigned = kept;
        m.revoking.clear();
        m.revocation_deadline_ms = None;
    }

    /// Session and revocation timeouts. Returns the ids of the members removed, with why.
    pub fn tick(&mut self, now_ms: i64) -> Vec<(String, &'static str)> {
        self.settle_after_replay();
        let mut gone = Vec::new();
        for m in self.members.values() {
            if now_ms > m.session_deadline_ms {
                gone.push((m.id.clone(), "session timed out"));
            } else if m.revocation_deadline_ms.is_some_and(|d| now_ms > d) {
                gone.push((m.id.clone(), "did not revoke its partitions within its rebalance timeout"));
            }
        }
        for (id, _) in &gone {
            self.remove_member(id);
        }
        gone
    }

    pub fn describe(&self) -> ConsumerGroupDescription {
        ConsumerGroupDescription {
            state: self.state_name(),
            group_epoch: self.group_epoch,
            assignment_epoch: self.assignment_epoch,
            assignor: self.assignor.clone(),
            members: self
                .members
                .values()
                .map(|m| ConsumerMemberDescription {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    member_epoch: m.epoch,
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed_topic_names: m.topic_names.clone(),
                    subscribed_topic_regex: m.regex.clone(),
                    assignment: m.assigned.clone(),
                    target_assignment: self.target.get(&m.id).cloned().unwrap_or_default(),
                })
                .collect(),
        }
    }

    /// Checks the invariants (tests and debug builds).
    pub fn check_invariants(&self) {
        assert!(self.assignment_epoch <= self.group_epoch);
        let mut held: HashMap<(Uuid, i32), &str> = HashMap::new();
        for m in self.members.values() {
            assert!(m.epoch <= self.assignment_epoch, "member {} at {} > {}", m.id, m.epoch, self.assignment_epoch);
            for (t, ps) in m.assigned.iter().chain(m.revoking.iter()) {
                for p in ps {
                    if let Some(other) = held.insert((*t, *p), &m.id) {
                        panic!("partition {t}:{p} held by {other} and {}", m.id);
                    }
                    assert_eq!(self.owners.get(&(*t, *p)).map(String::as_str), Some(m.id.as_str()));
                }
            }
        }
        assert_eq!(held.len(), self.owners.len(), "owners lists a partition no member holds");
    }
}

/// A subscription regex matches whole topic names (RE2/J's `matches()`).
fn anchored(regex: &str) -> String {
    format!("^(?:{regex})$")
}

fn validate(config: &ConsumerGroupConfig, req: &ConsumerHeartbeat) -> Result<(), ConsumerRefusal> {
    let invalid = |why: &str| Err((GroupError::InvalidRequest, why.to_string()));
    if req.group_id.is_empty() {
        return invalid("GroupId can't be empty.");
    }
    if req.instance_id.as_ref().is_some_and(|i| i.is_empty()) {
        return invalid("InstanceId can't be empty.");
    }
    if req.rack_id.as_ref().is_some_and(|r| r.is_empty()) {
        return invalid("RackId can't be empty.");
    }
    match req.member_epoch {
        0 => {
            if req.rebalance_timeout_ms == -1 {
                return invalid("RebalanceTimeoutMs must be provided in first request.");
            }
            if req.owned.as_ref().is_none_or(|o| !o.is_empty()) {
                return invalid("TopicPartitions must be empty when (re-)joining.");
            }
            if req.subscribed_topic_names.is_none() && req.subscribed_topic_regex.is_none() {
                return invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.");
            }
        }
        STATIC_LEAVE_EPOCH if req.instance_id.is_none() => {
            return invalid("InstanceId can't be null.");
        }
        e if e < STATIC_LEAVE_EPOCH => return invalid(&format!("MemberEpoch {e} is invalid.")),
        _ => {
            if req.member_id.is_empty() {
                return invalid("MemberId can't be empty.");
            }
        }
    }
    if let Some(a) = &req.server_assignor {
        if !config.assignors.iter().any(|c| c == a) {
            return Err((
                GroupError::UnsupportedAssignor,
                format!("ServerAssignor {a} is not supported. Supported assignors: {}.", config.assignors.join(", ")),
            ));
        }
    }
    if let Some(r) = &req.subscribed_topic_regex {
        if let Err(e) = regex::Regex::new(&anchored(r)) {
            return Err((
                GroupError::InvalidRegularExpression,
                format!("SubscribedTopicRegex `{r}` is not a valid regular expression: {e}."),
            ));
        }
    }
    Ok(())
}

fn is_subset(owned: &TopicPartitions, assigned: &TopicPartitions) -> bool {
    owned.iter().all(|(t, ps)| assigned.get(t).is_some_and(|a| ps.is_subset(a)))
}

/// Whether the member still holds any of `partitions` (not reported: assume it does).
fn owns_any(owned: Option<&TopicPartitions>, partitions: &TopicPartitions) -> bool {
    match owned {
        None => true,
        Some(o) => partitions.iter().any(|(t, ps)| o.get(t).is_some_and(|h| !h.is_disjoint(ps))),
    }
}

/// Kafka's `uniform` assignor: every partition of a subscribed topic goes to one of its
/// subscribers, as evenly as the subscriptions allow, and partitions stay where the
/// previous target put them when balance permits (sticky).
pub fn assign_uniform(
    subscriptions: &BTreeMap<String, BTreeSet<Uuid>>,
    partitions: &BTreeMap<Uuid, i32>,
    previous: &BTreeMap<String, TopicPartitions>,
) -> BTreeMap<String, TopicPartitions> {
    let mut out: BTreeMap<String, TopicPartitions> =
        subscriptions.keys().map(|m| (m.clone(), TopicPartitions::new())).collect();
    let mut count: BTreeMap<&str, usize> = subscriptions.keys().map(|m| (m.as_str(), 0)).collect();
    let total: usize = partitions
        .iter()
        .filter(|(t, _)| subscriptions.values().any(|s| s.contains(t)))
        .map(|(_, n)| (*n).max(0) as usize)
        .sum();
    let subscribers = subscriptions.values().filter(|s| !s.is_empty()).count().max(1);
    let quota = total.div_ceil(subscribers);
    let mut taken: HashMap<(Uuid, i32), &str> = HashMap::new();
    // Keep what the previous target gave, up to the quota.
    for (member, subs) in subscriptions {
        let Some(prev) = previous.get(member) else { continue };
        for (t, ps) in prev {
            let Some(n) = partitions.get(t) else { continue };
            if !subs.contains(t) {
                continue;
            }
            for p in ps.iter().filter(|p| **p < *n) {
                if count[member.as_str()] >= quota || taken.contains_key(&(*t, *p)) {
                    break;
                }
                taken.insert((*t, *p), member.as_str());
                out.get_mut(member).expect("member").entry(*t).or_default().insert(*p);
                *count.get_mut(member.as_str()).expect("member") += 1;
            }
        }
    }
    // The rest: to the least loaded subscriber.
    for (t, n) in partitions {
        let subs: Vec<&str> = subscriptions.iter().filter(|(_, s)| s.contains(t)).map(|(m, _)| m.as_str()).collect();
        if subs.is_empty() {
            continue;
        }
        for p in 0..*n {
            if taken.contains_key(&(*t, p)) {
                continue;
            }
            let m = *subs.iter().min_by_key(|m| (count[**m], **m)).expect("non-empty");
            taken.insert((*t, p), m);
            out.get_mut(m).expect("member").entry(*t).or_default().insert(p);
            *count.get_mut(m).expect("member") += 1;
        }
    }
    // Even out what subscriptions allow: move a partition from a member with two more
    // than another subscriber of its topic. Each move lowers the sum of squared counts,
    // so this ends; it is bounded anyway.
    let moves_max = total.saturating_mul(2);
    for _ in 0..moves_max {
        let mut moved = false;
        let mut by_load: Vec<&str> = count.keys().copied().collect();
        by_load.sort_by_key(|m| std::cmp::Reverse((count[*m], *m)));
        'outer: for from in by_load {
            let held: Vec<(Uuid, i32)> =
                out[from].iter().flat_map(|(t, ps)| ps.iter().rev().map(move |p| (*t, *p))).collect();
            for (t, p) in held {
                let to = subscriptions
                    .iter()
                    .filter(|(m, s)| s.contains(&t) && count[m.as_str()] + 1 < count[from])
                    .map(|(m, _)| m.as_str())
                    .min_by_key(|m| (count[*m], *m));
                if let Some(to) = to {
                    out.get_mut(from).expect("member").get_mut(&t).expect("held").remove(&p);
                    out.get_mut(to).expect("member").entry(t).or_default().insert(p);
                    *count.get_mut(from).expect("member") -= 1;
                    *count.get_mut(to).expect("member") += 1;
                    moved = true;
                    break 'outer;
                }
            }
        }
        if !moved {
            break;
        }
    }
    for a in out.values_mut() {
        a.retain(|_, ps| !ps.is_empty());
    }
    out
}

/// Kafka's `range` assignor: for each topic, its subscribers (by member id) get
/// consecutive ranges of partitions; the first `partitions % subscribers` one more.
pub fn assign_range(
    subscriptions: &BTreeMap<String, BTreeSet<Uuid>>,
    partitions: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, TopicPartitions> {
    let mut out: BTreeMap<String, TopicPartitions> =
        subscriptions.keys().map(|m| (m.clone(), TopicPartitions::new())).collect();
    for (t, n) in partitions {
        let subs: Vec<&String> = subscriptions.iter().filter(|(_, s)| s.contains(t)).map(|(m, _)| m).collect();
        if subs.is_empty() || *n <= 0 {
            continue;
        }
        let (quota, extra) = (*n as usize / subs.len(), *n as usize % subs.len());
        let mut next = 0i32;
        for (i, m) in subs.iter().enumerate() {
            let take = quota + usize::from(i < extra);
            let range: BTreeSet<i32> = (next..next + take as i32).collect();
            next += take as i32;
            if !range.is_empty() {
                out.get_mut(*m).expect("member").insert(*t, range);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Topics {
        topics: BTreeMap<String, (Uuid, i32)>,
        generation: u64,
    }

    impl Topics {
        fn new(list: &[(&str, i32)]) -> Self {
            let mut t = Topics { topics: BTreeMap::new(), generation: 1 };
            for (name, n) in list {
                t.add(name, *n);
            }
            t
        }
        fn add(&mut self, name: &str, partitions: i32) {
            let id = self.topics.get(name).map(|(id, _)| *id).unwrap_or_else(Uuid::new_v4);
            self.topics.insert(name.to_string(), (id, partitions));
            self.generation += 1;
        }
        fn id(&self, name: &str) -> Uuid {
            self.topics[name].0
        }
    }

    impl TopicsImage for Topics {
        fn topic(&self, name: &str) -> Option<(Uuid, i32)> {
            self.topics.get(name).copied()
        }
        fn matching(&self, regex: &regex::Regex) -> Vec<String> {
            self.topics.keys().filter(|t| regex.is_match(t)).cloned().collect()
        }
        fn generation(&self) -> u64 {
            self.generation
        }
    }

    fn join(member: &str, topics: &[&str]) -> ConsumerHeartbeat {
        ConsumerHeartbeat {
            group_id: "g".into(),
            member_id: member.into(),
            member_epoch: 0,
            instance_id: None,
            rack_id: None,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: Some(topics.iter().map(|t| t.to_string()).collect()),
            subscribed_topic_regex: None,
            server_assignor: None,
            owned: Some(TopicPartitions::new()),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
        }
    }

    fn beat(member: &str, epoch: i32, owned: &TopicPartitions) -> ConsumerHeartbeat {
        ConsumerHeartbeat {
            member_epoch: epoch,
            rebalance_timeout_ms: -1,
            subscribed_topic_names: None,
            owned: Some(owned.clone()),
            ..join(member, &[])
        }
    }

    fn count(a: &TopicPartitions) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    /// A client as the Java consumer behaves: it holds what the last assignment gave,
    /// revokes at once, and reports what it holds.
    struct Client {
        id: String,
        epoch: i32,
        owned: TopicPartitions,
    }

    impl Client {
        fn beat(&mut self, g: &mut ConsumerGroup, t: &Topics, now_ms: i64) -> ConsumerHeartbeatResponse {
            let cfg = ConsumerGroupConfig::default();
            let r =
                g.heartbeat(&cfg, &beat(&self.id, self.epoch, &self.owned), t, now_ms, "unused").expect("heartbeat");
            self.epoch = r.member_epoch;
            if let Some(a) = &r.assignment {
                self.owned = a.clone();
            }
            g.check_invariants();
            r
        }
    }

    fn joined(g: &mut ConsumerGroup, t: &Topics, id: &str, topics: &[&str], now_ms: i64) -> Client {
        let cfg = ConsumerGroupConfig::default();
        let r = g.heartbeat(&cfg, &join(id, topics), t, now_ms, "unused").expect("join");
        g.check_invariants();
        Client { id: id.into(), epoch: r.member_epoch, owned: r.assignment.unwrap_or_default() }
    }

    #[test]
    fn a_partition_is_revoked_before_it_is_reassigned() {
        let t = Topics::new(&[("orders", 6)]);
        let mut g = ConsumerGroup::default();
        let mut a = joined(&mut g, &t, "a", &["orders"], 0);
        assert_eq!((a.epoch, count(&a.owned)), (1, 6), "the first member takes every partition");
        let mut b = joined(&mut g, &t, "b", &["orders"], 10);
        assert_eq!(g.group_epoch(), 2);
        // b is at epoch 2 but gets nothing a still holds.
        assert_eq!((b.epoch, count(&b.owned)), (2, 0));
        assert_eq!(g.state_name(), "Reconciling");
        // a learns what to give up: it keeps its epoch until it has.
        let r = a.beat(&mut g, &t, 20);
        assert_eq!((r.member_epoch, count(&a.owned)), (1, 3));
        // b still waits: a has not reported the revocation yet... which it did just now
        // (its owned set is the 3 it keeps), so its next heartbeat moves it to epoch 2.
        a.beat(&mut g, &t, 30);
        assert_eq!(a.epoch, 2);
        b.beat(&mut g, &t, 40);
        assert_eq!((b.epoch, count(&b.owned)), (2, 3));
        assert_eq!(g.state_name(), "Stable");
        let both: BTreeSet<i32> = a.owned.values().chain(b.owned.values()).flatten().copied().collect();
        assert_eq!(both.len(), 6);
    }

    #[test]
    fn a_revoking_member_that_still_holds_blocks_the_new_owner() {
        let t = Topics::new(&[("orders", 2)]);
        let mut g = ConsumerGroup::default();
        let a = joined(&mut g, &t, "a", &["orders"], 0);
        let mut b = joined(&mut g, &t, "b", &["orders"], 0);
        // a heartbeats still holding both partitions (its revocation is not done).
        let cfg = ConsumerGroupConfig::default();
        let r = g.heartbeat(&cfg, &beat("a", a.epoch, &a.owned), &t, 5, "x").expect("beat");
        assert_eq!(r.member_epoch, 1);
        let r2 = g.heartbeat(&cfg, &beat("a", a.epoch, &a.owned), &t, 6, "x").expect("beat");
        assert_eq!(r2.member_epoch, 1, "still revoking");
        b.beat(&mut g, &t, 7);
        assert_eq!(count(&b.owned), 0, "b cannot get a partition a still holds");
        g.check_invariants();
    }

    #[test]
    fn stale_epochs_are_fenced_and_a_lost_response_is_tolerated() {
        let t = Topics::new(&[("orders", 4)]);
        let mut g = ConsumerGroup::default();
        let cfg = ConsumerGroupConfig::default();
        let mut a = joined(&mut g, &t, "a", &["orders"], 0);
        let err = g.heartbeat(&cfg, &beat("a", 7, &a.owned), &t, 1, "x").unwrap_err();
        assert_eq!(err.0, GroupError::FencedMemberEpoch);
        // a's epoch moves to 2 when b joins and a revokes; a resends with epoch 1 and a
        // subset of its assignment (the answer was lost): accepted.
        let _b = joined(&mut g, &t, "b", &["orders"], 2);
        a.beat(&mut g, &t, 3);
        a.beat(&mut g, &t, 4);
        assert_eq!(a.epoch, 2);
        let ok = g.heartbeat(&cfg, &beat("a", 1, &a.owned), &t, 5, "x").expect("previous epoch");
        assert_eq!(ok.member_epoch, 2);
        let err = g.heartbeat(
            &cfg,
            &beat("a", 1, &BTreeMap::from([(t.id("orders"), BTreeSet::from([0, 1, 2, 3]))])),
            &t,
            6,
            "x",
        );
        assert_eq!(err.unwrap_err().0, GroupError::FencedMemberEpoch, "previous epoch with partitions it lost");
        // An unknown member is told so.
        assert_eq!(g.heartbeat(&cfg, &beat("zz", 3, &a.owned), &t, 7, "x").unwrap_err().0, GroupError::UnknownMemberId);
    }

    #[test]
    fn leaving_and_timing_out_give_partitions_back() {
        let t = Topics::new(&[("orders", 4)]);
        let mut g = ConsumerGroup::default();
        let cfg = ConsumerGroupConfig::default();
        let mut a = joined(&mut g, &t, "a", &["orders"], 0);
        let mut b = joined(&mut g, &t, "b", &["orders"], 0);
        for now in 1..4 {
            a.beat(&mut g, &t, now);
            b.beat(&mut g, &t, now);
        }
        assert_eq!((count(&a.owned), count(&b.owned)), (2, 2));
        let left = g.heartbeat(
            &cfg,
            &ConsumerHeartbeat { member_epoch: LEAVE_EPOCH, ..beat("b", b.epoch, &b.owned) },
            &t,
            5,
            "x",
        );
        assert_eq!(left.expect("leave").member_epoch, LEAVE_EPOCH);
        a.beat(&mut g, &t, 6);
        assert_eq!(count(&a.owned), 4, "a takes what b left");
        // a stops heartbeating: its session ends.
        assert!(g.tick(6 + cfg.session_timeout_ms as i64).is_empty());
        assert_eq!(g.tick(7 + cfg.session_timeout_ms as i64).len(), 1);
        assert!(g.is_empty());
        assert_eq!(g.state_name(), "Empty");
        g.check_invariants();
    }

    #[test]
    fn a_member_that_does_not_revoke_in_time_is_removed() {
        let t = Topics::new(&[("orders", 2)]);
        let mut g = ConsumerGroup::default();
        let cfg = ConsumerGroupConfig::default();
        let a = joined(&mut g, &t, "a", &["orders"], 0);
        let _b = joined(&mut g, &t, "b", &["orders"], 0);
        g.heartbeat(&cfg, &beat("a", a.epoch, &a.owned), &t, 1, "x").expect("beat");
        let gone = g.tick(1 + 30_001);
        assert_eq!(gone, vec![("a".to_string(), "did not revoke its partitions within its rebalance timeout")]);
    }

    #[test]
    fn a_static_member_comes_back_without_a_rebalance() {
        let t = Topics::new(&[("orders", 4)]);
        let mut g = ConsumerGroup::default();
        let cfg = ConsumerGroupConfig::default();
        let static_join = |id: &str| ConsumerHeartbeat { instance_id: Some("i1".into()), ..join(id, &["orders"]) };
        let r = g.heartbeat(&cfg, &static_join("s1"), &t, 0, "x").expect("join");
        let epoch = g.group_epoch();
        // Another process with the same instance id cannot join while s1 is there.
        assert_eq!(g.heartbeat(&cfg, &static_join("s2"), &t, 1, "x").unwrap_err().0, GroupError::UnreleasedInstanceId);
        let leave = ConsumerHeartbeat {
            member_epoch: STATIC_LEAVE_EPOCH,
            instance_id: Some("i1".into()),
            ..beat("s1", r.member_epoch, &TopicPartitions::new())
        };
        assert_eq!(g.heartbeat(&cfg, &leave, &t, 2, "x").expect("leave").member_epoch, STATIC_LEAVE_EPOCH);
        let back = g.heartbeat(&cfg, &static_join("s2"), &t, 3, "x").expect("rejoin");
        assert_eq!(g.group_epoch(), epoch, "no rebalance");
        assert_eq!(back.assignment.as_ref().map(count), Some(4), "it gets its instance's partitions back");
        assert_eq!(back.member_epoch, epoch);
        g.check_invariants();
    }

    #[test]
    fn a_regex_subscription_picks_up_a_topic_created_later() {
        let mut t = Topics::new(&[("logs-a", 2), ("other", 2)]);
        let mut g = ConsumerGroup::default();
        let cfg = ConsumerGroupConfig::default();
        let req = ConsumerHeartbeat {
            subscribed_topic_names: None,
            subscribed_topic_regex: Some("logs-.*".into()),
            ..join("a", &[])
        };
        let r = g.heartbeat(&cfg, &req, &t, 0, "x").expect("join");
        let mut a = Client { id: "a".into(), epoch: r.member_epoch, owned: r.assignment.unwrap_or_default() };
        assert_eq!(a.owned.keys().copied().collect::<Vec<_>>(), vec![t.id("logs-a")]);
        t.add("logs-b", 3);
        a.beat(&mut g, &t, 1);
        assert_eq!(count(&a.owned), 5);
        assert!(a.owned.contains_key(&t.id("logs-b")));
        // A regex that does not compile is refused.
        let bad = ConsumerHeartbeat { subscribed_topic_regex: Some("(".into()), ..req };
        assert_eq!(g.heartbeat(&cfg, &bad, &t, 2, "x").unwrap_err().0, GroupError::InvalidRegularExpression);
    }

    #[test]
    fn joins_are_validated_as_kafka_validates_them() {
        let t = Topics::new(&[("orders", 1)]);
        let mut g = ConsumerGroup::default();
        let cfg = ConsumerGroupConfig::default();
        let cases = [
            ConsumerHeartbeat { rebalance_timeout_ms: -1, ..join("a", &["orders"]) },
            ConsumerHeartbeat { owned: None, ..join("a", &["orders"]) },
            ConsumerHeartbeat { subscribed_topic_names: None, ..join("a", &["orders"]) },
            ConsumerHeartbeat { instance_id: Some(String::new()), ..join("a", &["orders"]) },
            ConsumerHeartbeat { member_epoch: -3, ..join("a", &["orders"]) },
            ConsumerHeartbeat { member_epoch: STATIC_LEAVE_EPOCH, ..join("a", &["orders"]) },
        ];
        for c in cases {
            assert_eq!(g.heartbeat(&cfg, &c, &t, 0, "x").unwrap_err().0, GroupError::InvalidRequest, "{c:?}");
        }
        let bad = ConsumerHeartbeat { server_assignor: Some("sticky".into()), ..join("a", &["orders"]) };
        assert_eq!(g.heartbeat(&cfg, &bad, &t, 0, "x").unwrap_err().0, GroupError::UnsupportedAssignor);
        assert!(g.is_empty());
        // v0: a member joining without an id gets the one the broker made.
        let r = g.heartbeat(&cfg, &join("", &["orders"]), &t, 0, "made-here").expect("join");
        assert_eq!(r.member_id, "made-here");
    }

    #[test]
    fn uniform_balances_and_is_sticky() {
        let (x, y) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let parts = BTreeMap::from([(x, 6), (y, 3)]);
        let subs: BTreeMap<String, BTreeSet<Uuid>> = BTreeMap::from([
            ("a".to_string(), BTreeSet::from([x, y])),
            ("b".to_string(), BTreeSet::from([x, y])),
            ("c".to_string(), BTreeSet::from([y])),
        ]);
        let first = assign_uniform(&subs, &parts, &BTreeMap::new());
        let counts: Vec<usize> = first.values().map(count).collect();
        assert_eq!(counts.iter().sum::<usize>(), 9);
        assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1, "{first:?}");
        assert!(first["c"].keys().all(|t| *t == y), "c only gets the topic it subscribes to");
        // Adding a member moves only what balance needs.
        let mut more = subs.clone();
        more.insert("d".into(), BTreeSet::from([x, y]));
        let second = assign_uniform(&more, &parts, &first);
        let kept: usize = ["a", "b", "c"]
            .iter()
            .map(|m| {
                second[*m]
                    .iter()
                    .map(|(t, ps)| first[*m].get(t).map_or(0, |f| ps.intersection(f).count()))
                    .sum::<usize>()
            })
            .sum();
        assert!(kept >= 6, "at most what d needs moved: kept {kept} of 9 ({first:?} -> {second:?})");
        assert_eq!(second.values().map(count).sum::<usize>(), 9);
    }

    /// What the group writes, read back by a new coordinator (as a load does), is the
    /// same group: members keep their ids, epochs and partitions, and carry on.
    #[test]
    fn a_group_replayed_from_its_records_carries_on() {
        let t = Topics::new(&[("orders", 6)]);
        let cfg = ConsumerGroupConfig::default();
        let mut g = ConsumerGroup::default();
        let mut log: Vec<(bytes::Bytes, Option<bytes::Bytes>)> = Vec::new();
        let mut a = joined(&mut g, &t, "a", &["orders"], 0);
        let mut b = joined(&mut g, &t, "b", &["orders"], 0);
        let c = joined(&mut g, &t, "c", &["orders"], 0);
        log.extend(g.take_records("g").iter().map(ConsumerRecord::encode));
        for now in 1..4 {
            a.beat(&mut g, &t, now);
            b.beat(&mut g, &t, now);
            log.extend(g.take_records("g").iter().map(ConsumerRecord::encode));
        }
        // c leaves; a is in the middle of revoking when the coordinator moves.
        let leave = ConsumerHeartbeat { member_epoch: LEAVE_EPOCH, ..beat("c", c.epoch, &c.owned) };
        g.heartbeat(&cfg, &leave, &t, 5, "x").expect("leave");
        a.beat(&mut g, &t, 6);
        log.extend(g.take_records("g").iter().map(ConsumerRecord::encode));
        assert!(g.take_records("g").is_empty(), "nothing owed twice");

        let mut reloaded = ConsumerGroup::default();
        for (key, value) in &log {
            let mut k = key.clone();
            let version = bytes::Buf::get_i16(&mut k);
            let rec = crate::group::consumer_records::decode(version, k, value.as_ref()).expect("decodes");
            reloaded.replay(rec, 100, &cfg);
        }
        reloaded.settle_after_replay();
        reloaded.check_invariants();
        assert_eq!(reloaded.members.keys().collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(reloaded.group_epoch, g.group_epoch);
        assert_eq!(reloaded.assignment_epoch, g.assignment_epoch);
        assert_eq!(reloaded.target, g.target);
        for id in ["a", "b"] {
            assert_eq!(reloaded.members[id].stored_assignment(), g.members[id].stored_assignment(), "{id}");
        }
        for now in 101..105 {
            a.beat(&mut reloaded, &t, now);
            b.beat(&mut reloaded, &t, now);
        }
        assert_eq!(reloaded.state_name(), "Stable");
        assert_eq!((count(&a.owned), count(&b.owned)), (3, 3));
    }

    #[test]
    fn range_gives_consecutive_ranges() {
        let x = Uuid::from_u128(1);
        let subs: BTreeMap<String, BTreeSet<Uuid>> =
            ["a", "b", "c"].iter().map(|m| (m.to_string(), BTreeSet::from([x]))).collect();
        let out = assign_range(&subs, &BTreeMap::from([(x, 7)]));
        assert_eq!(out["a"][&x], BTreeSet::from([0, 1, 2]));
        assert_eq!(out["b"][&x], BTreeSet::from([3, 4]));
        assert_eq!(out["c"][&x], BTreeSet::from([5, 6]));
    }

    /// Members join, leave, stop heartbeating and heartbeat in random order, as clients
    /// that revoke at once: the invariants hold after every step, and once the members
    /// heartbeat in turn the group settles with every partition held exactly once.
    #[test]
    fn random_membership_changes_settle() {
        for seed in 1..40u64 {
            let mut rng = seed;
            let mut next = move |n: u64| {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (rng >> 33) % n
            };
            let t = Topics::new(&[("x", 7), ("y", 5)]);
            let mut g = ConsumerGroup::default();
            let cfg = ConsumerGroupConfig::default();
            let mut clients: Vec<Client> = Vec::new();
            let mut now = 0;
            for step in 0..200 {
                now += 10;
                match next(10) {
                    0 | 1 if clients.len() < 6 => {
                        let topics: &[&str] = if next(2) == 0 { &["x", "y"] } else { &["x"] };
                        clients.push(joined(&mut g, &t, &format!("m{seed}-{step}"), topics, now));
                    }
                    2 if !clients.is_empty() => {
                        let c = clients.remove(next(clients.len() as u64) as usize);
                        let req = ConsumerHeartbeat { member_epoch: LEAVE_EPOCH, ..beat(&c.id, c.epoch, &c.owned) };
                        g.heartbeat(&cfg, &req, &t, now, "x").expect("leave");
                    }
                    _ if !clients.is_empty() => {
                        let i = next(clients.len() as u64) as usize;
                        clients[i].beat(&mut g, &t, now);
                    }
                    _ => {}
                }
                g.check_invariants();
            }
            for _ in 0..6 {
                for c in clients.iter_mut() {
                    now += 1;
                    c.beat(&mut g, &t, now);
                }
            }
            if clients.is_empty() {
                continue;
            }
            assert_eq!(g.state_name(), "Stable", "seed {seed}");
            let held: usize = clients.iter().map(|c| count(&c.owned)).sum();
            let subscribed_y = g.members.values().any(|m| m.topic_names.iter().any(|t| t == "y"));
            assert_eq!(held, if subscribed_y { 12 } else { 7 }, "seed {seed}");
        }
    }
}
