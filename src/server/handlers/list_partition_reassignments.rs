//! ListPartitionReassignments (KIP-455; kafka-reassign-partitions --list and --verify,
//! the admin's `listPartitionReassignments`), answered from this broker's view of the
//! cluster: every reassignment in progress, or those of the named partitions (named
//! partitions with none in progress, or that do not exist, are left out, as Kafka
//! does). Each carries the partition's replicas (target first, then the leaving ones)
//! and the replicas being added and removed. DESCRIBE on the cluster is required.

use std::collections::BTreeSet;

use bytes::Bytes;
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
};

use crate::model::NodeId;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

fn broker_ids(nodes: &[NodeId]) -> Vec<BrokerId> {
    nodes.iter().map(|n| BrokerId(n.0)).collect()
}

pub fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: ListPartitionReassignmentsRequest = decode_body(frame)?;
    let view = ctx.view();
    // Kafka's handleListPartitionReassignmentsRequest: DESCRIBE on the cluster.
    if !super::authz::authorize_cluster(ctx, frame, &view, crate::security::acl::AclOperation::Describe) {
        let body = ListPartitionReassignmentsResponse::default()
            .with_error_code(error_code::CLUSTER_AUTHORIZATION_FAILED)
            .with_error_message(Some(str_bytes(super::authz::CLUSTER_DENIED.to_string())));
        return respond(ApiKey::ListPartitionReassignments, frame, &body);
    }
    let wanted: Option<BTreeSet<(&str, i32)>> = req
        .topics
        .as_ref()
        .map(|ts| ts.iter().flat_map(|t| t.partition_indexes.iter().map(move |p| (t.name.as_str(), *p))).collect());
    let mut topics: Vec<OngoingTopicReassignment> = Vec::new();
    for (topic, partition, replicas, r) in view.reassignments() {
        if wanted.as_ref().is_some_and(|w| !w.contains(&(topic, partition))) {
            continue;
        }
        let ongoing = OngoingPartitionReassignment::default()
            .with_partition_index(partition)
            .with_replicas(broker_ids(replicas))
            .with_adding_replicas(broker_ids(&r.adding))
            .with_removing_replicas(broker_ids(&r.removing));
        match topics.last_mut() {
            Some(t) if t.name.as_str() == topic => t.partitions.push(ongoing),
            _ => topics.push(
                OngoingTopicReassignment::default()
                    .with_name(TopicName(str_bytes(topic.to_string())))
                    .with_partitions(vec![ongoing]),
            ),
        }
    }
    respond(
        ApiKey::ListPartitionReassignments,
        frame,
        &ListPartitionReassignmentsResponse::default().with_topics(topics),
    )
}
