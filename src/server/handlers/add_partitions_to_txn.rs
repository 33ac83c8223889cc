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

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey};

use crate::model::TopicPartition;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::TxnOp;
use crate::txn::coordinator::ProducerIdAndEpoch;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::super::txn::{self, TxnOutcome};
use super::{fenced_for_version, respond, txn_outcome_code};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: AddPartitionsToTxnRequest = decode_body(frame)?;
    if frame.api_version >= 4 {
        let mut results = Vec::with_capacity(req.transactions.len());
        for t in &req.transactions {
            let producer = ProducerIdAndEpoch { producer_id: t.producer_id.0, epoch: t.producer_epoch };
            let codes = if t.verify_only {
                verify(ctx, t.transactional_id.as_str(), producer, &t.topics).await
            } else {
                add(ctx, t.transactional_id.as_str(), producer, &t.topics, frame.api_version).await
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
    let codes = add(ctx, txn_id, producer, &req.v3_and_below_topics, frame.api_version).await;
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

/// Add the partitions to the transaction: a code per partition, in request order.
async fn add(
    ctx: &ShardContext,
    txn_id: &str,
    producer: ProducerIdAndEpoch,
    topics: &[AddPartitionsToTxnTopic],
    version: i16,
) -> Vec<i16> {
    let requested = requested(topics);
    let unknown: Vec<bool> = {
        let reg = ctx.view();
        requested
            .iter()
            .map(|tp| !reg.get(&tp.topic).is_some_and(|m| tp.partition >= 0 && tp.partition < m.partitions))
            .collect()
    };
    if txn_id.is_empty() {
        vec![error_code::INVALID_REQUEST; requested.len()]
    } else if unknown.iter().any(|u| *u) {
        unknown
            .iter()
            .map(|u| if *u { error_code::UNKNOWN_TOPIC_OR_PARTITION } else { error_code::OPERATION_NOT_ATTEMPTED })
            .collect()
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
