//! SyncGroup: the leader brings the assignment; every member waits for its share.
//!
//! Needs READ on the group (GROUP_AUTHORIZATION_FAILED otherwise).

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, SyncGroupRequest, SyncGroupResponse};

use crate::group::{Deferred, SyncRequest, SyncResponse};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: SyncGroupRequest = decode_body(frame)?;
    if !super::authz::may_read_group(ctx, frame, req.group_id.as_str()) {
        let body = SyncGroupResponse::default().with_error_code(error_code::GROUP_AUTHORIZATION_FAILED);
        return respond(ApiKey::SyncGroup, frame, &body);
    }
    let sync = SyncRequest {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        group_instance_id: req.group_instance_id.as_ref().map(|s| s.to_string()),
        generation_id: req.generation_id,
        protocol_type: req.protocol_type.as_ref().map(|s| s.to_string()),
        protocol_name: req.protocol_name.as_ref().map(|s| s.to_string()),
        assignments: req.assignments.iter().map(|a| (a.member_id.to_string(), a.assignment.clone())).collect(),
    };
    let mut unserved = None;
    let result = match ctx.call_group(GroupOp::Sync { req: sync, now_ms: now_ms() }, None).await {
        Some(GroupReply::Sync(Deferred::Now(r))) => Some(r),
        Some(GroupReply::Sync(Deferred::Later(rx))) => rx.await.ok(),
        other => {
            unserved = other;
            None
        }
    };
    let (code, r) = match result {
        Some(r) => (r.error.as_ref().map(group_error_code).unwrap_or(error_code::NONE), r),
        None => (ctx.group_unavailable_code(req.group_id.as_str(), &unserved), SyncResponse::default()),
    };
    let mut body = SyncGroupResponse::default().with_error_code(code).with_assignment(r.assignment);
    if frame.api_version >= 5 {
        body.protocol_type = r.protocol_type.map(str_bytes);
        body.protocol_name = r.protocol_name.map(str_bytes);
    }
    respond(ApiKey::SyncGroup, frame, &body)
}
