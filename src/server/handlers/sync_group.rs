//! SyncGroup: the leader brings the assignment; every member waits for its share, and
//! for the group's metadata record to be stored (`stored`).
//!
//! Needs READ on the group (GROUP_AUTHORIZATION_FAILED otherwise).

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, SyncGroupRequest, SyncGroupResponse};

use crate::config::FsyncMode;
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
        Some(r) => match r.error.as_ref() {
            Some(e) => (group_error_code(e), r),
            None => match stored(ctx, req.group_id.as_str()).await {
                Ok(()) => (error_code::NONE, r),
                Err(code) => (code, SyncResponse::default()),
            },
        },
        None => (ctx.group_unavailable_code(req.group_id.as_str(), &unserved), SyncResponse::default()),
    };
    let mut body = SyncGroupResponse::default().with_error_code(code).with_assignment(r.assignment);
    if frame.api_version >= 5 {
        body.protocol_type = r.protocol_type.map(str_bytes);
        body.protocol_name = r.protocol_name.map(str_bytes);
    }
    respond(ApiKey::SyncGroup, frame, &body)
}

/// An assignment is answered once the group's metadata record (written when the leader
/// brought it) is stored as Kafka stores it: on the offsets partition's in-sync replicas,
/// and fsynced under `--fsync always`. Otherwise a coordinator failover or a crash could
/// bring back an older generation, whose number a later rebalance would hand out again
/// to members holding other partitions. Err: the code to answer with (the member
/// rejoins), mapped as Kafka's group store maps append errors.
pub(super) async fn stored(ctx: &ShardContext, group: &str) -> Result<(), i16> {
    let op = GroupOp::Stored { group_id: group.to_string(), durable: ctx.config.fsync == FsyncMode::Always };
    match ctx.call_group(op, None).await {
        Some(GroupReply::Stored { waits, replicated }) => {
            if !super::writes_succeeded(waits).await {
                return Err(error_code::COORDINATOR_NOT_AVAILABLE);
            }
            match replicated {
                // Kafka's storeGroup answers a timeout COORDINATOR_NOT_AVAILABLE too.
                Some(wait) => match super::offset_commit::replication_failure(wait).await {
                    None => Ok(()),
                    Some(error_code::REQUEST_TIMED_OUT) => Err(error_code::COORDINATOR_NOT_AVAILABLE),
                    Some(code) => Err(code),
                },
                None => Ok(()),
            }
        }
        other => Err(ctx.group_unavailable_code(group, &other)),
    }
}
