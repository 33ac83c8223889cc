//! CreatePartitions: grow topics. New partitions open lazily on their owner shards.
//! Manual assignments are refused until the cluster has more than one broker.

use bytes::Bytes;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{ApiKey, CreatePartitionsRequest, CreatePartitionsResponse};

use crate::coordinator::controller::ControllerError;
use crate::coordinator::registry::RegistryError;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

pub fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: CreatePartitionsRequest = decode_body(frame)?;
    let mut results = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let name = t.name.as_str();
        let outcome: Result<(), (i16, String)> = (|| {
            if t.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
                return Err((error_code::INVALID_REQUEST, "manual replica assignment is not supported yet".into()));
            }
            if name == crate::group::OFFSETS_TOPIC {
                return Err((error_code::INVALID_REQUEST, "the partition count of an internal topic is fixed".into()));
            }
            let mut reg = ctx.registry.write().expect("registry lock");
            let current = reg.get(name).map(|m| m.partitions);
            match current {
                None => return Err((error_code::UNKNOWN_TOPIC_OR_PARTITION, format!("topic {name:?} does not exist"))),
                Some(c) if t.count <= c => {
                    return Err((
                        error_code::INVALID_PARTITIONS,
                        format!("topic {name:?} has {c} partitions; {} is not more", t.count),
                    ))
                }
                Some(_) => {}
            }
            if req.validate_only {
                return Ok(());
            }
            reg.create_partitions(name, t.count).map(|_| ()).map_err(|e| {
                let code = match &e {
                    RegistryError::InvalidPartitions(_)
                    | RegistryError::Controller(ControllerError::InvalidPartitions(_)) => {
                        error_code::INVALID_PARTITIONS
                    }
                    RegistryError::UnknownTopic(_) => error_code::UNKNOWN_TOPIC_OR_PARTITION,
                    _ => error_code::UNKNOWN_SERVER_ERROR,
                };
                (code, e.to_string())
            })
        })();
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
