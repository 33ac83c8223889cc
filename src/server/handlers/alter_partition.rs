//! AlterPartition (between brokers): a partition's leader asks the active coordinator to
//! shrink or expand the ISR. The controller checks the leader, its epoch and the
//! partition epoch (a stale one gets INVALID_UPDATE_VERSION), and only live replicas may
//! be members, each in its current registration when the request names its broker epoch
//! (v3, KIP-903; else INELIGIBLE_REPLICA); the answer carries the committed state.
//! Needs CLUSTER_ACTION on the cluster (CLUSTER_AUTHORIZATION_FAILED for the whole
//! request otherwise), as Kafka's controller.

use bytes::Bytes;
use kafka_protocol::messages::alter_partition_response::{PartitionData, TopicData};
use kafka_protocol::messages::{AlterPartitionRequest, AlterPartitionResponse, ApiKey, BrokerId};

use crate::coordinator::controller::ControllerError;
use crate::coordinator::registry::RegistryError;
use crate::model::{BrokerEpoch, LeaderEpoch, NodeId, PartitionEpoch};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::replication::NO_BROKER_EPOCH;

use super::super::context::ShardContext;
use super::{registry_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: AlterPartitionRequest = decode_body(frame)?;
    let action = crate::security::acl::AclOperation::ClusterAction;
    if !super::authz::authorize_cluster(ctx, frame, &ctx.view(), action) {
        let body = AlterPartitionResponse::default().with_error_code(error_code::CLUSTER_AUTHORIZATION_FAILED);
        return respond(ApiKey::AlterPartition, frame, &body);
    }
    let leader = NodeId(req.broker_id.0);
    let version = frame.api_version;
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = ctx.view().by_id(t.topic_id).map(|(n, _)| n.clone());
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let answer = PartitionData::default().with_partition_index(p.partition_index);
            let Some(name) = name.clone() else {
                partitions.push(answer.with_error_code(error_code::UNKNOWN_TOPIC_OR_PARTITION));
                continue;
            };
            // v3 names each member with its broker epoch (KIP-903), v2 with its id alone.
            let isr: Vec<(NodeId, BrokerEpoch)> = if version >= 3 {
                p.new_isr_with_epochs.iter().map(|b| (NodeId(b.broker_id.0), BrokerEpoch(b.broker_epoch))).collect()
            } else {
                p.new_isr.iter().map(|b| (NodeId(b.0), NO_BROKER_EPOCH)).collect()
            };
            let partition = p.partition_index;
            let (leader_epoch, partition_epoch) = (LeaderEpoch(p.leader_epoch), PartitionEpoch(p.partition_epoch));
            let outcome = ctx
                .metadata
                .write(move |reg| reg.alter_partition(&name, partition, leader, leader_epoch, partition_epoch, &isr))
                .await;
            partitions.push(match outcome {
                Ok(state) => answer
                    .with_leader_id(BrokerId(state.leader.0))
                    .with_leader_epoch(state.leader_epoch.0)
                    .with_isr(state.isr.iter().map(|b| BrokerId(b.0)).collect())
                    .with_partition_epoch(state.partition_epoch.0),
                Err(e) => {
                    tracing::info!(partition, error = %e, "ISR change refused");
                    answer.with_error_code(alter_error_code(&e))
                }
            });
        }
        topics.push(TopicData::default().with_topic_id(t.topic_id).with_partitions(partitions));
    }
    respond(ApiKey::AlterPartition, frame, &AlterPartitionResponse::default().with_topics(topics))
}

fn alter_error_code(e: &RegistryError) -> i16 {
    match e {
        RegistryError::Controller(c) => match c {
            ControllerError::FencedLeaderEpoch { .. } => error_code::FENCED_LEADER_EPOCH,
            ControllerError::UnknownLeaderEpoch { .. } => error_code::UNKNOWN_LEADER_EPOCH,
            ControllerError::InvalidUpdateVersion { .. } => error_code::INVALID_UPDATE_VERSION,
            ControllerError::IneligibleReplica { .. } => error_code::INELIGIBLE_REPLICA,
            ControllerError::NotLeader { .. } => error_code::NOT_LEADER_OR_FOLLOWER,
            ControllerError::UnknownTopicOrPartition { .. } => error_code::UNKNOWN_TOPIC_OR_PARTITION,
            _ => error_code::INVALID_REQUEST,
        },
        other => registry_error_code(other),
    }
}
