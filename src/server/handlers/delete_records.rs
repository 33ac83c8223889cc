//! DeleteRecords: each partition leader moves its log start offset up to the requested
//! offset (-1: the high watermark), as Kafka does: above the high watermark is
//! OFFSET_OUT_OF_RANGE, a replica that does not lead answers NOT_LEADER_OR_FOLLOWER
//! (clients send each partition to its leader), and the answer's low watermark is the
//! new log start. The answer comes once the new log start is durable on the leader
//! (`shard/log_start.rs`); followers take it from their next fetch answer. Kafka also
//! waits for every live follower's log start to reach it (its DelayedDeleteRecords):
//! Spate does not.

use bytes::Bytes;
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::{ApiKey, DeleteRecordsRequest, DeleteRecordsResponse};

use crate::model::TopicPartition;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{PartitionOp, PartitionReply};

use super::super::context::ShardContext;
use super::{partition_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DeleteRecordsRequest = decode_body(frame)?;
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        // Kafka's handleDeleteRecordsRequest: DELETE on the topic.
        let denied = !super::authz::authorize(
            ctx,
            frame,
            &ctx.view(),
            crate::security::acl::AclOperation::Delete,
            crate::security::acl::ResourceType::Topic,
            t.name.as_str(),
        );
        let calls = t.partitions.iter().map(|p| async move {
            if denied {
                return (-1, error_code::TOPIC_AUTHORIZATION_FAILED);
            }
            let tp = TopicPartition::new(t.name.as_str(), p.partition_index);
            match ctx.call(PartitionOp::DeleteRecords { tp: tp.clone(), offset: p.offset }).await {
                Ok(PartitionReply::LogStartMoving(moved)) => match moved.await {
                    Ok(Ok(low_watermark)) => (low_watermark.0, error_code::NONE),
                    Ok(Err(e)) => (-1, partition_error_code(&e)),
                    // The owner shard dropped the move (shutting down).
                    Err(_) => (-1, error_code::NOT_LEADER_OR_FOLLOWER),
                },
                Ok(other) => unreachable!("DeleteRecords answered {other:?}"),
                Err(e) => (-1, partition_error_code(&e)),
            }
        });
        let replies = futures::future::join_all(calls).await;
        let partitions = t
            .partitions
            .iter()
            .zip(replies)
            .map(|(p, (low_watermark, code))| {
                DeleteRecordsPartitionResult::default()
                    .with_partition_index(p.partition_index)
                    .with_low_watermark(low_watermark)
                    .with_error_code(code)
            })
            .collect();
        topics.push(DeleteRecordsTopicResult::default().with_name(t.name.clone()).with_partitions(partitions));
    }
    respond(ApiKey::DeleteRecords, frame, &DeleteRecordsResponse::default().with_topics(topics))
}
