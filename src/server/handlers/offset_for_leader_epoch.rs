//! OffsetForLeaderEpoch: where a leader epoch ends in the leader's log (KIP-101, KIP-279):
//! the start offset of the next epoch, or the log end offset for the current one; for
//! an epoch the leader never had, the largest epoch below it and its end. Followers
//! truncate by it before fetching; consumers use it to detect log truncation (KIP-320).
//! `current_leader_epoch` fences callers with stale or future leadership views.

use bytes::Bytes;
use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{ApiKey, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};

use crate::model::{LeaderEpoch, TopicPartition};
use crate::protocol::{decode_body, ProtocolError, RequestFrame};
use crate::shard::{PartitionOp, PartitionReply};

use super::super::context::ShardContext;
use super::{partition_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: OffsetForLeaderEpochRequest = decode_body(frame)?;
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        // Kafka's handleOffsetForLeaderEpochRequest: a follower (replica id 0 or more)
        // needs CLUSTER_ACTION on the cluster, a consumer DESCRIBE on the topic.
        let view = ctx.view();
        let allowed = if req.replica_id.0 >= 0 {
            super::authz::authorize_cluster(ctx, frame, &view, crate::security::acl::AclOperation::ClusterAction)
        } else {
            super::authz::authorize(
                ctx,
                frame,
                &view,
                crate::security::acl::AclOperation::Describe,
                crate::security::acl::ResourceType::Topic,
                t.topic.as_str(),
            )
        };
        if !allowed {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    EpochEndOffset::default()
                        .with_partition(p.partition)
                        .with_error_code(crate::protocol::error_code::TOPIC_AUTHORIZATION_FAILED)
                        .with_leader_epoch(-1)
                        .with_end_offset(-1)
                })
                .collect();
            topics.push(OffsetForLeaderTopicResult::default().with_topic(t.topic.clone()).with_partitions(partitions));
            continue;
        }
        let calls = t.partitions.iter().map(|p| {
            ctx.call(PartitionOp::EpochEndOffset {
                tp: TopicPartition::new(t.topic.as_str(), p.partition),
                current_leader_epoch: LeaderEpoch(p.current_leader_epoch),
                leader_epoch: LeaderEpoch(p.leader_epoch),
            })
        });
        let partitions = futures::future::join_all(calls)
            .await
            .into_iter()
            .zip(&t.partitions)
            .map(|(r, p)| {
                let answer = EpochEndOffset::default().with_partition(p.partition);
                match r {
                    Ok(PartitionReply::EpochEnd { leader_epoch, end_offset }) => {
                        answer.with_leader_epoch(leader_epoch).with_end_offset(end_offset)
                    }
                    Ok(other) => unreachable!("EpochEndOffset answered {other:?}"),
                    Err(e) => {
                        answer.with_error_code(partition_error_code(&e)).with_leader_epoch(-1).with_end_offset(-1)
                    }
                }
            })
            .collect();
        topics.push(OffsetForLeaderTopicResult::default().with_topic(t.topic.clone()).with_partitions(partitions));
    }
    respond(ApiKey::OffsetForLeaderEpoch, frame, &OffsetForLeaderEpochResponse::default().with_topics(topics))
}
