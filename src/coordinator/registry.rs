//! The registry: cluster metadata as this broker sees it, kept in Kafka's ZooKeeper
//! layout in a `MetaStore` (embedded `LocalStore` by default, or a real ZooKeeper with
//! `--metadata zookeeper://...`), with the `Controller` state machine deciding
//! placement, leaders and epochs.
//!
//! Two roles:
//! - **active**: this broker runs the active coordinator. It won the ephemeral
//!   `/controller` node (fenced by `/controller_epoch`), owns the store, registers the
//!   other brokers (BrokerRegistration / BrokerHeartbeat on the Kafka port) and serves
//!   its state to them as a versioned snapshot.
//! - **mirror**: every other broker. Its controller is a read-only copy of the active
//!   one's, replaced by each snapshot it receives (the coordinator link long-polls for
//!   them) and cached in the data dir, so a broker cut off from the coordinator keeps
//!   serving with the metadata it has, across restarts too. It never writes the store;
//!   admin requests are forwarded to the active coordinator.
//!
//! Owned by one thread (`coordinator::owner`), which runs every change and then
//! publishes the registry's `view()` for everyone else to read; never touched per
//! record. Writes go to the store before the view that shows them is published. Store
//! calls block (a ZooKeeper round trip), and are made only for admin operations
//! (create/delete/alter a topic), the coordinator link's snapshots and the
//! once-a-second heartbeat tick.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::TopicConfig;
use crate::model::{limits, BrokerEpoch, LeaderEpoch, NodeId, PartitionEpoch};
use crate::security::entity::EntityConfigs;

use super::controller::{
    BrokerInfo, Change, Controller, ControllerConfig, ControllerError, ControllerSnapshot, Election, ElectionKind,
    Endpoint, FenceReason, PartitionState, TopicInfo,
};
use super::layout::{self, paths};
use super::store::{CreateMode, MetaStore, StoreError};
use super::view::ClusterView;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("topic {0:?} already exists")]
    TopicExists(String),
    #[error("topic {0:?} does not exist")]
    UnknownTopic(String),
    #[error("invalid topic name {0:?}: {1}")]
    InvalidName(String, &'static str),
    #[error("invalid partition count {0}")]
    InvalidPartitions(i32),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    /// A manual replica assignment the controller refused (Kafka INVALID_REPLICA_ASSIGNMENT).
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    #[error("another coordinator (broker {0}) is active on this metadata store")]
    ControllerTaken(NodeId),
    #[error("controller: {0}")]
    Controller(ControllerError),
    #[error("metadata store: {0}")]
    Store(#[from] StoreError),
    /// This broker is not the active coordinator (Kafka NOT_CONTROLLER); the active one
    /// is `Some(id)` when known.
    #[error("this broker is not the active coordinator (active: {0:?})")]
    NotController(Option<NodeId>),
    /// A heartbeat from an old incarnation of a broker (Kafka STALE_BROKER_EPOCH).
    #[error("broker {id} heartbeated with epoch {epoch}, current is {current}")]
    StaleBrokerEpoch { id: NodeId, epoch: BrokerEpoch, current: BrokerEpoch },
    #[error("broker {0} is not registered")]
    UnknownBroker(NodeId),
    #[error("metadata document {path}: {error}")]
    Corrupt { path: String, error: String },
}

impl From<ControllerError> for RegistryError {
    fn from(e: ControllerError) -> Self {
        match e {
            ControllerError::TopicExists(t) => RegistryError::TopicExists(t),
            ControllerError::UnknownTopic(t) => RegistryError::UnknownTopic(t),
            ControllerError::InvalidPartitions(n) => RegistryError::InvalidPartitions(n),
            e @ (ControllerError::InvalidReplicationFactor { .. }
            | ControllerError::ReplicationFactorChanged { .. }) => {
                RegistryError::InvalidReplicationFactor(e.to_string())
            }
            ControllerError::UnknownBroker(id) => RegistryError::UnknownBroker(id),
            ControllerError::InvalidReplicaAssignment(m) => RegistryError::InvalidReplicaAssignment(m),
            other => RegistryError::Controller(other),
        }
    }
}

/// What the rest of the broker needs to know about a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMeta {
    pub id: uuid::Uuid,
    pub partitions: i32,
    pub replication_factor: i32,
    pub configs: TopicConfig,
}

/// This broker, as it registers.
#[derive(Debug, Clone)]
pub struct LocalBroker {
    pub id: NodeId,
    pub endpoint: Endpoint,
    pub rack: Option<String>,
    pub shards: u32,
}

/// What the active coordinator sends to the other brokers: its controller's state with a
/// version that grows with every change (controller epoch in the high 32 bits, so a new
/// active coordinator's versions are above its predecessor's).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ClusterSnapshot {
    pub version: u64,
    pub controller_id: NodeId,
    pub cluster_id: String,
    #[serde(default)]
    pub incarnations: BTreeMap<NodeId, uuid::Uuid>,
    pub controller: ControllerSnapshot,
    /// Producer ids at or above this were never issued (see `producer_id_bound`).
    #[serde(default)]
    pub producer_id_bound: Option<i64>,
    /// Every ACL binding (left out when there is none).
    #[serde(default, skip_serializing_if = "crate::security::acl::Acls::is_empty")]
    pub acls: crate::security::acl::Acls,
}

/// Why an ACL was not created or deleted.
#[derive(Debug, thiserror::Error)]
pub enum AclWriteError {
    /// The binding is not valid (Kafka INVALID_REQUEST).
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Registry(RegistryError),
}

/// How this broker holds a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hosting {
    /// No such topic or partition.
    Unknown,
    /// It exists, but no replica lives on this broker.
    Elsewhere,
    /// A replica lives here and leads.
    Leader,
    /// A replica lives here and does not lead (or the partition is offline).
    Follower,
}

enum Role {
    Active {
        store: Box<dyn MetaStore>,
        changes: u64,
    },
    /// `cache`: where the last snapshot is kept; `version`: the snapshot's version.
    Mirror {
        cache: Option<PathBuf>,
        version: u64,
        controller_id: Option<NodeId>,
    },
}

/// The topic brokers fetch cluster snapshots from, on the active coordinator (KRaft's
/// name for its metadata log; here one record holding the whole snapshot, the offset
/// being the snapshot's version). Not a real topic: never listed, never stored.
pub const CLUSTER_METADATA_TOPIC: &str = "__cluster_metadata";

/// The file in the data dir where a mirror keeps its last snapshot.
pub const SNAPSHOT_CACHE_FILE: &str = "cluster-snapshot.json";

/// Tries to reserve a producer id block when other coordinators keep winning the race.
const producer_id_block_attempts_max: usize = 10;

/// Brokers a new active coordinator takes as live (see `take_over`), with their
/// incarnation ids where known, and the last registration epoch handed out.
struct Known {
    brokers: Vec<(BrokerInfo, Option<uuid::Uuid>)>,
    registration_epoch_last: BrokerEpoch,
}

impl Default for Known {
    fn default() -> Self {
        Self { brokers: Vec::new(), registration_epoch_last: BrokerEpoch(0) }
    }
}

pub struct Registry {
    role: Role,
    /// Kafka's cluster id (`/cluster/id`); empty on a mirror without a snapshot.
    cluster_id: String,
    /// The incarnation id each registered broker gave (a new one per process start).
    incarnations: BTreeMap<NodeId, uuid::Uuid>,
    /// Where a mirror caches its snapshot (see `set_snapshot_cache`).
    snapshot_cache: Option<PathBuf>,
    /// A mirror's coordinator link is registered and heartbeating.
    link_up: bool,
    /// Shutting down, the coordinator link has done its controlled shutdown.
    left_cluster: bool,
    /// A mirror has registered with the coordinator since this process started (and
    /// holds a snapshot taken after that).
    registered: bool,
    controller: Controller,
    /// +1 on every change seen here (either role): the owner publishes a new view when
    /// it moved (`coordinator::owner`).
    generation: u64,
    broker: LocalBroker,
    /// Derived from the controller's topics; kept so readers get a `&TopicMeta`.
    topics: BTreeMap<String, TopicMeta>,
    /// Seeds replica placement (Kafka picks a random start broker).
    placement_seed: u64,
    /// Producer ids (InitProducerId) from the block this coordinator reserved last;
    /// empty on a mirror and after a takeover (a fresh block is reserved first).
    producer_ids: crate::txn::producer_id::ProducerIdAllocator,
    /// Producer ids at or above this were never issued: one block past the latest
    /// reserved one, so that a broker whose snapshot lags by a block still accepts
    /// every id handed out. None until known (a mirror without a snapshot).
    producer_id_bound: Option<i64>,
    /// Every ACL binding (`/kafka-acl...`, see `acl_store`); shared with the views.
    acls: std::sync::Arc<crate::security::acl::Acls>,
    /// The controller's client entity configs, parsed (quotas, SCRAM credentials);
    /// rebuilt by `refresh_cache`, shared with every view.
    entity_configs: Arc<EntityConfigs>,
    /// The version of `/admin/reassign_partitions` whose partitions the active
    /// coordinator last started (see `follow_legacy_reassignments`).
    legacy_reassign_version: Option<i32>,
}

/// Kafka's topic name rule: 1..=249 chars of [a-zA-Z0-9._-], not "." or "..".
pub fn validate_topic_name(name: &str) -> Result<(), RegistryError> {
    let bad = |why| Err(RegistryError::InvalidName(name.to_string(), why));
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > limits::topic_name_bytes_max {
        return bad("longer than 249 characters");
    }
    if name == "." || name == ".." {
        return bad("'.' and '..' are not allowed");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return bad("only ASCII alphanumerics, '.', '_' and '-' are allowed");
    }
    Ok(())
}

/// A new cluster id as Kafka makes them: 16 random bytes, base64url without padding.
fn kafka_cluster_id() -> String {
    layout::kafka_uuid_string(uuid::Uuid::new_v4())
}

fn corrupt(path: &str, error: impl std::fmt::Display) -> RegistryError {
    RegistryError::Corrupt { path: path.to_string(), error: error.to_string() }
}

fn children_or_empty(store: &dyn MetaStore, path: &str) -> Result<Vec<String>, StoreError> {
    match store.children(path) {
        Err(StoreError::NoNode(_)) => Ok(Vec::new()),
        other => other,
    }
}

impl Registry {
    /// Become the active controller of `store`, register this broker, and load every
    /// topic from the store (finishing deletions a crash interrupted).
    pub fn open(store: Box<dyn MetaStore>, broker: LocalBroker, now_ms: u64) -> Result<Self, RegistryError> {
        Self::open_with(store, broker, now_ms, ControllerConfig::default())
    }

    pub fn open_with(
        store: Box<dyn MetaStore>,
        broker: LocalBroker,
        now_ms: u64,
        config: ControllerConfig,
    ) -> Result<Self, RegistryError> {
        Self::open_inner(store, broker, now_ms, config, None)
    }

    /// Failover: this standby (`self`, a mirror) becomes the active coordinator of
    /// `store`. The brokers its last snapshot showed alive (except the coordinator that
    /// is gone) keep their leaderships: they count as live, with their incarnations, and
    /// are fenced as usual if they do not come back within broker.session.timeout.ms. A
    /// broker that re-registers with the same incarnation is not fenced (Kafka's
    /// incarnation id rule), so a coordinator failover moves no leadership.
    pub fn take_over(
        &self,
        store: Box<dyn MetaStore>,
        now_ms: u64,
        config: ControllerConfig,
    ) -> Result<Self, RegistryError> {
        let gone = self.active_controller_id();
        let known = Known {
            brokers: self
                .controller
                .live_brokers()
                .filter(|b| Some(b.id) != gone && b.id != self.broker.id)
                .map(|b| (b.clone(), self.incarnations.get(&b.id).copied()))
                .collect(),
            registration_epoch_last: self.controller.registration_epoch_last(),
        };
        Self::open_inner(store, self.broker.clone(), now_ms, config, Some(known))
    }

    /// The registrations the previous active coordinator wrote (`paths::REGISTRATIONS`),
    /// except this broker's own. An unreadable document is logged and skipped: the
    /// brokers then register as new processes (their old incarnations fenced first,
    /// leaderships moved), which is safe, only slower.
    fn stored_registrations(store: &dyn MetaStore, own: NodeId) -> Result<Known, RegistryError> {
        let Some(node) = store.get(paths::REGISTRATIONS)? else { return Ok(Known::default()) };
        match layout::decode_registrations(&node.data) {
            Ok(doc) => Ok(Known {
                brokers: doc
                    .brokers
                    .into_iter()
                    .filter(|r| r.id != own)
                    .map(|r| {
                        let info = BrokerInfo {
                            id: r.id,
                            endpoint: r.endpoint,
                            rack: r.rack,
                            shards: r.shards,
                            last_heartbeat_ms: 0,
                            fenced: false,
                            registration_epoch: r.registration_epoch,
                        };
                        (info, Some(r.incarnation))
                    })
                    .collect(),
                registration_epoch_last: doc.registration_epoch,
            }),
            Err(e) => {
                tracing::warn!(path = paths::REGISTRATIONS, error = %e, "ignoring the stored broker registrations");
                Ok(Known::default())
            }
        }
    }

    /// What `paths::REGISTRATIONS` holds for this coordinator's state now.
    fn registrations_doc(&self) -> Vec<u8> {
        let brokers = self
            .controller
            .live_brokers()
            .filter(|b| b.id != self.broker.id)
            .filter_map(|b| {
                let incarnation = *self.incarnations.get(&b.id)?;
                Some(layout::RegistrationDoc {
                    id: b.id,
                    endpoint: b.endpoint.clone(),
                    rack: b.rack.clone(),
                    shards: b.shards,
                    registration_epoch: b.registration_epoch,
                    incarnation,
                })
            })
            .collect();
        layout::encode_registrations(self.controller.registration_epoch_last(), brokers)
    }

    fn open_inner(
        store: Box<dyn MetaStore>,
        broker: LocalBroker,
        now_ms: u64,
        config: ControllerConfig,
        known: Option<Known>,
    ) -> Result<Self, RegistryError> {
        // Election: the ephemeral /controller node. A leftover node of this same broker
        // (a LocalStore never keeps ephemerals; a ZooKeeper session may linger after a
        // crash) is taken over; another broker's is refused for now.
        match store.create(paths::CONTROLLER, &layout::encode_controller(broker.id, now_ms), CreateMode::Ephemeral) {
            Ok(()) => {}
            Err(StoreError::NodeExists(_)) => {
                let holder = store
                    .get(paths::CONTROLLER)?
                    .map(|n| layout::decode_controller(&n.data))
                    .transpose()
                    .map_err(|e| corrupt(paths::CONTROLLER, e))?;
                match holder {
                    Some(id) if id != broker.id => return Err(RegistryError::ControllerTaken(id)),
                    _ => {
                        store.delete(paths::CONTROLLER, None).or_else(|e| match e {
                            StoreError::NoNode(_) => Ok(()),
                            e => Err(e),
                        })?;
                        store.create(
                            paths::CONTROLLER,
                            &layout::encode_controller(broker.id, now_ms),
                            CreateMode::Ephemeral,
                        )?;
                    }
                }
            }
            Err(e) => return Err(e.into()),
        }
        let epoch = match store.get(paths::CONTROLLER_EPOCH)? {
            Some(n) => layout::decode_controller_epoch(&n.data).map_err(|e| corrupt(paths::CONTROLLER_EPOCH, e))?,
            None => 0,
        } + 1;

        let cluster_id = match store.get(paths::CLUSTER_ID)? {
            Some(n) => layout::decode_cluster_id(&n.data).map_err(|e| corrupt(paths::CLUSTER_ID, e))?,
            None => {
                let id = kafka_cluster_id();
                store.create_all(paths::CLUSTER_ID, &layout::encode_cluster_id(&id), CreateMode::Persistent)?;
                id
            }
        };
        let mut controller = Controller::new(config);
        let mut changes = controller.becomes_active(epoch)?;
        let process_start = known.is_none();
        // Brokers the previous coordinator held live keep their registrations (and so
        // their leaderships) as `take_over` describes; on a process start they come from
        // the store, where every active coordinator keeps them.
        let known = match known {
            Some(known) => known,
            None => Self::stored_registrations(store.as_ref(), broker.id)?,
        };
        controller.raise_registration_epoch(known.registration_epoch_last);
        // This broker is live from the start. On a process start it counts as its
        // previous incarnation until the topics are loaded; that one may have lost its
        // unsynced suffix, so it must not keep leading with the epochs it had: the
        // registration below fences it first (leaderships go to other in-sync replicas,
        // or come back to it with a new epoch where it was the last one). On a takeover
        // it is the same process and keeps its leaderships.
        controller.restore_broker(broker.id, broker.endpoint.clone(), broker.rack.clone(), broker.shards, now_ms);
        let mut incarnations = BTreeMap::new();
        for (b, incarnation) in known.brokers {
            controller.restore_registration(
                b.id,
                b.endpoint.clone(),
                b.rack.clone(),
                b.shards,
                b.registration_epoch,
                now_ms,
            );
            if let Some(i) = incarnation {
                incarnations.insert(b.id, i);
            }
            let restored = controller.broker(b.id).expect("just restored").clone();
            changes.push(Change::BrokerRegistered { broker: restored });
        }

        for name in children_or_empty(store.as_ref(), paths::TOPICS)? {
            let topic_path = paths::topic(&name);
            let Some(node) = store.get(&topic_path)? else { continue };
            let doc = layout::decode_topic(&node.data).map_err(|e| corrupt(&topic_path, e))?;
            let configs = match store.get(&paths::topic_config(&name))? {
                Some(n) => layout::decode_topic_config(&n.data).map_err(|e| corrupt(&paths::topic_config(&name), e))?,
                None => BTreeMap::new(),
            };
            let mut partitions = Vec::with_capacity(doc.assignment.len());
            for (p, replicas) in doc.assignment.iter().enumerate() {
                let path = paths::partition_state(&name, p as i32);
                let state = match store.get(&path)? {
                    Some(n) => layout::decode_partition_state(&n.data, n.version).map_err(|e| corrupt(&path, e))?,
                    None => PartitionState {
                        leader: replicas.first().copied().unwrap_or(NodeId::NONE),
                        leader_epoch: LeaderEpoch(0),
                        isr: replicas.clone(),
                        partition_epoch: PartitionEpoch(0),
                        controller_epoch: epoch,
                    },
                };
                partitions.push(state);
            }
            let topic_id = doc.topic_id.unwrap_or_else(uuid::Uuid::new_v4);
            controller.restore_topic(TopicInfo {
                name,
                topic_id,
                assignment: doc.assignment,
                configs,
                partitions,
                reassignments: doc.reassignments,
            })?;
        }
        let acls = super::acl_store::load(store.as_ref()).map_err(|(path, e)| corrupt(&path, e))?;
        for entity in children_or_empty(store.as_ref(), paths::BROKER_CONFIGS)? {
            let path = paths::broker_config(&entity);
            let Some(node) = store.get(&path)? else { continue };
            let configs = layout::decode_topic_config(&node.data).map_err(|e| corrupt(&path, e))?;
            controller.set_broker_configs(&entity, configs);
        }
        for (entity_path, configs) in load_entity_configs(store.as_ref())? {
            controller.set_entity_configs(&entity_path, configs);
        }
        // Partitions led by brokers not restored (a coordinator that is gone) are
        // re-elected first.
        changes.extend(controller.reconcile());
        if process_start {
            changes.extend(controller.register_broker(
                broker.id,
                broker.endpoint.clone(),
                broker.rack.clone(),
                broker.shards,
                now_ms,
            )?);
        } else {
            let this = controller.broker(broker.id).expect("restored").clone();
            changes.push(Change::BrokerRegistered { broker: this });
        }

        let mut registry = Self {
            role: Role::Active { store, changes: 0 },
            cluster_id,
            incarnations,
            snapshot_cache: None,
            link_up: false,
            left_cluster: false,
            registered: true,
            controller,
            generation: 1,
            broker,
            topics: BTreeMap::new(),
            placement_seed: now_ms ^ 0x9e37_79b9_7f4a_7c15,
            producer_ids: Default::default(),
            producer_id_bound: None,
            acls: std::sync::Arc::new(acls),
            entity_configs: Default::default(),
            legacy_reassign_version: None,
        };
        registry.persist(&changes)?;
        if let Err(e) = registry.load_producer_id_bound() {
            // Not fatal here: InitProducerId reports it; batches are not checked meanwhile.
            tracing::error!(error = %e, "cannot read the latest producer id block");
        }
        for name in children_or_empty(registry.store()?, paths::DELETE_TOPICS)? {
            tracing::info!(topic = %name, "finishing an interrupted topic deletion");
            if registry.controller.topic(&name).is_some() {
                let changes = registry.controller.delete_topic(&name)?;
                registry.persist(&changes)?;
            }
            registry.store()?.delete_all(&paths::delete_topic(&name))?;
        }
        registry.refresh_cache();
        tracing::info!(
            controller_epoch = epoch,
            broker = %registry.broker.id,
            topics = registry.topics.len(),
            "metadata loaded; this broker is the active controller"
        );
        Ok(registry)
    }

    /// A broker that is not the active coordinator: it starts from the snapshot cached in
    /// `cache_dir` when there is one (else knows nothing until the first snapshot).
    pub fn mirror(broker: LocalBroker, cache_dir: Option<&Path>) -> Self {
        let cache = cache_dir.map(|d| d.join(SNAPSHOT_CACHE_FILE));
        let mut registry = Self {
            role: Role::Mirror { cache: cache.clone(), version: 0, controller_id: None },
            cluster_id: String::new(),
            incarnations: BTreeMap::new(),
            snapshot_cache: cache.clone(),
            link_up: false,
            left_cluster: false,
            registered: false,
            controller: Controller::new(ControllerConfig::default()),
            generation: 1,
            broker,
            topics: BTreeMap::new(),
            placement_seed: 0,
            producer_ids: Default::default(),
            producer_id_bound: None,
            acls: Default::default(),
            entity_configs: Default::default(),
            legacy_reassign_version: None,
        };
        if let Some(path) = cache.as_ref().filter(|p| p.exists()) {
            match std::fs::read(path).map_err(|e| e.to_string()).and_then(|b| registry.install(&b, false)) {
                Ok(v) => {
                    tracing::info!(version = v, path = %path.display(), "cluster metadata loaded from the cached snapshot")
                }
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable cached snapshot"),
            }
        }
        registry
    }

    /// Takeover: this broker has just become the active coordinator (`active`, opened on
    /// the store). The generation keeps growing from where it was.
    pub fn replace_with(&mut self, active: Registry) {
        let generation = self.generation;
        let cache = self.snapshot_cache.clone();
        *self = active;
        self.generation = generation;
        self.snapshot_cache = cache;
        self.refresh_cache();
    }

    /// Kafka's cluster id; `None` on a mirror that has no snapshot yet.
    pub fn cluster_id(&self) -> Option<&str> {
        Some(self.cluster_id.as_str()).filter(|c| !c.is_empty())
    }

    /// The store's session ended (`/controller` is gone with it): stop acting as the
    /// coordinator and become a mirror, keeping the metadata held until the next active
    /// coordinator's snapshot replaces it.
    fn step_down(&mut self) {
        tracing::error!(
            controller_epoch = self.controller.controller_epoch(),
            "metadata store session lost: no longer the active coordinator"
        );
        let cache = self.snapshot_cache.clone();
        self.role = Role::Mirror { cache, version: 0, controller_id: None };
        self.generation += 1;
    }

    /// Where this broker keeps its cluster snapshot should it become a mirror.
    pub fn set_snapshot_cache(&mut self, dir: &Path) {
        self.snapshot_cache = Some(dir.join(SNAPSHOT_CACHE_FILE));
    }

    pub fn is_active(&self) -> bool {
        matches!(self.role, Role::Active { .. })
    }

    pub fn local_broker_id(&self) -> NodeId {
        self.broker.id
    }

    /// The active coordinator's broker id, when known.
    pub fn active_controller_id(&self) -> Option<NodeId> {
        match &self.role {
            Role::Active { .. } => Some(self.broker.id),
            Role::Mirror { controller_id, .. } => *controller_id,
        }
    }

    /// The coordinator link registered this process and pulled a snapshot after that.
    pub fn set_registered(&mut self) {
        if !self.registered {
            self.registered = true;
            self.generation += 1;
        }
    }

    /// Shutting down: the coordinator link finished its controlled shutdown.
    pub fn set_left_cluster(&mut self) {
        if !self.left_cluster {
            self.left_cluster = true;
            self.generation += 1;
        }
    }

    /// The coordinator link tells whether it is registered with the active coordinator.
    pub fn set_link_up(&mut self, up: bool) {
        if self.link_up != up {
            self.link_up = up;
            self.generation += 1;
        }
    }

    /// The change counter (see the field).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// What readers see of this registry now (published by `coordinator::owner`).
    pub fn view(&self) -> ClusterView {
        ClusterView {
            generation: self.generation,
            broker_id: self.broker.id,
            active: self.is_active(),
            active_controller_id: self.active_controller_id(),
            link_up: self.link_up,
            left_cluster: self.left_cluster,
            registered: self.registered,
            metadata_version: self.metadata_version(),
            cluster_id: self.cluster_id.clone(),
            incarnations: self.incarnations.clone(),
            producer_id_bound: self.producer_id_bound,
            acls: self.acls.clone(),
            controller: self.controller.clone(),
            topics: self.topics.clone(),
            topic_names: self.topics.iter().map(|(name, meta)| (meta.id, name.clone())).collect(),
            entity_configs: Arc::clone(&self.entity_configs),
        }
    }

    /// The version of the metadata: grows with every change on the active coordinator; on
    /// a mirror, the version of the snapshot it holds (0: none yet).
    pub fn metadata_version(&self) -> u64 {
        match &self.role {
            Role::Active { changes, .. } => ((self.controller.controller_epoch().max(0) as u64) << 32) | changes,
            Role::Mirror { version, .. } => *version,
        }
    }

    /// A mirror takes the active coordinator's snapshot (and caches it). Returns its
    /// version.
    pub fn apply_snapshot(&mut self, json: &[u8]) -> Result<u64, String> {
        self.install(json, true)
    }

    fn install(&mut self, json: &[u8], write_cache: bool) -> Result<u64, String> {
        let Role::Mirror { cache, .. } = &self.role else {
            return Err("the active coordinator does not take snapshots".into());
        };
        let cache = cache.clone();
        let snapshot: ClusterSnapshot = serde_json::from_slice(json).map_err(|e| format!("bad snapshot: {e}"))?;
        if write_cache {
            if let Some(path) = &cache {
                if let Err(e) = crate::model::write_file_atomically(path, json) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot cache the cluster snapshot");
                }
            }
        }
        let version = snapshot.version;
        if snapshot.controller.controller_epoch < self.controller.controller_epoch() {
            return Err(format!(
                "snapshot of controller epoch {} is older than the one held ({}): a deposed coordinator",
                snapshot.controller.controller_epoch,
                self.controller.controller_epoch()
            ));
        }
        self.cluster_id = snapshot.cluster_id;
        self.incarnations = snapshot.incarnations;
        self.producer_id_bound = snapshot.producer_id_bound;
        self.acls = std::sync::Arc::new(snapshot.acls);
        self.controller = Controller::from_snapshot(ControllerConfig::default(), snapshot.controller);
        self.role = Role::Mirror { cache, version, controller_id: Some(snapshot.controller_id) };
        self.refresh_cache();
        Ok(version)
    }

    fn store(&self) -> Result<&dyn MetaStore, RegistryError> {
        match &self.role {
            Role::Active { store, .. } => Ok(store.as_ref()),
            Role::Mirror { controller_id, .. } => Err(RegistryError::NotController(*controller_id)),
        }
    }

    /// AlterPartition from a partition's leader: a new ISR of (broker id, broker epoch),
    /// checked against the leader's epoch, the partition epoch and the members' current
    /// registrations (`Controller::alter_partition`). Returns the committed state.
    pub fn alter_partition(
        &mut self,
        topic: &str,
        partition: i32,
        leader_id: NodeId,
        leader_epoch: LeaderEpoch,
        partition_epoch: PartitionEpoch,
        new_isr_with_epochs: &[(NodeId, BrokerEpoch)],
    ) -> Result<PartitionState, RegistryError> {
        self.store()?;
        let changes = self.controller.alter_partition(
            topic,
            partition,
            leader_id,
            leader_epoch,
            partition_epoch,
            new_isr_with_epochs,
        )?;
        self.persist(&changes)?;
        tracing::info!(topic, partition, isr = ?new_isr_with_epochs, "ISR changed");
        Ok(self.controller.partition_state(topic, partition).expect("just altered").clone())
    }

    /// Controlled shutdown of another broker (BrokerHeartbeat with want_shut_down): its
    /// leaderships move away and it leaves the cluster.
    pub fn unregister_remote(&mut self, id: NodeId) -> Result<(), RegistryError> {
        self.store()?;
        let changes = self.controller.unregister_broker(id)?;
        self.persist(&changes)?;
        tracing::info!(broker = %id, "broker left the cluster (controlled shutdown)");
        Ok(())
    }

    /// BrokerRegistration from another broker (active coordinator only). Returns the
    /// broker epoch its heartbeats must carry.
    pub fn register_remote(
        &mut self,
        broker: LocalBroker,
        incarnation: uuid::Uuid,
        now_ms: u64,
    ) -> Result<BrokerEpoch, RegistryError> {
        self.store()?;
        if broker.id == self.broker.id {
            return Err(RegistryError::Controller(ControllerError::InvalidReplicaAssignment(format!(
                "broker id {} is this coordinator's own id",
                broker.id
            ))));
        }
        let same_process = self.incarnations.get(&broker.id) == Some(&incarnation);
        if let Some(current) = self.controller.broker(broker.id).filter(|b| same_process && !b.fenced) {
            // The same process registering again (after a coordinator failover, or a
            // lost connection): it keeps its registration and its leaderships.
            if current.endpoint == broker.endpoint {
                let epoch = current.registration_epoch;
                let mut changes = self.controller.heartbeat(broker.id, now_ms)?;
                changes.push(Change::BrokerRegistered {
                    broker: self.controller.broker(broker.id).expect("known").clone(),
                });
                self.persist(&changes)?;
                tracing::info!(broker = %broker.id, "broker registered again (same incarnation)");
                return Ok(epoch);
            }
        }
        self.incarnations.insert(broker.id, incarnation);
        let changes =
            self.controller.register_broker(broker.id, broker.endpoint, broker.rack, broker.shards, now_ms)?;
        self.persist(&changes)?;
        tracing::info!(broker = %broker.id, "broker registered");
        Ok(self.controller.broker_epoch(broker.id).expect("just registered"))
    }

    /// BrokerHeartbeat from another broker. Returns whether it is fenced after it.
    pub fn heartbeat_remote(&mut self, id: NodeId, epoch: BrokerEpoch, now_ms: u64) -> Result<bool, RegistryError> {
        self.store()?;
        let current = self.controller.broker_epoch(id).ok_or(RegistryError::UnknownBroker(id))?;
        if epoch != current {
            return Err(RegistryError::StaleBrokerEpoch { id, epoch, current });
        }
        let changes = self.controller.heartbeat(id, now_ms)?;
        self.persist(&changes)?;
        Ok(self.controller.broker(id).is_some_and(|b| b.fenced))
    }

    fn refresh_cache(&mut self) {
        self.generation += 1;
        self.entity_configs = Arc::new(EntityConfigs::parse(self.controller.entity_configs()));
        let dynamic_defaults = crate::config::dynamic_topic_defaults(
            self.controller.broker_configs(crate::config::BROKER_DEFAULT_ENTITY),
            self.controller.broker_configs(&self.broker.id.to_string()),
        );
        self.topics = self
            .controller
            .topics()
            .map(|t| {
                let configs = TopicConfig { overrides: t.configs.clone(), dynamic_defaults: dynamic_defaults.clone() };
                let replication_factor = if t.assignment.is_empty() { 0 } else { t.target_replicas(0).len() as i32 };
                (
                    t.name.clone(),
                    TopicMeta { id: t.topic_id, partitions: t.partition_count(), replication_factor, configs },
                )
            })
            .collect();
    }

    /// Write what the controller decided, in the order Kafka's controller does (a
    /// topic's config before its assignment, the assignment before partition states).
    fn persist(&mut self, changes: &[Change]) -> Result<(), RegistryError> {
        if changes.is_empty() {
            return Ok(());
        }
        let registrations = changes
            .iter()
            .any(|c| {
                matches!(
                    c,
                    Change::BrokerRegistered { .. }
                        | Change::BrokerFenced { .. }
                        | Change::BrokerUnfenced { .. }
                        | Change::BrokerUnregistered { .. }
                )
            })
            .then(|| self.registrations_doc());
        let Role::Active { store, changes: count } = &mut self.role else {
            return Err(RegistryError::NotController(self.active_controller_id()));
        };
        *count += 1;
        self.generation += 1;
        let s = store.as_ref();
        // One durable step for the whole decision (a topic's N partition states are N
        // writes; the embedded store then writes its file once, not N times), the
        // registrations with it when they moved.
        s.batch(&mut || {
            write_changes(s, changes)?;
            match &registrations {
                Some(doc) => s.put(paths::REGISTRATIONS, doc),
                None => Ok(()),
            }
        })?;
        Ok(())
    }

    /// A new producer id (InitProducerId), on the active coordinator. When the current
    /// block is used up, the next block is reserved in `/latest_producer_id_block`
    /// (Kafka's layout), conditionally on the version read, so two coordinators never
    /// reserve the same block; a lost race reads again.
    pub fn next_producer_id(&mut self) -> Result<crate::model::ProducerId, RegistryError> {
        use crate::txn::producer_id::{ProducerIdBlock, LATEST_PRODUCER_ID_BLOCK};
        if let Some(id) = self.producer_ids.next_id() {
            return Ok(id);
        }
        let broker = self.broker.id;
        let store = self.store()?;
        let mut last_error = String::new();
        for _ in 0..producer_id_block_attempts_max {
            let current = store.get(LATEST_PRODUCER_ID_BLOCK)?;
            let previous = match &current {
                Some(node) => Some(
                    ProducerIdBlock::decode(&node.data)
                        .map_err(|error| RegistryError::Corrupt { path: LATEST_PRODUCER_ID_BLOCK.into(), error })?,
                ),
                None => None,
            };
            let Some(block) = ProducerIdBlock::next_after(previous.as_ref(), broker.0) else {
                return Err(RegistryError::Corrupt {
                    path: LATEST_PRODUCER_ID_BLOCK.into(),
                    error: "producer id space exhausted".into(),
                });
            };
            let written = match &current {
                Some(node) => store.set(LATEST_PRODUCER_ID_BLOCK, &block.encode(), Some(node.version)).map(|_| ()),
                None => store.create(LATEST_PRODUCER_ID_BLOCK, &block.encode(), CreateMode::Persistent),
            };
            match written {
                Ok(()) => {
                    tracing::info!(broker = %broker, start = block.start, end = block.end, "reserved a producer id block");
                    self.producer_ids.install(block);
                    self.set_producer_id_bound(Some(&block));
                    return Ok(self.producer_ids.next_id().expect("a fresh block has ids"));
                }
                Err(e @ (StoreError::BadVersion(_) | StoreError::NodeExists(_))) => last_error = e.to_string(),
                Err(e) => return Err(e.into()),
            }
        }
        Err(RegistryError::Store(StoreError::Unavailable(format!(
            "could not reserve a producer id block in {producer_id_block_attempts_max} attempts: {last_error}"
        ))))
    }

    /// Producer ids at or above this were never issued (None: not known here).
    pub fn producer_id_bound(&self) -> Option<i64> {
        self.producer_id_bound
    }

    /// One block past `latest` (the latest reserved block; None: none yet). A change is
    /// a metadata change: mirrors pull it with the next snapshot.
    fn set_producer_id_bound(&mut self, latest: Option<&crate::txn::producer_id::ProducerIdBlock>) {
        let end = latest.map_or(-1, |b| b.end);
        let bound = end.saturating_add(1).saturating_add(limits::producer_id_block_size_max);
        if self.producer_id_bound != Some(bound) {
            self.producer_id_bound = Some(bound);
            if let Role::Active { changes, .. } = &mut self.role {
                *changes += 1;
            }
            self.generation += 1;
        }
    }

    /// The active coordinator learns the latest reserved block at open.
    fn load_producer_id_bound(&mut self) -> Result<(), RegistryError> {
        use crate::txn::producer_id::{ProducerIdBlock, LATEST_PRODUCER_ID_BLOCK};
        let latest = match self.store()?.get(LATEST_PRODUCER_ID_BLOCK)? {
            Some(node) => Some(
                ProducerIdBlock::decode(&node.data)
                    .map_err(|error| RegistryError::Corrupt { path: LATEST_PRODUCER_ID_BLOCK.into(), error })?,
            ),
            None => None,
        };
        self.set_producer_id_bound(latest.as_ref());
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    /// The live brokers' count (what a replication factor may not exceed).
    pub fn live_broker_count(&self) -> usize {
        self.controller.live_brokers().count()
    }

    pub fn controller_epoch(&self) -> i32 {
        self.controller.controller_epoch()
    }

    pub fn create(&mut self, name: &str, partitions: i32, configs: TopicConfig) -> Result<TopicMeta, RegistryError> {
        self.create_replicated(name, partitions, 1, configs)
    }

    /// CreateTopics: `replication_factor` replicas per partition, placed over the live
    /// brokers (rack-aware), leaders spread.
    pub fn create_replicated(
        &mut self,
        name: &str,
        partitions: i32,
        replication_factor: i32,
        configs: TopicConfig,
    ) -> Result<TopicMeta, RegistryError> {
        validate_topic_name(name)?;
        self.store()?;
        if !(1..=limits::topic_partitions_max).contains(&partitions) {
            return Err(RegistryError::InvalidPartitions(partitions));
        }
        let mut seed = self.placement_seed;
        let changes = self.controller.create_topic(
            name,
            uuid::Uuid::new_v4(),
            partitions,
            replication_factor,
            configs.overrides.clone(),
            &mut || crate::model::splitmix64(&mut seed),
        )?;
        self.placement_seed = seed;
        self.persist_new_topic(name, &changes)
    }

    /// CreateTopics with a manual assignment: partition `p` on the brokers
    /// `assignment[p]`, led by the first (its preferred leader). Checked by the
    /// controller (`Controller::check_assignment`).
    pub fn create_with_assignment(
        &mut self,
        name: &str,
        assignment: Vec<Vec<NodeId>>,
        configs: TopicConfig,
    ) -> Result<TopicMeta, RegistryError> {
        validate_topic_name(name)?;
        self.store()?;
        let changes = self.controller.create_topic_with_assignment(
            name,
            uuid::Uuid::new_v4(),
            assignment,
            configs.overrides.clone(),
        )?;
        self.persist_new_topic(name, &changes)
    }

    /// Check a manual assignment for a new topic (CreateTopics with validate_only)
    /// without creating anything.
    pub fn check_assignment(&self, name: &str, assignment: &[Vec<NodeId>]) -> Result<(), RegistryError> {
        validate_topic_name(name)?;
        if self.topics.contains_key(name) {
            return Err(RegistryError::TopicExists(name.to_string()));
        }
        if assignment.is_empty() || assignment.len() > limits::topic_partitions_max as usize {
            return Err(RegistryError::InvalidPartitions(assignment.len().min(i32::MAX as usize) as i32));
        }
        Ok(self.controller.check_assignment(assignment, assignment[0].len(), 0)?)
    }

    /// The replica lists of `name`'s partitions, in partition order.
    pub fn assignment(&self, name: &str) -> Option<&[Vec<NodeId>]> {
        self.controller.topic(name).map(|t| t.assignment.as_slice())
    }

    /// Write a topic the controller just created; on failure undo it in memory and in
    /// the store.
    fn persist_new_topic(&mut self, name: &str, changes: &[Change]) -> Result<TopicMeta, RegistryError> {
        if let Err(e) = self.persist(changes) {
            // Keep memory and store in step: undo in both.
            let _ = self.controller.delete_topic(name);
            if let Ok(store) = self.store() {
                let _ = store.delete_all(&paths::topic(name));
                let _ = store.delete_all(&paths::topic_config(name));
            }
            return Err(e);
        }
        self.refresh_cache();
        Ok(self.topics[name].clone())
    }

    /// CreatePartitions: grow a topic to `new_total` partitions (never shrink).
    pub fn create_partitions(&mut self, name: &str, new_total: i32) -> Result<TopicMeta, RegistryError> {
        self.store()?;
        let mut seed = self.placement_seed;
        let changes =
            self.controller.create_partitions(name, new_total, &mut || crate::model::splitmix64(&mut seed))?;
        self.placement_seed = seed;
        self.persist(&changes)?;
        self.refresh_cache();
        Ok(self.topics[name].clone())
    }

    /// CreatePartitions with a manual assignment: the new partitions, in order, on the
    /// brokers `added[i]` (each list as long as the topic's replication factor).
    /// `validate_only` checks without changing anything.
    pub fn create_partitions_with_assignment(
        &mut self,
        name: &str,
        added: Vec<Vec<NodeId>>,
        validate_only: bool,
    ) -> Result<TopicMeta, RegistryError> {
        self.store()?;
        if validate_only {
            let t = self.controller.topic(name).ok_or_else(|| RegistryError::UnknownTopic(name.to_string()))?;
            self.controller.check_assignment(&added, t.assignment[0].len(), t.partition_count())?;
            return Ok(self.topics[name].clone());
        }
        let changes = self.controller.create_partitions_with_assignment(name, added)?;
        self.persist(&changes)?;
        self.refresh_cache();
        Ok(self.topics[name].clone())
    }

    /// ElectLeaders: preferred (each partition's first replica made its leader where it
    /// is live and in the ISR) or unclean (an offline partition given a live replica);
    /// `None` asks for every partition of every topic. The outcome of each partition, in
    /// order.
    pub fn elect(
        &mut self,
        kind: ElectionKind,
        partitions: Option<Vec<(String, i32)>>,
    ) -> Result<Vec<(String, i32, Election)>, RegistryError> {
        self.store()?;
        let targets = partitions.unwrap_or_else(|| {
            self.controller.topics().flat_map(|t| (0..t.partition_count()).map(move |p| (t.name.clone(), p))).collect()
        });
        let mut changes = Vec::new();
        let outcomes: Vec<(String, i32, Election)> = targets
            .into_iter()
            .map(|(topic, p)| {
                let outcome = self.controller.elect_leader(kind, &topic, p, &mut changes);
                (topic, p, outcome)
            })
            .collect();
        self.persist(&changes)?;
        self.refresh_cache();
        Ok(outcomes)
    }

    /// AlterPartitionReassignments: for each (topic, partition, target), start, change or
    /// (`None`) cancel its reassignment (`Controller::alter_reassignment`; with
    /// `allow_rf_change` false a target may not change the replication factor). Every
    /// change is persisted in one batch; the outcome of each partition, in order.
    #[allow(clippy::type_complexity)]
    pub fn alter_reassignments(
        &mut self,
        requests: Vec<(String, i32, Option<Vec<NodeId>>)>,
        allow_rf_change: bool,
    ) -> Result<Vec<(String, i32, Result<(), RegistryError>)>, RegistryError> {
        self.store()?;
        let mut changes = Vec::new();
        let outcomes = requests
            .into_iter()
            .map(|(topic, p, target)| {
                let outcome = match self.controller.alter_reassignment(&topic, p, target, allow_rf_change) {
                    Ok(c) => {
                        changes.extend(c);
                        Ok(())
                    }
                    Err(e) => Err(e.into()),
                };
                (topic, p, outcome)
            })
            .collect();
        self.persist(&changes)?;
        self.refresh_cache();
        Ok(outcomes)
    }

    /// Delete a topic: marked in `/admin/delete_topics` first, so a crash half-way is
    /// finished at the next start.
    pub fn delete(&mut self, name: &str) -> Result<TopicMeta, RegistryError> {
        let meta = self.topics.get(name).cloned().ok_or_else(|| RegistryError::UnknownTopic(name.to_string()))?;
        self.store()?.put(&paths::delete_topic(name), b"")?;
        let changes = self.controller.delete_topic(name)?;
        self.persist(&changes)?;
        self.store()?.delete_all(&paths::delete_topic(name))?;
        self.refresh_cache();
        Ok(meta)
    }

    /// Replace a topic's config overrides, durably.
    pub fn set_configs(&mut self, name: &str, configs: TopicConfig) -> Result<TopicMeta, RegistryError> {
        if self.controller.topic(name).is_none() {
            return Err(RegistryError::UnknownTopic(name.to_string()));
        }
        self.store()?.put(&paths::topic_config(name), &layout::encode_topic_config(&configs.overrides))?;
        let elected = self.controller.set_topic_configs(name, configs.overrides.clone())?;
        self.persist(&elected)?;
        if let Role::Active { changes, .. } = &mut self.role {
            *changes += 1;
        }
        self.refresh_cache();
        Ok(self.topics[name].clone())
    }

    /// Replace the dynamic configs of broker config entity `entity` (a broker id, or
    /// `<default>`), durably in `/config/brokers/<entity>` (removed when empty); topics
    /// without their own override follow them from the next view.
    pub fn set_broker_configs(&mut self, entity: &str, configs: BTreeMap<String, String>) -> Result<(), RegistryError> {
        let path = paths::broker_config(entity);
        if configs.is_empty() {
            self.store()?.delete_all(&path)?;
        } else {
            self.store()?.put(&path, &layout::encode_topic_config(&configs))?;
        }
        // Kafka's change notification (`/config/changes/config_change_<n>`), which
        // Kafka's brokers watch for; Spate's brokers learn it from the snapshot.
        write_config_change(self.store()?, &format!("brokers/{entity}"))?;
        self.controller.set_broker_configs(entity, configs);
        if let Role::Active { changes, .. } = &mut self.role {
            *changes += 1;
        }
        self.refresh_cache();
        Ok(())
    }

    /// Every ACL binding.
    pub fn acls(&self) -> &crate::security::acl::Acls {
        &self.acls
    }

    /// CreateAcls, on the active coordinator: each binding is validated, added to its
    /// pattern's document and stored (with its change notification) before the next
    /// view shows it. One result per binding, in order; a binding already present is
    /// a success that changes nothing, as in Kafka.
    pub fn create_acls(
        &mut self,
        bindings: Vec<(crate::security::acl::ResourcePattern, crate::security::acl::AclEntry)>,
    ) -> Vec<Result<(), AclWriteError>> {
        let mut results = Vec::with_capacity(bindings.len());
        let mut acls = (*self.acls).clone();
        for (pattern, entry) in bindings {
            results.push(self.create_acl(&mut acls, pattern, entry));
        }
        self.install_acls(acls);
        results
    }

    fn create_acl(
        &self,
        acls: &mut crate::security::acl::Acls,
        pattern: crate::security::acl::ResourcePattern,
        entry: crate::security::acl::AclEntry,
    ) -> Result<(), AclWriteError> {
        crate::security::acl::validate_binding(&pattern, &entry).map_err(|e| AclWriteError::Invalid(e.to_string()))?;
        let mut entries = acls.entries(&pattern).cloned().unwrap_or_default();
        if entries.contains(&entry) {
            return Ok(());
        }
        if entries.len() >= limits::acl_entries_per_resource_max || acls.len() >= limits::acl_bindings_max {
            return Err(AclWriteError::Invalid(format!(
                "at most {} ACLs per resource pattern and {} in all",
                limits::acl_entries_per_resource_max,
                limits::acl_bindings_max
            )));
        }
        super::store::check_path(&super::acl_store::path(&pattern))
            .map_err(|_| AclWriteError::Invalid(format!("resource name {:?} cannot be stored", pattern.name)))?;
        entries.insert(entry);
        super::acl_store::write(self.store().map_err(AclWriteError::Registry)?, &pattern, &entries)
            .map_err(|e| AclWriteError::Registry(e.into()))?;
        acls.set(pattern, entries);
        Ok(())
    }

    /// DeleteAcls, on the active coordinator: for each filter, the bindings it matched
    /// and removed (each pattern's document rewritten, or removed when emptied).
    #[allow(clippy::type_complexity)]
    pub fn delete_acls(
        &mut self,
        filters: &[crate::security::acl::AclFilter],
    ) -> Vec<Result<Vec<(crate::security::acl::ResourcePattern, crate::security::acl::AclEntry)>, AclWriteError>> {
        let mut acls = (*self.acls).clone();
        let mut results = Vec::with_capacity(filters.len());
        for filter in filters {
            let matched = acls.matching(filter);
            let mut by_pattern: BTreeMap<_, Vec<_>> = BTreeMap::new();
            for (p, e) in &matched {
                by_pattern.entry(p.clone()).or_default().push(e.clone());
            }
            let mut outcome = Ok(matched);
            for (pattern, gone) in by_pattern {
                let mut entries = acls.entries(&pattern).cloned().unwrap_or_default();
                for e in &gone {
                    entries.remove(e);
                }
                let written = self.store().map_err(AclWriteError::Registry).and_then(|s| {
                    super::acl_store::write(s, &pattern, &entries).map_err(|e| AclWriteError::Registry(e.into()))
                });
                match written {
                    Ok(()) => acls.set(pattern, entries),
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            results.push(outcome);
        }
        self.install_acls(acls);
        results
    }

    fn install_acls(&mut self, acls: crate::security::acl::Acls) {
        if acls != *self.acls {
            self.acls = std::sync::Arc::new(acls);
            if let Role::Active { changes, .. } = &mut self.role {
                *changes += 1;
            }
            self.generation += 1;
        }
    }

    /// The dynamic configs of broker config entity `entity`.
    pub fn broker_configs(&self, entity: &str) -> BTreeMap<String, String> {
        self.controller.broker_configs(entity).cloned().unwrap_or_default()
    }

    /// Replace the configs of client entity `entity_path` (`users/alice`, `clients/c`,
    /// `users/alice/clients/c`, names sanitized), durably in `/config/<entity_path>`, then
    /// write Kafka's change notification. As Kafka, the node stays with an empty config
    /// when the last key goes (it may have children).
    pub fn set_entity_configs(
        &mut self,
        entity_path: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<(), RegistryError> {
        let store = self.store()?;
        store.put(&paths::entity_config(entity_path), &layout::encode_topic_config(&configs))?;
        write_config_change(store, entity_path)?;
        self.controller.set_entity_configs(entity_path, configs);
        if let Role::Active { changes, .. } = &mut self.role {
            *changes += 1;
        }
        self.refresh_cache();
        Ok(())
    }

    /// The configs of client entity `entity_path` (empty when none).
    pub fn entity_configs(&self, entity_path: &str) -> BTreeMap<String, String> {
        self.controller.entity_configs().get(entity_path).cloned().unwrap_or_default()
    }

    /// Once a second: this broker heartbeats its own registration; the controller fences
    /// brokers that stopped (none yet: a single broker) and writes what changed.
    pub fn tick(&mut self, now_ms: u64) -> Result<(), RegistryError> {
        if !self.is_active() {
            return Ok(());
        }
        if !self.store()?.session_alive() {
            self.step_down();
            return Ok(());
        }
        let mut changes = self.controller.heartbeat(self.broker.id, now_ms)?;
        changes.extend(self.controller.tick(now_ms));
        if let Some(pause_ms) = self.controller.take_pause() {
            tracing::warn!(
                pause_ms,
                "the coordinator did not tick for a while (a slow metadata write or a starved core): \
                 every live broker gets a fresh session instead of being fenced for it"
            );
        }
        self.persist(&changes)?;
        self.follow_legacy_reassignments()
    }

    /// Kafka's legacy reassignment path (its ZooKeeper controller's
    /// `processZkPartitionReassignment`), checked on every tick: an operator writes
    /// `/admin/reassign_partitions` (`{"version":1,"partitions":[{"topic","partition",
    /// "replicas"}]}`). Each new version of it starts (or changes) the reassignment of
    /// every partition it lists, as AlterPartitionReassignments would; a partition that
    /// cannot be reassigned (unknown, bad target) is logged and dropped from the znode.
    /// A partition leaves the znode once no reassignment of it is in progress
    /// (completed, or cancelled through the API), and the znode is deleted when none is
    /// left. Rewrites are conditional on the version read, so an operator's concurrent
    /// write is never lost: it is read again on the next tick. A document that does
    /// not decode is logged once per version and left alone, as Kafka ignores it.
    fn follow_legacy_reassignments(&mut self) -> Result<(), RegistryError> {
        let Some(node) = self.store()?.get(paths::REASSIGN_PARTITIONS)? else {
            self.legacy_reassign_version = None;
            return Ok(());
        };
        let fresh = self.legacy_reassign_version != Some(node.version);
        let listed = match layout::decode_reassign_partitions(&node.data) {
            Ok(listed) => listed,
            Err(e) => {
                if fresh {
                    tracing::warn!(error = %e, "ignoring {} that does not decode", paths::REASSIGN_PARTITIONS);
                    self.legacy_reassign_version = Some(node.version);
                }
                return Ok(());
            }
        };
        let mut started = Vec::with_capacity(listed.len());
        if fresh {
            let mut changes = Vec::new();
            for r in listed.iter() {
                match self.controller.alter_reassignment(&r.topic, r.partition, Some(r.replicas.clone()), true) {
                    Ok(c) => {
                        tracing::info!(topic = %r.topic, partition = r.partition, replicas = ?r.replicas,
                            "partition reassignment started through {}", paths::REASSIGN_PARTITIONS);
                        changes.extend(c);
                        started.push(r.clone());
                    }
                    Err(e) => tracing::warn!(topic = %r.topic, partition = r.partition, error = %e,
                        "failed partition reassignment through {}: dropped from it", paths::REASSIGN_PARTITIONS),
                }
            }
            self.persist(&changes)?;
            if !changes.is_empty() {
                self.refresh_cache();
            }
        } else {
            started = listed.clone();
        }
        let ongoing: BTreeSet<(&str, i32)> = self.controller.reassignments().map(|(t, p, _, _)| (t, p)).collect();
        let left: Vec<layout::LegacyReassignment> =
            started.into_iter().filter(|r| ongoing.contains(&(r.topic.as_str(), r.partition))).collect();
        if left == listed {
            self.legacy_reassign_version = Some(node.version);
            return Ok(());
        }
        let store = self.store()?;
        let written = if left.is_empty() {
            store.delete(paths::REASSIGN_PARTITIONS, Some(node.version)).map(|()| None)
        } else {
            store
                .set(paths::REASSIGN_PARTITIONS, &layout::encode_reassign_partitions(&left), Some(node.version))
                .map(Some)
        };
        match written {
            Ok(version) => self.legacy_reassign_version = version,
            // Rewritten by the operator meanwhile: read again next tick.
            Err(StoreError::BadVersion(_) | StoreError::NoNode(_)) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Clean shutdown: leave the cluster (remove `/brokers/ids/<id>` and `/controller`).
    pub fn close(&mut self) {
        if !self.is_active() {
            return;
        }
        match self.controller.unregister_broker(self.broker.id) {
            Ok(changes) => {
                if let Err(e) = self.persist(&changes) {
                    tracing::warn!(error = %e, "could not unregister from the metadata store");
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not unregister"),
        }
        if let Ok(store) = self.store() {
            let _ = store.delete(paths::CONTROLLER, None);
        }
    }
}

/// Every client entity config in the store: `/config/users/<u>`,
/// `/config/users/<u>/clients/<c>`, `/config/clients/<c>`, by entity path.
fn load_entity_configs(store: &dyn MetaStore) -> Result<BTreeMap<String, BTreeMap<String, String>>, RegistryError> {
    let mut out = BTreeMap::new();
    let mut read = |entity_path: String| -> Result<(), RegistryError> {
        let path = paths::entity_config(&entity_path);
        if let Some(node) = store.get(&path)? {
            let configs = layout::decode_topic_config(&node.data).map_err(|e| corrupt(&path, e))?;
            if !configs.is_empty() {
                out.insert(entity_path, configs);
            }
        }
        Ok(())
    };
    for user in children_or_empty(store, paths::USER_CONFIGS)? {
        read(format!("users/{user}"))?;
        for client in children_or_empty(store, &format!("{}/{user}/clients", paths::USER_CONFIGS))? {
            read(format!("users/{user}/clients/{client}"))?;
        }
    }
    for client in children_or_empty(store, paths::CLIENT_CONFIGS)? {
        read(format!("clients/{client}"))?;
    }
    Ok(out)
}

/// Kafka's change notification for `entity_path`: the next sequential
/// `/config/changes/config_change_<n>` (the store has no sequential nodes, so the number
/// is one past the highest present; a node another writer took first means a retry).
fn write_config_change(store: &dyn MetaStore, entity_path: &str) -> Result<(), StoreError> {
    const attempts_max: usize = 10;
    let data = layout::encode_config_change(entity_path);
    let mut last = None;
    for _ in 0..attempts_max {
        let next = children_or_empty(store, paths::CONFIG_CHANGES)?
            .iter()
            .filter_map(|name| layout::config_change_sequence(name))
            .max()
            .map_or(0, |n| n + 1);
        match store.create_all(&paths::config_change(next), &data, CreateMode::Persistent) {
            Ok(()) => return Ok(()),
            Err(e @ StoreError::NodeExists(_)) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("at least one attempt"))
}

/// The store writes for `changes`, in the order Kafka's controller makes them.
fn write_changes(s: &dyn MetaStore, changes: &[Change]) -> Result<(), StoreError> {
    for c in changes {
        match c {
            Change::ControllerEpoch { epoch } => {
                s.put(paths::CONTROLLER_EPOCH, &layout::encode_controller_epoch(*epoch))?
            }
            Change::BrokerRegistered { broker } => {
                let doc = layout::BrokerDoc {
                    endpoint: broker.endpoint.clone(),
                    rack: broker.rack.clone(),
                    timestamp_ms: broker.last_heartbeat_ms,
                };
                let path = paths::broker(broker.id);
                match s.delete(&path, None) {
                    Ok(()) | Err(StoreError::NoNode(_)) => {}
                    Err(e) => return Err(e),
                }
                s.create_all(&path, &layout::encode_broker(&doc), CreateMode::Ephemeral)?;
            }
            Change::BrokerFenced { id, reason } => match reason {
                FenceReason::SessionExpired => {
                    tracing::warn!(broker = %id, "broker fenced: no heartbeat within broker.session.timeout.ms")
                }
                FenceReason::Reregistered => {
                    tracing::info!(broker = %id, "broker registered again: its previous incarnation is fenced")
                }
                FenceReason::ControlledShutdown => tracing::info!(broker = %id, "broker fenced: controlled shutdown"),
            },
            Change::BrokerUnfenced { id } => tracing::info!(broker = %id, "broker unfenced: heartbeating again"),
            Change::BrokerUnregistered { id } => match s.delete(&paths::broker(*id), None) {
                Ok(()) | Err(StoreError::NoNode(_)) => {}
                Err(e) => return Err(e),
            },
            Change::TopicCreated { name, topic_id, assignment, configs } => {
                s.put(&paths::topic_config(name), &layout::encode_topic_config(configs))?;
                s.put(&paths::topic(name), &layout::encode_topic(*topic_id, assignment, &BTreeMap::new()))?;
            }
            Change::PartitionsCreated { topic, topic_id, assignment, reassignments, .. } => {
                s.put(&paths::topic(topic), &layout::encode_topic(*topic_id, assignment, reassignments))?;
            }
            Change::AssignmentChanged { topic, topic_id, assignment, reassignments } => {
                s.put(&paths::topic(topic), &layout::encode_topic(*topic_id, assignment, reassignments))?;
            }
            Change::TopicDeleted { name, .. } => {
                s.delete_all(&paths::topic(name))?;
                s.delete_all(&paths::topic_config(name))?;
            }
            Change::PartitionChanged { topic, partition, state } => {
                s.put(&paths::partition_state(topic, *partition), &layout::encode_partition_state(state))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::store::LocalStore;

    fn broker() -> LocalBroker {
        LocalBroker { id: NodeId(1), endpoint: Endpoint::new("127.0.0.1", 9092), rack: None, shards: 2 }
    }

    #[test]
    fn topics_live_in_kafka_layout_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let id;
        {
            let mut r = Registry::open(Box::new(LocalStore::open(dir.path()).unwrap()), broker(), 1_000).unwrap();
            let configs = TopicConfig::from_pairs([("retention.ms", Some("1000"))], &Default::default()).unwrap();
            id = r.create("orders", 3, configs).unwrap().id;
            assert!(matches!(r.create("orders", 1, TopicConfig::default()), Err(RegistryError::TopicExists(_))));
            assert!(matches!(r.create("bad name", 1, TopicConfig::default()), Err(RegistryError::InvalidName(..))));
            assert!(matches!(r.create("x", 0, TopicConfig::default()), Err(RegistryError::InvalidPartitions(0))));
            r.create("gone", 1, TopicConfig::default()).unwrap();
            r.delete("gone").unwrap();
            let view = r.view();
            let (replicas, state) = view.partition("orders", 2).unwrap();
            assert_eq!((replicas, state.leader, &state.isr[..]), (&[NodeId(1)][..], NodeId(1), &[NodeId(1)][..]));
            r.close();
        }
        let store = LocalStore::open(dir.path()).unwrap();
        let doc = layout::decode_topic(&store.get(&paths::topic("orders")).unwrap().unwrap().data).unwrap();
        assert_eq!((doc.topic_id, doc.assignment.len()), (Some(id), 3));
        let cfg =
            layout::decode_topic_config(&store.get(&paths::topic_config("orders")).unwrap().unwrap().data).unwrap();
        assert_eq!(cfg.get("retention.ms").map(String::as_str), Some("1000"));
        assert!(store.get(&paths::topic("gone")).unwrap().is_none());
        assert_eq!(
            layout::decode_controller_epoch(&store.get(paths::CONTROLLER_EPOCH).unwrap().unwrap().data).unwrap(),
            1
        );

        let r = Registry::open(Box::new(store), broker(), 2_000).unwrap();
        assert_eq!(r.get("orders").unwrap().id, id);
        assert_eq!(r.get("orders").unwrap().configs.overrides.get("retention.ms").map(String::as_str), Some("1000"));
        assert!(r.get("gone").is_none());
        assert_eq!(r.controller_epoch(), 2, "every start is a new controller epoch");
    }

    #[test]
    fn producer_ids_come_in_blocks_that_never_repeat_across_reopens_and_mirrors_learn_the_bound() {
        use crate::txn::producer_id::{ProducerIdBlock, LATEST_PRODUCER_ID_BLOCK};
        let dir = tempfile::tempdir().unwrap();
        let mut seen = Vec::new();
        {
            let mut r = Registry::open(Box::new(LocalStore::open(dir.path()).unwrap()), broker(), 1_000).unwrap();
            assert_eq!(r.producer_id_bound(), Some(1000), "nothing reserved yet: the first block");
            for _ in 0..1001 {
                seen.push(r.next_producer_id().unwrap().0);
            }
            assert_eq!(r.producer_id_bound(), Some(3000), "one block past the second");
            let mut mirror = Registry::mirror(remote(2), None);
            assert_eq!(mirror.producer_id_bound(), None);
            mirror.apply_snapshot(&r.view().snapshot_json().unwrap().1).unwrap();
            assert_eq!(mirror.producer_id_bound(), Some(3000));
            assert!(matches!(mirror.next_producer_id(), Err(RegistryError::NotController(_))));
            r.close();
        }
        let store = LocalStore::open(dir.path()).unwrap();
        let block = ProducerIdBlock::decode(&store.get(LATEST_PRODUCER_ID_BLOCK).unwrap().unwrap().data).unwrap();
        assert_eq!(block, ProducerIdBlock { broker: 1, start: 1000, end: 1999 });
        let mut r = Registry::open(Box::new(store), broker(), 2_000).unwrap();
        // A restarted coordinator skips the rest of its old block.
        seen.push(r.next_producer_id().unwrap().0);
        assert_eq!(*seen.last().unwrap(), 2000);
        let mut sorted = seen.clone();
        sorted.dedup();
        assert_eq!(sorted, seen, "ids increase and never repeat");
    }

    fn remote(id: i32) -> LocalBroker {
        LocalBroker { id: NodeId(id), endpoint: Endpoint::new("127.0.0.1", 9092 + id as u16), rack: None, shards: 0 }
    }

    fn ids(assignment: Vec<Vec<i32>>) -> Vec<Vec<NodeId>> {
        assignment.into_iter().map(|r| r.into_iter().map(NodeId).collect()).collect()
    }

    /// Broker 1 active with brokers 2 and 3 registered and a topic spread over the three.
    fn cluster(dir: &Path) -> (Registry, [uuid::Uuid; 2]) {
        let mut r = Registry::open(Box::new(LocalStore::open(dir).unwrap()), broker(), 1_000).unwrap();
        let incarnations = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()];
        r.register_remote(remote(2), incarnations[0], 1_000).unwrap();
        r.register_remote(remote(3), incarnations[1], 1_000).unwrap();
        r.create("spread", 6, TopicConfig::default()).unwrap();
        (r, incarnations)
    }

    fn states(r: &Registry, topic: &str) -> Vec<(i32, i32)> {
        (0..r.get(topic).unwrap().partitions)
            .map(|p| r.view().partition(topic, p).map(|(_, s)| (s.leader.0, s.leader_epoch.0)).unwrap())
            .collect()
    }

    /// `/admin/reassign_partitions` (Kafka's legacy path): the coordinator's tick starts
    /// what it lists, drops what cannot be reassigned and what is done, and deletes the
    /// znode when nothing is left; a document that does not decode stays untouched.
    #[test]
    fn the_legacy_reassign_partitions_znode_is_followed_then_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let (mut r, _) = cluster(dir.path());
        r.create_with_assignment("moved", ids(vec![vec![1, 2], vec![2, 3]]), TopicConfig::default()).unwrap();
        let entry = |topic: &str, partition: i32, replicas: Vec<i32>| layout::LegacyReassignment {
            topic: topic.into(),
            partition,
            replicas: replicas.into_iter().map(NodeId).collect(),
        };
        let znode = |r: &Registry| {
            r.store()
                .unwrap()
                .get(paths::REASSIGN_PARTITIONS)
                .unwrap()
                .map(|n| layout::decode_reassign_partitions(&n.data))
        };
        // 0 -> [2, 3] (3 must catch up), 1 -> [3, 2] (a reorder: done at once), a
        // partition that does not exist (dropped).
        let listed = [entry("moved", 0, vec![2, 3]), entry("moved", 1, vec![3, 2]), entry("nope", 0, vec![1])];
        let doc = layout::encode_reassign_partitions(&listed);
        r.store().unwrap().create_all(paths::REASSIGN_PARTITIONS, &doc, CreateMode::Persistent).unwrap();
        r.tick(1_500).unwrap();
        assert_eq!(r.assignment("moved").unwrap(), &ids(vec![vec![2, 3, 1], vec![3, 2]])[..]);
        assert_eq!(r.view().reassignments().count(), 1);
        assert_eq!(znode(&r).unwrap().unwrap(), [entry("moved", 0, vec![2, 3])]);
        r.tick(1_600).unwrap();
        assert_eq!(znode(&r).unwrap().unwrap(), [entry("moved", 0, vec![2, 3])], "nothing changed: left as is");
        // Broker 3 joins the ISR: the reassignment completes, and the next tick empties
        // the znode.
        let s = r.view().partition("moved", 0).unwrap().1.clone();
        let isr: Vec<_> = [1, 2, 3].map(|b| (NodeId(b), crate::replication::NO_BROKER_EPOCH)).into();
        r.alter_partition("moved", 0, s.leader, s.leader_epoch, s.partition_epoch, &isr).unwrap();
        assert_eq!(r.assignment("moved").unwrap()[0], [NodeId(2), NodeId(3)]);
        r.tick(1_700).unwrap();
        assert!(znode(&r).is_none(), "the znode is deleted once nothing is in progress");
        // A document that does not decode is left alone; a later good one is followed.
        r.store().unwrap().create_all(paths::REASSIGN_PARTITIONS, b"{", CreateMode::Persistent).unwrap();
        r.tick(1_800).unwrap();
        assert!(znode(&r).unwrap().is_err());
        let back = layout::encode_reassign_partitions(&[entry("moved", 0, vec![3])]);
        r.store().unwrap().set(paths::REASSIGN_PARTITIONS, &back, None).unwrap();
        r.tick(1_900).unwrap();
        assert_eq!(r.assignment("moved").unwrap()[0], [NodeId(3)]);
        assert!(znode(&r).is_none());
    }

    /// A manual assignment is kept as given (first replica the leader), written in
    /// Kafka's layout, survives a reopen; CreatePartitions appends the given lists; a bad
    /// assignment changes nothing.
    #[test]
    fn manual_assignments_are_kept_as_given_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (mut r, _) = cluster(dir.path());
        let given = ids(vec![vec![2, 3], vec![3, 1], vec![1, 2]]);
        r.create_with_assignment("manual", given.clone(), TopicConfig::default()).unwrap();
        assert_eq!(r.assignment("manual").unwrap(), &given[..]);
        let view = r.view();
        for (p, replicas) in given.iter().enumerate() {
            let (in_view, state) = view.partition("manual", p as i32).unwrap();
            assert_eq!((in_view, state.leader, &state.isr[..]), (&replicas[..], replicas[0], &replicas[..]));
        }
        let bad = |r: &mut Registry, a: Vec<Vec<i32>>| match r.create_with_assignment(
            "bad",
            ids(a),
            TopicConfig::default(),
        ) {
            Err(RegistryError::InvalidReplicaAssignment(m)) => m,
            other => panic!("expected InvalidReplicaAssignment, got {other:?}"),
        };
        assert!(bad(&mut r, vec![vec![1, 1]]).contains("more than once"));
        assert!(bad(&mut r, vec![vec![1, 2], vec![3]]).contains("not consistent"));
        assert!(bad(&mut r, vec![vec![1, 9]]).contains("broker 9 is not registered"));
        assert!(bad(&mut r, vec![vec![]]).contains("empty"));
        assert!(r.get("bad").is_none());
        assert!(r.check_assignment("bad", &ids(vec![vec![1, 4]])).is_err());
        assert!(r.check_assignment("bad", &ids(vec![vec![1, 3]])).is_ok());
        assert!(matches!(r.check_assignment("manual", &ids(vec![vec![1]])), Err(RegistryError::TopicExists(_))));

        assert!(r.create_partitions_with_assignment("manual", ids(vec![vec![1, 2, 3]]), false).is_err());
        r.create_partitions_with_assignment("manual", ids(vec![vec![3, 2]]), true).unwrap();
        assert_eq!(r.get("manual").unwrap().partitions, 3, "validate_only changes nothing");
        r.create_partitions_with_assignment("manual", ids(vec![vec![3, 2], vec![1, 3]]), false).unwrap();
        let grown = [given.clone(), ids(vec![vec![3, 2], vec![1, 3]])].concat();
        assert_eq!(r.assignment("manual").unwrap(), &grown[..]);
        assert_eq!(r.view().partition("manual", 4).unwrap().1.leader, NodeId(1));

        // Brokers 2 and 3 stop heartbeating and are fenced: still registered, they may be
        // named beside a live broker, which leads, and start outside the ISR.
        r.tick(1_000_000).unwrap();
        r.create_with_assignment("fenced", ids(vec![vec![3, 1], vec![2, 1]]), TopicConfig::default()).unwrap();
        let view = r.view();
        for p in 0..2 {
            let (replicas, state) = view.partition("fenced", p).unwrap();
            assert_eq!((replicas[1], state.leader, &state.isr[..]), (NodeId(1), NodeId(1), &[NodeId(1)][..]));
        }
        assert!(bad(&mut r, vec![vec![2, 3]]).contains("are fenced"));
        assert!(r.create_partitions_with_assignment("fenced", ids(vec![vec![3, 2]]), false).is_err());
        r.create_partitions_with_assignment("fenced", ids(vec![vec![3, 1]]), false).unwrap();
        assert_eq!(r.view().partition("fenced", 2).unwrap().1.isr, [NodeId(1)]);
        r.close();
        drop(r);

        let store = LocalStore::open(dir.path()).unwrap();
        let doc = layout::decode_topic(&store.get(&paths::topic("manual")).unwrap().unwrap().data).unwrap();
        assert_eq!(doc.assignment, grown, "/brokers/topics/manual holds the assignment as given");
        let r = Registry::open(Box::new(store), broker(), 2_000).unwrap();
        assert_eq!(r.assignment("manual").unwrap(), &grown[..]);
    }

    /// ElectLeaders (preferred): only a partition whose first replica is live, in the
    /// ISR and not already its leader moves; the others say why.
    #[test]
    fn preferred_elections_move_only_what_can_move() {
        let dir = tempfile::tempdir().unwrap();
        let (mut r, _) = cluster(dir.path());
        r.create_with_assignment("elect", ids(vec![vec![2, 1], vec![1, 2], vec![3, 1]]), TopicConfig::default())
            .unwrap();
        // Broker 2 leaves: partition 0 goes to broker 1, then broker 2 comes back into
        // the ISR of partition 0 (as its leader would report).
        r.unregister_remote(NodeId(2)).unwrap();
        assert_eq!(r.view().partition("elect", 0).unwrap().1.leader, NodeId(1));
        let epoch = r.register_remote(remote(2), uuid::Uuid::new_v4(), 2_000).unwrap();
        let state = r.view().partition("elect", 0).unwrap().1.clone();
        let isr_with_epochs = [(NodeId(1), r.controller.broker_epoch(NodeId(1)).unwrap()), (NodeId(2), epoch)];
        r.alter_partition("elect", 0, NodeId(1), state.leader_epoch, state.partition_epoch, &isr_with_epochs).unwrap();

        let asked = vec![("elect".to_string(), 0), ("elect".to_string(), 1), ("elect".to_string(), 7)];
        let outcomes: Vec<Election> =
            r.elect(ElectionKind::Preferred, Some(asked)).unwrap().into_iter().map(|o| o.2).collect();
        assert_eq!(outcomes, [Election::Elected, Election::NotNeeded, Election::UnknownPartition]);
        let s = r.view().partition("elect", 0).unwrap().1.clone();
        assert_eq!((s.leader, s.leader_epoch), (NodeId(2), state.leader_epoch.next()));
        let all = r.elect(ElectionKind::Preferred, None).unwrap();
        assert!(all.iter().all(|o| o.2 == Election::NotNeeded), "{all:?}");
    }

    /// ElectLeaders (unclean): an offline partition whose only live replica is out of
    /// sync gets it as leader, with an ISR of just it; a partition with a leader needs
    /// none; one with no live replica cannot have one.
    #[test]
    fn unclean_elections_lead_offline_partitions_from_any_live_replica() {
        let dir = tempfile::tempdir().unwrap();
        let (mut r, _) = cluster(dir.path());
        r.create_with_assignment("unclean", ids(vec![vec![2, 3], vec![1, 2], vec![3, 2]]), TopicConfig::default())
            .unwrap();
        // Broker 3 leaves (out of the ISR of 0, partition 2 moves to broker 2), then
        // broker 2: partitions 0 and 2 are offline with ISR [2].
        r.unregister_remote(NodeId(3)).unwrap();
        r.unregister_remote(NodeId(2)).unwrap();
        for p in [0, 2] {
            let s = r.view().partition("unclean", p).unwrap().1.clone();
            assert_eq!((s.leader, &s.isr[..]), (NodeId(-1), &[NodeId(2)][..]), "partition {p}");
        }
        // Broker 3 comes back: not in sync, so nothing elects it on its own.
        r.register_remote(remote(3), uuid::Uuid::new_v4(), 2_000).unwrap();
        let before = r.view().partition("unclean", 0).unwrap().1.clone();
        assert_eq!(before.leader, NodeId(-1));

        let asked: Vec<(String, i32)> = (0..4).map(|p| ("unclean".to_string(), p)).collect();
        let outcomes: Vec<Election> =
            r.elect(ElectionKind::Unclean, Some(asked.clone())).unwrap().into_iter().map(|o| o.2).collect();
        assert_eq!(outcomes, [Election::Elected, Election::NotNeeded, Election::Elected, Election::UnknownPartition]);
        for p in [0, 2] {
            let s = r.view().partition("unclean", p).unwrap().1.clone();
            assert_eq!((s.leader, &s.isr[..]), (NodeId(3), &[NodeId(3)][..]), "partition {p}");
        }
        let s = r.view().partition("unclean", 0).unwrap().1.clone();
        assert_eq!(s.leader_epoch, before.leader_epoch.next());
        // Preferred elections never lead from outside the ISR.
        let preferred = r.elect(ElectionKind::Preferred, Some(vec![("unclean".to_string(), 1)])).unwrap();
        assert_eq!(preferred[0].2, Election::NotNeeded);

        // No live replica at all: nothing to elect.
        r.unregister_remote(NodeId(3)).unwrap();
        assert_eq!(r.view().partition("unclean", 0).unwrap().1.leader, NodeId(-1));
        let outcome = r.elect(ElectionKind::Unclean, Some(vec![("unclean".to_string(), 0)])).unwrap();
        assert_eq!(outcome[0].2, Election::EligibleNotAvailable);
    }

    #[test]
    fn a_mirror_answers_like_the_coordinator_and_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let (active, _) = cluster(dir.path());
        let leaders: std::collections::BTreeSet<i32> = states(&active, "spread").iter().map(|s| s.0).collect();
        assert_eq!(leaders.into_iter().collect::<Vec<_>>(), vec![1, 2, 3]);

        let cache = tempfile::tempdir().unwrap();
        let mut mirror = Registry::mirror(remote(2), Some(cache.path()));
        assert!(!mirror.view().has_metadata());
        let (version, json) = active.view().snapshot_json().unwrap();
        assert_eq!(mirror.apply_snapshot(&json).unwrap(), version);
        assert_eq!(mirror.metadata_version(), active.metadata_version());
        assert_eq!(mirror.get("spread"), active.get("spread"));
        assert_eq!(states(&mirror, "spread"), states(&active, "spread"));
        assert_eq!(mirror.cluster_id(), active.cluster_id());
        assert_eq!(mirror.active_controller_id(), Some(NodeId(1)));
        assert_eq!(mirror.view().live_brokers().count(), 3);
        for p in 0..6 {
            let leader = active.view().leader_of("spread", p).unwrap();
            let expect = if leader == NodeId(2) { Hosting::Leader } else { Hosting::Elsewhere };
            assert_eq!(mirror.view().hosting("spread", p), expect);
        }
        assert_eq!(mirror.view().hosting("nope", 0), Hosting::Unknown);
        assert!(matches!(
            mirror.create("x", 1, TopicConfig::default()),
            Err(RegistryError::NotController(Some(NodeId(1))))
        ));
        assert!(matches!(mirror.delete("spread"), Err(RegistryError::NotController(Some(NodeId(1))))));
        assert!(mirror.get("x").is_none(), "a refused write leaves the mirror as it was");

        // A restart starts from the cached snapshot.
        let again = Registry::mirror(remote(2), Some(cache.path()));
        assert_eq!(again.metadata_version(), version);
        assert_eq!(states(&again, "spread"), states(&active, "spread"));

        // Every change moves the version.
        let mut active = active;
        active.create("more", 1, TopicConfig::default()).unwrap();
        assert!(active.metadata_version() > version);
    }

    #[test]
    fn heartbeats_need_the_current_broker_epoch_and_a_new_incarnation_is_fenced_first() {
        let dir = tempfile::tempdir().unwrap();
        let (mut r, incarnations) = cluster(dir.path());
        let (two, nine) = (NodeId(2), NodeId(9));
        let epoch = r.controller.broker_epoch(two).unwrap();
        let stale = BrokerEpoch(epoch.0 - 1);
        assert!(matches!(r.heartbeat_remote(two, stale, 2_000), Err(RegistryError::StaleBrokerEpoch { .. })));
        assert!(
            matches!(r.heartbeat_remote(nine, BrokerEpoch(1), 2_000), Err(RegistryError::UnknownBroker(n)) if n == nine)
        );
        assert!(!r.heartbeat_remote(two, epoch, 2_000).unwrap());
        let before = states(&r, "spread");

        // The same process registering again keeps its epoch and its leaderships.
        assert_eq!(r.register_remote(remote(2), incarnations[0], 2_000).unwrap(), epoch);
        assert_eq!(states(&r, "spread"), before);

        // A new process (restart) gets a new epoch; its old incarnation was fenced first,
        // so its partitions have a new leader epoch (and the same leader: it is back).
        let new_epoch = r.register_remote(remote(2), uuid::Uuid::new_v4(), 2_000).unwrap();
        assert!(new_epoch > epoch);
        for (b, a) in before.iter().zip(states(&r, "spread")) {
            if b.0 == 2 {
                assert_eq!(a.0, 2);
                assert!(a.1 > b.1, "leader epoch must grow across a fenced incarnation");
            } else {
                assert_eq!(&a, b);
            }
        }

        // Missing heartbeats: fenced, its partitions offline (no other replica).
        r.tick(1_000 + r.controller.config().broker_session_timeout_ms + 1_500).unwrap();
        for (p, s) in states(&r, "spread").iter().enumerate() {
            assert_eq!(s.0 == -1, before[p].0 != 1, "partition {p}: {s:?}");
        }
        // Controlled shutdown of a broker removes it at once.
        r.unregister_remote(NodeId(3)).unwrap();
        assert!(r.view().broker_info(NodeId(3)).is_none());
    }

    /// The embedded coordinator's process dies (kill -9) and starts again: brokers that
    /// did not restart keep their leaderships, leader epochs and broker epochs; the
    /// coordinator's own partitions get new leader epochs (its unsynced suffix may be
    /// gone); a broker that restarted meanwhile is fenced first; one that never comes
    /// back is fenced after the session timeout.
    #[test]
    fn a_restarted_coordinator_keeps_the_leaderships_of_brokers_that_did_not_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (r, incarnations) = cluster(dir.path());
        let before = states(&r, "spread");
        let epoch = |r: &Registry, id| r.view().broker_info(NodeId(id)).unwrap().registration_epoch;
        let (epoch_2, epoch_3) = (epoch(&r, 2), epoch(&r, 3));
        drop(r);

        let mut r = Registry::open(Box::new(LocalStore::open(dir.path()).unwrap()), broker(), 5_000).unwrap();
        let check = |r: &Registry| {
            for (p, (b, a)) in before.iter().zip(states(r, "spread")).enumerate() {
                if b.0 == 1 {
                    assert!(a.1 > b.1, "partition {p} of the restarted coordinator gets a new leader epoch");
                } else {
                    assert_eq!(&a, b, "partition {p} keeps its leader and leader epoch");
                }
            }
        };
        check(&r); // before brokers 2 and 3 heard of the restart
        assert_eq!(r.register_remote(remote(2), incarnations[0], 5_000).unwrap(), epoch_2);
        assert_eq!(r.register_remote(remote(3), incarnations[1], 5_000).unwrap(), epoch_3);
        check(&r);

        // Broker 3's process restarted too: its old incarnation is fenced first, and
        // epochs keep growing past every one handed out before the coordinator restart.
        let led_by_3 = r.view().broker_info(NodeId(3)).map(|_| states(&r, "spread")).unwrap();
        let epoch_3_new = r.register_remote(remote(3), uuid::Uuid::new_v4(), 6_000).unwrap();
        assert!(epoch_3_new > epoch_2.max(epoch_3), "{epoch_3_new:?}");
        for (p, (b, a)) in led_by_3.iter().zip(states(&r, "spread")).enumerate() {
            if b.0 == 3 {
                assert!(a.1 > b.1, "partition {p} of the restarted broker gets a new leader epoch");
            }
        }

        // The coordinator restarts again and broker 2 never comes back: fenced after the
        // session timeout, its leaderships moved.
        drop(r);
        let mut r = Registry::open(Box::new(LocalStore::open(dir.path()).unwrap()), broker(), 10_000).unwrap();
        assert!(!r.view().broker_info(NodeId(2)).unwrap().fenced);
        let timeout = ControllerConfig::default().broker_session_timeout_ms;
        for now in (10_000..=10_000 + timeout + 1_000).step_by(1_000) {
            r.heartbeat_remote(NodeId(3), epoch_3_new, now).unwrap();
            r.tick(now).unwrap();
        }
        assert!(r.view().broker_info(NodeId(2)).unwrap().fenced);
        assert!(states(&r, "spread").iter().all(|(leader, _)| *leader != 2));
    }

    #[test]
    fn a_standby_takes_over_without_moving_live_leaderships() {
        let dir = tempfile::tempdir().unwrap();
        let (active, incarnations) = cluster(dir.path());
        let before = states(&active, "spread");
        let mut standby = Registry::mirror(remote(2), None);
        standby.apply_snapshot(&active.view().snapshot_json().unwrap().1).unwrap();
        drop(active); // the coordinator dies (the embedded store keeps no ephemerals)

        let mut new = standby
            .take_over(Box::new(LocalStore::open(dir.path()).unwrap()), 5_000, ControllerConfig::default())
            .unwrap();
        assert!(new.is_active());
        assert_eq!(new.controller_epoch(), 2);
        for (p, (b, a)) in before.iter().zip(states(&new, "spread")).enumerate() {
            if b.0 == 1 {
                assert_eq!(a.0, -1, "partition {p} of the dead coordinator goes offline");
            } else {
                assert_eq!(&a, b, "partition {p} keeps its leader and leader epoch");
            }
        }
        // Broker 3 comes back with the same incarnation: nothing moves.
        new.register_remote(remote(3), incarnations[1], 5_000).unwrap();
        let after: Vec<_> = states(&new, "spread");
        for (b, a) in before.iter().zip(&after) {
            if b.0 == 3 {
                assert_eq!(a, b);
            }
        }
        // A snapshot of the deposed coordinator's epoch is refused by mirrors that saw the new one.
        let mut mirror = Registry::mirror(remote(3), None);
        mirror.apply_snapshot(&new.view().snapshot_json().unwrap().1).unwrap();
        let (_, old_json) = {
            let (old, _) = cluster(tempfile::tempdir().unwrap().path());
            old.view().snapshot_json().unwrap()
        };
        assert!(mirror.apply_snapshot(&old_json).is_err());
    }

    /// `ClusterView::may_take_roles`, every case it decides: the active coordinator and
    /// a mirror registered since this process started take every role; a mirror that
    /// restarted on its cached snapshot (or has none yet) takes single-replica roles
    /// only, until its link registers it (the snapshot may name it leader of an epoch
    /// whose records its previous incarnation lost); registering moves the generation,
    /// so the shards look again.
    #[test]
    fn a_restarted_mirror_takes_replicated_roles_only_once_registered() {
        let dir = tempfile::tempdir().unwrap();
        let (active, _) = cluster(dir.path());
        for rf in [1, 2, 3] {
            assert!(active.view().may_take_roles(rf), "active coordinator, rf {rf}");
        }

        let fresh = Registry::mirror(remote(2), None);
        assert!(fresh.view().may_take_roles(1));
        assert!(!fresh.view().may_take_roles(2), "a mirror with no snapshot, rf 2");

        let cache = tempfile::tempdir().unwrap();
        Registry::mirror(remote(2), Some(cache.path()))
            .apply_snapshot(&active.view().snapshot_json().unwrap().1)
            .unwrap();
        let mut restarted = Registry::mirror(remote(2), Some(cache.path()));
        assert!(restarted.view().has_metadata(), "the restart starts from its cached snapshot");
        assert!(restarted.view().may_take_roles(1), "nobody to diverge from with one replica");
        for rf in [2, 3] {
            assert!(!restarted.view().may_take_roles(rf), "restarted mirror, rf {rf}, before registering");
        }
        let generation = restarted.generation();
        restarted.set_registered();
        assert!(restarted.generation() > generation, "the shards must notice");
        for rf in [1, 2, 3] {
            assert!(restarted.view().may_take_roles(rf), "registered mirror, rf {rf}");
        }
        let generation = restarted.generation();
        restarted.set_registered();
        assert_eq!(restarted.generation(), generation, "registering again changes nothing");
    }

    /// The snapshot mirrors cache (`cluster-snapshot.json`) and fetch: ids and epochs are
    /// the plain integers they were before they had their own types.
    #[test]
    fn a_cluster_snapshot_is_read_and_written_byte_for_byte() {
        let json = concat!(
            r#"{"version":4294967298,"controller_id":1,"cluster_id":"c","#,
            r#""incarnations":{"2":"00000000-0000-0000-0000-000000000007"},"#,
            r#""controller":{"controller_epoch":1,"brokers":[{"id":1,"endpoint":{"host":"h","port":9092},"#,
            r#""rack":null,"shards":2,"last_heartbeat_ms":5,"fenced":false,"registration_epoch":3}],"#,
            r#""topics":[{"name":"t","topic_id":"00000000-0000-0000-0000-000000000001","assignment":[[1,2]],"#,
            r#""configs":{},"partitions":[{"leader":-1,"leader_epoch":4,"isr":[2],"partition_epoch":9,"#,
            r#""controller_epoch":1}]}]},"producer_id_bound":1000}"#
        );
        let snapshot: ClusterSnapshot = serde_json::from_str(json).unwrap();
        assert_eq!(snapshot.controller_id, NodeId(1));
        assert_eq!(snapshot.incarnations.keys().copied().collect::<Vec<_>>(), [NodeId(2)]);
        assert_eq!(snapshot.controller.brokers[0].registration_epoch, BrokerEpoch(3));
        let t = &snapshot.controller.topics[0];
        assert_eq!(t.assignment, ids(vec![vec![1, 2]]));
        let s = &t.partitions[0];
        assert_eq!(
            (s.leader, s.leader_epoch, &s.isr[..], s.partition_epoch),
            (NodeId::NONE, LeaderEpoch(4), &[NodeId(2)][..], PartitionEpoch(9))
        );
        assert_eq!(serde_json::to_string(&snapshot).unwrap(), json);
    }

    /// Quotas and SCRAM credentials live in `/config/users/...` and `/config/clients/...`
    /// with a change notification each, survive a reopen, and reach mirrors.
    #[test]
    fn client_entity_configs_live_in_kafka_layout_and_reach_mirrors() {
        use crate::security::scram::{ScramCredential, ScramMechanism};
        let dir = tempfile::tempdir().unwrap();
        let credential = ScramCredential::from_password(ScramMechanism::Sha512, b"alice-secret", b"saltsalt", 8192);
        {
            let mut r = Registry::open(Box::new(LocalStore::open(dir.path()).unwrap()), broker(), 1_000).unwrap();
            let quota = BTreeMap::from([("producer_byte_rate".to_string(), "1048576".to_string())]);
            r.set_entity_configs("clients/app%201", quota).unwrap();
            let user = BTreeMap::from([("SCRAM-SHA-512".to_string(), credential.to_kafka_string())]);
            r.set_entity_configs("users/alice", user).unwrap();
            r.set_entity_configs("users/<default>/clients/<default>", BTreeMap::new()).unwrap();
            let store = r.store().unwrap();
            assert_eq!(
                store.get("/config/clients/app%201").unwrap().unwrap().data,
                br#"{"version":1,"config":{"producer_byte_rate":"1048576"}}"#.to_vec()
            );
            assert_eq!(
                store.get("/config/users/<default>/clients/<default>").unwrap().unwrap().data,
                br#"{"version":1,"config":{}}"#.to_vec()
            );
            assert_eq!(
                store.children("/config/changes").unwrap(),
                ["config_change_0000000000", "config_change_0000000001", "config_change_0000000002"]
            );
            assert_eq!(
                store.get("/config/changes/config_change_0000000001").unwrap().unwrap().data,
                br#"{"version":2,"entity_path":"users/alice"}"#.to_vec()
            );
            r.close();
        }
        let r = Registry::open(Box::new(LocalStore::open(dir.path()).unwrap()), broker(), 2_000).unwrap();
        let view = r.view();
        assert_eq!(view.scram_credential("alice", ScramMechanism::Sha512), Some(&credential));
        assert_eq!(view.scram_credential("alice", ScramMechanism::Sha256), None);
        let quota = view.entity_configs().quota_for(crate::security::entity::QuotaKind::Produce, "ANONYMOUS", "app 1");
        assert_eq!(quota.map(|(_, v)| v), Some(1048576.0));
        let mut mirror = Registry::mirror(remote(2), None);
        mirror.apply_snapshot(&view.snapshot_json().unwrap().1).unwrap();
        assert_eq!(mirror.view().scram_credential("alice", ScramMechanism::Sha512), Some(&credential));
    }

    #[test]
    fn interrupted_deletion_is_finished_at_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut r = Registry::open(Box::new(LocalStore::open(dir.path()).unwrap()), broker(), 1_000).unwrap();
            r.create("half", 2, TopicConfig::default()).unwrap();
        }
        let store = LocalStore::open(dir.path()).unwrap();
        store.put(&paths::delete_topic("half"), b"").unwrap();
        let r = Registry::open(Box::new(store), broker(), 2_000).unwrap();
        assert!(r.get("half").is_none());
    }
}
