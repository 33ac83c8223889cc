//! Metadata: every live broker, the active coordinator as the controller, and every
//! requested topic with its partitions' leaders, epochs, replicas and ISR, from this
//! broker's registry (the active coordinator's own, or its mirror). Unknown topics are
//! created when both the request and the broker (`auto.create.topics.enable`) allow it,
//! as Kafka does.
//!
//! Authorization (Kafka's `handleTopicMetadataRequest`): an all-topics request lists only
//! the topics the principal may DESCRIBE; a named topic it may not is answered
//! TOPIC_AUTHORIZATION_FAILED (whether it exists or not), and auto-creation needs CREATE
//! on the cluster or the topic. Authorized-operations bitmasks are the principal's.

use bytes::Bytes;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{ApiKey, BrokerId, MetadataRequest, MetadataResponse, TopicName};

use crate::coordinator::registry::{validate_topic_name, TopicMeta};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclOperation, ResourceType, CLUSTER_RESOURCE_NAME};

use super::super::context::ShardContext;
use super::create_topics::auto_create;
use super::{authz, respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: MetadataRequest = decode_body(frame)?;
    let (brokers, controller_id) = {
        let reg = ctx.view();
        let brokers: Vec<MetadataResponseBroker> = super::listed_brokers(ctx, &reg, frame, false)
            .into_iter()
            .map(|b| {
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(b.id))
                    .with_host(str_bytes(b.host))
                    .with_port(b.port)
                    .with_rack(b.rack.map(str_bytes))
            })
            .collect();
        (brokers, reg.controller_id_for_clients())
    };
    // Live brokers a client of this listener cannot reach: they have no listener of its name.
    let no_listener: std::collections::BTreeSet<i32> = ctx
        .view()
        .live_brokers()
        .filter(|b| b.id.0 != ctx.config.node_id && b.endpoint.for_listener(&frame.listener).is_none())
        .map(|b| b.id.0)
        .collect();
    let mut body = MetadataResponse::default().with_brokers(brokers);
    let version = frame.api_version;
    if version >= 1 {
        body.controller_id = BrokerId(controller_id.0);
    }
    if version >= 2 {
        let reg = ctx.view();
        body.cluster_id = Some(str_bytes(reg.cluster_id().unwrap_or(&ctx.cluster_id).to_string()));
    }

    // v0: an empty list means all topics; v1+: null means all topics.
    let wanted: Option<Vec<Requested>> = match &req.topics {
        None => None,
        Some(t) if t.is_empty() && frame.api_version == 0 => None,
        Some(t) => Some(
            t.iter().map(|t| requested_topic(version, t.name.as_ref().map(|n| n.0.as_str()), t.topic_id)).collect(),
        ),
    };
    let allow_create = (frame.api_version < 4 || req.allow_auto_topic_creation) && ctx.config.auto_create_topics;

    let mut unknown_id_topics: Vec<uuid::Uuid> = Vec::new();
    let topics: Vec<(String, Result<TopicMeta, i16>)> = match wanted {
        None => {
            let reg = ctx.view();
            reg.topics()
                .filter(|(n, _)| {
                    authz::authorize_quietly(ctx, frame, &reg, AclOperation::Describe, ResourceType::Topic, n)
                })
                .map(|(n, m)| (n.clone(), Ok(m.clone())))
                .collect()
        }
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            let mut unknown_ids = Vec::new();
            for wanted in list {
                let name = match wanted {
                    Requested::ByName(n) => n,
                    Requested::ById(id) => match ctx.view().by_id(id) {
                        Some((n, _)) => n.clone(),
                        None => {
                            unknown_ids.push(id);
                            continue;
                        }
                    },
                };
                if validate_topic_name(&name).is_err() {
                    out.push((name, Err(error_code::INVALID_TOPIC_EXCEPTION)));
                    continue;
                }
                let view = ctx.view();
                if !authz::authorize(ctx, frame, &view, AclOperation::Describe, ResourceType::Topic, &name) {
                    out.push((name, Err(error_code::TOPIC_AUTHORIZATION_FAILED)));
                    continue;
                }
                let existing = view.get(&name).cloned();
                let may_create = || {
                    authz::authorize_quietly(
                        ctx,
                        frame,
                        &view,
                        AclOperation::Create,
                        ResourceType::Cluster,
                        CLUSTER_RESOURCE_NAME,
                    ) || authz::authorize(ctx, frame, &view, AclOperation::Create, ResourceType::Topic, &name)
                };
                let result = match existing {
                    Some(m) => Ok(m),
                    None if allow_create && !may_create() => Err(error_code::TOPIC_AUTHORIZATION_FAILED),
                    None if allow_create => {
                        match auto_create(ctx, &name, ctx.config.num_partitions).await {
                            Ok(m) => {
                                tracing::info!(topic = %name, partitions = m.partitions, "auto-created topic");
                                Ok(m)
                            }
                            // Another connection created it meanwhile.
                            Err((code, _)) if code == error_code::TOPIC_ALREADY_EXISTS => {
                                ctx.view().get(&name).cloned().ok_or(error_code::LEADER_NOT_AVAILABLE)
                            }
                            Err((code, _)) => Err(code),
                        }
                    }
                    None => Err(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                };
                out.push((name, result));
            }
            unknown_id_topics = unknown_ids;
            out
        }
    };

    // As Kafka: an id that names no topic is answered with UNKNOWN_TOPIC_ID, the id echoed
    // and no name (the Java admin's describeTopics by id keys its answer on the id).
    let unknown = unknown_id_topics.into_iter().map(|id| {
        MetadataResponseTopic::default().with_error_code(error_code::UNKNOWN_TOPIC_ID).with_name(None).with_topic_id(id)
    });
    body.topics = topics
        .into_iter()
        .map(|(name, meta)| {
            let internal = version >= 1 && crate::model::is_internal_topic(&name);
            let mut t =
                MetadataResponseTopic::default().with_name(Some(TopicName(str_bytes(name)))).with_is_internal(internal);
            if version >= 8 && req.include_topic_authorized_operations {
                t.topic_authorized_operations =
                    authz::authorized_operations(ctx, frame, &ctx.view(), ResourceType::Topic, &name_of(&t));
            }
            match meta {
                Err(code) => t.with_error_code(code),
                Ok(meta) => {
                    let reg = ctx.view();
                    let topic_name = name_of(&t);
                    t.with_topic_id(if version >= 10 { meta.id } else { uuid::Uuid::nil() }).with_partitions(
                        (0..meta.partitions)
                            .map(|p| {
                                let r = MetadataResponsePartition::default().with_partition_index(p);
                                match reg.partition(&topic_name, p) {
                                    // A leader without the client's listener: Kafka's
                                    // LISTENER_NOT_FOUND (v6+; LEADER_NOT_AVAILABLE before),
                                    // with no leader id the client could not reach.
                                    Some((replicas, state)) if no_listener.contains(&state.leader.0) => r
                                        .with_error_code(if version >= 6 {
                                            error_code::LISTENER_NOT_FOUND
                                        } else {
                                            error_code::LEADER_NOT_AVAILABLE
                                        })
                                        .with_leader_id(BrokerId(-1))
                                        .with_leader_epoch(if version >= 7 { state.leader_epoch.0 } else { -1 })
                                        .with_replica_nodes(replicas.iter().map(|b| BrokerId(b.0)).collect())
                                        .with_isr_nodes(state.isr.iter().map(|b| BrokerId(b.0)).collect()),
                                    Some((replicas, state)) => r
                                        .with_error_code(if state.leader.0 < 0 {
                                            error_code::LEADER_NOT_AVAILABLE
                                        } else {
                                            error_code::NONE
                                        })
                                        .with_leader_id(BrokerId(state.leader.0))
                                        .with_leader_epoch(if version >= 7 { state.leader_epoch.0 } else { -1 })
                                        .with_replica_nodes(replicas.iter().map(|b| BrokerId(b.0)).collect())
                                        .with_isr_nodes(state.isr.iter().map(|b| BrokerId(b.0)).collect()),
                                    None => {
                                        r.with_error_code(error_code::LEADER_NOT_AVAILABLE).with_leader_id(BrokerId(-1))
                                    }
                                }
                            })
                            .collect(),
                    )
                }
            }
        })
        .chain(unknown)
        .collect();
    if (8..=10).contains(&version) && req.include_cluster_authorized_operations {
        let view = ctx.view();
        body.cluster_authorized_operations = if authz::authorize_cluster(ctx, frame, &view, AclOperation::Describe) {
            authz::authorized_operations(ctx, frame, &view, ResourceType::Cluster, CLUSTER_RESOURCE_NAME)
        } else {
            0
        };
    }
    respond(ApiKey::Metadata, frame, &body)
}

/// Without an authorizer every operation is allowed; Kafka then answers with the set of
/// operations that apply (AclOperation bit numbers: READ 3, WRITE 4, CREATE 5, DELETE 6,
/// ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11,
/// IDEMPOTENT_WRITE 12). Clients decode every set bit, so no unknown bit may be set.
/// (`authz::authorized_operations` answers these sets with the authorizer off.)
#[cfg(test)]
const TOPIC_OPERATIONS: i32 = (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 10) | (1 << 11);
#[cfg(test)]
const CLUSTER_OPERATIONS: i32 = (1 << 5) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12);

/// How one requested topic is looked up.
#[derive(Debug, PartialEq, Eq)]
enum Requested {
    ByName(String),
    ById(uuid::Uuid),
}

/// Kafka (KafkaApis.handleTopicMetadataRequest) looks a topic up by its id when the id is
/// set (v12+, the first version whose requests carry ids), whatever the name says: the
/// Java admin's describeTopics by id sends the id with an empty name, not a null one.
/// Otherwise by name; a null name (v10+) with no id names no topic.
fn requested_topic(version: i16, name: Option<&str>, id: uuid::Uuid) -> Requested {
    if version >= 12 && !id.is_nil() {
        return Requested::ById(id);
    }
    match name {
        Some(n) => Requested::ByName(n.to_string()),
        None => Requested::ById(id),
    }
}

fn name_of(t: &MetadataResponseTopic) -> String {
    t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_the_authorizer_off_the_bitmasks_are_every_supported_operation() {
        let fold = |t: ResourceType| t.supported_operations().iter().fold(0, |b, op| b | (1 << op.code()));
        assert_eq!(fold(ResourceType::Topic), TOPIC_OPERATIONS);
        assert_eq!(fold(ResourceType::Cluster), CLUSTER_OPERATIONS);
    }

    #[test]
    fn a_topic_id_wins_over_the_name_from_v12() {
        let id = uuid::Uuid::from_u128(0x1234);
        // The Java admin's describeTopics(TopicCollection.ofTopicIds(..)): id and "".
        assert_eq!(requested_topic(12, Some(""), id), Requested::ById(id));
        assert_eq!(requested_topic(12, None, id), Requested::ById(id));
        assert_eq!(requested_topic(12, Some("orders"), id), Requested::ById(id));
        // No id: by name, at every version.
        assert_eq!(requested_topic(12, Some("orders"), uuid::Uuid::nil()), Requested::ByName("orders".into()));
        assert_eq!(requested_topic(9, Some("orders"), uuid::Uuid::nil()), Requested::ByName("orders".into()));
        // Before v12 requests carry no ids: the name decides.
        assert_eq!(requested_topic(11, Some("orders"), id), Requested::ByName("orders".into()));
        // Neither: the nil id, which names no topic (UNKNOWN_TOPIC_ID).
        assert_eq!(requested_topic(12, None, uuid::Uuid::nil()), Requested::ById(uuid::Uuid::nil()));
    }
}
