//! LeaveGroup: one member (v0-2) or a batch of them by member or instance id (v3+).
//!
//! Needs READ on the group (GROUP_AUTHORIZATION_FAILED otherwise).

use bytes::Bytes;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{ApiKey, LeaveGroupRequest, LeaveGroupResponse};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: LeaveGroupRequest = decode_body(frame)?;
    if !super::authz::may_read_group(ctx, frame, req.group_id.as_str()) {
        let body = LeaveGroupResponse::default().with_error_code(error_code::GROUP_AUTHORIZATION_FAILED);
        return respond(ApiKey::LeaveGroup, frame, &body);
    }
    let batched = frame.api_version >= 3;
    let members: Vec<(String, Option<String>)> = if batched {
        req.members
            .iter()
            .map(|m| (m.member_id.to_string(), m.group_instance_id.as_ref().map(|s| s.to_string())))
            .collect()
    } else {
        vec![(req.member_id.to_string(), None)]
    };
    let op = GroupOp::Leave { group_id: req.group_id.to_string(), members, now_ms: now_ms() };
    let mut body = LeaveGroupResponse::default();
    match ctx.call_group(op, None).await {
        Some(GroupReply::Leave(Ok(results))) => {
            if batched {
                body.members = req
                    .members
                    .iter()
                    .zip(&results)
                    .map(|(m, r)| {
                        MemberResponse::default()
                            .with_member_id(m.member_id.clone())
                            .with_group_instance_id(m.group_instance_id.clone())
                            .with_error_code(r.as_ref().err().map(group_error_code).unwrap_or(error_code::NONE))
                    })
                    .collect();
            } else if let Some(Err(e)) = results.first() {
                body.error_code = group_error_code(e);
            }
        }
        Some(GroupReply::Leave(Err(e))) => body.error_code = group_error_code(&e),
        other => body.error_code = ctx.group_unavailable_code(req.group_id.as_str(), &other),
    }
    respond(ApiKey::LeaveGroup, frame, &body)
}
