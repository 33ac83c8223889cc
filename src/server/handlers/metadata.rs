//! Metadata: every live broker, the active coordinator as the controller, and every
//! requested topic with its partitions' leaders, epochs, replicas and ISR, from this
//! broker's registry (the active coordinator's own, or its mirror). Unknown topics are
//! created when both the request and the broker (`auto.create.topics.enable`) allow it,
//! as Kafka does.

use bytes::Bytes;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{ApiKey, BrokerId, MetadataRequest, MetadataResponse, TopicName};

use crate::config::split_host_port;
use crate::coordinator::registry::{validate_topic_name, TopicMeta};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::create_topics::auto_create;
use super::{respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: MetadataRequest = decode_body(frame)?;
    let (brokers, controller_id) = {
        let reg = ctx.view();
        let mut brokers: Vec<MetadataResponseBroker> = reg
            .live_brokers()
            .into_iter()
            .map(|b| {
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(b.id))
                    .with_host(str_bytes(b.endpoint.host.clone()))
                    .with_port(b.endpoint.port as i32)
                    .with_rack(b.rack.map(str_bytes))
            })
            .collect();
        if !brokers.iter().any(|b| b.node_id.0 == ctx.config.node_id) {
            // Not registered (yet): clients must still be able to reach this broker.
            let (host, port) = split_host_port(ctx.config.advertised()).expect("validated at startup");
            brokers.push(
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(ctx.config.node_id))
                    .with_host(str_bytes(host))
                    .with_port(port),
            );
        }
        (brokers, reg.controller_id_for_clients())
    };
    let mut body = MetadataResponse::default().with_brokers(brokers);
    let version = frame.api_version;
    if version >= 1 {
        body.controller_id = BrokerId(controller_id);
    }
    if version >= 2 {
        let reg = ctx.view();
        body.cluster_id = Some(str_bytes(reg.cluster_id().unwrap_or(&ctx.cluster_id).to_string()));
    }

    // v0: an empty list means all topics; v1+: null means all topics.
    let wanted: Option<Vec<(Option<String>, uuid::Uuid)>> = match &req.topics {
        None => None,
        Some(t) if t.is_empty() && frame.api_version == 0 => None,
        Some(t) => Some(t.iter().map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id)).collect()),
    };
    let allow_create = (frame.api_version < 4 || req.allow_auto_topic_creation) && ctx.config.auto_create_topics;

    let topics: Vec<(String, Result<TopicMeta, i16>)> = match wanted {
        None => {
            let reg = ctx.view();
            reg.topics().map(|(n, m)| (n.clone(), Ok(m.clone()))).collect()
        }
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for (name, id) in list {
                let name = match name {
                    Some(n) => n,
                    None => match ctx.view().by_id(id) {
                        Some((n, _)) => n.clone(),
                        None => {
                            out.push((String::new(), Err(error_code::UNKNOWN_TOPIC_OR_PARTITION)));
                            continue;
                        }
                    },
                };
                if validate_topic_name(&name).is_err() {
                    out.push((name, Err(error_code::INVALID_TOPIC_EXCEPTION)));
                    continue;
                }
                let existing = ctx.view().get(&name).cloned();
                let result = match existing {
                    Some(m) => Ok(m),
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
            out
        }
    };

    body.topics = topics
        .into_iter()
        .map(|(name, meta)| {
            let internal = version >= 1 && name == crate::group::OFFSETS_TOPIC;
            let mut t =
                MetadataResponseTopic::default().with_name(Some(TopicName(str_bytes(name)))).with_is_internal(internal);
            if version >= 8 && req.include_topic_authorized_operations {
                t.topic_authorized_operations = TOPIC_OPERATIONS;
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
                                    Some((replicas, state)) => r
                                        .with_error_code(if state.leader < 0 {
                                            error_code::LEADER_NOT_AVAILABLE
                                        } else {
                                            error_code::NONE
                                        })
                                        .with_leader_id(BrokerId(state.leader))
                                        .with_leader_epoch(if version >= 7 { state.leader_epoch } else { -1 })
                                        .with_replica_nodes(replicas.iter().map(|b| BrokerId(*b)).collect())
                                        .with_isr_nodes(state.isr.iter().map(|b| BrokerId(*b)).collect()),
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
        .collect();
    if (8..=10).contains(&version) && req.include_cluster_authorized_operations {
        body.cluster_authorized_operations = CLUSTER_OPERATIONS;
    }
    respond(ApiKey::Metadata, frame, &body)
}

/// Without an authorizer every operation is allowed; Kafka then answers with the set of
/// operations that apply (AclOperation bit numbers: READ 3, WRITE 4, CREATE 5, DELETE 6,
/// ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11,
/// IDEMPOTENT_WRITE 12). Clients decode every set bit, so no unknown bit may be set.
const TOPIC_OPERATIONS: i32 = (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 10) | (1 << 11);
const CLUSTER_OPERATIONS: i32 = (1 << 5) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12);

fn name_of(t: &MetadataResponseTopic) -> String {
    t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default()
}
