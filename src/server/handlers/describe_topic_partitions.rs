//! DescribeTopicPartitions (KIP-966): topics and their partitions, paginated, as Kafka
//! 4.4's DescribeTopicPartitionsRequestHandler answers (what `kafka-topics.sh
//! --describe` and the Java admin's describeTopics use when a broker offers it).
//!
//! - The topics asked for, or every topic the principal may DESCRIBE when none are,
//!   sorted by name and starting at the cursor's topic and partition.
//! - At most `ResponsePartitionLimit` partitions per answer (capped by Kafka's
//!   `max.request.partition.size.limit`, 2,000); where more are left, `NextCursor` names
//!   the next topic and partition.
//! - A topic asked for and not authorized is TOPIC_AUTHORIZATION_FAILED (with no id); one
//!   that does not exist UNKNOWN_TOPIC_OR_PARTITION (or INVALID_TOPIC_EXCEPTION for a
//!   bad name). A cursor on a topic not asked for, or on a negative partition, answers
//!   every topic asked for with INVALID_REQUEST, as Kafka's error response does.
//! - Each partition: leader (-1 when it has none or no listener of the request's name),
//!   leader epoch, replicas, ISR, the replicas on brokers that are not live, and
//!   KIP-966's eligible leader replicas, empty: Spate's controller keeps no ELR (a
//!   replica back from an unclean stop is fenced by its re-registration instead).

use bytes::Bytes;
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{ApiKey, BrokerId, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse};

use crate::coordinator::registry::validate_topic_name;
use crate::coordinator::view::ClusterView;
use crate::model::NodeId;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclOperation, ResourceType};

use super::super::context::ShardContext;
use super::{authz, respond};

/// Kafka's `max.request.partition.size.limit` default: the most partitions one answer holds.
const response_partitions_max: i32 = 2000;

pub fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeTopicPartitionsRequest = decode_body(frame)?;
    let view = ctx.view();
    let all = req.topics.is_empty();
    let (cursor_topic, cursor_partition) =
        req.cursor.as_ref().map_or((String::new(), 0), |c| (c.topic_name.to_string(), c.partition_index));
    let mut names: Vec<String> = if all {
        view.topics().map(|(name, _)| name.clone()).filter(|n| *n >= cursor_topic).collect()
    } else {
        req.topics.iter().map(|t| t.name.to_string()).filter(|n| *n >= cursor_topic).collect()
    };
    names.sort();
    names.dedup();
    let cursor_invalid = req.cursor.is_some() && (cursor_partition < 0 || !all && !names.contains(&cursor_topic));
    if cursor_invalid {
        let topics = req
            .topics
            .iter()
            .map(|t| {
                DescribeTopicPartitionsResponseTopic::default()
                    .with_error_code(error_code::INVALID_REQUEST)
                    .with_name(Some(t.name.clone()))
            })
            .collect();
        return respond(
            ApiKey::DescribeTopicPartitions,
            frame,
            &DescribeTopicPartitionsResponse::default().with_topics(topics),
        );
    }
    let mut unauthorized = Vec::new();
    names.retain(|name| {
        let allowed = authz::authorize_quietly(ctx, frame, &view, AclOperation::Describe, ResourceType::Topic, name);
        if !allowed && !all {
            unauthorized.push(
                DescribeTopicPartitionsResponseTopic::default()
                    .with_error_code(error_code::TOPIC_AUTHORIZATION_FAILED)
                    .with_name(Some(crate::client::topic_name(name))),
            );
        }
        allowed
    });
    let mut remaining = req.response_partition_limit.clamp(1, response_partitions_max);
    let mut body = DescribeTopicPartitionsResponse::default();
    for name in &names {
        if remaining == 0 {
            // Every partition of the topics before is answered: go on at this one.
            body.next_cursor = Some(Cursor::default().with_topic_name(crate::client::topic_name(name)));
            break;
        }
        let internal = crate::model::is_internal_topic(name);
        let topic = DescribeTopicPartitionsResponseTopic::default()
            .with_name(Some(crate::client::topic_name(name)))
            .with_is_internal(internal);
        let Some(meta) = view.get(name) else {
            if !all {
                let code = if validate_topic_name(name).is_err() {
                    error_code::INVALID_TOPIC_EXCEPTION
                } else {
                    error_code::UNKNOWN_TOPIC_OR_PARTITION
                };
                body.topics.push(topic.with_error_code(code));
            }
            continue;
        };
        let first = if *name == cursor_topic { cursor_partition } else { 0 };
        let end = meta.partitions.min(first.saturating_add(remaining));
        let partitions: Vec<_> = (first..end).map(|p| partition(ctx, frame, &view, name, p)).collect();
        remaining -= partitions.len() as i32;
        body.topics.push(topic.with_topic_id(meta.id).with_partitions(partitions).with_topic_authorized_operations(
            authz::authorized_operations(ctx, frame, &view, ResourceType::Topic, name),
        ));
        if end < meta.partitions {
            body.next_cursor =
                Some(Cursor::default().with_topic_name(crate::client::topic_name(name)).with_partition_index(end));
            break;
        }
    }
    body.topics.extend(unauthorized);
    respond(ApiKey::DescribeTopicPartitions, frame, &body)
}

fn partition(
    ctx: &ShardContext,
    frame: &RequestFrame,
    view: &ClusterView,
    topic: &str,
    p: i32,
) -> DescribeTopicPartitionsResponsePartition {
    let ids = |nodes: &[NodeId]| nodes.iter().map(|n| BrokerId(n.0)).collect::<Vec<_>>();
    let answer = DescribeTopicPartitionsResponsePartition::default()
        .with_partition_index(p)
        .with_eligible_leader_replicas(Some(Vec::new()))
        .with_last_known_elr(Some(Vec::new()));
    let Some((replicas, state)) = view.partition(topic, p) else {
        return answer.with_error_code(error_code::LEADER_NOT_AVAILABLE).with_leader_id(BrokerId(-1));
    };
    let live = |n: &NodeId| view.broker_info(*n).is_some_and(|b| b.is_live());
    let reachable = state.leader.0 == ctx.config.node_id
        || view
            .broker_info(state.leader)
            .is_some_and(|b| b.is_live() && b.endpoint.for_listener(&frame.listener).is_some());
    answer
        .with_leader_id(BrokerId(if reachable { state.leader.0 } else { -1 }))
        .with_leader_epoch(state.leader_epoch.0)
        .with_replica_nodes(ids(replicas))
        .with_isr_nodes(ids(&state.isr))
        .with_offline_replicas(replicas.iter().filter(|n| !live(n)).map(|n| BrokerId(n.0)).collect())
}
