//! CreatePartitions: grow topics. New partitions open lazily on their owner shards.
//! Manual assignments are refused until the cluster has more than one broker.

use bytes::Bytes;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{ApiKey, CreatePartitionsRequest, CreatePartitionsResponse};

use crate::coordinator::controller::ControllerError;
use crate::coordinator::registry::{Registry, RegistryError};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: CreatePartitionsRequest = decode_body(frame)?;
    let mut results = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let name = t.name.as_str();
        let outcome: Result<(), (i16, String)> = if t.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
            Err((error_code::INVALID_REQUEST, "manual replica assignment is not supported yet".into()))
        } else if name == crate::group::OFFSETS_TOPIC {
            Err((error_code::INVALID_REQUEST, "the partition count of an internal topic is fixed".into()))
        } else {
            let (topic, count, validate_only) = (name.to_string(), t.count, req.validate_only);
            ctx.metadata.write(move |reg| grow(reg, &topic, count, validate_only)).await
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

/// Check and apply one topic's new partition count (on the blocking pool).
fn grow(reg: &mut Registry, name: &str, count: i32, validate_only: bool) -> Result<(), (i16, String)> {
    match reg.get(name).map(|m| m.partitions) {
        None => return Err((error_code::UNKNOWN_TOPIC_OR_PARTITION, format!("topic {name:?} does not exist"))),
        Some(c) if count <= c => {
            return Err((
                error_code::INVALID_PARTITIONS,
                format!("topic {name:?} has {c} partitions; {count} is not more"),
            ))
        }
        Some(_) => {}
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
