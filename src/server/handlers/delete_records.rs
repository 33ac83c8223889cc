//! DeleteRecords: each partition leader moves its log start offset up to the requested
//! offset (-1: the high watermark), as Kafka does: above the high watermark is
//! OFFSET_OUT_OF_RANGE, a replica that does not lead answers NOT_LEADER_OR_FOLLOWER
//! (clients send each partition to its leader), and the answer's low watermark is the
//! partition's low watermark. The leader's new log start is made durable first
//! (`shard/log_start.rs`); followers take it from their next fetch answer and say their
//! own in the fetch after. The answer comes, as Kafka's DelayedDeleteRecords, once the
//! low watermark (the smallest log start over the leader and its followers on live
//! brokers) reaches the new log start; past the request's timeout it is
//! REQUEST_TIMED_OUT (the records are deleted on the leader all the same).

use std::time::Duration;

use bytes::Bytes;
use futures::future::{select, Either};
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::{ApiKey, DeleteRecordsRequest, DeleteRecordsResponse};

use crate::model::TopicPartition;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{PartitionOp, PartitionReply};

use super::super::context::ShardContext;
use super::{partition_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DeleteRecordsRequest = decode_body(frame)?;
    let timeout = Duration::from_millis(u64::try_from(req.timeout_ms).unwrap_or(0));
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
            let log_start = match ctx.call(PartitionOp::DeleteRecords { tp: tp.clone(), offset: p.offset }).await {
                Ok(PartitionReply::LogStartMoving(moved)) => moved.await,
                Ok(other) => unreachable!("DeleteRecords answered {other:?}"),
                Err(e) => return (-1, partition_error_code(&e)),
            };
            let log_start = match log_start {
                Ok(Ok(log_start)) => log_start,
                Ok(Err(e)) => return (-1, partition_error_code(&e)),
                // The owner shard dropped the move (shutting down).
                Err(_) => return (-1, error_code::NOT_LEADER_OR_FOLLOWER),
            };
            let reached = match ctx.call(PartitionOp::AwaitLowWatermark { tp, offset: log_start.0 }).await {
                Ok(PartitionReply::LowWatermarkReached(reached)) => reached,
                Ok(other) => unreachable!("AwaitLowWatermark answered {other:?}"),
                Err(e) => return (-1, partition_error_code(&e)),
            };
            match select(reached, Box::pin(glommio::timer::sleep(timeout))).await {
                Either::Left((Ok(Ok(low_watermark)), _)) => (low_watermark.0, error_code::NONE),
                Either::Left((Ok(Err(e)), _)) => (-1, partition_error_code(&e)),
                Either::Left((Err(_), _)) => (-1, error_code::NOT_LEADER_OR_FOLLOWER),
                Either::Right(_) => (-1, error_code::REQUEST_TIMED_OUT),
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
