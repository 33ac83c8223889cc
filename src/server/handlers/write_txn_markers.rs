//! WriteTxnMarkers (v1-2; Kafka 4 dropped v0): the transaction coordinator asks each partition's leader to
//! end a producer's transaction there with a COMMIT or ABORT marker (Kafka's
//! `handleWriteTxnMarkersRequest`). Each partition goes to its owner shard, which
//! appends the control batch at its current leader epoch (`PartitionOp::WriteMarker`);
//! it is answered once the in-sync replicas have it (acks=all, as Kafka appends markers),
//! or with the partition's error: NOT_LEADER_OR_FOLLOWER (the coordinator finds the new
//! leader and resends), UNKNOWN_TOPIC_OR_PARTITION, NOT_ENOUGH_REPLICAS,
//! INVALID_PRODUCER_EPOCH (a newer epoch of the producer wrote here),
//! TRANSACTION_COORDINATOR_FENCED (a marker from an older coordinator epoch),
//! REQUEST_TIMED_OUT. Needs CLUSTER_ACTION on the cluster (every partition answers
//! CLUSTER_AUTHORIZATION_FAILED otherwise), as Kafka's. v2 (KIP-1228) carries each
//! marker's transaction version; from 2 the partition takes it only above the epoch its
//! producer wrote at (`ProducerStateManager::check_marker`).

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{ApiKey, WriteTxnMarkersRequest, WriteTxnMarkersResponse};

use crate::model::TopicPartition;
use crate::protocol::{decode_body, decode_newer_body, ProtocolError, RequestFrame};
use crate::shard::{PartitionOp, PartitionReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::produce::await_append;
use super::{partition_error_code, respond};

/// How long a marker may wait for the in-sync replicas (Kafka's coordinator sends with
/// `request.timeout.ms`, 30 s).
const marker_timeout_ms: u64 = 30_000;

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let (req, versions) = if frame.api_version >= 2 {
        decode_newer_body(frame, crate::protocol::newer::decode_write_txn_markers_v2)?
    } else {
        let req: WriteTxnMarkersRequest = decode_body(frame)?;
        let versions = vec![0; req.markers.len()];
        (req, versions)
    };
    let action = crate::security::acl::AclOperation::ClusterAction;
    let allowed = super::authz::authorize_cluster(ctx, frame, &ctx.view(), action);
    let mut markers = Vec::with_capacity(req.markers.len());
    for (m, &transaction_version) in req.markers.iter().zip(&versions) {
        let mut topics = Vec::with_capacity(m.topics.len());
        for t in &m.topics {
            let calls = t.partition_indexes.iter().map(|&partition| async move {
                if !allowed {
                    return Err(crate::protocol::error_code::CLUSTER_AUTHORIZATION_FAILED);
                }
                let op = PartitionOp::WriteMarker {
                    tp: TopicPartition::new(t.name.as_str(), partition),
                    producer_id: m.producer_id.0,
                    producer_epoch: m.producer_epoch,
                    coordinator_epoch: m.coordinator_epoch,
                    commit: m.transaction_result,
                    now_ms: now_ms(),
                    transaction_version,
                };
                match ctx.call(op).await {
                    Ok(PartitionReply::Produced { written, durable, replicated, .. }) => {
                        let timeout = Duration::from_millis(marker_timeout_ms);
                        await_append(written, durable, replicated, timeout).await.map_err(|(code, _)| code)
                    }
                    Ok(other) => unreachable!("WriteMarker answered {other:?}"),
                    Err(e) => {
                        tracing::debug!(topic = t.name.as_str(), partition, producer_id = m.producer_id.0,
                            error = %e, "transaction marker refused");
                        Err(partition_error_code(&e))
                    }
                }
            });
            let results = futures::future::join_all(calls).await;
            let partitions = t
                .partition_indexes
                .iter()
                .zip(results)
                .map(|(&partition, r)| {
                    WritableTxnMarkerPartitionResult::default()
                        .with_partition_index(partition)
                        .with_error_code(r.err().unwrap_or(0))
                })
                .collect();
            topics.push(WritableTxnMarkerTopicResult::default().with_name(t.name.clone()).with_partitions(partitions));
        }
        markers.push(WritableTxnMarkerResult::default().with_producer_id(m.producer_id).with_topics(topics));
    }
    respond(ApiKey::WriteTxnMarkers, frame, &WriteTxnMarkersResponse::default().with_markers(markers))
}
