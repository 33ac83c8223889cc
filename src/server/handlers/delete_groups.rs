//! DeleteGroups: removes empty groups and their committed offsets.

use bytes::Bytes;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::{ApiKey, DeleteGroupsRequest, DeleteGroupsResponse};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond};

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
        let code = match ctx.call_group(GroupOp::Delete { group_id: id.to_string(), now_ms: now_ms() }, None).await {
            Some(GroupReply::Delete(Ok(()))) => error_code::NONE,
            Some(GroupReply::Delete(Err(e))) => group_error_code(&e),
            other => ctx.group_unavailable_code(id, &other),
        };
        results.push(DeletableGroupResult::default().with_group_id(id.clone()).with_error_code(code));
    }
    respond(ApiKey::DeleteGroups, frame, &DeleteGroupsResponse::default().with_results(results))
}
