//! The controller: the active coordinator's brain. It owns cluster metadata (brokers,
//! topics, replica assignments, partition leadership and ISR) and turns events into
//! decisions, returned as `Change`s that the caller persists to the `MetaStore` (in Kafka's
//! ZooKeeper layout, see `layout.rs`) and pushes to brokers.
//!
//! A pure state machine: no I/O, no clock, no async, no global randomness. Time comes in
//! as `now_ms`, randomness (placement start index and shift) as an `rng` closure, so a
//! seeded simulation drives it deterministically (`tests/controller_sim.rs`).
//!
//! Invariants (checked by `check_invariants`, asserted locally on every change):
//! - a partition has at most one leader; a leader is registered, unfenced and in the ISR;
//! - the ISR is a non-empty subset of the replicas without duplicates; a member that is
//!   not live appears only as the last one left of an offline partition (Kafka keeps the
//!   last ISR member, so that it can come back and lead without losing data);
//! - leader_epoch and partition_epoch never decrease: leader_epoch +1 and partition_epoch
//!   +1 on every leader change and every change that removes a replica (its stale
//!   fetches are fenced), partition_epoch +1 on every ISR or replica change;
//! - fenced brokers lead nothing; the controller epoch only grows;
//! - leaders are only elected from the ISR, unless `unclean.leader.election.enable` is
//!   true (topic config, else `ControllerConfig::unclean_leader_election`).
//!
//! Owned by whichever thread runs the active coordinator; not shared.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

use crate::model::{limits, BrokerEpoch, LeaderEpoch, NodeId, PartitionEpoch};
use crate::replication::NO_BROKER_EPOCH;

/// `leader` of a partition that has none (Kafka's `LeaderAndIsr.NoLeader`).
pub const NO_LEADER: NodeId = NodeId::NONE;
/// Kafka's `broker.session.timeout.ms` default.
pub const BROKER_SESSION_TIMEOUT_MS_DEFAULT: u64 = 9_000;
/// The largest replication factor a topic may ask for.
pub const REPLICATION_FACTOR_MAX: i32 = 64;
/// The topic config that allows electing a leader outside the ISR.
pub const UNCLEAN_LEADER_ELECTION_CONFIG: &str = "unclean.leader.election.enable";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// A broker that has not heartbeated for longer than this is fenced.
    pub broker_session_timeout_ms: u64,
    /// Broker-level `unclean.leader.election.enable`; a topic config overrides it.
    pub unclean_leader_election: bool,
    /// How often `tick` gives leadership back to preferred replicas (Kafka's
    /// auto.leader.rebalance.enable with leader.imbalance.check.interval.seconds); 0: never.
    pub preferred_leader_check_interval_ms: u64,
    /// The most partition replicas one broker may host (`max.broker.partitions`, as
    /// KIP-578 names it): each costs open files and memory, and one CreateTopics for
    /// 65,535 partitions must not exhaust a broker's file descriptors.
    pub broker_partitions_max: usize,
}

/// `max.broker.partitions` when nothing else is known.
pub const BROKER_PARTITIONS_MAX_DEFAULT: usize = 10_000;

/// Kafka's leader.imbalance.check.interval.seconds default.
pub const PREFERRED_LEADER_CHECK_INTERVAL_MS_DEFAULT: u64 = 300_000;

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            broker_session_timeout_ms: BROKER_SESSION_TIMEOUT_MS_DEFAULT,
            unclean_leader_election: false,
            preferred_leader_check_interval_ms: PREFERRED_LEADER_CHECK_INTERVAL_MS_DEFAULT,
            broker_partitions_max: BROKER_PARTITIONS_MAX_DEFAULT,
        }
    }
}

/// Where a broker is reached: `host:port` is its inter-broker listener's advertised
/// address (replication, forwarding, the coordinator link); `listeners` are all its
/// advertised listeners, the inter-broker one included, which clients are told about by
/// the name of the listener they connected through (as Kafka's Metadata does). A broker
/// that registered no listeners (an older registration) is known by `host:port` alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<AdvertisedListener>,
}

/// One named listener as a broker advertises it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct AdvertisedListener {
    /// Upper case, as Kafka normalises listener names.
    pub name: String,
    /// Kafka's security protocol name (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL).
    pub protocol: String,
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self { host: host.into(), port, listeners: Vec::new() }
    }

    /// With these listeners, in one order whatever the source (a registration, a
    /// `/brokers/ids` document, the config): the inter-broker one (at `host:port`) first.
    /// Kafka's default alone (one PLAINTEXT listener named PLAINTEXT, at `host:port`) is
    /// kept as no list, as registrations before listeners were registered had it.
    pub fn with_listeners(mut self, mut listeners: Vec<AdvertisedListener>) -> Self {
        listeners.sort_by_key(|l| !(l.host == self.host && l.port == self.port));
        let default_only = matches!(&listeners[..], [l] if l.name == "PLAINTEXT" && l.protocol == "PLAINTEXT"
            && l.host == self.host && l.port == self.port);
        self.listeners = if default_only { Vec::new() } else { listeners };
        self
    }

    /// Where a client of listener `name` reaches this broker: that listener's address;
    /// `host:port` when the broker registered no listeners; None when it has listeners
    /// but not this one (Kafka leaves such a broker out of that client's Metadata).
    pub fn for_listener(&self, name: &str) -> Option<(&str, u16)> {
        if self.listeners.is_empty() {
            return Some((&self.host, self.port));
        }
        self.listeners.iter().find(|l| l.name == name).map(|l| (l.host.as_str(), l.port))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A registered broker.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BrokerInfo {
    pub id: NodeId,
    pub endpoint: Endpoint,
    pub rack: Option<String>,
    /// Shards (cores) the broker runs.
    pub shards: u32,
    pub last_heartbeat_ms: u64,
    /// Fenced brokers are registered but lead nothing and get no new replicas.
    pub fenced: bool,
    /// Grows with every registration in this cluster (Kafka's broker epoch): a broker that
    /// restarts gets a new one.
    pub registration_epoch: BrokerEpoch,
}

impl BrokerInfo {
    pub fn is_live(&self) -> bool {
        !self.fenced
    }
}

/// Leadership and ISR of one partition, as the `/brokers/topics/<t>/partitions/<p>/state`
/// document carries it (plus the partition epoch, which KRaft added).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionState {
    /// `NO_LEADER` when offline.
    pub leader: NodeId,
    pub leader_epoch: LeaderEpoch,
    /// In-sync replicas, in the order the controller keeps them (assignment order).
    pub isr: Vec<NodeId>,
    /// +1 on every change of leader or ISR (Kafka's partition epoch / zk version).
    pub partition_epoch: PartitionEpoch,
    /// The controller epoch that last wrote this state.
    pub controller_epoch: i32,
}

/// A topic's metadata.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopicInfo {
    pub name: String,
    pub topic_id: Uuid,
    /// `assignment[p]` = the replicas of partition `p`, the preferred leader first.
    pub assignment: Vec<Vec<NodeId>>,
    /// Topic config overrides, Kafka's names (`retention.ms`, ...).
    pub configs: BTreeMap<String, String>,
    /// `partitions[p]` = the state of partition `p`.
    pub partitions: Vec<PartitionState>,
    /// Reassignments in progress, by partition (`assignment[p]` then holds the target
    /// replicas first, then the ones leaving).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reassignments: BTreeMap<i32, Reassignment>,
}

impl TopicInfo {
    pub fn partition_count(&self) -> i32 {
        self.assignment.len() as i32
    }

    /// The replicas partition `p` is to have: its replicas less those a reassignment in
    /// progress removes (all of them when none is).
    pub fn target_replicas(&self, p: usize) -> Vec<NodeId> {
        let removing = self.reassignments.get(&(p as i32)).map(|r| r.removing.as_slice()).unwrap_or(&[]);
        self.assignment[p].iter().copied().filter(|r| !removing.contains(r)).collect()
    }
}

/// A partition reassignment in progress (KIP-455), as Kafka keeps it: the partition's
/// replicas are the target replicas followed by the original ones not in the target;
/// `adding` are the target replicas that were not replicas before (they copy the log and
/// join the ISR), `removing` the original ones not in the target (they leave when every
/// target replica is in the ISR).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reassignment {
    pub adding: Vec<NodeId>,
    pub removing: Vec<NodeId>,
}

/// Why a broker was fenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceReason {
    /// No heartbeat within `broker.session.timeout.ms`.
    SessionExpired,
    /// The broker registered again (a restart): its previous incarnation is fenced
    /// before the new one is registered.
    Reregistered,
    /// Controlled shutdown: the broker asked to leave.
    ControlledShutdown,
}

/// What an event changed; the caller persists it and tells the brokers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// This controller is active with `epoch` (write `/controller_epoch`).
    ControllerEpoch {
        epoch: i32,
    },
    /// A broker registered (or re-registered with a new registration epoch).
    BrokerRegistered {
        broker: BrokerInfo,
    },
    /// A broker lost its leaderships and ISR places, for `reason`.
    BrokerFenced {
        id: NodeId,
        reason: FenceReason,
    },
    BrokerUnfenced {
        id: NodeId,
    },
    /// A broker left (controlled shutdown): remove `/brokers/ids/<id>`.
    BrokerUnregistered {
        id: NodeId,
    },
    /// A new topic; a `PartitionChanged` for each of its partitions follows.
    TopicCreated {
        name: String,
        topic_id: Uuid,
        assignment: Vec<Vec<NodeId>>,
        configs: BTreeMap<String, String>,
    },
    /// Partitions were added; `assignment` is the full new assignment (rewrite
    /// `/brokers/topics/<t>`); a `PartitionChanged` for each new partition follows.
    PartitionsCreated {
        topic: String,
        topic_id: Uuid,
        first_new_partition: i32,
        assignment: Vec<Vec<NodeId>>,
        /// The topic's reassignments in progress (the document carries them too).
        reassignments: BTreeMap<i32, Reassignment>,
    },
    TopicDeleted {
        name: String,
        topic_id: Uuid,
        partition_count: i32,
    },
    /// A reassignment started, moved on, finished or was cancelled: `assignment` and
    /// `reassignments` are the topic's full new ones (rewrite `/brokers/topics/<t>`); a
    /// `PartitionChanged` follows.
    AssignmentChanged {
        topic: String,
        topic_id: Uuid,
        assignment: Vec<Vec<NodeId>>,
        reassignments: BTreeMap<i32, Reassignment>,
    },
    /// A partition's leader or ISR changed (or it was created).
    PartitionChanged {
        topic: String,
        partition: i32,
        state: PartitionState,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControllerError {
    #[error("replication factor {requested} is invalid: {available} live brokers")]
    InvalidReplicationFactor { requested: i32, available: usize },
    /// A reassignment that would change the replication factor, where the request did
    /// not allow it (KIP-860); Kafka's message, INVALID_REPLICATION_FACTOR.
    #[error("The replication factor is changed from {from} to {to} but allowReplicationFactorChange is false")]
    ReplicationFactorChanged { from: usize, to: usize },
    #[error("topic {0:?} already exists")]
    TopicExists(String),
    #[error("topic {0:?} does not exist")]
    UnknownTopic(String),
    #[error("partition {topic}-{partition} does not exist")]
    UnknownTopicOrPartition { topic: String, partition: i32 },
    #[error("invalid partition count {0}")]
    InvalidPartitions(i32),
    #[error("broker {broker} would host {replicas} partition replicas, above max.broker.partitions ({max})")]
    BrokerPartitionsExceeded { broker: NodeId, replicas: usize, max: usize },
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    #[error("broker {0} is not registered")]
    UnknownBroker(NodeId),
    #[error("broker {broker} is not the leader of {topic}-{partition} (leader is {leader})")]
    NotLeader { topic: String, partition: i32, broker: NodeId, leader: NodeId },
    /// The request's leader epoch is older than the controller's (Kafka FENCED_LEADER_EPOCH).
    #[error("leader epoch {request} is fenced: current is {current}")]
    FencedLeaderEpoch { request: LeaderEpoch, current: LeaderEpoch },
    /// The request's leader epoch is newer than the controller's (UNKNOWN_LEADER_EPOCH).
    #[error("leader epoch {request} is unknown: current is {current}")]
    UnknownLeaderEpoch { request: LeaderEpoch, current: LeaderEpoch },
    /// The request's partition epoch is not the current one (Kafka INVALID_UPDATE_VERSION).
    #[error("partition epoch {request} is stale: current is {current}")]
    InvalidUpdateVersion { request: PartitionEpoch, current: PartitionEpoch },
    /// A proposed ISR member is not a live replica (Kafka INELIGIBLE_REPLICA).
    #[error("replica {replica} may not be in the ISR: {reason}")]
    IneligibleReplica { replica: NodeId, reason: &'static str },
    #[error("invalid ISR: {0}")]
    InvalidIsr(String),
    #[error("controller epoch {request} is not above the current {current}")]
    StaleControllerEpoch { request: i32, current: i32 },
    /// A reassignment cancelled where none is in progress (Kafka NO_REASSIGNMENT_IN_PROGRESS).
    #[error("no partition reassignment is in progress for {topic}-{partition}")]
    NoReassignmentInProgress { topic: String, partition: i32 },
}

/// Which leader an ElectLeaders request asks for (Kafka's `ElectionType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElectionKind {
    /// The partition's first replica, when it is live and in sync.
    Preferred,
    /// Any leader for a partition that has none: a live ISR member if there is one,
    /// else the first live replica, out of sync or not (its ISR is then just it).
    Unclean,
}

/// What an ElectLeaders request finds for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Election {
    /// A leader as asked is now the leader.
    Elected,
    /// Preferred: it already was; unclean: the partition has a leader (Kafka
    /// ELECTION_NOT_NEEDED).
    NotNeeded,
    /// The preferred replica is not live or not in the ISR (Kafka
    /// PREFERRED_LEADER_NOT_AVAILABLE).
    PreferredNotAvailable,
    /// Unclean: no replica is live (Kafka ELIGIBLE_LEADERS_NOT_AVAILABLE).
    EligibleNotAvailable,
    UnknownPartition,
}

/// A broker as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementBroker {
    pub id: NodeId,
    pub rack: Option<String>,
}

/// Replica placement as Kafka's `AdminUtils.assignReplicasToBrokers`: replicas go
/// round-robin over the brokers (sorted by id) from `start_index`, each following replica
/// `1 + (shift + j) % (n - 1)` brokers after the first, the shift growing by one every `n`
/// partitions. Rack-aware when every broker has a rack: brokers are ordered alternating
/// between racks, and a replica skips a broker whose rack (or the broker itself) already
/// holds one while some rack (broker) holds none. Partitions are numbered from
/// `start_partition` (`CreatePartitions` continues an existing topic).
pub fn assign_replicas(
    brokers: &[PlacementBroker],
    partitions: i32,
    replication_factor: i32,
    start_partition: i32,
    start_index: usize,
    replica_shift: usize,
) -> Result<Vec<Vec<NodeId>>, ControllerError> {
    if partitions < 0 {
        return Err(ControllerError::InvalidPartitions(partitions));
    }
    if replication_factor < 1 || replication_factor as usize > brokers.len() {
        return Err(ControllerError::InvalidReplicationFactor {
            requested: replication_factor,
            available: brokers.len(),
        });
    }
    let mut sorted: Vec<&PlacementBroker> = brokers.iter().collect();
    sorted.sort_by_key(|b| b.id);
    for w in sorted.windows(2) {
        assert!(w[0].id != w[1].id, "placement: broker {} listed twice", w[0].id);
    }
    let rack_aware = sorted.iter().all(|b| b.rack.is_some());
    let rf = replication_factor as usize;
    let start_partition = start_partition.max(0) as usize;
    let n = sorted.len();
    let start_index = start_index % n;
    let mut shift = replica_shift % n;
    let mut out = Vec::with_capacity(partitions as usize);

    if !rack_aware {
        let ids: Vec<NodeId> = sorted.iter().map(|b| b.id).collect();
        for p in start_partition..start_partition + partitions as usize {
            if p > 0 && p % n == 0 {
                shift += 1;
            }
            let first = (p + start_index) % n;
            let mut replicas = vec![ids[first]];
            for j in 0..rf - 1 {
                replicas.push(ids[replica_index(first, shift, j, n)]);
            }
            out.push(replicas);
        }
    } else {
        // Brokers alternating between racks: racks sorted by name, brokers by id in each.
        let mut by_rack: BTreeMap<&str, Vec<NodeId>> = BTreeMap::new();
        let mut rack_of: BTreeMap<NodeId, &str> = BTreeMap::new();
        for b in &sorted {
            let rack = b.rack.as_deref().expect("rack-aware placement: every broker has a rack");
            by_rack.entry(rack).or_default().push(b.id);
            rack_of.insert(b.id, rack);
        }
        let rack_count = by_rack.len();
        let mut iters: Vec<std::vec::IntoIter<NodeId>> = by_rack.into_values().map(|v| v.into_iter()).collect();
        let mut arranged = Vec::with_capacity(n);
        let mut r = 0;
        while arranged.len() < n {
            if let Some(id) = iters[r].next() {
                arranged.push(id);
            }
            r = (r + 1) % rack_count;
        }
        for p in start_partition..start_partition + partitions as usize {
            if p > 0 && p % n == 0 {
                shift += 1;
            }
            let first = (p + start_index) % n;
            let leader = arranged[first];
            let mut replicas = vec![leader];
            let mut racks_used: BTreeSet<&str> = BTreeSet::from([rack_of[&leader]]);
            let mut k = 0;
            for _ in 0..rf - 1 {
                loop {
                    let broker = arranged[replica_index(first, shift * rack_count, k, n)];
                    let rack = rack_of[&broker];
                    k += 1;
                    let rack_ok = !racks_used.contains(rack) || racks_used.len() == rack_count;
                    let broker_ok = !replicas.contains(&broker) || replicas.len() == n;
                    if rack_ok && broker_ok {
                        replicas.push(broker);
                        racks_used.insert(rack);
                        break;
                    }
                    // Every broker is visited within n steps of k; more means a bug.
                    assert!(k <= 4 * n * n + 4, "rack-aware placement did not converge");
                }
            }
            out.push(replicas);
        }
    }
    for replicas in &out {
        assert_eq!(replicas.len(), rf);
        let distinct: BTreeSet<&NodeId> = replicas.iter().collect();
        assert_eq!(distinct.len(), rf, "placement put two replicas on one broker: {replicas:?}");
    }
    Ok(out)
}

fn replica_index(first: usize, shift: usize, j: usize, n: usize) -> usize {
    let step = 1 + (shift + j) % (n - 1).max(1);
    (first + step) % n
}

/// The controller's state as brokers mirror it (serialized as JSON between brokers).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControllerSnapshot {
    pub controller_epoch: i32,
    pub brokers: Vec<BrokerInfo>,
    pub topics: Vec<TopicInfo>,
    /// Dynamic broker configs by entity (a broker id, or `<default>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub broker_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Client entity configs (quotas, SCRAM credentials) by Kafka's entity path
    /// (`users/alice`, `clients/c`, `users/alice/clients/c`); see `security::entity`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub entity_configs: BTreeMap<String, BTreeMap<String, String>>,
}

/// The controller state machine. See the module comment.
#[derive(Debug, Clone)]
pub struct Controller {
    config: ControllerConfig,
    controller_epoch: i32,
    brokers: BTreeMap<NodeId, BrokerInfo>,
    topics: BTreeMap<String, TopicInfo>,
    /// Dynamic broker configs (`/config/brokers/<entity>`) by entity: a broker id, or
    /// `config::BROKER_DEFAULT_ENTITY` for the cluster-wide default. Empty maps are dropped.
    broker_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// Client entity configs (`/config/users/...`, `/config/clients/...`) by entity path
    /// (`users/alice`); empty maps are dropped.
    entity_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// The last registration epoch handed out.
    registration_epoch_last: BrokerEpoch,
    /// When `tick` last ran the preferred leader election.
    preferred_checked_ms: u64,
    /// When `tick` last ran (0: never).
    ticked_ms: u64,
    /// The last pause `tick` found and not yet taken (`take_pause`), in ms.
    pause_ms: Option<u64>,
}

impl Controller {
    pub fn new(config: ControllerConfig) -> Self {
        Self {
            config,
            controller_epoch: 0,
            brokers: BTreeMap::new(),
            topics: BTreeMap::new(),
            broker_configs: BTreeMap::new(),
            entity_configs: BTreeMap::new(),
            registration_epoch_last: BrokerEpoch(0),
            preferred_checked_ms: 0,
            ticked_ms: 0,
            pause_ms: None,
        }
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    /// What brokers that mirror this controller need: every broker (fenced ones too),
    /// every topic with its assignment, configs and partition states.
    pub fn snapshot(&self) -> ControllerSnapshot {
        ControllerSnapshot {
            controller_epoch: self.controller_epoch,
            brokers: self.brokers.values().cloned().collect(),
            topics: self.topics.values().cloned().collect(),
            broker_configs: self.broker_configs.clone(),
            entity_configs: self.entity_configs.clone(),
        }
    }

    /// A read-only copy of the active controller, built from its snapshot (on brokers
    /// that are not the active coordinator; they answer Metadata from it).
    pub fn from_snapshot(config: ControllerConfig, snapshot: ControllerSnapshot) -> Self {
        let registration_epoch_last =
            snapshot.brokers.iter().map(|b| b.registration_epoch).max().unwrap_or(BrokerEpoch(0));
        Self {
            config,
            controller_epoch: snapshot.controller_epoch,
            brokers: snapshot.brokers.into_iter().map(|b| (b.id, b)).collect(),
            topics: snapshot.topics.into_iter().map(|t| (t.name.clone(), t)).collect(),
            broker_configs: snapshot.broker_configs,
            entity_configs: snapshot.entity_configs,
            registration_epoch_last,
            preferred_checked_ms: 0,
            ticked_ms: 0,
            pause_ms: None,
        }
    }

    /// The registration epoch a registered broker must present in heartbeats (Kafka's
    /// broker epoch); `None` for an unknown broker.
    pub fn broker_epoch(&self, id: NodeId) -> Option<BrokerEpoch> {
        self.brokers.get(&id).map(|b| b.registration_epoch)
    }

    // ---- Read API (answers Metadata) ----

    pub fn controller_epoch(&self) -> i32 {
        self.controller_epoch
    }

    /// Every registered broker, fenced ones included, by id.
    pub fn brokers(&self) -> impl Iterator<Item = &BrokerInfo> {
        self.brokers.values()
    }

    /// Registered, unfenced brokers: what Metadata lists.
    pub fn live_brokers(&self) -> impl Iterator<Item = &BrokerInfo> {
        self.brokers.values().filter(|b| b.is_live())
    }

    pub fn broker(&self, id: NodeId) -> Option<&BrokerInfo> {
        self.brokers.get(&id)
    }

    pub fn topics(&self) -> impl Iterator<Item = &TopicInfo> {
        self.topics.values()
    }

    pub fn topic(&self, name: &str) -> Option<&TopicInfo> {
        self.topics.get(name)
    }

    pub fn topic_by_id(&self, topic_id: Uuid) -> Option<&TopicInfo> {
        self.topics.values().find(|t| t.topic_id == topic_id)
    }

    pub fn partition_state(&self, topic: &str, partition: i32) -> Option<&PartitionState> {
        let t = self.topics.get(topic)?;
        usize::try_from(partition).ok().and_then(|p| t.partitions.get(p))
    }

    pub fn replicas(&self, topic: &str, partition: i32) -> Option<&[NodeId]> {
        let t = self.topics.get(topic)?;
        usize::try_from(partition).ok().and_then(|p| t.assignment.get(p)).map(|r| r.as_slice())
    }

    /// The leader, or `None` when the partition does not exist or is offline.
    pub fn leader_of(&self, topic: &str, partition: i32) -> Option<NodeId> {
        self.partition_state(topic, partition).map(|s| s.leader).filter(|&l| l != NO_LEADER)
    }

    // ---- Events ----

    /// This controller won the election with `controller_epoch`, which must be above every
    /// epoch it has seen.
    pub fn becomes_active(&mut self, controller_epoch: i32) -> Result<Vec<Change>, ControllerError> {
        if controller_epoch <= self.controller_epoch {
            return Err(ControllerError::StaleControllerEpoch {
                request: controller_epoch,
                current: self.controller_epoch,
            });
        }
        self.controller_epoch = controller_epoch;
        Ok(vec![Change::ControllerEpoch { epoch: controller_epoch }])
    }

    /// Restore a broker read from the store (after a failover): it counts as live and
    /// heartbeating at `now_ms`, and is fenced by `tick` if it does not heartbeat in time.
    pub fn restore_broker(&mut self, id: NodeId, endpoint: Endpoint, rack: Option<String>, shards: u32, now_ms: u64) {
        let broker = self.new_registration(id, endpoint, rack, shards, now_ms);
        self.brokers.insert(id, broker);
    }

    /// Restore a broker whose registration survived a coordinator restart or failover
    /// (its registration epoch kept): it counts as live and heartbeating at `now_ms`, and
    /// is fenced by `tick` if it does not heartbeat in time.
    pub fn restore_registration(
        &mut self,
        id: NodeId,
        endpoint: Endpoint,
        rack: Option<String>,
        shards: u32,
        registration_epoch: BrokerEpoch,
        now_ms: u64,
    ) {
        self.raise_registration_epoch(registration_epoch);
        let broker =
            BrokerInfo { id, endpoint, rack, shards, last_heartbeat_ms: now_ms, fenced: false, registration_epoch };
        self.brokers.insert(id, broker);
    }

    /// Registration epochs handed out from now on are above `epoch` (the last one a
    /// previous coordinator handed out).
    pub fn raise_registration_epoch(&mut self, epoch: BrokerEpoch) {
        self.registration_epoch_last = self.registration_epoch_last.max(epoch);
    }

    /// The last registration epoch handed out.
    pub fn registration_epoch_last(&self) -> BrokerEpoch {
        self.registration_epoch_last
    }

    /// A live, unfenced broker with the next registration epoch.
    fn new_registration(
        &mut self,
        id: NodeId,
        endpoint: Endpoint,
        rack: Option<String>,
        shards: u32,
        now_ms: u64,
    ) -> BrokerInfo {
        self.registration_epoch_last = self.registration_epoch_last.next();
        BrokerInfo {
            id,
            endpoint,
            rack,
            shards,
            last_heartbeat_ms: now_ms,
            fenced: false,
            registration_epoch: self.registration_epoch_last,
        }
    }

    /// Restore a topic read from the store (after a failover). Partition states are taken
    /// as stored; a leader that is not a known broker is handled by the next `tick` once
    /// `restore_broker` calls are done (see `reconcile`).
    pub fn restore_topic(&mut self, topic: TopicInfo) -> Result<(), ControllerError> {
        if self.topics.contains_key(&topic.name) {
            return Err(ControllerError::TopicExists(topic.name));
        }
        if topic.assignment.len() != topic.partitions.len() || topic.assignment.is_empty() {
            return Err(ControllerError::InvalidReplicaAssignment(format!(
                "{}: {} assignments for {} partition states",
                topic.name,
                topic.assignment.len(),
                topic.partitions.len()
            )));
        }
        self.topics.insert(topic.name.clone(), topic);
        Ok(())
    }

    /// After restoring: partitions whose leader is not a live broker get a new leader (or
    /// go offline), and ISR members that are not registered are removed.
    pub fn reconcile(&mut self) -> Vec<Change> {
        let dead: Vec<NodeId> = self
            .topics
            .values()
            .flat_map(|t| t.partitions.iter().flat_map(|s| s.isr.iter().copied()))
            .filter(|id| !self.is_live(*id))
            .collect::<BTreeSet<NodeId>>()
            .into_iter()
            .collect();
        let mut changes = Vec::new();
        for id in dead {
            self.remove_from_partitions(id, &mut changes);
        }
        self.elect_offline(&mut changes);
        changes
    }

    /// A broker registers (first start or restart). A broker already registered is first
    /// fenced (its old incarnation's leaderships move away), then registered anew.
    pub fn register_broker(
        &mut self,
        id: NodeId,
        endpoint: Endpoint,
        rack: Option<String>,
        shards: u32,
        now_ms: u64,
    ) -> Result<Vec<Change>, ControllerError> {
        if id.get() < 0 {
            return Err(ControllerError::UnknownBroker(id));
        }
        let mut changes = Vec::new();
        if let Some(old) = self.brokers.get(&id) {
            if !old.fenced {
                self.fence(id, FenceReason::Reregistered, &mut changes);
            }
        }
        let broker = self.new_registration(id, endpoint, rack, shards, now_ms);
        self.brokers.insert(id, broker.clone());
        changes.push(Change::BrokerRegistered { broker });
        self.elect_offline(&mut changes);
        self.debug_check();
        Ok(changes)
    }

    /// A broker's heartbeat. A fenced broker that heartbeats again is unfenced, and leads
    /// the offline partitions whose ISR it is in.
    pub fn heartbeat(&mut self, id: NodeId, now_ms: u64) -> Result<Vec<Change>, ControllerError> {
        let broker = self.brokers.get_mut(&id).ok_or(ControllerError::UnknownBroker(id))?;
        broker.last_heartbeat_ms = broker.last_heartbeat_ms.max(now_ms);
        let mut changes = Vec::new();
        if broker.fenced {
            broker.fenced = false;
            changes.push(Change::BrokerUnfenced { id });
            self.elect_offline(&mut changes);
        }
        self.debug_check();
        Ok(changes)
    }

    /// Fence every broker whose last heartbeat is older than the session timeout; move its
    /// leaderships to other live ISR members, or take the partitions offline.
    ///
    /// Ticks come about once a second. A gap between two of more than half the session
    /// timeout means the controller itself was paused (a store write stalled by the disk,
    /// a starved core): heartbeats that came meanwhile could not be processed, or were
    /// processed late with their arrival time, so every unfenced broker gets a fresh
    /// session from now instead of being fenced for the controller's own pause (as
    /// Cassandra's failure detector ignores its local pauses). A broker that is really
    /// gone is fenced one session timeout later.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Change> {
        let timeout_ms = self.config.broker_session_timeout_ms;
        let gap_ms = now_ms.saturating_sub(self.ticked_ms);
        if self.ticked_ms > 0 && gap_ms > timeout_ms / 2 {
            self.pause_ms = Some(gap_ms);
            for b in self.brokers.values_mut().filter(|b| !b.fenced) {
                b.last_heartbeat_ms = b.last_heartbeat_ms.max(now_ms);
            }
        }
        self.ticked_ms = self.ticked_ms.max(now_ms);
        let expired: Vec<NodeId> = self
            .brokers
            .values()
            .filter(|b| !b.fenced && now_ms.saturating_sub(b.last_heartbeat_ms) > timeout_ms)
            .map(|b| b.id)
            .collect();
        let mut changes = Vec::new();
        for id in expired {
            self.fence(id, FenceReason::SessionExpired, &mut changes);
        }
        let interval = self.config.preferred_leader_check_interval_ms;
        if interval > 0 && now_ms.saturating_sub(self.preferred_checked_ms) >= interval {
            if self.preferred_checked_ms > 0 {
                changes.extend(self.elect_preferred_leaders());
            }
            self.preferred_checked_ms = now_ms;
        }
        self.debug_check();
        changes
    }

    /// The last pause `tick` found (how long it did not run, ms), once.
    pub fn take_pause(&mut self) -> Option<u64> {
        self.pause_ms.take()
    }

    /// Controlled shutdown: leadership moves away and the broker leaves the ISRs first,
    /// then it is unregistered.
    pub fn unregister_broker(&mut self, id: NodeId) -> Result<Vec<Change>, ControllerError> {
        let broker = self.brokers.get(&id).ok_or(ControllerError::UnknownBroker(id))?;
        let mut changes = Vec::new();
        if !broker.fenced {
            self.fence(id, FenceReason::ControlledShutdown, &mut changes);
        }
        self.brokers.remove(&id);
        changes.push(Change::BrokerUnregistered { id });
        self.debug_check();
        Ok(changes)
    }

    /// CreateTopics with a replication factor: replicas placed by `assign_replicas` over
    /// the live brokers, with a start index and shift drawn from `rng`.
    pub fn create_topic(
        &mut self,
        name: &str,
        topic_id: Uuid,
        partitions: i32,
        replication_factor: i32,
        configs: BTreeMap<String, String>,
        rng: &mut dyn FnMut() -> u64,
    ) -> Result<Vec<Change>, ControllerError> {
        self.check_new_topic(name, topic_id)?;
        if !(1..=limits::topic_partitions_max).contains(&partitions) {
            return Err(ControllerError::InvalidPartitions(partitions));
        }
        let live = self.placement_brokers();
        if !(1..=REPLICATION_FACTOR_MAX).contains(&replication_factor) || replication_factor as usize > live.len() {
            return Err(ControllerError::InvalidReplicationFactor {
                requested: replication_factor,
                available: live.len(),
            });
        }
        let start_index = (rng() % live.len() as u64) as usize;
        let shift = (rng() % live.len() as u64) as usize;
        let assignment = assign_replicas(&live, partitions, replication_factor, 0, start_index, shift)?;
        self.check_broker_partitions(&assignment)?;
        Ok(self.insert_topic(name, topic_id, assignment, configs))
    }

    /// CreateTopics with an explicit assignment: every replica a live broker, no broker
    /// twice in a partition, the same count for every partition.
    pub fn create_topic_with_assignment(
        &mut self,
        name: &str,
        topic_id: Uuid,
        assignment: Vec<Vec<NodeId>>,
        configs: BTreeMap<String, String>,
    ) -> Result<Vec<Change>, ControllerError> {
        self.check_new_topic(name, topic_id)?;
        if assignment.is_empty() || assignment.len() > limits::topic_partitions_max as usize {
            return Err(ControllerError::InvalidPartitions(assignment.len() as i32));
        }
        self.check_assignment(&assignment, assignment[0].len(), 0)?;
        self.check_broker_partitions(&assignment)?;
        Ok(self.insert_topic(name, topic_id, assignment, configs))
    }

    /// Replace a topic's config overrides (AlterConfigs); the caller writes
    /// `/config/topics/<t>` and persists the changes returned. Turning
    /// `unclean.leader.election.enable` on elects a live replica for each offline partition
    /// at once, as Kafka's controller does when the config changes (not at the next
    /// broker event: the invariants hold after every decision).
    pub fn set_topic_configs(
        &mut self,
        name: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<Vec<Change>, ControllerError> {
        let t = self.topics.get_mut(name).ok_or_else(|| ControllerError::UnknownTopic(name.to_string()))?;
        t.configs = configs;
        let mut changes = Vec::new();
        self.elect_offline(&mut changes);
        self.debug_check();
        Ok(changes)
    }

    /// The dynamic configs of broker config entity `entity` (a broker id, or `<default>`).
    pub fn broker_configs(&self, entity: &str) -> Option<&BTreeMap<String, String>> {
        self.broker_configs.get(entity)
    }

    /// Replace the dynamic configs of `entity` (the caller stores
    /// `/config/brokers/<entity>` first; nothing here checks names or values).
    pub fn set_broker_configs(&mut self, entity: &str, configs: BTreeMap<String, String>) {
        if configs.is_empty() {
            self.broker_configs.remove(entity);
        } else {
            self.broker_configs.insert(entity.to_string(), configs);
        }
    }

    /// Every client entity's configs, by entity path (`users/alice`).
    pub fn entity_configs(&self) -> &BTreeMap<String, BTreeMap<String, String>> {
        &self.entity_configs
    }

    /// Replace the configs of client entity `path` (the caller stores
    /// `/config/<path>` first; nothing here checks names or values).
    pub fn set_entity_configs(&mut self, path: &str, configs: BTreeMap<String, String>) {
        if configs.is_empty() {
            self.entity_configs.remove(path);
        } else {
            self.entity_configs.insert(path.to_string(), configs);
        }
    }

    /// ElectLeaders for one partition, of the kind asked for.
    pub fn elect_leader(
        &mut self,
        kind: ElectionKind,
        topic: &str,
        partition: i32,
        changes: &mut Vec<Change>,
    ) -> Election {
        match kind {
            ElectionKind::Preferred => self.elect_preferred_leader(topic, partition, changes),
            ElectionKind::Unclean => self.elect_unclean_leader(topic, partition, changes),
        }
    }

    /// ElectLeaders (unclean) for one partition, as Kafka's controller: a partition with
    /// a leader needs none; an offline one gets its first live ISR member, else its first
    /// live replica in assignment order with an ISR of just that replica (what that
    /// replica lacks is lost, which is what the operator asked for). This is what
    /// `unclean.leader.election.enable` does on its own, done once on request.
    pub fn elect_unclean_leader(&mut self, topic: &str, partition: i32, changes: &mut Vec<Change>) -> Election {
        let Some(t) = self.topics.get(topic) else { return Election::UnknownPartition };
        let Some(p) = usize::try_from(partition).ok().filter(|p| *p < t.partitions.len()) else {
            return Election::UnknownPartition;
        };
        let (replicas, state) = (&t.assignment[p], &t.partitions[p]);
        if state.leader != NO_LEADER {
            return Election::NotNeeded;
        }
        let clean = self.choose_leader(replicas, &state.isr);
        let (leader, isr) = if clean != NO_LEADER {
            (clean, state.isr.iter().copied().filter(|r| self.is_live(*r)).collect())
        } else {
            match replicas.iter().find(|r| self.is_live(**r)) {
                Some(&u) => (u, vec![u]),
                None => return Election::EligibleNotAvailable,
            }
        };
        self.update_partition(
            topic,
            p,
            |s| {
                s.leader = leader;
                s.isr = isr;
            },
            changes,
        );
        self.debug_check();
        Election::Elected
    }

    /// ElectLeaders (preferred) for one partition: its first replica becomes its leader
    /// when live and in the ISR, as Kafka's `electLeader` decides it (the periodic
    /// `elect_preferred_leaders` does the same for every partition).
    pub fn elect_preferred_leader(&mut self, topic: &str, partition: i32, changes: &mut Vec<Change>) -> Election {
        let Some(t) = self.topics.get(topic) else { return Election::UnknownPartition };
        let Some(p) = usize::try_from(partition).ok().filter(|p| *p < t.partitions.len()) else {
            return Election::UnknownPartition;
        };
        let (preferred, state) = (t.assignment[p][0], &t.partitions[p]);
        if state.leader == preferred {
            return Election::NotNeeded;
        }
        if !self.is_live(preferred) || !state.isr.contains(&preferred) {
            return Election::PreferredNotAvailable;
        }
        self.update_partition(topic, p, |s| s.leader = preferred, changes);
        self.debug_check();
        Election::Elected
    }

    /// Refuse `added` replicas if any broker would then host more than
    /// `broker_partitions_max`.
    fn check_broker_partitions(&self, added: &[Vec<NodeId>]) -> Result<(), ControllerError> {
        let mut count: BTreeMap<NodeId, usize> = BTreeMap::new();
        for replica in self.topics.values().flat_map(|t| t.assignment.iter().flatten()).chain(added.iter().flatten()) {
            *count.entry(*replica).or_default() += 1;
        }
        match count.into_iter().find(|(_, n)| *n > self.config.broker_partitions_max) {
            Some((broker, replicas)) => Err(ControllerError::BrokerPartitionsExceeded {
                broker,
                replicas,
                max: self.config.broker_partitions_max,
            }),
            None => Ok(()),
        }
    }

    /// AlterPartitionReassignments for one partition, as Kafka's controller
    /// (`ReplicationControlManager`):
    /// - `Some(target)`: the target is checked as a manual assignment is (registered
    ///   brokers, none twice, at least one live). The partition's replicas become the
    ///   target followed by the current replicas not in it; the target replicas that are
    ///   new are added, the others removed once every target replica is in the ISR. A
    ///   target already in the ISR (a reorder, a shrink) completes at once. A new target
    ///   while one is in progress is taken from the original replicas (those not being
    ///   added), as Kafka's `ReplicaAssignment.reassignTo`: a replica being added that the
    ///   new target leaves out is dropped, unless it is in the ISR (then it is removed
    ///   with the others when the new target is in sync, so the ISR never empties).
    /// - `None`: cancel. The replicas go back to the original ones (those not being
    ///   added, in their current order, as Kafka's revert), the ISR and the leadership
    ///   with them; NO_REASSIGNMENT_IN_PROGRESS when
    ///   there is nothing to cancel. A cancel that would leave no ISR member is refused
    ///   (Kafka would need an unclean election there).
    ///
    /// With `allow_rf_change` false (KIP-860, AlterPartitionReassignments v1), a target
    /// whose length differs from the partition's replication factor now (the current
    /// target's length while a reassignment is in progress, as Kafka's
    /// `validatePartitionReplicationFactorUnchanged`) is refused with
    /// INVALID_REPLICATION_FACTOR; a cancel is always allowed.
    pub fn alter_reassignment(
        &mut self,
        topic: &str,
        partition: i32,
        target: Option<Vec<NodeId>>,
        allow_rf_change: bool,
    ) -> Result<Vec<Change>, ControllerError> {
        let unknown = || ControllerError::UnknownTopicOrPartition { topic: topic.to_string(), partition };
        let t = self.topics.get(topic).ok_or_else(unknown)?;
        let p = usize::try_from(partition).ok().filter(|&p| p < t.partitions.len()).ok_or_else(unknown)?;
        let current = t.assignment[p].clone();
        let ongoing = t.reassignments.get(&partition).cloned();
        let mut changes = Vec::new();
        match target {
            None => {
                let Some(r) = ongoing else {
                    return Err(ControllerError::NoReassignmentInProgress { topic: topic.to_string(), partition });
                };
                let original: Vec<NodeId> = current.iter().copied().filter(|x| !r.adding.contains(x)).collect();
                if !t.partitions[p].isr.iter().any(|x| original.contains(x)) {
                    return Err(ControllerError::InvalidReplicaAssignment(format!(
                        "cancelling the reassignment of {topic}-{partition} would need an unclean leader election: \
                         no original replica is in the ISR"
                    )));
                }
                self.set_replicas(topic, p, original, None, &mut changes);
            }
            Some(target) => {
                self.check_assignment(std::slice::from_ref(&target), target.len(), partition)?;
                let factor = t.target_replicas(p).len();
                if !allow_rf_change && target.len() != factor {
                    return Err(ControllerError::ReplicationFactorChanged { from: factor, to: target.len() });
                }
                let adding_now = ongoing.map(|r| r.adding).unwrap_or_default();
                let origin: Vec<NodeId> = current.iter().copied().filter(|x| !adding_now.contains(x)).collect();
                let adding: Vec<NodeId> = target.iter().copied().filter(|x| !origin.contains(x)).collect();
                let mut removing: Vec<NodeId> = origin.iter().copied().filter(|x| !target.contains(x)).collect();
                // A replica being added that joined the ISR stays until the new target is
                // in sync: dropping it could leave the partition no ISR member (the
                // original ones may have left it meanwhile).
                for r in &t.partitions[p].isr {
                    if !target.contains(r) && !removing.contains(r) {
                        removing.push(*r);
                    }
                }
                let replicas: Vec<NodeId> = target.iter().chain(&removing).copied().collect();
                let reassignment =
                    (!adding.is_empty() || !removing.is_empty()).then_some(Reassignment { adding, removing });
                self.set_replicas(topic, p, replicas, reassignment, &mut changes);
            }
        }
        self.try_complete_reassignment(topic, p, &mut changes);
        // A partition left offline by the change may be led again.
        self.elect_offline(&mut changes);
        self.debug_check();
        Ok(changes)
    }

    /// Every reassignment in progress: (topic, partition, replicas, reassignment).
    pub fn reassignments(&self) -> impl Iterator<Item = (&str, i32, &[NodeId], &Reassignment)> {
        self.topics.values().flat_map(|t| {
            t.reassignments.iter().map(move |(p, r)| (t.name.as_str(), *p, t.assignment[*p as usize].as_slice(), r))
        })
    }

    /// Finish `topic`-`p`'s reassignment when every target replica is in the ISR of a
    /// led partition: the replicas become the target, the leaving ones leave the ISR,
    /// and a leaving leader hands the leadership to the first target replica in the ISR.
    fn try_complete_reassignment(&mut self, topic: &str, p: usize, changes: &mut Vec<Change>) {
        let Some(t) = self.topics.get(topic) else { return };
        if !t.reassignments.contains_key(&(p as i32)) || t.partitions[p].leader == NO_LEADER {
            return;
        }
        let target = t.target_replicas(p);
        if target.iter().all(|r| t.partitions[p].isr.contains(r)) {
            self.set_replicas(topic, p, target, None, changes);
        }
    }

    /// Give `topic`-`p` the replicas `replicas` (and `reassignment`, or none): the ISR
    /// keeps its members that remain replicas, the leader stays if it is one of them,
    /// else the first live remaining ISR member leads; the partition epoch moves even
    /// when leader and ISR do not (the replicas changed). Nothing changes if nothing
    /// differs. The caller makes sure an ISR member remains.
    fn set_replicas(
        &mut self,
        topic: &str,
        p: usize,
        replicas: Vec<NodeId>,
        reassignment: Option<Reassignment>,
        changes: &mut Vec<Change>,
    ) {
        let t = self.topics.get_mut(topic).expect("set_replicas: topic exists");
        if t.assignment[p] == replicas && t.reassignments.get(&(p as i32)) == reassignment.as_ref() {
            return;
        }
        let old_replicas = std::mem::replace(&mut t.assignment[p], replicas.clone());
        match reassignment {
            Some(r) => t.reassignments.insert(p as i32, r),
            None => t.reassignments.remove(&(p as i32)),
        };
        changes.push(Change::AssignmentChanged {
            topic: topic.to_string(),
            topic_id: t.topic_id,
            assignment: t.assignment.clone(),
            reassignments: t.reassignments.clone(),
        });
        let removed = if old_replicas.iter().any(|r| !replicas.contains(r)) {
            ReplicasChange::Removed
        } else {
            ReplicasChange::Changed
        };
        let state = t.partitions[p].clone();
        let isr: Vec<NodeId> = state.isr.iter().copied().filter(|r| replicas.contains(r)).collect();
        assert!(!isr.is_empty(), "{topic}-{p}: no ISR member among the new replicas {replicas:?}");
        let leader = if state.leader != NO_LEADER && isr.contains(&state.leader) {
            state.leader
        } else {
            self.choose_leader(&replicas, &isr)
        };
        self.change_partition(
            topic,
            p,
            |s| {
                s.leader = leader;
                s.isr = isr;
            },
            removed,
            changes,
        );
    }

    pub fn delete_topic(&mut self, name: &str) -> Result<Vec<Change>, ControllerError> {
        let t = self.topics.remove(name).ok_or_else(|| ControllerError::UnknownTopic(name.to_string()))?;
        Ok(vec![Change::TopicDeleted {
            name: t.name,
            topic_id: t.topic_id,
            partition_count: t.assignment.len() as i32,
        }])
    }

    /// CreatePartitions: grow `name` to `new_total` partitions, placed as Kafka does (the
    /// start index is where partition 0's first replica sits among the live brokers).
    pub fn create_partitions(
        &mut self,
        name: &str,
        new_total: i32,
        rng: &mut dyn FnMut() -> u64,
    ) -> Result<Vec<Change>, ControllerError> {
        let t = self.topics.get(name).ok_or_else(|| ControllerError::UnknownTopic(name.to_string()))?;
        let current = t.partition_count();
        if new_total <= current || new_total > limits::topic_partitions_max {
            return Err(ControllerError::InvalidPartitions(new_total));
        }
        let rf = t.target_replicas(0).len() as i32;
        let first_replica = t.assignment[0][0];
        let live = self.placement_brokers();
        if rf as usize > live.len() {
            return Err(ControllerError::InvalidReplicationFactor { requested: rf, available: live.len() });
        }
        let start_index = match live.iter().position(|b| b.id >= first_replica) {
            Some(i) => i,
            None => (rng() % live.len() as u64) as usize,
        };
        let added = assign_replicas(&live, new_total - current, rf, current, start_index, start_index)?;
        self.check_broker_partitions(&added)?;
        Ok(self.append_partitions(name, added))
    }

    /// CreatePartitions with an explicit assignment of the new partitions (Kafka's
    /// `CreatePartitionsAssignment`): one replica list per added partition, each as long
    /// as the topic's existing partitions' and checked as `check_assignment` does. The
    /// first replica of each is its preferred leader (and its leader when live).
    pub fn create_partitions_with_assignment(
        &mut self,
        name: &str,
        added: Vec<Vec<NodeId>>,
    ) -> Result<Vec<Change>, ControllerError> {
        let t = self.topics.get(name).ok_or_else(|| ControllerError::UnknownTopic(name.to_string()))?;
        let current = t.partition_count();
        let new_total = current as i64 + added.len() as i64;
        if added.is_empty() || new_total > limits::topic_partitions_max as i64 {
            return Err(ControllerError::InvalidPartitions(new_total.min(i32::MAX as i64) as i32));
        }
        let rf = t.target_replicas(0).len();
        self.check_assignment(&added, rf, current)?;
        self.check_broker_partitions(&added)?;
        Ok(self.append_partitions(name, added))
    }

    /// Append checked replica lists to `name` as new partitions (`new_partition_state`).
    fn append_partitions(&mut self, name: &str, added: Vec<Vec<NodeId>>) -> Vec<Change> {
        let epoch = self.controller_epoch;
        let states: Vec<PartitionState> = added.iter().map(|r| self.new_partition_state(r, epoch)).collect();
        let t = self.topics.get_mut(name).expect("append_partitions: the topic exists");
        let current = t.partition_count();
        let mut changes = Vec::new();
        let mut new_states = Vec::new();
        for (i, (replicas, state)) in added.into_iter().zip(states).enumerate() {
            new_states.push((current + i as i32, state.clone()));
            t.assignment.push(replicas);
            t.partitions.push(state);
        }
        changes.push(Change::PartitionsCreated {
            topic: name.to_string(),
            topic_id: t.topic_id,
            first_new_partition: current,
            assignment: t.assignment.clone(),
            reassignments: t.reassignments.clone(),
        });
        for (partition, state) in new_states {
            changes.push(Change::PartitionChanged { topic: name.to_string(), partition, state });
        }
        self.debug_check();
        changes
    }

    /// AlterPartition: the leader of `topic`-`partition` reports a new ISR, each member
    /// with the broker epoch of the incarnation the leader saw (AlterPartition v3's
    /// NewIsrWithEpochs; `NO_BROKER_EPOCH` is not checked, as for v2's plain ids).
    /// Rejected when `leader_id` is not the leader, an epoch is stale, or a member is not
    /// a live replica in its current registration (KIP-903: the leader's view of a member
    /// may come from an incarnation that has since restarted and lost data; Kafka's
    /// `ineligibleReplicasForIsr` answers INELIGIBLE_REPLICA). An unchanged ISR changes
    /// nothing.
    pub fn alter_partition(
        &mut self,
        topic: &str,
        partition: i32,
        leader_id: NodeId,
        leader_epoch: LeaderEpoch,
        partition_epoch: PartitionEpoch,
        new_isr_with_epochs: &[(NodeId, BrokerEpoch)],
    ) -> Result<Vec<Change>, ControllerError> {
        let unknown = || ControllerError::UnknownTopicOrPartition { topic: topic.to_string(), partition };
        let t = self.topics.get(topic).ok_or_else(unknown)?;
        let p = usize::try_from(partition).ok().filter(|&p| p < t.partitions.len()).ok_or_else(unknown)?;
        let state = &t.partitions[p];
        let replicas = &t.assignment[p];
        if leader_epoch < state.leader_epoch {
            return Err(ControllerError::FencedLeaderEpoch { request: leader_epoch, current: state.leader_epoch });
        }
        if leader_epoch > state.leader_epoch {
            return Err(ControllerError::UnknownLeaderEpoch { request: leader_epoch, current: state.leader_epoch });
        }
        if state.leader != leader_id {
            return Err(ControllerError::NotLeader {
                topic: topic.to_string(),
                partition,
                broker: leader_id,
                leader: state.leader,
            });
        }
        if partition_epoch != state.partition_epoch {
            return Err(ControllerError::InvalidUpdateVersion {
                request: partition_epoch,
                current: state.partition_epoch,
            });
        }
        let new_isr: Vec<NodeId> = new_isr_with_epochs.iter().map(|(r, _)| *r).collect();
        if !new_isr.contains(&leader_id) {
            return Err(ControllerError::InvalidIsr(format!("{new_isr:?} does not contain the leader {leader_id}")));
        }
        let mut seen = BTreeSet::new();
        for &(r, broker_epoch) in new_isr_with_epochs {
            if !seen.insert(r) {
                return Err(ControllerError::InvalidIsr(format!("{new_isr:?} names {r} twice")));
            }
            if !replicas.contains(&r) {
                return Err(ControllerError::IneligibleReplica { replica: r, reason: "not a replica" });
            }
            if !self.is_live(r) {
                return Err(ControllerError::IneligibleReplica { replica: r, reason: "not a live broker" });
            }
            if broker_epoch != NO_BROKER_EPOCH && self.broker_epoch(r) != Some(broker_epoch) {
                return Err(ControllerError::IneligibleReplica {
                    replica: r,
                    reason: "broker epoch is not its current registration (a restarted broker)",
                });
            }
        }
        // Keep the ISR in assignment order, so that equal sets compare equal.
        let ordered: Vec<NodeId> = replicas.iter().copied().filter(|r| new_isr.contains(r)).collect();
        let mut current_sorted = state.isr.clone();
        current_sorted.sort_unstable();
        let mut new_sorted = ordered.clone();
        new_sorted.sort_unstable();
        if current_sorted == new_sorted {
            return Ok(Vec::new());
        }
        let mut changes = Vec::new();
        self.update_partition(topic, p, |s| s.isr = ordered, &mut changes);
        // A reassignment finishes when its last target replica joins the ISR.
        self.try_complete_reassignment(topic, p, &mut changes);
        self.debug_check();
        Ok(changes)
    }

    /// Preferred leader election: each partition whose first replica is live and in the ISR
    /// but does not lead gets it back as leader.
    pub fn elect_preferred_leaders(&mut self) -> Vec<Change> {
        let mut moves = Vec::new();
        for t in self.topics.values() {
            for (p, s) in t.partitions.iter().enumerate() {
                let preferred = t.assignment[p][0];
                if s.leader != preferred && self.is_live(preferred) && s.isr.contains(&preferred) {
                    moves.push((t.name.clone(), p, preferred));
                }
            }
        }
        let mut changes = Vec::new();
        for (topic, p, leader) in moves {
            self.update_partition(&topic, p, |s| s.leader = leader, &mut changes);
        }
        self.debug_check();
        changes
    }

    // ---- Invariants ----

    /// Checks every invariant of the module comment that a single state can show; the
    /// simulation also checks the ones over time (epochs only grow).
    pub fn check_invariants(&self) -> Result<(), String> {
        for t in self.topics.values() {
            if t.assignment.len() != t.partitions.len() || t.assignment.is_empty() {
                return Err(format!("{}: {} assignments, {} states", t.name, t.assignment.len(), t.partitions.len()));
            }
            for (p, r) in &t.reassignments {
                let tp = TpName(&t.name, *p as usize);
                let Some(replicas) = usize::try_from(*p).ok().and_then(|p| t.assignment.get(p)) else {
                    return Err(format!("{tp}: a reassignment of a partition that does not exist"));
                };
                if r.adding.is_empty() && r.removing.is_empty() {
                    return Err(format!("{tp}: an empty reassignment"));
                }
                if let Some(x) = r.adding.iter().chain(&r.removing).find(|x| !replicas.contains(x)) {
                    return Err(format!("{tp}: reassignment {r:?} names {x}, not a replica {replicas:?}"));
                }
                if let Some(x) = r.adding.iter().find(|x| r.removing.contains(x)) {
                    return Err(format!("{tp}: reassignment {r:?} adds and removes {x}"));
                }
                if replicas.len() == r.removing.len() {
                    return Err(format!("{tp}: reassignment {r:?} removes every replica {replicas:?}"));
                }
            }
            for (p, (replicas, s)) in t.assignment.iter().zip(&t.partitions).enumerate() {
                let tp = TpName(&t.name, p);
                if replicas.is_empty() || has_duplicates(replicas) {
                    return Err(format!("{tp}: bad replicas {replicas:?}"));
                }
                if s.isr.is_empty() || has_duplicates(&s.isr) {
                    return Err(format!("{tp}: bad isr {:?}", s.isr));
                }
                if let Some(r) = s.isr.iter().find(|r| !replicas.contains(r)) {
                    return Err(format!("{tp}: isr member {r} is not a replica {replicas:?}"));
                }
                if s.leader != NO_LEADER {
                    if !s.isr.contains(&s.leader) {
                        return Err(format!("{tp}: leader {} not in isr {:?}", s.leader, s.isr));
                    }
                    if !self.is_live(s.leader) {
                        return Err(format!("{tp}: leader {} is not live", s.leader));
                    }
                    if let Some(r) = s.isr.iter().find(|r| !self.is_live(**r)) {
                        return Err(format!("{tp}: isr {:?} has dead member {r} while led", s.isr));
                    }
                } else {
                    if s.isr.len() > 1 {
                        return Err(format!("{tp}: offline with more than one isr member {:?}", s.isr));
                    }
                    if let Some(r) = s.isr.iter().find(|r| self.is_live(**r)) {
                        return Err(format!("{tp}: offline although isr member {r} is live"));
                    }
                    if self.unclean_allowed(t) && replicas.iter().any(|r| self.is_live(*r)) {
                        return Err(format!("{tp}: offline although unclean election may pick a live replica"));
                    }
                }
                if s.leader_epoch.get() < 0 || s.partition_epoch.get() < 0 {
                    return Err(format!("{tp}: negative epochs {s:?}"));
                }
                if s.controller_epoch > self.controller_epoch {
                    return Err(format!(
                        "{tp}: written by controller epoch {} > {}",
                        s.controller_epoch, self.controller_epoch
                    ));
                }
            }
        }
        Ok(())
    }

    // ---- Internals ----

    fn debug_check(&self) {
        if cfg!(debug_assertions) {
            if let Err(e) = self.check_invariants() {
                panic!("controller invariant broken: {e}");
            }
        }
    }

    fn is_live(&self, id: NodeId) -> bool {
        self.brokers.get(&id).is_some_and(|b| b.is_live())
    }

    fn unclean_allowed(&self, t: &TopicInfo) -> bool {
        match t.configs.get(UNCLEAN_LEADER_ELECTION_CONFIG).map(|v| v.trim()) {
            Some(v) if v.eq_ignore_ascii_case("true") => true,
            Some(v) if v.eq_ignore_ascii_case("false") => false,
            _ => self.config.unclean_leader_election,
        }
    }

    fn placement_brokers(&self) -> Vec<PlacementBroker> {
        self.live_brokers().map(|b| PlacementBroker { id: b.id, rack: b.rack.clone() }).collect()
    }

    fn check_new_topic(&self, name: &str, topic_id: Uuid) -> Result<(), ControllerError> {
        if self.topics.contains_key(name) {
            return Err(ControllerError::TopicExists(name.to_string()));
        }
        if topic_id.is_nil() || self.topics.values().any(|t| t.topic_id == topic_id) {
            return Err(ControllerError::TopicExists(format!("{name} (topic id {topic_id} taken)")));
        }
        Ok(())
    }

    /// A manual assignment as Kafka's `validateManualPartitionAssignment` checks it: no
    /// empty replica list, every broker registered, none twice in a partition, `rf`
    /// replicas in every partition, and (as Kafka's `createTopic`) at least one live
    /// replica in each: a fenced broker may be named, it starts outside the ISR
    /// (`new_partition_state`). Errors are `InvalidReplicaAssignment` (Kafka
    /// INVALID_REPLICA_ASSIGNMENT).
    /// `assignment[i]` is partition `first_partition + i` (for messages).
    pub fn check_assignment(
        &self,
        assignment: &[Vec<NodeId>],
        rf: usize,
        first_partition: i32,
    ) -> Result<(), ControllerError> {
        let bad = |m: String| Err(ControllerError::InvalidReplicaAssignment(m));
        for (i, replicas) in assignment.iter().enumerate() {
            let p = first_partition as i64 + i as i64;
            if replicas.is_empty() {
                return bad(format!("partition {p}: the replica list is empty"));
            }
            if replicas.len() > REPLICATION_FACTOR_MAX as usize {
                return bad(format!(
                    "partition {p} has {} replicas, above the most a partition may have ({REPLICATION_FACTOR_MAX})",
                    replicas.len()
                ));
            }
            if let Some(r) = replicas.iter().find(|r| !self.brokers.contains_key(r)) {
                return bad(format!("partition {p}: broker {r} is not registered"));
            }
            if has_duplicates(replicas) {
                return bad(format!("partition {p}: {replicas:?} names a broker more than once"));
            }
            if replicas.len() != rf {
                return bad(format!(
                    "partition {p} has {} replica(s), not consistent with the other partitions' {rf}",
                    replicas.len()
                ));
            }
            if !replicas.iter().any(|r| self.is_live(*r)) {
                return bad(format!(
                    "all brokers specified in the manual partition assignment for partition {p} are fenced"
                ));
            }
        }
        Ok(())
    }

    /// A new partition on `replicas` (checked: at least one live): its ISR is its live
    /// replicas in assignment order, its leader the first of them, which is the
    /// preferred replica unless that one is fenced (as Kafka's `createTopic`).
    fn new_partition_state(&self, replicas: &[NodeId], controller_epoch: i32) -> PartitionState {
        let isr: Vec<NodeId> = replicas.iter().copied().filter(|r| self.is_live(*r)).collect();
        assert!(!isr.is_empty(), "a new partition on {replicas:?} needs a live replica");
        PartitionState {
            leader: isr[0],
            leader_epoch: LeaderEpoch(0),
            isr,
            partition_epoch: PartitionEpoch(0),
            controller_epoch,
        }
    }

    fn insert_topic(
        &mut self,
        name: &str,
        topic_id: Uuid,
        assignment: Vec<Vec<NodeId>>,
        configs: BTreeMap<String, String>,
    ) -> Vec<Change> {
        let epoch = self.controller_epoch;
        let partitions: Vec<PartitionState> =
            assignment.iter().map(|replicas| self.new_partition_state(replicas, epoch)).collect();
        let mut changes = vec![Change::TopicCreated {
            name: name.to_string(),
            topic_id,
            assignment: assignment.clone(),
            configs: configs.clone(),
        }];
        for (p, state) in partitions.iter().enumerate() {
            changes.push(Change::PartitionChanged {
                topic: name.to_string(),
                partition: p as i32,
                state: state.clone(),
            });
        }
        self.topics.insert(
            name.to_string(),
            TopicInfo {
                name: name.to_string(),
                topic_id,
                assignment,
                configs,
                partitions,
                reassignments: BTreeMap::new(),
            },
        );
        self.debug_check();
        changes
    }

    /// Mark `id` fenced, then take it out of every ISR and leadership.
    fn fence(&mut self, id: NodeId, reason: FenceReason, changes: &mut Vec<Change>) {
        let b = self.brokers.get_mut(&id).expect("fence: broker is registered");
        assert!(!b.fenced, "fence: broker {id} already fenced");
        b.fenced = true;
        changes.push(Change::BrokerFenced { id, reason });
        self.remove_from_partitions(id, changes);
    }

    /// `id` is no longer live: remove it from every ISR (keeping it when it is the last
    /// member, as Kafka does), and give the partitions it led a new leader from the ISR
    /// (or, where allowed, an unclean one), else `NO_LEADER`.
    fn remove_from_partitions(&mut self, id: NodeId, changes: &mut Vec<Change>) {
        assert!(!self.is_live(id));
        let affected: Vec<(String, usize)> = self
            .topics
            .values()
            .flat_map(|t| {
                t.partitions.iter().enumerate().filter(|(_, s)| s.isr.contains(&id)).map(|(p, _)| (t.name.clone(), p))
            })
            .collect();
        for (topic, p) in affected {
            let t = &self.topics[&topic];
            let s = &t.partitions[p];
            let replicas = &t.assignment[p];
            let mut isr: Vec<NodeId> = s.isr.iter().copied().filter(|&r| r != id).collect();
            if isr.is_empty() {
                isr = s.isr.clone();
            }
            let mut leader =
                if s.leader == id || s.leader == NO_LEADER { self.choose_leader(replicas, &isr) } else { s.leader };
            if leader == NO_LEADER && self.unclean_allowed(t) {
                if let Some(&u) = replicas.iter().find(|r| self.is_live(**r)) {
                    leader = u;
                    isr = vec![u];
                }
            }
            self.update_partition(
                &topic,
                p,
                |s| {
                    s.leader = leader;
                    s.isr = isr;
                },
                changes,
            );
        }
    }

    /// Offline partitions get a leader when an ISR member is live again, or (unclean) when
    /// any replica is.
    fn elect_offline(&mut self, changes: &mut Vec<Change>) {
        let mut moves = Vec::new();
        for t in self.topics.values() {
            for (p, s) in t.partitions.iter().enumerate() {
                if s.leader != NO_LEADER {
                    continue;
                }
                let replicas = &t.assignment[p];
                let clean = self.choose_leader(replicas, &s.isr);
                if clean != NO_LEADER {
                    // Members that are not live leave the ISR with the new leadership.
                    let isr: Vec<NodeId> = s.isr.iter().copied().filter(|r| self.is_live(*r)).collect();
                    moves.push((t.name.clone(), p, clean, isr));
                } else if self.unclean_allowed(t) {
                    if let Some(&u) = replicas.iter().find(|r| self.is_live(**r)) {
                        moves.push((t.name.clone(), p, u, vec![u]));
                    }
                }
            }
        }
        for (topic, p, leader, isr) in moves {
            self.update_partition(
                &topic,
                p,
                |s| {
                    s.leader = leader;
                    s.isr = isr;
                },
                changes,
            );
        }
    }

    /// First live replica, in assignment order, that is in `isr`.
    fn choose_leader(&self, replicas: &[NodeId], isr: &[NodeId]) -> NodeId {
        replicas.iter().copied().find(|r| isr.contains(r) && self.is_live(*r)).unwrap_or(NO_LEADER)
    }

    /// Apply `f` to one partition's state, bump the epochs as the change requires, and
    /// record it. No change, no epoch bump, no record.
    fn update_partition(
        &mut self,
        topic: &str,
        p: usize,
        f: impl FnOnce(&mut PartitionState),
        changes: &mut Vec<Change>,
    ) {
        self.change_partition(topic, p, f, ReplicasChange::None, changes)
    }

    /// `update_partition`, recording a new state even when leader and ISR are unchanged
    /// if the replicas changed, and moving the leader epoch if some were removed.
    fn change_partition(
        &mut self,
        topic: &str,
        p: usize,
        f: impl FnOnce(&mut PartitionState),
        replicas_change: ReplicasChange,
        changes: &mut Vec<Change>,
    ) {
        let controller_epoch = self.controller_epoch;
        let t = self.topics.get_mut(topic).expect("update_partition: topic exists");
        let replicas = t.assignment[p].clone();
        let old = t.partitions[p].clone();
        let mut new = old.clone();
        f(&mut new);
        // Keep the ISR in assignment order.
        new.isr = replicas.iter().copied().filter(|r| new.isr.contains(r)).collect();
        if new.leader == old.leader && new.isr == old.isr && replicas_change == ReplicasChange::None {
            return;
        }
        assert_eq!((new.leader_epoch, new.partition_epoch), (old.leader_epoch, old.partition_epoch));
        // A removed replica's fetches still carry the old leader epoch: the new one fences
        // them (Kafka's PartitionChangeBuilder bumps it too). Else a fetch it sent before it
        // deleted its log could reach the leader after the replica was added back, empty,
        // and vouch for a log end it no longer has: the leader would take it into the ISR
        // and it could be elected without the committed records (the replication
        // simulation's seed 35863512891).
        if new.leader != old.leader || replicas_change == ReplicasChange::Removed {
            new.leader_epoch = old.leader_epoch.next();
        }
        new.partition_epoch = old.partition_epoch.next();
        new.controller_epoch = controller_epoch;
        assert!(!new.isr.is_empty(), "{topic}-{p}: empty ISR");
        assert!(new.leader == NO_LEADER || new.isr.contains(&new.leader), "{topic}-{p}: leader outside the ISR");
        t.partitions[p] = new.clone();
        changes.push(Change::PartitionChanged { topic: topic.to_string(), partition: p as i32, state: new });
    }
}

/// How a partition change touches its replica list (`change_partition`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplicasChange {
    None,
    /// Replicas were added or reordered, none removed: the partition epoch moves.
    Changed,
    /// At least one replica was removed: the leader epoch moves too.
    Removed,
}

/// Quadratic, for the short lists of replicas (at most `REPLICATION_FACTOR_MAX`).
fn has_duplicates(ids: &[NodeId]) -> bool {
    ids.iter().enumerate().any(|(i, a)| ids[i + 1..].contains(a))
}

/// `topic-partition` for messages, formatted only when one is written.
struct TpName<'a>(&'a str, usize);

impl std::fmt::Display for TpName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pb(id: i32, rack: Option<&str>) -> PlacementBroker {
        PlacementBroker { id: NodeId(id), rack: rack.map(str::to_string) }
    }

    fn ids(assignment: Vec<Vec<i32>>) -> Vec<Vec<NodeId>> {
        assignment.into_iter().map(|r| r.into_iter().map(NodeId).collect()).collect()
    }

    #[test]
    fn rack_unaware_placement_matches_kafka() {
        // Kafka's AdminUtilsTest.testReplicaAssignment: brokers 0..4, 10 partitions, rf 3,
        // fixed start index 0.
        let brokers: Vec<_> = (0..5).map(|i| pb(i, None)).collect();
        let got = assign_replicas(&brokers, 10, 3, 0, 0, 0).unwrap();
        let want = ids(vec![
            vec![0, 1, 2],
            vec![1, 2, 3],
            vec![2, 3, 4],
            vec![3, 4, 0],
            vec![4, 0, 1],
            vec![0, 2, 3],
            vec![1, 3, 4],
            vec![2, 4, 0],
            vec![3, 0, 1],
            vec![4, 1, 2],
        ]);
        assert_eq!(got, want);
    }

    #[test]
    fn single_broker_rf1() {
        let got = assign_replicas(&[pb(7, None)], 3, 1, 0, 5, 9).unwrap();
        assert_eq!(got, ids(vec![vec![7], vec![7], vec![7]]));
    }

    #[test]
    fn rack_aware_spreads_over_racks() {
        // Racks: rack1 {0,5}, rack2 {3,4}, rack3 {1,2}: alternated 0,3,1,5,4,2 (Kafka's
        // getRackAlternatedBrokerList example).
        let racks = [(0, "rack1"), (1, "rack3"), (2, "rack3"), (3, "rack2"), (4, "rack2"), (5, "rack1")];
        let brokers: Vec<_> = racks.iter().map(|&(id, r)| pb(id, Some(r))).collect();
        let rack_of = |id: i32| racks.iter().find(|r| r.0 == id).unwrap().1;
        let got = assign_replicas(&brokers, 6, 1, 0, 0, 0).unwrap();
        let leaders: Vec<i32> = got.iter().map(|r| r[0].0).collect();
        assert_eq!(leaders, vec![0, 3, 1, 5, 4, 2]);
        for start in 0..6 {
            for shift in 0..6 {
                for rf in 1..=6 {
                    let got = assign_replicas(&brokers, 12, rf, 0, start, shift).unwrap();
                    for replicas in &got {
                        let racks: BTreeSet<&str> = replicas.iter().map(|&b| rack_of(b.0)).collect();
                        assert_eq!(racks.len(), (rf as usize).min(3), "{replicas:?}");
                    }
                    // Leaders are balanced: 12 partitions over 6 brokers, 2 each.
                    let mut count = BTreeMap::new();
                    for r in &got {
                        *count.entry(r[0]).or_insert(0) += 1;
                    }
                    assert!(count.values().all(|&c| c == 2), "{count:?}");
                }
            }
        }
    }

    #[test]
    fn rack_aware_only_when_every_broker_has_a_rack() {
        let brokers = vec![pb(1, Some("a")), pb(2, Some("a")), pb(3, None)];
        // Falls back to rack-unaware: same as with no racks at all.
        let no_racks = vec![pb(1, None), pb(2, None), pb(3, None)];
        assert_eq!(
            assign_replicas(&brokers, 6, 2, 0, 1, 2).unwrap(),
            assign_replicas(&no_racks, 6, 2, 0, 1, 2).unwrap()
        );
    }

    #[test]
    fn placement_refuses_rf_above_brokers() {
        let brokers = vec![pb(1, None), pb(2, None)];
        assert!(matches!(
            assign_replicas(&brokers, 1, 3, 0, 0, 0),
            Err(ControllerError::InvalidReplicationFactor { requested: 3, available: 2 })
        ));
        assert!(matches!(
            assign_replicas(&brokers, 1, 0, 0, 0, 0),
            Err(ControllerError::InvalidReplicationFactor { .. })
        ));
    }

    fn n(v: &[i32]) -> Vec<NodeId> {
        v.iter().copied().map(NodeId).collect()
    }

    /// Brokers 1-4 registered; topic "t" with partition 0 on [1, 2, 3] led by 1.
    fn four_brokers() -> Controller {
        let mut c = Controller::new(ControllerConfig::default());
        c.becomes_active(1).unwrap();
        for id in 1..=4 {
            c.register_broker(NodeId(id), Endpoint::new("h", 9000 + id as u16), None, 1, 0).unwrap();
        }
        c.create_topic_with_assignment("t", Uuid::new_v4(), vec![n(&[1, 2, 3])], BTreeMap::new()).unwrap();
        c
    }

    fn isr_of(c: &Controller) -> Vec<NodeId> {
        c.partition_state("t", 0).unwrap().isr.clone()
    }

    /// The leader (broker `leader`) reports `isr` at the current epochs.
    fn alter_isr(c: &mut Controller, isr: &[i32]) -> Vec<Change> {
        let s = c.partition_state("t", 0).unwrap().clone();
        let with_epochs: Vec<(NodeId, BrokerEpoch)> = isr.iter().map(|&r| (NodeId(r), NO_BROKER_EPOCH)).collect();
        c.alter_partition("t", 0, s.leader, s.leader_epoch, s.partition_epoch, &with_epochs).unwrap()
    }

    #[test]
    fn a_reassignment_adds_waits_for_the_isr_then_removes_and_moves_the_leader() {
        let mut c = four_brokers();
        let before = c.partition_state("t", 0).unwrap().clone();
        // [1,2,3] -> [2,3,4]: 4 is added; replicas are the target, then the leaving 1.
        let changes = c.alter_reassignment("t", 0, Some(n(&[2, 3, 4])), true).unwrap();
        assert_eq!(c.replicas("t", 0).unwrap(), n(&[2, 3, 4, 1]));
        let listed: Vec<_> = c.reassignments().map(|(t, p, r, a)| (t.to_string(), p, r.to_vec(), a.clone())).collect();
        let want = Reassignment { adding: n(&[4]), removing: n(&[1]) };
        assert_eq!(listed, vec![("t".to_string(), 0, n(&[2, 3, 4, 1]), want.clone())]);
        assert!(matches!(&changes[0], Change::AssignmentChanged { reassignments, .. } if reassignments[&0] == want));
        let s = c.partition_state("t", 0).unwrap().clone();
        assert_eq!((s.leader, s.leader_epoch), (NodeId(1), before.leader_epoch), "the leader stays while it copies");
        assert_eq!(s.partition_epoch, before.partition_epoch.next(), "new replicas are a new partition epoch");
        assert_eq!(s.isr, n(&[2, 3, 1]), "the ISR in the new replica order");
        // The same target again changes nothing.
        assert!(c.alter_reassignment("t", 0, Some(n(&[2, 3, 4])), true).unwrap().is_empty());
        // 4 catches up: the reassignment completes in the same step; 1 leaves and its
        // leadership goes to the first target replica in the ISR.
        alter_isr(&mut c, &[1, 2, 3, 4]);
        assert_eq!(c.replicas("t", 0).unwrap(), n(&[2, 3, 4]));
        assert_eq!(c.reassignments().count(), 0);
        let s = c.partition_state("t", 0).unwrap().clone();
        assert_eq!((s.leader, s.isr.clone()), (NodeId(2), n(&[2, 3, 4])));
        assert_eq!(s.leader_epoch, before.leader_epoch.next());
        c.check_invariants().unwrap();
        // Nothing left to cancel.
        assert!(matches!(
            c.alter_reassignment("t", 0, None, true),
            Err(ControllerError::NoReassignmentInProgress { .. })
        ));
    }

    #[test]
    fn removing_a_replica_moves_the_leader_epoch_even_when_the_leader_stays() {
        let mut c = four_brokers();
        let before = c.partition_state("t", 0).unwrap().clone();
        // [1,2,3] -> [1,2]: 3 leaves at once (no replica to add); 1 keeps leading, in a new
        // leader epoch that fences the fetches 3 still has in flight.
        c.alter_reassignment("t", 0, Some(n(&[1, 2])), true).unwrap();
        let s = c.partition_state("t", 0).unwrap().clone();
        assert_eq!((c.replicas("t", 0).unwrap().to_vec(), s.isr.clone()), (n(&[1, 2]), n(&[1, 2])));
        assert_eq!((s.leader, s.leader_epoch), (NodeId(1), before.leader_epoch.next()));
        // Adding it back removes nothing: the leader epoch stays.
        c.alter_reassignment("t", 0, Some(n(&[1, 2, 3])), true).unwrap();
        let t = c.partition_state("t", 0).unwrap().clone();
        assert_eq!((t.leader, t.leader_epoch), (NodeId(1), s.leader_epoch));
        assert_eq!(t.partition_epoch, s.partition_epoch.next());
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_cancelled_reassignment_goes_back_to_the_original_replicas() {
        let mut c = four_brokers();
        c.alter_reassignment("t", 0, Some(n(&[4, 2, 3])), true).unwrap();
        assert_eq!(c.replicas("t", 0).unwrap(), n(&[4, 2, 3, 1]));
        c.alter_reassignment("t", 0, None, true).unwrap();
        // The original replicas, in the order they have among the current ones (as
        // Kafka's revert: the first one is no longer the preferred leader).
        assert_eq!(c.replicas("t", 0).unwrap(), n(&[2, 3, 1]));
        assert_eq!(isr_of(&c), n(&[2, 3, 1]));
        assert_eq!(c.reassignments().count(), 0);
        assert_eq!(c.leader_of("t", 0), Some(NodeId(1)));
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_reorder_or_a_shrink_in_the_isr_completes_at_once() {
        let mut c = four_brokers();
        c.alter_reassignment("t", 0, Some(n(&[3, 2, 1])), true).unwrap();
        assert_eq!((c.replicas("t", 0).unwrap().to_vec(), c.reassignments().count()), (n(&[3, 2, 1]), 0));
        assert_eq!(c.leader_of("t", 0), Some(NodeId(1)), "the leader stays; a preferred election moves it");
        c.alter_reassignment("t", 0, Some(n(&[2])), true).unwrap();
        assert_eq!(c.replicas("t", 0).unwrap(), n(&[2]));
        assert_eq!((c.leader_of("t", 0), isr_of(&c)), (Some(NodeId(2)), n(&[2])));
        // The topic's replication factor follows the target (CreatePartitions uses it).
        c.create_partitions("t", 2, &mut || 0).unwrap();
        assert_eq!(c.replicas("t", 1).unwrap().len(), 1);
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_reassignment_target_is_checked_as_a_manual_assignment() {
        let mut c = four_brokers();
        for bad in [vec![], n(&[2, 2]), n(&[2, 9])] {
            assert!(
                matches!(
                    c.alter_reassignment("t", 0, Some(bad.clone()), true),
                    Err(ControllerError::InvalidReplicaAssignment(_))
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            c.alter_reassignment("t", 1, Some(n(&[1])), true),
            Err(ControllerError::UnknownTopicOrPartition { .. })
        ));
        assert!(matches!(
            c.alter_reassignment("nope", 0, Some(n(&[1])), true),
            Err(ControllerError::UnknownTopicOrPartition { .. })
        ));
        assert_eq!(c.replicas("t", 0).unwrap(), n(&[1, 2, 3]), "a refused target changes nothing");
    }

    #[test]
    fn a_reassignment_that_may_not_change_the_replication_factor() {
        let mut c = four_brokers();
        // KIP-860: [1,2,3] -> [2,3] or [1,2,3,4] refused, the partition untouched.
        for bad in [n(&[2, 3]), n(&[1, 2, 3, 4])] {
            let e = c.alter_reassignment("t", 0, Some(bad.clone()), false).unwrap_err();
            assert_eq!(e, ControllerError::ReplicationFactorChanged { from: 3, to: bad.len() });
            assert!(matches!(
                crate::coordinator::registry::RegistryError::from(e),
                crate::coordinator::registry::RegistryError::InvalidReplicationFactor(_)
            ));
        }
        assert_eq!((c.replicas("t", 0).unwrap().to_vec(), c.reassignments().count()), (n(&[1, 2, 3]), 0));
        // The same factor on other brokers is a move.
        c.alter_reassignment("t", 0, Some(n(&[2, 3, 4])), false).unwrap();
        assert_eq!(c.replicas("t", 0).unwrap(), n(&[2, 3, 4, 1]));
        // While it is in progress the factor is the target's (3), not the 4 replicas.
        c.alter_reassignment("t", 0, Some(n(&[4, 3, 2])), false).unwrap();
        assert!(matches!(
            c.alter_reassignment("t", 0, Some(n(&[4, 3])), false),
            Err(ControllerError::ReplicationFactorChanged { from: 3, to: 2 })
        ));
        // A cancel is always allowed; with the change allowed the factor may move.
        c.alter_reassignment("t", 0, None, false).unwrap();
        assert_eq!(c.replicas("t", 0).unwrap(), n(&[3, 2, 1]));
        c.alter_reassignment("t", 0, Some(n(&[3, 2])), true).unwrap();
        assert_eq!(c.replicas("t", 0).unwrap(), n(&[3, 2]));
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_new_target_during_a_reassignment_starts_from_the_original_replicas() {
        let mut c = four_brokers();
        c.alter_reassignment("t", 0, Some(n(&[2, 3, 4])), true).unwrap();
        // Before 4 caught up, the operator changes the target back to the original
        // [1, 2, 3]: 4 is dropped, and as the target is the ISR it completes at once.
        c.alter_reassignment("t", 0, Some(n(&[1, 2, 3])), true).unwrap();
        assert_eq!((c.replicas("t", 0).unwrap().to_vec(), c.reassignments().count()), (n(&[1, 2, 3]), 0));
        c.check_invariants().unwrap();
    }

    #[test]
    fn a_new_target_keeps_an_added_replica_that_is_the_isr() {
        let mut c = four_brokers();
        // Moving to [4, 2]: 4 joins the ISR, 2 and 3 leave it, then 1 leaves the
        // cluster, before the move completes...
        c.alter_reassignment("t", 0, Some(n(&[4, 2])), true).unwrap();
        alter_isr(&mut c, &[1, 4]);
        c.unregister_broker(NodeId(1)).unwrap();
        assert_eq!((c.leader_of("t", 0), isr_of(&c)), (Some(NodeId(4)), n(&[4])));
        // ... and a new target without 4 keeps it (removing) so the ISR is not emptied.
        c.alter_reassignment("t", 0, Some(n(&[2, 3])), true).unwrap();
        assert_eq!(c.replicas("t", 0).unwrap(), n(&[2, 3, 1, 4]));
        assert_eq!((c.leader_of("t", 0), isr_of(&c)), (Some(NodeId(4)), n(&[4])));
        let r = c.reassignments().next().unwrap().3.clone();
        assert_eq!(r, Reassignment { adding: vec![], removing: n(&[1, 4]) });
        c.check_invariants().unwrap();
    }
}
