//! JoinGroup: handed to the group's coordinator shard; the answer waits until the
//! rebalance's join phase completes (or comes at once: MEMBER_ID_REQUIRED, errors, a
//! static member back in a stable group), and a static member's until the group's
//! records are stored (`sync_group::stored`).
//!
//! v8's Reason (KIP-800) is logged with the rebalance the join starts. v9's
//! SkipAssignment (KIP-814): a static leader back in a stable group is told it leads
//! but runs no assignment (its SyncGroup brings none; every member keeps its own).
//! Older leaders run one, which SyncGroup applies, as before.
//!
//! Needs READ on the group (GROUP_AUTHORIZATION_FAILED otherwise).

use bytes::Bytes;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{ApiKey, JoinGroupRequest, JoinGroupResponse};

use crate::group::{Deferred, JoinRequest, JoinResponse};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: JoinGroupRequest = decode_body(frame)?;
    if !super::authz::may_read_group(ctx, frame, req.group_id.as_str()) {
        let body = JoinGroupResponse::default()
            .with_generation_id(-1)
            .with_member_id(req.member_id.clone())
            .with_error_code(error_code::GROUP_AUTHORIZATION_FAILED);
        return respond(ApiKey::JoinGroup, frame, &body);
    }
    let v = frame.api_version;
    let client_id = frame.header.as_ref().and_then(|h| h.client_id.as_ref()).map(|c| c.to_string()).unwrap_or_default();
    let join = JoinRequest {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        group_instance_id: req.group_instance_id.as_ref().map(|s| s.to_string()),
        protocol_type: req.protocol_type.to_string(),
        protocols: req.protocols.iter().map(|p| (p.name.to_string(), p.metadata.clone())).collect(),
        session_timeout_ms: req.session_timeout_ms,
        // v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_timeout_ms: if v >= 1 { req.rebalance_timeout_ms } else { req.session_timeout_ms },
        client_id: client_id.clone(),
        client_host: frame.client_host.clone(),
        require_known_member_id: v >= 4,
        reason: if v >= 8 { req.reason.as_ref().map(|r| r.to_string()) } else { None },
    };
    let new_member_id =
        format!("{}-{}", if client_id.is_empty() { "member" } else { &client_id }, uuid::Uuid::new_v4());
    let mut unserved = None;
    let result = match ctx.call_group(GroupOp::Join { req: join, now_ms: now_ms(), new_member_id }, None).await {
        Some(GroupReply::Join(Deferred::Now(r))) => Ok(r),
        Some(GroupReply::Join(Deferred::Later(rx))) => rx.await.map_err(|_| ()),
        other => {
            unserved = other;
            Err(())
        }
    };
    let mut r = result.unwrap_or_else(|()| JoinResponse { generation_id: -1, ..Default::default() });
    // A static member's join may have replaced its old member id (answered at once, in
    // a stable group): answered once that is stored, as Kafka does, so that a failover
    // cannot bring back the old id for a zombie to commit under. (Any static join waits:
    // nothing is owed when it wrote nothing.)
    if req.group_instance_id.is_some() && r.error.is_none() && r.generation_id != -1 {
        if let Err(code) = super::sync_group::stored(ctx, req.group_id.as_str()).await {
            let body = JoinGroupResponse::default()
                .with_error_code(code)
                .with_generation_id(-1)
                .with_member_id(str_bytes(std::mem::take(&mut r.member_id)));
            return respond(ApiKey::JoinGroup, frame, &body);
        }
    }
    let mut body = JoinGroupResponse::default()
        .with_error_code(match (&r.error, r.generation_id) {
            (Some(e), _) => group_error_code(e),
            (None, -1) => ctx.group_unavailable_code(req.group_id.as_str(), &unserved),
            (None, _) => error_code::NONE,
        })
        .with_generation_id(r.generation_id)
        .with_leader(str_bytes(r.leader))
        .with_member_id(str_bytes(r.member_id));
    // protocol_name is nullable from v7 on; before that an empty string stands for none.
    body.protocol_name = Some(str_bytes(r.protocol_name.unwrap_or_default()));
    if v >= 7 {
        body.protocol_type = r.protocol_type.map(str_bytes);
    }
    if v >= 9 {
        body.skip_assignment = r.skip_assignment;
    }
    body.members = r
        .members
        .into_iter()
        .map(|(id, instance, metadata)| {
            let m = JoinGroupResponseMember::default().with_member_id(str_bytes(id)).with_metadata(metadata);
            if v >= 5 {
                m.with_group_instance_id(instance.map(str_bytes))
            } else {
                m
            }
        })
        .collect();
    respond(ApiKey::JoinGroup, frame, &body)
}
