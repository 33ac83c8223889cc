//! Heartbeat: keeps a member's session alive; tells it when to rejoin.
//!
//! Needs READ on the group (GROUP_AUTHORIZATION_FAILED otherwise).

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, HeartbeatRequest, HeartbeatResponse};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: HeartbeatRequest = decode_body(frame)?;
    if !super::authz::may_read_group(ctx, frame, req.group_id.as_str()) {
        let body = HeartbeatResponse::default().with_error_code(error_code::GROUP_AUTHORIZATION_FAILED);
        return respond(ApiKey::Heartbeat, frame, &body);
    }
    let op = GroupOp::Heartbeat {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        instance: req.group_instance_id.as_ref().map(|s| s.to_string()),
        generation: req.generation_id,
        now_ms: now_ms(),
    };
    let code = match ctx.call_group(op, None).await {
        Some(GroupReply::Heartbeat(Ok(()))) => error_code::NONE,
        Some(GroupReply::Heartbeat(Err(e))) => group_error_code(&e),
        other => ctx.group_unavailable_code(req.group_id.as_str(), &other),
    };
    respond(ApiKey::Heartbeat, frame, &HeartbeatResponse::default().with_error_code(code))
}
