//! ConsumerGroupHeartbeat (KIP-848, `group.protocol=consumer`): a member joins, stays,
//! reconciles and leaves through this one request; the group's coordinator shard runs
//! the assignor and answers the member's epoch and, when it changed, its assignment.
//! v0 members get their id from the broker; v1 members bring their own. An answer that
//! changed the group waits until its records are stored (in-sync replicas; fsync under
//! `--fsync always`), as Kafka answers once they are committed.
//!
//! Needs READ on the group (GROUP_AUTHORIZATION_FAILED otherwise) and, as Kafka 4.4,
//! DESCRIBE on every topic the member subscribes to by name (TOPIC_AUTHORIZATION_FAILED
//! otherwise, for the whole heartbeat: a client must not learn of topics it may not see).
//! A regex subscription is resolved on the coordinator's shard to the topics the
//! principal of the heartbeat that resolves it may DESCRIBE (`shard::DescribeFilter`).

use bytes::Bytes;
use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::{ApiKey, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse};

use crate::group::consumer::{self, ConsumerHeartbeat};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{DescribeFilter, GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: ConsumerGroupHeartbeatRequest = decode_body(frame)?;
    let refuse = |code: i16, message: Option<String>| {
        let mut body = ConsumerGroupHeartbeatResponse::default().with_error_code(code);
        body.error_message = message.map(str_bytes);
        respond(ApiKey::ConsumerGroupHeartbeat, frame, &body)
    };
    if !super::authz::may_read_group(ctx, frame, req.group_id.as_str()) {
        return refuse(error_code::GROUP_AUTHORIZATION_FAILED, None);
    }
    if let Some(names) = req.subscribed_topic_names.as_ref().filter(|n| !n.is_empty()) {
        use crate::security::acl::{AclOperation, ResourceType};
        let view = ctx.view();
        let denied = names.iter().any(|t| {
            !super::authz::authorize(ctx, frame, &view, AclOperation::Describe, ResourceType::Topic, t.as_str())
        });
        if denied {
            return refuse(error_code::TOPIC_AUTHORIZATION_FAILED, None);
        }
    }
    // v1 (KIP-1082): the member generates its id and sends it from its first request.
    if frame.api_version >= 1 && req.member_id.is_empty() {
        return refuse(error_code::INVALID_REQUEST, Some("MemberId can't be empty.".to_string()));
    }
    let client_id = frame.header.as_ref().and_then(|h| h.client_id.as_ref()).map(|c| c.to_string()).unwrap_or_default();
    let hb = ConsumerHeartbeat {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.as_ref().map(|s| s.to_string()),
        rack_id: req.rack_id.as_ref().map(|s| s.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req
            .subscribed_topic_names
            .as_ref()
            .map(|ts| ts.iter().map(|t| t.to_string()).collect()),
        subscribed_topic_regex: if frame.api_version >= 1 {
            req.subscribed_topic_regex.as_ref().map(|s| s.to_string())
        } else {
            None
        },
        server_assignor: req.server_assignor.as_ref().map(|s| s.to_string()),
        owned: req.topic_partitions.as_ref().map(|ts| {
            let mut owned = consumer::TopicPartitions::new();
            for t in ts {
                owned.entry(t.topic_id).or_default().extend(t.partitions.iter().copied());
            }
            owned
        }),
        client_id,
        client_host: frame.client_host.clone(),
    };
    let group_id = hb.group_id.clone();
    let describe = super::authz::enabled(ctx).then(|| {
        Box::new(DescribeFilter {
            authorizer: ctx.authorizer.clone(),
            principal: frame.principal.clone(),
            host: super::authz::host(frame).to_string(),
        })
    });
    let op = GroupOp::ConsumerHeartbeat {
        req: hb,
        now_ms: now_ms(),
        new_member_id: uuid::Uuid::new_v4().to_string(),
        describe,
    };
    match ctx.call_group(op, None).await {
        Some(GroupReply::ConsumerHeartbeat { result: Ok(r), wrote }) => {
            // What the heartbeat changed (epochs, assignments) is on the offsets
            // partition's in-sync replicas before the member hears of it: a coordinator
            // failover must not bring back a state older than what members act on.
            if wrote {
                if let Err(code) = super::sync_group::stored(ctx, &group_id).await {
                    return refuse(code, None);
                }
            }
            let mut body = ConsumerGroupHeartbeatResponse::default()
                .with_member_id(Some(str_bytes(r.member_id)))
                .with_member_epoch(r.member_epoch)
                .with_heartbeat_interval_ms(r.heartbeat_interval_ms);
            body.assignment = r.assignment.map(|a| {
                Assignment::default().with_topic_partitions(
                    a.into_iter()
                        .map(|(id, ps)| {
                            TopicPartitions::default().with_topic_id(id).with_partitions(ps.into_iter().collect())
                        })
                        .collect(),
                )
            });
            respond(ApiKey::ConsumerGroupHeartbeat, frame, &body)
        }
        Some(GroupReply::ConsumerHeartbeat { result: Err((e, message)), .. }) => {
            refuse(group_error_code(&e), Some(message))
        }
        other => refuse(ctx.group_unavailable_code(&group_id, &other), None),
    }
}
