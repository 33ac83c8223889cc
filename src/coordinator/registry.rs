//! The registry: cluster metadata as this broker sees it, kept in Kafka's ZooKeeper
//! layout in a `MetaStore` (embedded `LocalStore` by default, or a real ZooKeeper with
//! `--metadata zookeeper://...`), with the `Controller` state machine deciding
//! placement, leaders and epochs.
//!
//! For now every broker is its own cluster: it is the active controller of its store
//! (elected through the ephemeral `/controller` node, fenced by `/controller_epoch`) and
//! the only registered broker. Joining other brokers (`--coordinator`) is the next step
//! of the coordinator issue.
//!
//! Read-mostly, shared by all shards behind a lock; never touched per record. Writes go
//! to the store before they are visible here. Store calls block (a ZooKeeper round
//! trip), and are made only for admin operations (create/delete/alter a topic) and the
//! once-a-second heartbeat tick.

use std::collections::BTreeMap;

use crate::config::TopicConfig;
use crate::model::limits;

use super::controller::{Change, Controller, ControllerConfig, ControllerError, Endpoint, PartitionState, TopicInfo};
use super::layout::{self, paths};
use super::store::{CreateMode, MetaStore, StoreError};

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
    #[error("another coordinator (broker {0}) is active on this metadata store")]
    ControllerTaken(i32),
    #[error("controller: {0}")]
    Controller(ControllerError),
    #[error("metadata store: {0}")]
    Store(#[from] StoreError),
    #[error("metadata document {path}: {error}")]
    Corrupt { path: String, error: String },
}

impl From<ControllerError> for RegistryError {
    fn from(e: ControllerError) -> Self {
        match e {
            ControllerError::TopicExists(t) => RegistryError::TopicExists(t),
            ControllerError::UnknownTopic(t) => RegistryError::UnknownTopic(t),
            ControllerError::InvalidPartitions(n) => RegistryError::InvalidPartitions(n),
            e @ ControllerError::InvalidReplicationFactor { .. } => {
                RegistryError::InvalidReplicationFactor(e.to_string())
            }
            other => RegistryError::Controller(other),
        }
    }
}

/// What the rest of the broker needs to know about a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMeta {
    pub id: uuid::Uuid,
    pub partitions: i32,
    pub configs: TopicConfig,
}

/// This broker, as it registers.
#[derive(Debug, Clone)]
pub struct LocalBroker {
    pub id: i32,
    pub endpoint: Endpoint,
    pub rack: Option<String>,
    pub shards: u32,
}

pub struct Registry {
    store: Box<dyn MetaStore>,
    controller: Controller,
    broker: LocalBroker,
    /// Derived from the controller's topics; kept so readers get a `&TopicMeta`.
    topics: BTreeMap<String, TopicMeta>,
    /// Seeds replica placement (Kafka picks a random start broker).
    placement_seed: u64,
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

/// splitmix64: replica placement only needs a spread, not secrecy.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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

        let mut controller = Controller::new(ControllerConfig::default());
        let mut changes = controller.becomes_active(epoch)?;
        changes.extend(controller.register_broker(
            broker.id,
            broker.endpoint.clone(),
            broker.rack.clone(),
            broker.shards,
            now_ms,
        )?);

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
                        leader: replicas.first().copied().unwrap_or(-1),
                        leader_epoch: 0,
                        isr: replicas.clone(),
                        partition_epoch: 0,
                        controller_epoch: epoch,
                    },
                };
                partitions.push(state);
            }
            let topic_id = doc.topic_id.unwrap_or_else(uuid::Uuid::new_v4);
            controller.restore_topic(TopicInfo { name, topic_id, assignment: doc.assignment, configs, partitions })?;
        }
        changes.extend(controller.reconcile());

        let mut registry =
            Self { store, controller, broker, topics: BTreeMap::new(), placement_seed: now_ms ^ 0x9e37_79b9_7f4a_7c15 };
        registry.persist(&changes)?;
        for name in children_or_empty(registry.store.as_ref(), paths::DELETE_TOPICS)? {
            tracing::info!(topic = %name, "finishing an interrupted topic deletion");
            if registry.controller.topic(&name).is_some() {
                let changes = registry.controller.delete_topic(&name)?;
                registry.persist(&changes)?;
            }
            registry.store.delete_all(&paths::delete_topic(&name))?;
        }
        registry.refresh_cache();
        tracing::info!(
            controller_epoch = epoch,
            broker = registry.broker.id,
            topics = registry.topics.len(),
            "metadata loaded; this broker is the active controller"
        );
        Ok(registry)
    }

    fn refresh_cache(&mut self) {
        self.topics = self
            .controller
            .topics()
            .map(|t| {
                let configs = TopicConfig { overrides: t.configs.clone() };
                (t.name.clone(), TopicMeta { id: t.topic_id, partitions: t.partition_count(), configs })
            })
            .collect();
    }

    /// Write what the controller decided, in the order Kafka's controller does (a
    /// topic's config before its assignment, the assignment before partition states).
    fn persist(&self, changes: &[Change]) -> Result<(), RegistryError> {
        let s = self.store.as_ref();
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
                        Err(e) => return Err(e.into()),
                    }
                    s.create_all(&path, &layout::encode_broker(&doc), CreateMode::Ephemeral)?;
                }
                Change::BrokerFenced { .. } | Change::BrokerUnfenced { .. } => {}
                Change::BrokerUnregistered { id } => match s.delete(&paths::broker(*id), None) {
                    Ok(()) | Err(StoreError::NoNode(_)) => {}
                    Err(e) => return Err(e.into()),
                },
                Change::TopicCreated { name, topic_id, assignment, configs } => {
                    s.put(&paths::topic_config(name), &layout::encode_topic_config(configs))?;
                    s.put(&paths::topic(name), &layout::encode_topic(*topic_id, assignment))?;
                }
                Change::PartitionsCreated { topic, topic_id, assignment, .. } => {
                    s.put(&paths::topic(topic), &layout::encode_topic(*topic_id, assignment))?;
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

    pub fn get(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    pub fn by_id(&self, id: uuid::Uuid) -> Option<(&String, &TopicMeta)> {
        self.topics.iter().find(|(_, m)| m.id == id)
    }

    pub fn topics(&self) -> impl Iterator<Item = (&String, &TopicMeta)> {
        self.topics.iter()
    }

    /// Replicas, leader, leader epoch and ISR of a partition (for Metadata).
    pub fn partition(&self, topic: &str, partition: i32) -> Option<(&[i32], &PartitionState)> {
        Some((self.controller.replicas(topic, partition)?, self.controller.partition_state(topic, partition)?))
    }

    pub fn controller_epoch(&self) -> i32 {
        self.controller.controller_epoch()
    }

    pub fn create(&mut self, name: &str, partitions: i32, configs: TopicConfig) -> Result<TopicMeta, RegistryError> {
        validate_topic_name(name)?;
        if !(1..=limits::topic_partitions_max).contains(&partitions) {
            return Err(RegistryError::InvalidPartitions(partitions));
        }
        let mut seed = self.placement_seed;
        let changes = self.controller.create_topic(
            name,
            uuid::Uuid::new_v4(),
            partitions,
            1,
            configs.overrides.clone(),
            &mut || splitmix64(&mut seed),
        )?;
        self.placement_seed = seed;
        if let Err(e) = self.persist(&changes) {
            // Keep memory and store in step: undo in both.
            let _ = self.controller.delete_topic(name);
            let _ = self.store.delete_all(&paths::topic(name));
            let _ = self.store.delete_all(&paths::topic_config(name));
            return Err(e);
        }
        self.refresh_cache();
        Ok(self.topics[name].clone())
    }

    /// CreatePartitions: grow a topic to `new_total` partitions (never shrink).
    pub fn create_partitions(&mut self, name: &str, new_total: i32) -> Result<TopicMeta, RegistryError> {
        let mut seed = self.placement_seed;
        let changes = self.controller.create_partitions(name, new_total, &mut || splitmix64(&mut seed))?;
        self.placement_seed = seed;
        self.persist(&changes)?;
        self.refresh_cache();
        Ok(self.topics[name].clone())
    }

    /// Delete a topic: marked in `/admin/delete_topics` first, so a crash half-way is
    /// finished at the next start.
    pub fn delete(&mut self, name: &str) -> Result<TopicMeta, RegistryError> {
        let meta = self.topics.get(name).cloned().ok_or_else(|| RegistryError::UnknownTopic(name.to_string()))?;
        self.store.put(&paths::delete_topic(name), b"")?;
        let changes = self.controller.delete_topic(name)?;
        self.persist(&changes)?;
        self.store.delete_all(&paths::delete_topic(name))?;
        self.refresh_cache();
        Ok(meta)
    }

    /// Replace a topic's config overrides, durably.
    pub fn set_configs(&mut self, name: &str, configs: TopicConfig) -> Result<TopicMeta, RegistryError> {
        if self.controller.topic(name).is_none() {
            return Err(RegistryError::UnknownTopic(name.to_string()));
        }
        self.store.put(&paths::topic_config(name), &layout::encode_topic_config(&configs.overrides))?;
        self.controller.set_topic_configs(name, configs.overrides.clone())?;
        self.refresh_cache();
        Ok(self.topics[name].clone())
    }

    /// Once a second: this broker heartbeats its own registration; the controller fences
    /// brokers that stopped (none yet: a single broker) and writes what changed.
    pub fn tick(&mut self, now_ms: u64) -> Result<(), RegistryError> {
        let mut changes = self.controller.heartbeat(self.broker.id, now_ms)?;
        changes.extend(self.controller.tick(now_ms));
        self.persist(&changes)
    }

    /// Clean shutdown: leave the cluster (remove `/brokers/ids/<id>` and `/controller`).
    pub fn close(&mut self) {
        match self.controller.unregister_broker(self.broker.id) {
            Ok(changes) => {
                if let Err(e) = self.persist(&changes) {
                    tracing::warn!(error = %e, "could not unregister from the metadata store");
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not unregister"),
        }
        let _ = self.store.delete(paths::CONTROLLER, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::store::LocalStore;

    fn broker() -> LocalBroker {
        LocalBroker { id: 1, endpoint: Endpoint::new("127.0.0.1", 9092), rack: None, shards: 2 }
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
            let (replicas, state) = r.partition("orders", 2).unwrap();
            assert_eq!((replicas, state.leader, &state.isr[..]), (&[1][..], 1, &[1][..]));
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
