//! CreatePartitions: grow topics. New partitions open lazily on their owner shards.
//! With a manual assignment (one replica list per added partition) it is checked as
//! Kafka checks it: as many lists as added partitions, each as long as the topic's
//! replication factor, no broker twice, every broker registered and at least one live
//! in each list, else INVALID_REPLICA_ASSIGNMENT. Each new partition's first replica is
//! its preferred leader; its ISR is its live replicas and its leader the first of them.

use bytes::Bytes;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{ApiKey, CreatePartitionsRequest, CreatePartitionsResponse};

use crate::coordinator::controller::{ControllerError, REPLICATION_FACTOR_MAX};
use crate::coordinator::registry::{Registry, RegistryError};
use crate::model::{limits, NodeId};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: CreatePartitionsRequest = decode_body(frame)?;
    let mut results = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let name = t.name.as_str();
        // Kafka's handleCreatePartitionsRequest: ALTER on the topic.
        let outcome: Result<(), (i16, String)> = if !super::authz::authorize(
            ctx,
            frame,
            &ctx.view(),
            crate::security::acl::AclOperation::Alter,
            crate::security::acl::ResourceType::Topic,
            name,
        ) {
            Err((error_code::TOPIC_AUTHORIZATION_FAILED, "Authorization failed.".into()))
        } else if name == crate::group::OFFSETS_TOPIC {
            Err((error_code::INVALID_REQUEST, "the partition count of an internal topic is fixed".into()))
        } else {
            match manual_assignment(t.assignments.as_deref()) {
                Err(e) => Err(e),
                Ok(assignment) => {
                    let (topic, count, validate_only) = (name.to_string(), t.count, req.validate_only);
                    ctx.metadata.write(move |reg| grow(reg, &topic, count, assignment, validate_only)).await
                }
            }
        };
        let r = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        results.push(match outcome {
            Ok(()) => {
                if !req.validate_only {
                    tracing::info!(topic = name, partitions = t.count, "added partitions");
                }
                r
            }
            Err((code, msg)) => r.with_error_code(code).with_error_message(Some(str_bytes(msg))),
        });
    }
    respond(ApiKey::CreatePartitions, frame, &CreatePartitionsResponse::default().with_results(results))
}

/// The request's replica lists for the new partitions (`None`: no assignment), each
/// count from the wire held to a named limit before anything is allocated for it.
fn manual_assignment(
    assignments: Option<&[kafka_protocol::messages::create_partitions_request::CreatePartitionsAssignment]>,
) -> Result<Option<Vec<Vec<NodeId>>>, (i16, String)> {
    let Some(assignments) = assignments else { return Ok(None) };
    if assignments.len() > limits::topic_partitions_max as usize {
        return Err((
            error_code::INVALID_REPLICA_ASSIGNMENT,
            format!(
                "{} partitions assigned, above the most a topic may have ({})",
                assignments.len(),
                limits::topic_partitions_max
            ),
        ));
    }
    let mut added = Vec::with_capacity(assignments.len());
    for (i, a) in assignments.iter().enumerate() {
        if a.broker_ids.len() > REPLICATION_FACTOR_MAX as usize {
            return Err((
                error_code::INVALID_REPLICA_ASSIGNMENT,
                format!(
                    "new partition {i} has {} replicas, above the most a partition may have ({REPLICATION_FACTOR_MAX})",
                    a.broker_ids.len()
                ),
            ));
        }
        added.push(a.broker_ids.iter().map(|b| NodeId(b.0)).collect());
    }
    Ok(Some(added))
}

/// Check and apply one topic's new partition count (on the blocking pool).
fn grow(
    reg: &mut Registry,
    name: &str,
    count: i32,
    assignment: Option<Vec<Vec<NodeId>>>,
    validate_only: bool,
) -> Result<(), (i16, String)> {
    let current = match reg.get(name).map(|m| m.partitions) {
        None => return Err((error_code::UNKNOWN_TOPIC_OR_PARTITION, format!("topic {name:?} does not exist"))),
        Some(c) if count <= c => {
            return Err((
                error_code::INVALID_PARTITIONS,
                format!("topic {name:?} has {c} partitions; {count} is not more"),
            ))
        }
        Some(c) => c,
    };
    if let Some(added) = assignment {
        let additional = count as i64 - current as i64;
        if added.len() as i64 != additional {
            return Err((
                error_code::INVALID_REPLICA_ASSIGNMENT,
                format!(
                    "attempted to add {additional} additional partition(s), but {} assignment(s) were specified",
                    added.len()
                ),
            ));
        }
        return reg
            .create_partitions_with_assignment(name, added, validate_only)
            .map(|_| ())
            .map_err(|e| (super::registry_error_code(&e), e.to_string()));
    }
    if validate_only {
        return Ok(());
    }
    reg.create_partitions(name, count).map(|_| ()).map_err(|e| {
        let code = match &e {
            RegistryError::InvalidPartitions(_) | RegistryError::Controller(ControllerError::InvalidPartitions(_)) => {
                error_code::INVALID_PARTITIONS
            }
            RegistryError::UnknownTopic(_) => error_code::UNKNOWN_TOPIC_OR_PARTITION,
            e => super::registry_error_code(e),
        };
        (code, e.to_string())
    })
}
