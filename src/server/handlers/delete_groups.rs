//! DeleteGroups: removes empty groups and their committed offsets. Answered once the
//! tombstones are written (fsynced under `--fsync always`), as Kafka answers after its
//! local append. v3 adds a message per group, which is null as in Kafka 4.4's answers
//! (`protocol::newer`).

use bytes::Bytes;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{ApiKey, DeleteGroupsRequest, DeleteGroupsResponse};

use crate::config::FsyncMode;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{DurableWait, GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond, respond_newer};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DeleteGroupsRequest = decode_body(frame)?;
    let mut results = Vec::with_capacity(req.groups_names.len());
    for id in &req.groups_names {
        if !super::authz::authorize(
            ctx,
            frame,
            &ctx.view(),
            crate::security::acl::AclOperation::Delete,
            crate::security::acl::ResourceType::Group,
            id.as_str(),
        ) {
            results.push(
                DeletableGroupResult::default()
                    .with_group_id(id.clone())
                    .with_error_code(error_code::GROUP_AUTHORIZATION_FAILED),
            );
            continue;
        }
        let op = GroupOp::Delete {
            group_id: id.to_string(),
            now_ms: now_ms(),
            durable: ctx.config.fsync == FsyncMode::Always,
        };
        let code = match ctx.call_group(op, None).await {
            Some(GroupReply::Delete { result, waits }) => match (result, tombstones_written(waits).await) {
                (Err(e), _) => group_error_code(&e),
                (Ok(()), false) => error_code::COORDINATOR_NOT_AVAILABLE,
                (Ok(()), true) => error_code::NONE,
            },
            other => ctx.group_unavailable_code(id, &other),
        };
        results.push(DeletableGroupResult::default().with_group_id(id.clone()).with_error_code(code));
    }
    let answer = DeleteGroupsResponse::default().with_results(results);
    if frame.api_version >= 3 {
        return respond_newer(ApiKey::DeleteGroups, frame, |buf| {
            crate::protocol::newer::encode_delete_groups_response_v3(&answer, buf)
        });
    }
    respond(ApiKey::DeleteGroups, frame, &answer)
}

/// Whether the tombstones were appended (`waits` is None when not), written and, when
/// asked, fsynced.
pub(super) async fn tombstones_written(waits: Option<Vec<DurableWait>>) -> bool {
    match waits {
        Some(waits) => super::writes_succeeded(waits).await,
        None => false,
    }
}
