//! DescribeProducers (v0): each partition leader's producer state (KIP-664), as the
//! partition log keeps it: per producer id its epoch, last sequence and last timestamp.
//! A topic needs READ (TOPIC_AUTHORIZATION_FAILED for each of its partitions), as Kafka.

use bytes::Bytes;
use kafka_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
use kafka_protocol::messages::{ApiKey, DescribeProducersRequest, DescribeProducersResponse, ProducerId};

use crate::model::TopicPartition;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclOperation, ResourceType};
use crate::shard::{PartitionOp, PartitionReply};

use super::super::context::ShardContext;
use super::{authz, partition_error_code, respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeProducersRequest = decode_body(frame)?;
    let mut topics = Vec::with_capacity(req.topics.len());
    let view = ctx.view();
    for t in &req.topics {
        if !authz::authorize(ctx, frame, &view, AclOperation::Read, ResourceType::Topic, t.name.as_str()) {
            let refused = t.partition_indexes.iter().map(|&index| {
                PartitionResponse::default()
                    .with_partition_index(index)
                    .with_error_code(error_code::TOPIC_AUTHORIZATION_FAILED)
            });
            topics.push(TopicResponse::default().with_name(t.name.clone()).with_partitions(refused.collect()));
            continue;
        }
        let calls = t
            .partition_indexes
            .iter()
            .map(|&index| ctx.call(PartitionOp::DescribeProducers { tp: TopicPartition::new(t.name.as_str(), index) }));
        let replies = futures::future::join_all(calls).await;
        let partitions = t
            .partition_indexes
            .iter()
            .zip(replies)
            .map(|(&index, reply)| {
                let r = PartitionResponse::default().with_partition_index(index);
                match reply {
                    Ok(PartitionReply::Producers(producers)) => r.with_active_producers(
                        producers
                            .into_iter()
                            .map(|p| {
                                ProducerState::default()
                                    .with_producer_id(ProducerId(p.producer_id.0))
                                    .with_producer_epoch(p.epoch.0 as i32)
                                    .with_last_sequence(p.last_sequence)
                                    .with_last_timestamp(p.last_timestamp_ms)
                                    .with_coordinator_epoch(p.coordinator_epoch)
                                    .with_current_txn_start_offset(p.current_txn_start_offset)
                            })
                            .collect(),
                    ),
                    Ok(other) => unreachable!("DescribeProducers answered {other:?}"),
                    Err(e) => {
                        r.with_error_code(partition_error_code(&e)).with_error_message(Some(str_bytes(e.to_string())))
                    }
                }
            })
            .collect();
        topics.push(TopicResponse::default().with_name(t.name.clone()).with_partitions(partitions));
    }
    respond(ApiKey::DescribeProducers, frame, &DescribeProducersResponse::default().with_topics(topics))
}
