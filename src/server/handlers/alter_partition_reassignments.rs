//! AlterPartitionReassignments (KIP-455; kafka-reassign-partitions --execute and
//! --cancel, the admin's `alterPartitionReassignments`) on the active coordinator (other
//! brokers forward it). Each named partition gets its target replicas, or with none
//! (`replicas` null) its reassignment cancelled, as `Controller::alter_reassignment`
//! decides: new replicas copy the log as followers and join the ISR, then the partition
//! keeps only the target replicas (a leaving leader hands over to a target replica in
//! the ISR) and the brokers left out delete their copy. Errors per partition, as Kafka:
//! UNKNOWN_TOPIC_OR_PARTITION, INVALID_REPLICA_ASSIGNMENT (a broker not registered,
//! named twice, no live one, an empty list), NO_REASSIGNMENT_IN_PROGRESS (a cancel with
//! nothing to cancel), and from v1 (KIP-860, `--disallow-replication-factor-change`)
//! INVALID_REPLICATION_FACTOR for a target that would change the replication factor
//! when the request does not allow it; the answer says which it applied. ALTER on the
//! cluster is required.

use std::collections::BTreeSet;

use bytes::Bytes;
use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, ApiKey, TopicName,
};

use crate::model::{limits, NodeId};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: AlterPartitionReassignmentsRequest = decode_body(frame)?;
    // v0 decodes as allowed (Kafka's default).
    let allow_rf_change = req.allow_replication_factor_change;
    let refuse = |code: i16, message: String| {
        let responses = req
            .topics
            .iter()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        ReassignablePartitionResponse::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(code)
                            .with_error_message(Some(str_bytes(message.clone())))
                    })
                    .collect();
                ReassignableTopicResponse::default().with_name(t.name.clone()).with_partitions(partitions)
            })
            .collect();
        let body = AlterPartitionReassignmentsResponse::default()
            .with_allow_replication_factor_change(allow_rf_change)
            .with_error_code(code)
            .with_error_message(Some(str_bytes(message.clone())))
            .with_responses(responses);
        respond(ApiKey::AlterPartitionReassignments, frame, &body)
    };
    // Kafka's handleAlterPartitionReassignmentsRequest: ALTER on the cluster.
    if !super::authz::authorize_cluster(ctx, frame, &ctx.view(), crate::security::acl::AclOperation::Alter) {
        return refuse(error_code::CLUSTER_AUTHORIZATION_FAILED, super::authz::CLUSTER_DENIED.into());
    }
    let named: u64 = req.topics.iter().map(|t| t.partitions.len() as u64).sum();
    // The shape walk bounds the request's array elements as a whole to the same limit;
    // checked again because one answer is built per named partition.
    if named > limits::request_array_elements_max {
        return refuse(error_code::INVALID_REQUEST, "too many partitions in one request".into());
    }
    // A partition named twice is refused on its own (Kafka answers the whole request
    // with one outcome per partition; two different targets have no meaning).
    let mut seen = BTreeSet::new();
    let mut twice = BTreeSet::new();
    for t in &req.topics {
        for p in &t.partitions {
            if !seen.insert((t.name.to_string(), p.partition_index)) {
                twice.insert((t.name.to_string(), p.partition_index));
            }
        }
    }
    let requests: Vec<(String, i32, Option<Vec<NodeId>>)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                let target = p.replicas.as_ref().map(|r| r.iter().map(|b| NodeId(b.0)).collect());
                (t.name.to_string(), p.partition_index, target)
            })
        })
        .filter(|(topic, p, _)| !twice.contains(&(topic.clone(), *p)))
        .collect();
    let outcome = ctx.metadata.write(move |reg| reg.alter_reassignments(requests, allow_rf_change)).await;
    let outcomes = match outcome {
        Ok(o) => o,
        Err(e) => return refuse(super::registry_error_code(&e), e.to_string()),
    };
    let mut responses: Vec<ReassignableTopicResponse> = Vec::new();
    let mut answer = |topic: String, partition: i32, code: i16, message: Option<String>| {
        let r = ReassignablePartitionResponse::default()
            .with_partition_index(partition)
            .with_error_code(code)
            .with_error_message(message.map(str_bytes));
        match responses.iter_mut().find(|t| t.name.as_str() == topic) {
            Some(t) => t.partitions.push(r),
            None => responses.push(
                ReassignableTopicResponse::default().with_name(TopicName(str_bytes(topic))).with_partitions(vec![r]),
            ),
        }
    };
    for (topic, partition, result) in outcomes {
        match result {
            Ok(()) => {
                tracing::info!(topic = %topic, partition, "partition reassignment changed");
                answer(topic, partition, error_code::NONE, None)
            }
            Err(e) => answer(topic, partition, super::registry_error_code(&e), Some(e.to_string())),
        }
    }
    for (topic, partition) in twice {
        answer(topic, partition, error_code::INVALID_REQUEST, Some("the partition is named more than once".into()));
    }
    respond(
        ApiKey::AlterPartitionReassignments,
        frame,
        &AlterPartitionReassignmentsResponse::default()
            .with_allow_replication_factor_change(allow_rf_change)
            .with_responses(responses),
    )
}
