//! CreateTopics: validate name, partition count, replication factor (or a manual
//! replica assignment) and every config (unsupported configs are refused with
//! INVALID_CONFIG, never silently ignored), then register the topic durably. Partition
//! logs open lazily on their owner shard.
//!
//! A manual assignment is checked as Kafka checks it: with numPartitions or
//! replicationFactor also set it is INVALID_REQUEST; a partition given twice, partitions
//! not numbered 0..n-1, an empty replica list, a broker named twice in a partition, an
//! unregistered broker, replica counts that differ between partitions or a partition
//! whose brokers are all fenced are INVALID_REPLICA_ASSIGNMENT. Each partition's first
//! replica is its preferred leader; its ISR is its live replicas and its leader the
//! first of them.

use bytes::Bytes;
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse};

use crate::config::TopicConfig;
use crate::coordinator::controller::REPLICATION_FACTOR_MAX;
use crate::coordinator::registry::{validate_topic_name, TopicMeta};
use crate::model::{limits, NodeId};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

/// Register a topic (on the blocking pool: the metadata store may wait). Errors come
/// back as (Kafka error code, message).
pub async fn create_topic(
    ctx: &ShardContext,
    name: &str,
    placement: Placement,
    configs: TopicConfig,
    validate_only: bool,
) -> Result<TopicMeta, (i16, String)> {
    let name = name.to_string();
    ctx.metadata.write(move |reg| create_in(reg, &name, placement, configs, validate_only)).await
}

/// Where a new topic's replicas go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// `partitions` partitions of `replication_factor` replicas, placed by the controller.
    Replicated { partitions: i32, replication_factor: i32 },
    /// Partition `p` on the brokers `assignment[p]` (checked for shape already).
    Manual(Vec<Vec<NodeId>>),
}

/// A CreateTopics manual assignment, in partition order, as Kafka's controller checks
/// the request's shape (the brokers themselves are checked by the controller). Each
/// count from the wire is held to a named limit before anything is allocated for it.
fn manual_assignment(
    t: &kafka_protocol::messages::create_topics_request::CreatableTopic,
) -> Result<Vec<Vec<NodeId>>, (i16, String)> {
    if t.replication_factor != -1 {
        return Err((
            error_code::INVALID_REQUEST,
            "a manual partition assignment was specified, but replication factor was not set to -1".into(),
        ));
    }
    if t.num_partitions != -1 {
        return Err((
            error_code::INVALID_REQUEST,
            "a manual partition assignment was specified, but numPartitions was not set to -1".into(),
        ));
    }
    let bad = |m: String| Err((error_code::INVALID_REPLICA_ASSIGNMENT, m));
    if t.assignments.len() > limits::topic_partitions_max as usize {
        return bad(format!(
            "{} partitions assigned, above the most a topic may have ({})",
            t.assignments.len(),
            limits::topic_partitions_max
        ));
    }
    let mut by_partition: Vec<Option<Vec<NodeId>>> = vec![None; t.assignments.len()];
    for a in &t.assignments {
        if a.broker_ids.len() > REPLICATION_FACTOR_MAX as usize {
            return bad(format!(
                "partition {} has {} replicas, above the most a partition may have ({REPLICATION_FACTOR_MAX})",
                a.partition_index,
                a.broker_ids.len()
            ));
        }
        let slot = match usize::try_from(a.partition_index).ok().and_then(|p| by_partition.get_mut(p)) {
            Some(slot) => slot,
            None => return bad("partitions should be a consecutive 0-based integer sequence".into()),
        };
        if slot.is_some() {
            return bad(format!("found multiple manual partition assignments for partition {}", a.partition_index));
        }
        *slot = Some(a.broker_ids.iter().map(|b| NodeId(b.0)).collect());
    }
    // n assignments, none twice, each index below n: every index 0..n-1 is there.
    Ok(by_partition.into_iter().map(|r| r.expect("each index filled once")).collect())
}

/// Auto-creation (Metadata for an unknown topic): here on the active coordinator, else
/// through it. `__consumer_offsets` is never auto-created as a user topic: the active
/// coordinator creates it as the internal topic it is, once enough brokers are live
/// (`create_offsets_topic`); until then it is LEADER_NOT_AVAILABLE.
pub async fn auto_create(ctx: &ShardContext, name: &str, partitions: i32) -> Result<TopicMeta, (i16, String)> {
    if name == crate::group::OFFSETS_TOPIC {
        if ctx.view().is_active() {
            let rf = ctx.config.offsets_topic();
            if let Err(e) = ctx.metadata.write(move |r| super::super::create_offsets_topic(r, rf, false)).await {
                tracing::warn!(error = %e, "cannot create the offsets topic");
            }
        }
        return ctx.view().get(name).cloned().ok_or_else(|| {
            (
                error_code::LEADER_NOT_AVAILABLE,
                format!(
                    "{name} is created once {} brokers are live or a group \
                 coordinator is asked for",
                    ctx.config.offsets_topic_replication_factor
                ),
            )
        });
    }
    if ctx.view().is_active() {
        let rf = ctx.config.default_replication_factor;
        let placement = Placement::Replicated { partitions, replication_factor: rf };
        return create_topic(ctx, name, placement, TopicConfig::default(), false).await;
    }
    super::super::forward::create_topic(ctx, name, partitions).await?;
    ctx.view().get(name).cloned().ok_or_else(|| {
        (error_code::LEADER_NOT_AVAILABLE, format!("topic {name:?} created; its metadata is on its way"))
    })
}

fn create_in(
    reg: &mut crate::coordinator::registry::Registry,
    name: &str,
    placement: Placement,
    configs: TopicConfig,
    validate_only: bool,
) -> Result<TopicMeta, (i16, String)> {
    let code = |e: crate::coordinator::registry::RegistryError| (super::registry_error_code(&e), e.to_string());
    let (partitions, replication_factor) = match placement {
        Placement::Replicated { partitions, replication_factor } => (partitions, replication_factor),
        Placement::Manual(assignment) => {
            if validate_only {
                reg.check_assignment(name, &assignment).map_err(code)?;
                let (partitions, replication_factor) = (assignment.len() as i32, assignment[0].len() as i32);
                return Ok(TopicMeta { id: uuid::Uuid::nil(), partitions, replication_factor, configs });
            }
            return reg.create_with_assignment(name, assignment, configs).map_err(code);
        }
    };
    let live = reg.live_broker_count() as i32;
    if replication_factor < 1 || replication_factor > live {
        return Err((
            error_code::INVALID_REPLICATION_FACTOR,
            format!("replication factor {replication_factor} is invalid: {live} live brokers"),
        ));
    }
    if validate_only {
        validate_topic_name(name).map_err(|e| (error_code::INVALID_TOPIC_EXCEPTION, e.to_string()))?;
        if reg.get(name).is_some() {
            return Err((error_code::TOPIC_ALREADY_EXISTS, format!("topic {name:?} already exists")));
        }
        return Ok(TopicMeta { id: uuid::Uuid::nil(), partitions, replication_factor, configs });
    }
    reg.create_replicated(name, partitions, replication_factor, configs)
        .map_err(|e| (super::registry_error_code(&e), e.to_string()))
}

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: CreateTopicsRequest = decode_body(frame)?;
    let mut results = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let name = t.name.0.to_string();
        let partitions = if t.num_partitions == -1 { ctx.config.num_partitions } else { t.num_partitions };
        // Kafka's handleCreateTopicsRequest: CREATE on the cluster, or on the topic.
        let authorized = {
            let view = ctx.view();
            super::authz::authorize_quietly(
                ctx,
                frame,
                &view,
                crate::security::acl::AclOperation::Create,
                crate::security::acl::ResourceType::Cluster,
                crate::security::acl::CLUSTER_RESOURCE_NAME,
            ) || super::authz::authorize(
                ctx,
                frame,
                &view,
                crate::security::acl::AclOperation::Create,
                crate::security::acl::ResourceType::Topic,
                &name,
            )
        };
        let checked = (|| {
            if !authorized {
                return Err((error_code::TOPIC_AUTHORIZATION_FAILED, "Authorization failed.".to_string()));
            }
            if name == crate::group::OFFSETS_TOPIC {
                // As Kafka: the internal topic is the coordinator's to create.
                return Err((error_code::INVALID_REQUEST, format!("creation of internal topic {name} is prohibited")));
            }
            let placement = if t.assignments.is_empty() {
                let replication_factor = if t.replication_factor == -1 {
                    ctx.config.default_replication_factor
                } else {
                    t.replication_factor as i32
                };
                Placement::Replicated { partitions, replication_factor }
            } else {
                Placement::Manual(manual_assignment(t)?)
            };
            let configs = TopicConfig::from_pairs(
                t.configs.iter().map(|c| (c.name.as_str(), c.value.as_ref().map(|v| v.as_str()))),
                &ctx.config.topic_defaults,
            )
            .map_err(|e| (error_code::INVALID_CONFIG, e))?;
            Ok((placement, configs))
        })();
        let outcome = match checked {
            Ok((placement, configs)) => create_topic(ctx, &name, placement, configs, req.validate_only).await,
            Err(e) => Err(e),
        };
        let mut r = CreatableTopicResult::default().with_name(t.name.clone());
        match outcome {
            Ok(meta) => {
                if !req.validate_only {
                    tracing::info!(topic = %name, partitions = meta.partitions, configs = ?meta.configs.overrides, "created topic");
                }
                if frame.api_version >= 7 {
                    r.topic_id = meta.id;
                }
                if frame.api_version >= 5 {
                    r = r.with_num_partitions(meta.partitions).with_replication_factor(meta.replication_factor as i16);
                    let configs = meta
                        .configs
                        .describe(&ctx.config.topic_defaults)
                        .into_iter()
                        .map(|(k, v, source)| {
                            CreatableTopicConfigs::default()
                                .with_name(str_bytes(k))
                                .with_value(Some(str_bytes(v)))
                                .with_config_source(source as i8)
                        })
                        .collect();
                    r = r.with_configs(Some(configs));
                }
            }
            Err((code, message)) => {
                tracing::info!(topic = %name, error = %message, "create topic refused");
                r = r.with_error_code(code).with_error_message(Some(str_bytes(message)));
                if frame.api_version >= 5 {
                    r = r.with_num_partitions(-1).with_replication_factor(-1);
                }
            }
        }
        results.push(r);
    }
    respond(ApiKey::CreateTopics, frame, &CreateTopicsResponse::default().with_topics(results))
}
