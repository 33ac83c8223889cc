//! ListOffsets: earliest (-2), latest (-1: the high watermark, or the last stable offset
//! for isolation_level 1, read_committed), the first offset at or after a timestamp, the
//! record with the largest timestamp (-3, v7+), earliest local (-4, v8+: the log start,
//! there being no tiered storage), latest tiered (-5, v9+) and earliest pending upload
//! (-6, v11+), both offset -1 as Kafka answers without remote storage. A special
//! timestamp below the version that defines it, or a negative one no version defines,
//! is UNSUPPORTED_VERSION for its partition, as Kafka 4.4 answers (measured side by
//! side). The partition's shard answers (`PartitionOp::ListOffset`).

use bytes::Bytes;
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::{ApiKey, ListOffsetsRequest, ListOffsetsResponse};

use crate::model::{LeaderEpoch, TopicPartition};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{list_offsets, PartitionOp, PartitionReply};

use super::super::context::ShardContext;
use super::{partition_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: ListOffsetsRequest = decode_body(frame)?;
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        // Kafka's handleListOffsetRequest: DESCRIBE on the topic.
        if !super::authz::authorize(
            ctx,
            frame,
            &ctx.view(),
            crate::security::acl::AclOperation::Describe,
            crate::security::acl::ResourceType::Topic,
            t.name.as_str(),
        ) {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(crate::protocol::error_code::TOPIC_AUTHORIZATION_FAILED)
                        .with_offset(-1)
                        .with_timestamp(-1)
                })
                .collect();
            topics.push(ListOffsetsTopicResponse::default().with_name(t.name.clone()).with_partitions(partitions));
            continue;
        }
        let calls = t.partitions.iter().map(|p| async move {
            let defined = list_offsets::first_version(p.timestamp).is_some_and(|v| frame.api_version >= v);
            if !defined {
                return Err(error_code::UNSUPPORTED_VERSION);
            }
            ctx.call(PartitionOp::ListOffset {
                tp: TopicPartition::new(t.name.as_str(), p.partition_index),
                timestamp_ms: p.timestamp,
                current_leader_epoch: LeaderEpoch(p.current_leader_epoch),
                read_committed: req.isolation_level == 1,
            })
            .await
            .map_err(|e| partition_error_code(&e))
        });
        let replies = futures::future::join_all(calls).await;
        let partitions = t
            .partitions
            .iter()
            .zip(replies)
            .map(|(p, reply)| {
                let r = ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
                match reply {
                    Ok(PartitionReply::Offset { offset, timestamp_ms, leader_epoch }) => {
                        let r = r.with_offset(offset.0).with_timestamp(timestamp_ms);
                        if frame.api_version >= 4 {
                            r.with_leader_epoch(leader_epoch)
                        } else {
                            r
                        }
                    }
                    Ok(other) => unreachable!("ListOffset answered {other:?}"),
                    Err(code) => r.with_error_code(code).with_offset(-1).with_timestamp(-1),
                }
            })
            .collect();
        topics.push(ListOffsetsTopicResponse::default().with_name(t.name.clone()).with_partitions(partitions));
    }
    respond(ApiKey::ListOffsets, frame, &ListOffsetsResponse::default().with_topics(topics))
}
