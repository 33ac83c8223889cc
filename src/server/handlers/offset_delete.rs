//! OffsetDelete: drop a group's committed offsets for partitions it no longer consumes.
//! Answered once the tombstones are written (fsynced under `--fsync always`).

use bytes::Bytes;
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::{ApiKey, OffsetDeleteRequest, OffsetDeleteResponse};

use crate::config::FsyncMode;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: OffsetDeleteRequest = decode_body(frame)?;
    // Kafka's handleOffsetDeleteRequest: DELETE on the group (topic READ is not checked
    // here yet).
    if !super::authz::authorize(
        ctx,
        frame,
        &ctx.view(),
        crate::security::acl::AclOperation::Delete,
        crate::security::acl::ResourceType::Group,
        req.group_id.as_str(),
    ) {
        let body = OffsetDeleteResponse::default().with_error_code(error_code::GROUP_AUTHORIZATION_FAILED);
        return respond(ApiKey::OffsetDelete, frame, &body);
    }
    let partitions: Vec<(String, i32)> = req
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.name.to_string(), p.partition_index)))
        .collect();
    let durable = ctx.config.fsync == FsyncMode::Always;
    let op = GroupOp::DeleteOffsets { group_id: req.group_id.to_string(), partitions, now_ms: now_ms(), durable };
    let mut body = OffsetDeleteResponse::default();
    let codes: Vec<i16> = match ctx.call_group(op, None).await {
        Some(GroupReply::DeleteOffsets { result: Ok(results), waits }) => {
            if super::delete_groups::tombstones_written(waits).await {
                results.iter().map(|r| r.as_ref().err().map(group_error_code).unwrap_or(error_code::NONE)).collect()
            } else {
                body.error_code = error_code::COORDINATOR_NOT_AVAILABLE;
                Vec::new()
            }
        }
        Some(GroupReply::DeleteOffsets { result: Err(e), .. }) => {
            body.error_code = group_error_code(&e);
            Vec::new()
        }
        other => {
            body.error_code = ctx.group_unavailable_code(req.group_id.as_str(), &other);
            Vec::new()
        }
    };
    if body.error_code == error_code::NONE {
        let mut codes = codes.into_iter();
        body.topics = req
            .topics
            .iter()
            .map(|t| {
                OffsetDeleteResponseTopic::default().with_name(t.name.clone()).with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            OffsetDeleteResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(codes.next().unwrap_or(error_code::UNKNOWN_SERVER_ERROR))
                        })
                        .collect(),
                )
            })
            .collect();
    }
    respond(ApiKey::OffsetDelete, frame, &body)
}
