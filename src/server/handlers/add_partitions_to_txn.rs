//! AddPartitionsToTxn.
//!
//! v0-3, the client's request: the transaction coordinator adds the partitions to the
//! id's transaction (starting it with the first), written to `__transaction_state`
//! before the answer. As Kafka: if any partition names a topic the metadata does not
//! know (or a partition past its count), those are answered UNKNOWN_TOPIC_OR_PARTITION
//! and the others OPERATION_NOT_ATTEMPTED, and nothing is added; otherwise every
//! partition gets the coordinator's code.
//!
//! v4-5, between brokers (KIP-890 part 1): a batch of transactions. With `verify_only`
//! a partition leader asks, before a producer's first transactional batch in a
//! partition, whether the partition is in the producer's open transaction: NONE or
//! TRANSACTION_ABORTABLE per partition, or the transaction's error (PRODUCER_FENCED,
//! INVALID_PRODUCER_ID_MAPPING, CONCURRENT_TRANSACTIONS, NOT_COORDINATOR...) for all of
//! them. Without it the partitions are added, as for a client.
//!
//! Authorization, as Kafka's KafkaApis: v4+ come from brokers and need CLUSTER_ACTION on
//! the cluster (CLUSTER_AUTHORIZATION_FAILED for the whole request). v0-3 come from
//! clients: WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for
//! every partition), then WRITE on each topic; an internal topic is never writable.
//! Any partition refused or unknown fails the whole request: those partitions get
//! TOPIC_AUTHORIZATION_FAILED or UNKNOWN_TOPIC_OR_PARTITION, the others
//! OPERATION_NOT_ATTEMPTED, and nothing is added.

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey};

use crate::model::TopicPartition;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclOperation, ResourceType};
use crate::shard::TxnOp;
use crate::txn::coordinator::ProducerIdAndEpoch;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::super::txn::{self, TxnOutcome};
use super::{authz, fenced_for_version, respond, txn_outcome_code};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: AddPartitionsToTxnRequest = decode_body(frame)?;
    if frame.api_version >= 4 {
        if !authz::authorize_cluster(ctx, frame, &ctx.view(), AclOperation::ClusterAction) {
            let response =
                AddPartitionsToTxnResponse::default().with_error_code(error_code::CLUSTER_AUTHORIZATION_FAILED);
            return respond(ApiKey::AddPartitionsToTxn, frame, &response);
        }
        let mut results = Vec::with_capacity(req.transactions.len());
        for t in &req.transactions {
            let producer = ProducerIdAndEpoch { producer_id: t.producer_id.0, epoch: t.producer_epoch };
            let codes = if t.verify_only {
                verify(ctx, t.transactional_id.as_str(), producer, &t.topics).await
            } else {
                let none_refused = vec![false; requested(&t.topics).len()];
                add(ctx, t.transactional_id.as_str(), producer, &t.topics, none_refused, frame.api_version).await
            };
            results.push(
                AddPartitionsToTxnResult::default()
                    .with_transactional_id(t.transactional_id.clone())
                    .with_topic_results(topic_results(&t.topics, codes)),
            );
        }
        let response = AddPartitionsToTxnResponse::default().with_results_by_transaction(results);
        return respond(ApiKey::AddPartitionsToTxn, frame, &response);
    }
    let producer =
        ProducerIdAndEpoch { producer_id: req.v3_and_below_producer_id.0, epoch: req.v3_and_below_producer_epoch };
    let txn_id = req.v3_and_below_transactional_id.as_str();
    let codes = if !txn_id.is_empty() && !authz::may_write_transactional_id(ctx, frame, txn_id) {
        vec![error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED; requested(&req.v3_and_below_topics).len()]
    } else {
        let refused = unwritable(ctx, frame, &req.v3_and_below_topics);
        add(ctx, txn_id, producer, &req.v3_and_below_topics, refused, frame.api_version).await
    };
    let results = topic_results(&req.v3_and_below_topics, codes);
    respond(
        ApiKey::AddPartitionsToTxn,
        frame,
        &AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results),
    )
}

fn requested(topics: &[AddPartitionsToTxnTopic]) -> Vec<TopicPartition> {
    topics.iter().flat_map(|t| t.partitions.iter().map(move |p| TopicPartition::new(t.name.as_str(), *p))).collect()
}

/// Per requested partition, in request order: whether the principal may not WRITE its
/// topic (one check, and one denial logged, per topic of the request).
fn unwritable(ctx: &ShardContext, frame: &RequestFrame, topics: &[AddPartitionsToTxnTopic]) -> Vec<bool> {
    let view = ctx.view();
    topics
        .iter()
        .flat_map(|t| {
            let name = t.name.as_str();
            let internal = crate::model::is_internal_topic(name);
            let refused =
                internal || !authz::authorize(ctx, frame, &view, AclOperation::Write, ResourceType::Topic, name);
            t.partitions.iter().map(move |_| refused)
        })
        .collect()
}

/// Add the partitions to the transaction: a code per partition, in request order.
/// `refused` marks the partitions whose topic the principal may not write.
async fn add(
    ctx: &ShardContext,
    txn_id: &str,
    producer: ProducerIdAndEpoch,
    topics: &[AddPartitionsToTxnTopic],
    refused: Vec<bool>,
    version: i16,
) -> Vec<i16> {
    let requested = requested(topics);
    let failed: Vec<Option<i16>> = {
        let reg = ctx.view();
        requested
            .iter()
            .zip(&refused)
            .map(|(tp, refused)| {
                if *refused {
                    Some(error_code::TOPIC_AUTHORIZATION_FAILED)
                } else if !reg.get(&tp.topic).is_some_and(|m| tp.partition >= 0 && tp.partition < m.partitions) {
                    Some(error_code::UNKNOWN_TOPIC_OR_PARTITION)
                } else {
                    None
                }
            })
            .collect()
    };
    if txn_id.is_empty() {
        vec![error_code::INVALID_REQUEST; requested.len()]
    } else if failed.iter().any(Option::is_some) {
        failed.iter().map(|f| f.unwrap_or(error_code::OPERATION_NOT_ATTEMPTED)).collect()
    } else {
        let n = requested.len();
        let op = TxnOp::AddPartitions { txn_id: txn_id.to_string(), producer, partitions: requested, now_ms: now_ms() };
        let code = fenced_for_version(txn_outcome_code(&txn::call(ctx, op, None).await), version, 2);
        vec![code; n]
    }
}

/// verify_only: NONE or TRANSACTION_ABORTABLE per partition, or one error for all.
async fn verify(
    ctx: &ShardContext,
    txn_id: &str,
    producer: ProducerIdAndEpoch,
    topics: &[AddPartitionsToTxnTopic],
) -> Vec<i16> {
    let requested = requested(topics);
    let n = requested.len();
    if txn_id.is_empty() {
        return vec![error_code::INVALID_REQUEST; n];
    }
    let op = TxnOp::Verify { txn_id: txn_id.to_string(), producer, partitions: requested };
    match txn::call(ctx, op, None).await {
        TxnOutcome::Verified(Ok(in_txn)) => in_txn
            .into_iter()
            .map(|yes| if yes { error_code::NONE } else { error_code::TRANSACTION_ABORTABLE })
            .collect(),
        other => vec![txn_outcome_code(&other); n],
    }
}

/// The per-topic results for `topics`, taking `codes` in request order.
fn topic_results(topics: &[AddPartitionsToTxnTopic], codes: Vec<i16>) -> Vec<AddPartitionsToTxnTopicResult> {
    let mut codes = codes.into_iter();
    topics
        .iter()
        .map(|t| {
            AddPartitionsToTxnTopicResult::default().with_name(t.name.clone()).with_results_by_partition(
                t.partitions
                    .iter()
                    .map(|p| {
                        AddPartitionsToTxnPartitionResult::default()
                            .with_partition_index(*p)
                            .with_partition_error_code(codes.next().unwrap_or(error_code::UNKNOWN_SERVER_ERROR))
                    })
                    .collect(),
            )
        })
        .collect()
}
