//! Kafka's ZooKeeper layout: the znode paths and JSON documents Kafka (ZooKeeper mode,
//! `kafka.zk.ZkData`) reads and writes, so that Kafka's own tools and a ZooKeeper shell
//! see a cluster they recognise. Pure encoding; the `MetaStore` does the I/O.
//!
//! Documents, byte for byte as Kafka 2.7+ writes them (key order is Jackson's iteration
//! of Kafka's Scala maps, copied from real documents):
//! - `/brokers/ids/<id>` (ephemeral), version 5:
//!   `{"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},"endpoints":["PLAINTEXT://h:9092"],`
//!   `"jmx_port":-1,"features":{},"host":"h","timestamp":"<ms>","port":9092,"version":5}`; with a
//!   rack, `"rack":"r"` follows `"endpoints"` (computed from the Scala map's hash order;
//!   not yet compared with a document Kafka wrote). Every advertised listener is in
//!   `endpoints` and the map; `host` and `port` are the inter-broker listener's.
//! - `/brokers/topics/<t>`, version 3:
//!   `{"partitions":{"0":[1,2]},"topic_id":"<id>","adding_replicas":{},"removing_replicas":{},"version":3}`.
//!   The topic id is Kafka's `Uuid.toString`: base64url without padding of the 16 bytes.
//!   Partitions are written in numeric order; Kafka writes them in hash order, which is the
//!   same below 10 partitions (readers do not care).
//! - `/brokers/topics/<t>/partitions/<p>/state`, version 1:
//!   `{"controller_epoch":1,"leader":2,"version":1,"leader_epoch":0,"isr":[2,3,1]}`; the
//!   partition epoch is the znode's version (Kafka's `zkVersion`), not in the document.
//! - `/config/topics/<t>`: `{"version":1,"config":{"retention.ms":"1000"}}`, keys sorted.
//! - `/config/brokers/<id>` and `/config/brokers/<default>` (dynamic broker configs, per
//!   broker and cluster-wide): the same document, e.g.
//!   `{"version":1,"config":{"log.retention.ms":"1000"}}`.
//! - `/config/users/<user>`, `/config/clients/<client-id>`,
//!   `/config/users/<user>/clients/<client-id>` (client quotas and SCRAM credentials;
//!   names sanitized as `security::entity::sanitize`, `<default>` for the default
//!   entity): the same document, e.g. `{"version":1,"config":{"producer_byte_rate":"1048576"}}`
//!   or `{"version":1,"config":{"SCRAM-SHA-512":"salt=..,stored_key=..,server_key=..,iterations=8192"}}`.
//!   Kafka keeps a node once written, with an empty config when its last key goes.
//! - `/config/changes/config_change_<10 digits>`: Kafka's change notification (a
//!   sequential node), written after an entity's config changes, version 2:
//!   `{"version":2,"entity_path":"users/alice"}`. Spate's brokers learn of changes from
//!   the coordinator's snapshots and do not read these; they are for Kafka's tools and
//!   brokers watching the same ZooKeeper. Kafka's brokers delete them after 15 minutes;
//!   Spate leaves them.
//! - `/controller` (ephemeral): `{"version":1,"brokerid":1,"timestamp":"<ms>"}`; version 2
//!   (Kafka 3.4+, with `"kraftControllerEpoch"`) is read too.
//! - `/controller_epoch`: the epoch as decimal text, e.g. `3`.
//! - `/admin/delete_topics/<t>`: empty; its presence asks for the topic's deletion.
//! - `/brokers/topics/<t>/partitions` and `/brokers/topics/<t>/partitions/<p>`: empty.
//!
//! One node is Spate's own, not Kafka's (Kafka's tools ignore it):
//! - `/spate/registrations`, version 1: the live brokers the active coordinator knows,
//!   except itself, with their registration epochs and incarnation ids, and the last
//!   registration epoch handed out:
//!   `{"version":1,"registration_epoch":7,"brokers":[{"id":2,"endpoint":{"host":"h","port":9093},`
//!   `"rack":null,"shards":2,"registration_epoch":5,"incarnation":"<uuid>"}]}`.
//!   A coordinator that restarts (or a broker that becomes the coordinator without a
//!   snapshot) reads it, so that brokers that did not restart keep their leaderships.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::controller::{AdvertisedListener, Endpoint, PartitionState, Reassignment};
use super::store::{base64_decode, base64_encode};
use crate::model::{BrokerEpoch, LeaderEpoch, NodeId, PartitionEpoch};

/// Znode paths, as `kafka.zk.ZkData` names them.
pub mod paths {
    use crate::model::NodeId;

    pub const BROKERS: &str = "/brokers";
    pub const BROKER_IDS: &str = "/brokers/ids";
    pub const TOPICS: &str = "/brokers/topics";
    pub const CONFIG: &str = "/config";
    pub const TOPIC_CONFIGS: &str = "/config/topics";
    pub const BROKER_CONFIGS: &str = "/config/brokers";
    pub const USER_CONFIGS: &str = "/config/users";
    pub const CLIENT_CONFIGS: &str = "/config/clients";
    pub const CONFIG_CHANGES: &str = "/config/changes";
    /// Kafka's prefix of the sequential change-notification nodes.
    pub const CONFIG_CHANGE_PREFIX: &str = "config_change_";
    pub const CONTROLLER: &str = "/controller";
    pub const CONTROLLER_EPOCH: &str = "/controller_epoch";
    pub const ADMIN: &str = "/admin";
    pub const DELETE_TOPICS: &str = "/admin/delete_topics";
    /// Kafka's legacy reassignment request (before KIP-455's API): written by an
    /// operator, followed by the active coordinator.
    pub const REASSIGN_PARTITIONS: &str = "/admin/reassign_partitions";
    pub const CLUSTER_ID: &str = "/cluster/id";
    /// Spate's own (not Kafka's): the registrations the active coordinator holds, kept
    /// persistent because `/brokers/ids/<id>` is ephemeral (see `encode_registrations`).
    pub const REGISTRATIONS: &str = "/spate/registrations";

    pub fn broker(id: NodeId) -> String {
        format!("{BROKER_IDS}/{id}")
    }
    pub fn topic(topic: &str) -> String {
        format!("{TOPICS}/{topic}")
    }
    pub fn topic_partitions(topic: &str) -> String {
        format!("{TOPICS}/{topic}/partitions")
    }
    pub fn topic_partition(topic: &str, partition: i32) -> String {
        format!("{TOPICS}/{topic}/partitions/{partition}")
    }
    pub fn partition_state(topic: &str, partition: i32) -> String {
        format!("{TOPICS}/{topic}/partitions/{partition}/state")
    }
    pub fn topic_config(topic: &str) -> String {
        format!("{TOPIC_CONFIGS}/{topic}")
    }
    /// `entity`: a broker id, or `<default>`.
    pub fn broker_config(entity: &str) -> String {
        format!("{BROKER_CONFIGS}/{entity}")
    }
    /// `entity_path`: Kafka's entity path (`users/alice`, `clients/c`,
    /// `users/alice/clients/c`), names already sanitized.
    pub fn entity_config(entity_path: &str) -> String {
        format!("{CONFIG}/{entity_path}")
    }
    /// The change notification numbered `sequence` (ZooKeeper's 10-digit sequence).
    pub fn config_change(sequence: u64) -> String {
        format!("{CONFIG_CHANGES}/{CONFIG_CHANGE_PREFIX}{sequence:010}")
    }
    pub fn delete_topic(topic: &str) -> String {
        format!("{DELETE_TOPICS}/{topic}")
    }
}

pub const BROKER_DOC_VERSION: i32 = 5;
pub const TOPIC_DOC_VERSION: i32 = 3;
pub const PARTITION_STATE_DOC_VERSION: i32 = 1;
pub const CONFIG_DOC_VERSION: i32 = 1;
pub const CONTROLLER_DOC_VERSION: i32 = 1;
/// Kafka's default listener name and security protocol: what a broker with that listener
/// alone registers (as no listener list, see `Endpoint::with_listeners`), and how a
/// `/brokers/ids` endpoint's protocol is read when the document's map lacks its name.
pub const LISTENER: &str = "PLAINTEXT";
/// Kafka writes -1 when JMX is off.
pub const JMX_PORT_NONE: i32 = -1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("{path_kind} document is not valid: {reason}")]
    Invalid { path_kind: &'static str, reason: String },
    #[error("bad Kafka topic id {0:?}")]
    BadTopicId(String),
}

fn invalid(path_kind: &'static str, reason: impl ToString) -> LayoutError {
    LayoutError::Invalid { path_kind, reason: reason.to_string() }
}

fn to_bytes<T: Serialize>(doc: &T) -> Vec<u8> {
    serde_json::to_vec(doc).expect("layout documents always serialise")
}

// ---- Topic ids ----

/// Kafka's `Uuid.toString`: base64url without padding of the 16 big-endian bytes.
pub fn kafka_uuid_string(id: Uuid) -> String {
    base64_encode(id.as_bytes()).trim_end_matches('=').replace('+', "-").replace('/', "_")
}

/// Kafka's `Uuid.fromString`.
pub fn parse_kafka_uuid(s: &str) -> Result<Uuid, LayoutError> {
    let bad = || LayoutError::BadTopicId(s.to_string());
    if s.len() != 22 || !s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_') {
        return Err(bad());
    }
    let bytes = base64_decode(&s.replace('-', "+").replace('_', "/")).ok_or_else(bad)?;
    let bytes: [u8; 16] = bytes.try_into().map_err(|_| bad())?;
    Ok(Uuid::from_bytes(bytes))
}

// ---- /brokers/ids/<id> ----

/// What a broker registration document says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerDoc {
    pub endpoint: Endpoint,
    pub rack: Option<String>,
    pub timestamp_ms: u64,
}

#[derive(Serialize)]
struct BrokerDocOut<'a> {
    listener_security_protocol_map: BTreeMap<&'a str, &'a str>,
    endpoints: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rack: Option<&'a str>,
    jmx_port: i32,
    features: BTreeMap<String, serde_json::Value>,
    host: &'a str,
    timestamp: String,
    port: u16,
    version: i32,
}

#[derive(Deserialize)]
struct BrokerDocIn {
    version: i32,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    port: Option<i64>,
    #[serde(default)]
    endpoints: Vec<String>,
    #[serde(default)]
    listener_security_protocol_map: BTreeMap<String, String>,
    #[serde(default)]
    rack: Option<String>,
    #[serde(default)]
    timestamp: Option<String>,
}

/// Every advertised listener goes into `endpoints` (the inter-broker one first) and the
/// protocol map. The top-level `host` and `port` are the inter-broker listener's: Kafka
/// writes its PLAINTEXT listener's there, the same document when that is the
/// inter-broker one (the default).
pub fn encode_broker(doc: &BrokerDoc) -> Vec<u8> {
    let endpoint = |name: &str, host: &str, port: u16| {
        if host.contains(':') {
            format!("{name}://[{host}]:{port}")
        } else {
            format!("{name}://{host}:{port}")
        }
    };
    let host = doc.endpoint.host.as_str();
    let (endpoints, map) = if doc.endpoint.listeners.is_empty() {
        (vec![endpoint(LISTENER, host, doc.endpoint.port)], BTreeMap::from([(LISTENER, LISTENER)]))
    } else {
        let listeners = &doc.endpoint.listeners;
        (
            listeners.iter().map(|l| endpoint(&l.name, &l.host, l.port)).collect(),
            listeners.iter().map(|l| (l.name.as_str(), l.protocol.as_str())).collect(),
        )
    };
    to_bytes(&BrokerDocOut {
        listener_security_protocol_map: map,
        endpoints,
        rack: doc.rack.as_deref(),
        jmx_port: JMX_PORT_NONE,
        features: BTreeMap::new(),
        host,
        timestamp: doc.timestamp_ms.to_string(),
        port: doc.endpoint.port,
        version: BROKER_DOC_VERSION,
    })
}

/// Reads versions 1 to 5. The endpoint is the top-level host and port where they name
/// one of the endpoints (Kafka's PLAINTEXT listener, Spate's inter-broker one), else
/// the first PLAINTEXT listener, else the first endpoint; every endpoint is a listener.
pub fn decode_broker(bytes: &[u8]) -> Result<BrokerDoc, LayoutError> {
    const KIND: &str = "broker";
    let d: BrokerDocIn = serde_json::from_slice(bytes).map_err(|e| invalid(KIND, e))?;
    if d.version < 1 {
        return Err(invalid(KIND, format!("version {}", d.version)));
    }
    let mut endpoints = Vec::new();
    for e in &d.endpoints {
        let (listener, addr) = e.split_once("://").ok_or_else(|| invalid(KIND, format!("endpoint {e:?}")))?;
        let (host, port) = addr.rsplit_once(':').ok_or_else(|| invalid(KIND, format!("endpoint {e:?}")))?;
        let port: u16 = port.parse().map_err(|_| invalid(KIND, format!("endpoint {e:?}")))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let protocol = d.listener_security_protocol_map.get(listener).map(String::as_str).unwrap_or(listener);
        endpoints.push(AdvertisedListener {
            name: listener.to_ascii_uppercase(),
            protocol: protocol.to_string(),
            host: host.to_string(),
            port,
        });
    }
    let top = match (&d.host, d.port) {
        (Some(h), Some(p)) => endpoints.iter().find(|l| &l.host == h && i64::from(l.port) == p),
        _ => None,
    };
    let chosen = top.or_else(|| endpoints.iter().find(|l| l.protocol == LISTENER)).or(endpoints.first());
    // (Kafka's default single PLAINTEXT listener becomes no list: see `with_listeners`.)
    let endpoint = match chosen {
        Some(l) => Endpoint::new(l.host.clone(), l.port).with_listeners(endpoints.clone()),
        None => {
            let host = d.host.ok_or_else(|| invalid(KIND, "no endpoints and no host"))?;
            let port = d.port.and_then(|p| u16::try_from(p).ok()).ok_or_else(|| invalid(KIND, "no port"))?;
            Endpoint::new(host, port)
        }
    };
    let timestamp_ms = match d.timestamp {
        Some(t) => t.parse().map_err(|_| invalid(KIND, format!("timestamp {t:?}")))?,
        None => 0,
    };
    Ok(BrokerDoc { endpoint, rack: d.rack, timestamp_ms })
}

// ---- /admin/reassign_partitions ----

/// One partition of a legacy reassignment request: its target replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyReassignment {
    pub topic: String,
    pub partition: i32,
    pub replicas: Vec<NodeId>,
}

#[derive(Serialize, Deserialize)]
struct ReassignPartitionsDoc {
    version: i32,
    partitions: Vec<ReassignPartitionDoc>,
}

#[derive(Serialize, Deserialize)]
struct ReassignPartitionDoc {
    topic: String,
    partition: i32,
    replicas: Vec<i32>,
}

/// Kafka's `ReassignPartitionsZNode`: `{"version":1,"partitions":[{"topic":..,
/// "partition":..,"replicas":[..]}]}`.
pub fn encode_reassign_partitions(partitions: &[LegacyReassignment]) -> Vec<u8> {
    to_bytes(&ReassignPartitionsDoc {
        version: 1,
        partitions: partitions
            .iter()
            .map(|r| ReassignPartitionDoc {
                topic: r.topic.clone(),
                partition: r.partition,
                replicas: ids_of(&r.replicas),
            })
            .collect(),
    })
}

/// Other fields (the old tool's `log_dirs`) are ignored, as Kafka's decoder does.
pub fn decode_reassign_partitions(bytes: &[u8]) -> Result<Vec<LegacyReassignment>, LayoutError> {
    const KIND: &str = "reassign_partitions";
    let d: ReassignPartitionsDoc = serde_json::from_slice(bytes).map_err(|e| invalid(KIND, e))?;
    if d.version != 1 {
        return Err(invalid(KIND, format!("version {}", d.version)));
    }
    Ok(d.partitions
        .into_iter()
        .map(|p| LegacyReassignment {
            topic: p.topic,
            partition: p.partition,
            replicas: p.replicas.into_iter().map(NodeId).collect(),
        })
        .collect())
}

// ---- /brokers/topics/<t> ----

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDoc {
    /// Absent in documents older than Kafka 2.8.
    pub topic_id: Option<Uuid>,
    /// `assignment[p]` = the replicas of partition `p`.
    pub assignment: Vec<Vec<NodeId>>,
    /// Reassignments in progress (`adding_replicas` / `removing_replicas`), by partition.
    pub reassignments: BTreeMap<i32, Reassignment>,
}

#[derive(Serialize)]
struct TopicDocOut {
    partitions: BTreeMap<i32, Vec<i32>>,
    topic_id: String,
    adding_replicas: BTreeMap<i32, Vec<i32>>,
    removing_replicas: BTreeMap<i32, Vec<i32>>,
    version: i32,
}

#[derive(Deserialize)]
struct TopicDocIn {
    #[serde(default)]
    partitions: BTreeMap<String, Vec<i32>>,
    #[serde(default)]
    topic_id: Option<String>,
    #[serde(default)]
    adding_replicas: BTreeMap<String, Vec<i32>>,
    #[serde(default)]
    removing_replicas: BTreeMap<String, Vec<i32>>,
}

fn ids_of(nodes: &[NodeId]) -> Vec<i32> {
    nodes.iter().map(|b| b.0).collect()
}

pub fn encode_topic(
    topic_id: Uuid,
    assignment: &[Vec<NodeId>],
    reassignments: &BTreeMap<i32, Reassignment>,
) -> Vec<u8> {
    let listed = |f: fn(&Reassignment) -> &Vec<NodeId>| {
        reassignments.iter().filter(|(_, r)| !f(r).is_empty()).map(|(p, r)| (*p, ids_of(f(r)))).collect()
    };
    to_bytes(&TopicDocOut {
        partitions: assignment.iter().enumerate().map(|(p, r)| (p as i32, ids_of(r))).collect(),
        topic_id: kafka_uuid_string(topic_id),
        adding_replicas: listed(|r| &r.adding),
        removing_replicas: listed(|r| &r.removing),
        version: TOPIC_DOC_VERSION,
    })
}

/// Partitions must be numbered 0..n without gaps; a reassignment may only name
/// replicas of an existing partition.
pub fn decode_topic(bytes: &[u8]) -> Result<TopicDoc, LayoutError> {
    const KIND: &str = "topic";
    let d: TopicDocIn = serde_json::from_slice(bytes).map_err(|e| invalid(KIND, e))?;
    let partition =
        |p: &str| -> Result<i32, LayoutError> { p.parse().map_err(|_| invalid(KIND, format!("partition {p:?}"))) };
    let mut by_partition = BTreeMap::new();
    for (p, replicas) in d.partitions {
        by_partition.insert(partition(&p)?, replicas.into_iter().map(NodeId).collect::<Vec<_>>());
    }
    if by_partition.keys().copied().ne(0..by_partition.len() as i32) {
        return Err(invalid(KIND, "partitions are not numbered 0..n"));
    }
    let mut reassignments: BTreeMap<i32, Reassignment> = BTreeMap::new();
    for (adding, listed) in [(true, d.adding_replicas), (false, d.removing_replicas)] {
        for (p, replicas) in listed {
            let p = partition(&p)?;
            let nodes: Vec<NodeId> = replicas.into_iter().map(NodeId).collect();
            let Some(assigned) = by_partition.get(&p) else {
                return Err(invalid(KIND, format!("a reassignment of partition {p}, which does not exist")));
            };
            if let Some(x) = nodes.iter().find(|x| !assigned.contains(x)) {
                return Err(invalid(KIND, format!("partition {p}: reassignment names {x}, not a replica")));
            }
            if nodes.is_empty() {
                continue;
            }
            let r = reassignments.entry(p).or_default();
            if adding {
                r.adding = nodes;
            } else {
                r.removing = nodes;
            }
        }
    }
    for (p, r) in &reassignments {
        if r.adding.iter().any(|x| r.removing.contains(x)) || r.removing.len() >= by_partition[p].len() {
            return Err(invalid(
                KIND,
                format!("partition {p}: reassignment {r:?} adds a removed replica or removes all"),
            ));
        }
    }
    let topic_id = d.topic_id.as_deref().map(parse_kafka_uuid).transpose()?;
    Ok(TopicDoc { topic_id, assignment: by_partition.into_values().collect(), reassignments })
}

// ---- /brokers/topics/<t>/partitions/<p>/state ----

#[derive(Serialize, Deserialize)]
struct PartitionStateDoc {
    controller_epoch: i32,
    leader: i32,
    version: i32,
    leader_epoch: i32,
    isr: Vec<i32>,
}

pub fn encode_partition_state(state: &PartitionState) -> Vec<u8> {
    to_bytes(&PartitionStateDoc {
        controller_epoch: state.controller_epoch,
        leader: state.leader.0,
        version: PARTITION_STATE_DOC_VERSION,
        leader_epoch: state.leader_epoch.0,
        isr: state.isr.iter().map(|b| b.0).collect(),
    })
}

/// `znode_version` (the znode's `stat.version`) becomes the partition epoch.
pub fn decode_partition_state(bytes: &[u8], znode_version: i32) -> Result<PartitionState, LayoutError> {
    let d: PartitionStateDoc = serde_json::from_slice(bytes).map_err(|e| invalid("partition state", e))?;
    Ok(PartitionState {
        leader: NodeId(d.leader),
        leader_epoch: LeaderEpoch(d.leader_epoch),
        isr: d.isr.into_iter().map(NodeId).collect(),
        partition_epoch: PartitionEpoch(znode_version),
        controller_epoch: d.controller_epoch,
    })
}

// ---- /config/topics/<t> ----

#[derive(Serialize)]
struct ConfigDocOut<'a> {
    version: i32,
    config: &'a BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct ConfigDocIn {
    #[serde(default)]
    config: BTreeMap<String, String>,
}

pub fn encode_topic_config(configs: &BTreeMap<String, String>) -> Vec<u8> {
    to_bytes(&ConfigDocOut { version: CONFIG_DOC_VERSION, config: configs })
}

/// An empty node (Kafka creates some with no data) is an empty config.
pub fn decode_topic_config(bytes: &[u8]) -> Result<BTreeMap<String, String>, LayoutError> {
    if bytes.is_empty() {
        return Ok(BTreeMap::new());
    }
    let d: ConfigDocIn = serde_json::from_slice(bytes).map_err(|e| invalid("config", e))?;
    Ok(d.config)
}

/// Kafka's version of the config change notification.
pub const CONFIG_CHANGE_DOC_VERSION: i32 = 2;

#[derive(Serialize)]
struct ConfigChangeDocOut<'a> {
    version: i32,
    entity_path: &'a str,
}

/// `/config/changes/config_change_<n>`: `{"version":2,"entity_path":"users/alice"}`.
pub fn encode_config_change(entity_path: &str) -> Vec<u8> {
    to_bytes(&ConfigChangeDocOut { version: CONFIG_CHANGE_DOC_VERSION, entity_path })
}

/// The sequence number of a change notification's node name (`config_change_0000000003`).
pub fn config_change_sequence(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(paths::CONFIG_CHANGE_PREFIX)?;
    if digits.is_empty() || digits.len() > 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

// ---- /controller and /controller_epoch ----

#[derive(Serialize)]
struct ControllerDocOut {
    version: i32,
    brokerid: i32,
    timestamp: String,
}

#[derive(Deserialize)]
struct ControllerDocIn {
    brokerid: i32,
}

// ---- /spate/registrations ----

pub const REGISTRATIONS_DOC_VERSION: i32 = 1;

/// One live broker's registration as the coordinator holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrationDoc {
    pub id: NodeId,
    pub endpoint: Endpoint,
    pub rack: Option<String>,
    pub shards: u32,
    pub registration_epoch: BrokerEpoch,
    /// The id the broker's process gave when it registered (a new one per start).
    pub incarnation: Uuid,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrationsDoc {
    pub version: i32,
    /// The last registration epoch handed out, so that epochs keep growing across a
    /// coordinator restart.
    pub registration_epoch: BrokerEpoch,
    pub brokers: Vec<RegistrationDoc>,
}

pub fn encode_registrations(registration_epoch: BrokerEpoch, brokers: Vec<RegistrationDoc>) -> Vec<u8> {
    to_bytes(&RegistrationsDoc { version: REGISTRATIONS_DOC_VERSION, registration_epoch, brokers })
}

/// Reads version 1; a later version is refused (it may mean something else).
pub fn decode_registrations(bytes: &[u8]) -> Result<RegistrationsDoc, LayoutError> {
    const KIND: &str = "registrations";
    let d: RegistrationsDoc = serde_json::from_slice(bytes).map_err(|e| invalid(KIND, e))?;
    if d.version != REGISTRATIONS_DOC_VERSION {
        return Err(invalid(KIND, format!("version {}", d.version)));
    }
    Ok(d)
}

pub fn encode_controller(broker_id: NodeId, timestamp_ms: u64) -> Vec<u8> {
    to_bytes(&ControllerDocOut {
        version: CONTROLLER_DOC_VERSION,
        brokerid: broker_id.0,
        timestamp: timestamp_ms.to_string(),
    })
}

/// The active controller's broker id.
pub fn decode_controller(bytes: &[u8]) -> Result<NodeId, LayoutError> {
    let d: ControllerDocIn = serde_json::from_slice(bytes).map_err(|e| invalid("controller", e))?;
    Ok(NodeId(d.brokerid))
}

/// `/cluster/id`: `{"version":"1","id":"<cluster id>"}` (Kafka's ClusterIdZNode).
pub fn encode_cluster_id(id: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"version": "1", "id": id})).expect("plain JSON")
}

pub fn decode_cluster_id(bytes: &[u8]) -> Result<String, LayoutError> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| invalid("cluster id", e))?;
    v.get("id").and_then(|i| i.as_str()).map(str::to_string).ok_or_else(|| invalid("cluster id", "no id"))
}

pub fn encode_controller_epoch(epoch: i32) -> Vec<u8> {
    epoch.to_string().into_bytes()
}

pub fn decode_controller_epoch(bytes: &[u8]) -> Result<i32, LayoutError> {
    let s = std::str::from_utf8(bytes).map_err(|e| invalid("controller_epoch", e))?;
    s.trim().parse().map_err(|_| invalid("controller_epoch", format!("{s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_round_trip_and_a_later_version_is_refused() {
        let doc = RegistrationDoc {
            id: NodeId(2),
            endpoint: Endpoint::new("h", 9093),
            rack: Some("r1".into()),
            shards: 2,
            registration_epoch: BrokerEpoch(5),
            incarnation: Uuid::from_u128(7),
        };
        let bytes = encode_registrations(BrokerEpoch(7), vec![doc.clone()]);
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"version":1,"registration_epoch":7,"brokers":[{"id":2,"endpoint":{"host":"h","port":9093},"rack":"r1","shards":2,"registration_epoch":5,"incarnation":"00000000-0000-0000-0000-000000000007"}]}"#
        );
        let back = decode_registrations(&bytes).unwrap();
        assert_eq!((back.registration_epoch, back.brokers), (BrokerEpoch(7), vec![doc]));
        let later = String::from_utf8(bytes).unwrap().replace(r#""version":1"#, r#""version":2"#);
        assert!(decode_registrations(later.as_bytes()).is_err());
        assert!(decode_registrations(br#"{"version":1,"registration_epoch":1,"brokers":[{"id":2}]}"#).is_err());
    }

    // Documents as Kafka wrote them (copied from ZooKeeper shells of Kafka 2.8 to 3.9).

    #[test]
    fn broker_document_is_kafkas() {
        let kafka = br#"{"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},"endpoints":["PLAINTEXT://192.168.199.134:9092"],"jmx_port":-1,"features":{},"host":"192.168.199.134","timestamp":"1615489355496","port":9092,"version":5}"#;
        let doc =
            BrokerDoc { endpoint: Endpoint::new("192.168.199.134", 9092), rack: None, timestamp_ms: 1615489355496 };
        assert_eq!(String::from_utf8(encode_broker(&doc)).unwrap(), std::str::from_utf8(kafka).unwrap());
        assert_eq!(decode_broker(kafka).unwrap(), doc);
    }

    #[test]
    fn broker_document_with_rack() {
        let doc = BrokerDoc { endpoint: Endpoint::new("127.0.0.1", 9093), rack: Some("r1".into()), timestamp_ms: 17 };
        let want = r#"{"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},"endpoints":["PLAINTEXT://127.0.0.1:9093"],"rack":"r1","jmx_port":-1,"features":{},"host":"127.0.0.1","timestamp":"17","port":9093,"version":5}"#;
        assert_eq!(String::from_utf8(encode_broker(&doc)).unwrap(), want);
        assert_eq!(decode_broker(want.as_bytes()).unwrap(), doc);
    }

    #[test]
    fn broker_document_with_several_listeners_and_older_versions() {
        let kafka = br#"{"listener_security_protocol_map":{"INTERNAL":"PLAINTEXT","EXTERNAL":"SSL"},"endpoints":["EXTERNAL://localhost:19092","INTERNAL://kf01:9092"],"jmx_port":-1,"features":{},"host":"kf01","timestamp":"1684599876292","port":9092,"version":5}"#;
        let doc = decode_broker(kafka).unwrap();
        assert_eq!((doc.endpoint.host.as_str(), doc.endpoint.port), ("kf01", 9092));
        let listener = |name: &str, protocol: &str, host: &str, port| AdvertisedListener {
            name: name.into(),
            protocol: protocol.into(),
            host: host.into(),
            port,
        };
        assert_eq!(
            doc.endpoint.listeners,
            [listener("INTERNAL", "PLAINTEXT", "kf01", 9092), listener("EXTERNAL", "SSL", "localhost", 19092)]
        );
        assert_eq!(doc.endpoint.for_listener("EXTERNAL"), Some(("localhost", 19092)));
        assert_eq!(doc.endpoint.for_listener("OTHER"), None);
        // Spate's own: the inter-broker listener (SASL_SSL here) first, and in host/port.
        let ours = BrokerDoc {
            endpoint: Endpoint::new("10.0.0.1", 9093).with_listeners(vec![
                listener("CLIENT", "SASL_SSL", "broker1.example", 9092),
                listener("BROKER", "SASL_SSL", "10.0.0.1", 9093),
                listener("PLAIN", "PLAINTEXT", "10.0.0.1", 9094),
            ]),
            rack: None,
            timestamp_ms: 3,
        };
        let want = r#"{"listener_security_protocol_map":{"BROKER":"SASL_SSL","CLIENT":"SASL_SSL","PLAIN":"PLAINTEXT"},"endpoints":["BROKER://10.0.0.1:9093","CLIENT://broker1.example:9092","PLAIN://10.0.0.1:9094"],"jmx_port":-1,"features":{},"host":"10.0.0.1","timestamp":"3","port":9093,"version":5}"#;
        assert_eq!(String::from_utf8(encode_broker(&ours)).unwrap(), want);
        let back = decode_broker(want.as_bytes()).unwrap();
        assert_eq!((back.endpoint.host.as_str(), back.endpoint.port), ("10.0.0.1", 9093));
        assert_eq!(back.endpoint, ours.endpoint);
        assert_eq!(back.endpoint.listeners[0].name, "BROKER", "the inter-broker listener first");
        // Kafka's default alone is no list, whichever way it comes.
        let default = Endpoint::new("h", 9092).with_listeners(vec![listener("PLAINTEXT", "PLAINTEXT", "h", 9092)]);
        assert_eq!(default, Endpoint::new("h", 9092));
        let v1 = br#"{"version":1,"host":"192.168.1.148","port":9092,"jmx_port":9999}"#;
        assert_eq!(decode_broker(v1).unwrap().endpoint, Endpoint::new("192.168.1.148", 9092));
        let v4 = br#"{"version":4,"endpoints":["PLAINTEXT://[::1]:9092"],"jmx_port":-1,"timestamp":"5"}"#;
        assert_eq!(decode_broker(v4).unwrap().endpoint, Endpoint::new("::1", 9092));
        let back = decode_broker(&encode_broker(&BrokerDoc {
            endpoint: Endpoint::new("::1", 9092),
            rack: None,
            timestamp_ms: 0,
        }))
        .unwrap();
        assert_eq!(back.endpoint, Endpoint::new("::1", 9092));
        assert!(decode_broker(b"{}").is_err());
        assert!(decode_broker(b"not json").is_err());
    }

    fn ids(assignment: Vec<Vec<i32>>) -> Vec<Vec<NodeId>> {
        assignment.into_iter().map(|r| r.into_iter().map(NodeId).collect()).collect()
    }

    #[test]
    fn topic_document_is_kafkas() {
        let kafka = br#"{"partitions":{"0":[0,2,3],"1":[2,3,0],"2":[3,0,2]},"topic_id":"aSFJVxF7SIaTCptmWn_GgA","adding_replicas":{},"removing_replicas":{},"version":3}"#;
        let doc = decode_topic(kafka).unwrap();
        assert_eq!(doc.assignment, ids(vec![vec![0, 2, 3], vec![2, 3, 0], vec![3, 0, 2]]));
        let id = doc.topic_id.unwrap();
        assert_eq!(kafka_uuid_string(id), "aSFJVxF7SIaTCptmWn_GgA");
        assert_eq!(encode_topic(id, &doc.assignment, &doc.reassignments), kafka.to_vec());
    }

    #[test]
    fn topic_document_carries_reassignments_as_kafka() {
        // Partition 0 moving from [1,2,3] to [2,3,4] (Kafka's ZooKeeper-mode layout of an
        // ongoing reassignment): replicas are the target then the leaving ones.
        let kafka = br#"{"partitions":{"0":[2,3,4,1],"1":[3,1,2]},"topic_id":"aSFJVxF7SIaTCptmWn_GgA","adding_replicas":{"0":[4]},"removing_replicas":{"0":[1]},"version":3}"#;
        let doc = decode_topic(kafka).unwrap();
        let want = Reassignment { adding: vec![NodeId(4)], removing: vec![NodeId(1)] };
        assert_eq!(doc.reassignments, BTreeMap::from([(0, want)]));
        assert_eq!(encode_topic(doc.topic_id.unwrap(), &doc.assignment, &doc.reassignments), kafka.to_vec());
        // A reassignment must name replicas of an existing partition, not add what it
        // removes, and not remove every replica.
        for bad in [
            r#"{"partitions":{"0":[1,2]},"adding_replicas":{"1":[1]}}"#,
            r#"{"partitions":{"0":[1,2]},"adding_replicas":{"0":[3]}}"#,
            r#"{"partitions":{"0":[1,2]},"adding_replicas":{"0":[2]},"removing_replicas":{"0":[2]}}"#,
            r#"{"partitions":{"0":[1,2]},"removing_replicas":{"0":[1,2]}}"#,
            r#"{"partitions":{"0":[1,2]},"removing_replicas":{"x":[1]}}"#,
        ] {
            assert!(decode_topic(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn topic_document_in_hash_order_and_without_id() {
        // Kafka writes more than 10 partitions in hash order; readers must not care.
        let kafka = br#"{"partitions":{"11":[1,3,4],"0":[0,1,2],"1":[1,2,3],"2":[2,3,4],"3":[3,4,0],"4":[4,0,1],"5":[0,2,3],"6":[1,3,4],"7":[2,4,0],"8":[3,0,1],"9":[4,1,2],"10":[1,2,3]},"adding_replicas":{},"removing_replicas":{},"version":3}"#;
        let doc = decode_topic(kafka).unwrap();
        assert_eq!(doc.topic_id, None);
        assert_eq!(doc.assignment.len(), 12);
        assert_eq!(ids(vec![vec![1, 2, 3], vec![1, 3, 4]]), doc.assignment[10..12]);
        assert!(decode_topic(br#"{"partitions":{"1":[1]},"version":3}"#).is_err());
    }

    #[test]
    fn kafka_uuids() {
        for s in
            ["WV18z8nWQ8yekl_6282UEQ", "SbJQ_jVrRFOYqlkfIgLwNg", "cMr3GpVESX2L3byPGf93lQ", "zeTNbNaeRS-h5yGiMZBOyg"]
        {
            assert_eq!(kafka_uuid_string(parse_kafka_uuid(s).unwrap()), s);
        }
        let id = Uuid::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        assert_eq!(kafka_uuid_string(id), "AQIDBAUGBwgJCgsMDQ4PEA");
        assert!(parse_kafka_uuid("too-short").is_err());
        assert!(parse_kafka_uuid("aSFJVxF7SIaTCptmWn/GgA").is_err());
    }

    #[test]
    fn partition_state_document_is_kafkas() {
        let kafka = br#"{"controller_epoch":20,"leader":1,"version":1,"leader_epoch":2,"isr":[1,0]}"#;
        let state = decode_partition_state(kafka, 7).unwrap();
        assert_eq!(
            state,
            PartitionState {
                leader: NodeId(1),
                leader_epoch: LeaderEpoch(2),
                isr: vec![NodeId(1), NodeId(0)],
                partition_epoch: PartitionEpoch(7),
                controller_epoch: 20
            }
        );
        assert_eq!(encode_partition_state(&state), kafka.to_vec());
        let offline = PartitionState {
            leader: NodeId::NONE,
            leader_epoch: LeaderEpoch(3),
            isr: vec![NodeId(2)],
            partition_epoch: PartitionEpoch(9),
            controller_epoch: 1,
        };
        assert_eq!(
            encode_partition_state(&offline),
            br#"{"controller_epoch":1,"leader":-1,"version":1,"leader_epoch":3,"isr":[2]}"#.to_vec()
        );
    }

    #[test]
    fn config_controller_and_epoch_documents_are_kafkas() {
        let configs = BTreeMap::from([("retention.ms".to_string(), "1000".to_string())]);
        let kafka = br#"{"version":1,"config":{"retention.ms":"1000"}}"#;
        assert_eq!(encode_topic_config(&configs), kafka.to_vec());
        assert_eq!(decode_topic_config(kafka).unwrap(), configs);
        assert_eq!(encode_topic_config(&BTreeMap::new()), br#"{"version":1,"config":{}}"#.to_vec());
        assert_eq!(decode_topic_config(b"").unwrap(), BTreeMap::new());

        let kafka = br#"{"version":1,"brokerid":0,"timestamp":"1643692590537"}"#;
        assert_eq!(encode_controller(NodeId(0), 1643692590537), kafka.to_vec());
        assert_eq!(decode_controller(kafka).unwrap(), NodeId(0));
        let v2 = br#"{"version":2,"brokerid":2,"timestamp":"1676813353461","kraftControllerEpoch":-1}"#;
        assert_eq!(decode_controller(v2).unwrap(), NodeId(2));

        assert_eq!(encode_controller_epoch(12), b"12".to_vec());
        assert_eq!(decode_controller_epoch(b"12").unwrap(), 12);
        assert!(decode_controller_epoch(b"x").is_err());
    }

    #[test]
    fn client_entity_documents_are_kafkas() {
        // As Kafka 3.9's kafka-configs.sh --zookeeper wrote them.
        let kafka = br#"{"version":1,"config":{"producer_byte_rate":"1048576"}}"#;
        let configs = decode_topic_config(kafka).unwrap();
        assert_eq!(encode_topic_config(&configs), kafka.to_vec());
        assert_eq!(paths::entity_config("users/alice/clients/<default>"), "/config/users/alice/clients/<default>");
        assert_eq!(encode_config_change("users/alice"), br#"{"version":2,"entity_path":"users/alice"}"#.to_vec());
        assert_eq!(paths::config_change(7), "/config/changes/config_change_0000000007");
        assert_eq!(config_change_sequence("config_change_0000000007"), Some(7));
        assert_eq!(config_change_sequence("config_change_"), None);
        assert_eq!(config_change_sequence("config_change_99999999999"), None);
        assert_eq!(config_change_sequence("other_0000000001"), None);
    }

    #[test]
    fn reassign_partitions_document_is_kafkas() {
        // As Kafka's ReassignPartitionsZNode writes it; the pre-KIP-455 tool added
        // log_dirs, which is ignored.
        let kafka =
            br#"{"version":1,"partitions":[{"topic":"foo","partition":1,"replicas":[2,3],"log_dirs":["any","any"]}]}"#;
        let want = vec![LegacyReassignment { topic: "foo".into(), partition: 1, replicas: vec![NodeId(2), NodeId(3)] }];
        assert_eq!(decode_reassign_partitions(kafka).unwrap(), want);
        assert_eq!(
            encode_reassign_partitions(&want),
            br#"{"version":1,"partitions":[{"topic":"foo","partition":1,"replicas":[2,3]}]}"#.to_vec()
        );
        assert_eq!(decode_reassign_partitions(&encode_reassign_partitions(&want)).unwrap(), want);
        for bad in [&br#"{"version":2,"partitions":[]}"#[..], br#"{"partitions":[]}"#, b"[", br#"{"version":1}"#] {
            assert!(decode_reassign_partitions(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn paths_are_kafkas() {
        assert_eq!(paths::broker(NodeId(3)), "/brokers/ids/3");
        assert_eq!(paths::topic("t"), "/brokers/topics/t");
        assert_eq!(paths::topic_partition("t", 0), "/brokers/topics/t/partitions/0");
        assert_eq!(paths::partition_state("t", 4), "/brokers/topics/t/partitions/4/state");
        assert_eq!(paths::topic_config("t"), "/config/topics/t");
        assert_eq!(paths::delete_topic("t"), "/admin/delete_topics/t");
        assert_eq!(paths::REASSIGN_PARTITIONS, "/admin/reassign_partitions");
        assert_eq!(paths::CONTROLLER, "/controller");
        assert_eq!(paths::CONTROLLER_EPOCH, "/controller_epoch");
    }
}
