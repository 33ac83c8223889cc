//! What shards read of the cluster metadata: an immutable `ClusterView` (topics,
//! replicas, partition states, brokers, topic configs, this broker's role), built by the
//! registry after each change and published by its owner (`coordinator::owner`) behind
//! an `Arc`. A view never changes once published; readers hold it as long as they like
//! and take the next one when the generation moves. Nothing here locks or does I/O.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::controller::{BrokerInfo, Controller, PartitionState, Reassignment};
use super::registry::{ClusterSnapshot, Hosting, RegistryError, TopicMeta};
use crate::model::NodeId;
use crate::security::entity::EntityConfigs;
use crate::security::scram::{ScramCredential, ScramMechanism};

/// The cluster as the registry saw it at one generation.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// The registry's change counter when this view was built: grows with every change.
    pub(super) generation: u64,
    pub(super) broker_id: NodeId,
    pub(super) active: bool,
    pub(super) active_controller_id: Option<NodeId>,
    pub(super) link_up: bool,
    pub(super) left_cluster: bool,
    pub(super) registered: bool,
    pub(super) metadata_version: u64,
    pub(super) cluster_id: String,
    pub(super) incarnations: BTreeMap<NodeId, uuid::Uuid>,
    pub(super) producer_id_bound: Option<i64>,
    /// Every ACL binding, shared by the views that did not change them.
    pub(super) acls: std::sync::Arc<crate::security::acl::Acls>,
    pub(super) controller: Controller,
    pub(super) topics: BTreeMap<String, TopicMeta>,
    pub(super) topic_names: HashMap<uuid::Uuid, String>,
    /// Client quotas and SCRAM credentials (`/config/users/...`, `/config/clients/...`).
    pub(super) entity_configs: Arc<EntityConfigs>,
}

impl ClusterView {
    /// The dynamic broker configs of `entity` (a broker id, or `<default>`), if any.
    pub fn broker_configs(&self, entity: &str) -> Option<&BTreeMap<String, String>> {
        self.controller.broker_configs(entity)
    }

    /// Every ACL binding (what the authorizer checks against).
    pub fn acls(&self) -> &crate::security::acl::Acls {
        &self.acls
    }

    /// The SCRAM credential stored for `user` (the SASL user name, not sanitized) and
    /// `mechanism` (`/config/users/<user>`, key `SCRAM-SHA-256` / `SCRAM-SHA-512`), for
    /// the SASL SCRAM exchange: salt and iterations go in server-first, `stored_key`
    /// checks the client's proof (`ScramCredential::verify_client_proof`), `server_key`
    /// signs server-final (`ScramCredential::server_signature`).
    pub fn scram_credential(&self, user: &str, mechanism: ScramMechanism) -> Option<&ScramCredential> {
        self.entity_configs.scram_credential(user, mechanism)
    }

    /// Client quotas and SCRAM credentials, parsed.
    pub fn entity_configs(&self) -> &EntityConfigs {
        &self.entity_configs
    }

    /// The registry's change counter this view was built at.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Kafka's cluster id; `None` on a mirror that has no snapshot yet.
    pub fn cluster_id(&self) -> Option<&str> {
        Some(self.cluster_id.as_str()).filter(|c| !c.is_empty())
    }

    /// This broker runs the active coordinator.
    pub fn is_active(&self) -> bool {
        self.active
    }

    pub fn local_broker_id(&self) -> NodeId {
        self.broker_id
    }

    /// The active coordinator's broker id, when known.
    pub fn active_controller_id(&self) -> Option<NodeId> {
        self.active_controller_id
    }

    /// Whether this broker may lead or follow a partition with `replication_factor`
    /// replicas on what it knows. A restarted mirror starts from its cached snapshot,
    /// which may name it leader of an epoch whose records it lost (an unclean stop):
    /// replicated partitions wait until the coordinator has seen this process (and fenced
    /// its previous incarnation). Single-replica partitions have nobody to diverge from.
    pub fn may_take_roles(&self, replication_factor: usize) -> bool {
        self.active || self.registered || replication_factor <= 1
    }

    /// Whether a shutting-down broker may stop serving: its leaderships moved (or it has
    /// no coordinator link to wait for).
    pub fn left_cluster(&self) -> bool {
        self.left_cluster || self.active
    }

    /// The controller id Metadata answers with: the active coordinator while this broker
    /// is in touch with it, else this broker itself (admin requests sent here are
    /// forwarded as soon as a coordinator is reachable; clients that wait for an
    /// unreachable controller would otherwise wait until their request times out).
    pub fn controller_id_for_clients(&self) -> NodeId {
        match self.active_controller_id {
            Some(id) if self.active || self.link_up => id,
            _ => self.broker_id,
        }
    }

    /// The version of the metadata: grows with every change on the active coordinator; on
    /// a mirror, the version of the snapshot it holds (0: none yet).
    pub fn metadata_version(&self) -> u64 {
        self.metadata_version
    }

    /// Whether the registry knows the cluster: the active coordinator, or a mirror that
    /// holds a snapshot. Data is deleted only on what a registry that knows says.
    pub fn has_metadata(&self) -> bool {
        self.metadata_version > 0
    }

    /// How this broker holds a partition (see `Hosting`).
    pub fn hosting(&self, topic: &str, partition: i32) -> Hosting {
        match self.controller.replicas(topic, partition) {
            None => Hosting::Unknown,
            Some(r) if !r.contains(&self.broker_id) => Hosting::Elsewhere,
            Some(_) if self.controller.leader_of(topic, partition) == Some(self.broker_id) => Hosting::Leader,
            Some(_) => Hosting::Follower,
        }
    }

    /// The live brokers' count (what a replication factor may not exceed).
    pub fn live_broker_count(&self) -> usize {
        self.controller.live_brokers().count()
    }

    /// Registered brokers, fenced ones included (DescribeCluster v2's IncludeFencedBrokers).
    pub fn registered_brokers(&self) -> impl Iterator<Item = &BrokerInfo> + '_ {
        self.controller.brokers()
    }

    /// Registered, unfenced brokers (what Metadata lists).
    pub fn live_brokers(&self) -> impl Iterator<Item = &BrokerInfo> + '_ {
        self.controller.live_brokers()
    }

    pub fn broker_info(&self, id: NodeId) -> Option<&BrokerInfo> {
        self.controller.broker(id)
    }

    /// The leader of a partition, when it has one.
    pub fn leader_of(&self, topic: &str, partition: i32) -> Option<NodeId> {
        self.controller.leader_of(topic, partition)
    }

    /// Producer ids at or above this were never issued (None: not known here).
    pub fn producer_id_bound(&self) -> Option<i64> {
        self.producer_id_bound
    }

    pub fn get(&self, name: &str) -> Option<&TopicMeta> {
        self.topics.get(name)
    }

    pub fn by_id(&self, id: uuid::Uuid) -> Option<(&String, &TopicMeta)> {
        self.topics.get_key_value(self.topic_names.get(&id)?)
    }

    pub fn topics(&self) -> impl Iterator<Item = (&String, &TopicMeta)> {
        self.topics.iter()
    }

    /// Replicas, leader, leader epoch and ISR of a partition (for Metadata).
    pub fn partition(&self, topic: &str, partition: i32) -> Option<(&[NodeId], &PartitionState)> {
        Some((self.controller.replicas(topic, partition)?, self.controller.partition_state(topic, partition)?))
    }

    pub fn controller_epoch(&self) -> i32 {
        self.controller.controller_epoch()
    }

    /// Every partition reassignment in progress: (topic, partition, replicas, what is
    /// added and removed).
    pub fn reassignments(&self) -> impl Iterator<Item = (&str, i32, &[NodeId], &Reassignment)> {
        self.controller.reassignments()
    }

    /// The active coordinator's snapshot, as JSON (what mirrors install).
    pub fn snapshot_json(&self) -> Result<(u64, Vec<u8>), RegistryError> {
        if !self.active {
            return Err(RegistryError::NotController(self.active_controller_id));
        }
        let snapshot = ClusterSnapshot {
            version: self.metadata_version,
            controller_id: self.broker_id,
            cluster_id: self.cluster_id.clone(),
            incarnations: self.incarnations.clone(),
            controller: self.controller.snapshot(),
            producer_id_bound: self.producer_id_bound,
            acls: (*self.acls).clone(),
        };
        let json = serde_json::to_vec(&snapshot)
            .map_err(|e| RegistryError::Corrupt { path: "snapshot".into(), error: e.to_string() })?;
        Ok((snapshot.version, json))
    }
}
