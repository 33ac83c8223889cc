//! AddPartitionsToTxn (v0-3, the client's request): the transaction coordinator adds the
//! partitions to the id's transaction (starting it with the first), written to
//! `__transaction_state` before the answer. As Kafka: if any partition names a topic the
//! metadata does not know (or a partition past its count), those are answered
//! UNKNOWN_TOPIC_OR_PARTITION and the others OPERATION_NOT_ATTEMPTED, and nothing is
//! added; otherwise every partition gets the coordinator's code. v4+ (KIP-890 part 1,
//! brokers verifying a partition is in a transaction) is not served.

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey};

use crate::model::TopicPartition;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::TxnOp;
use crate::txn::coordinator::ProducerIdAndEpoch;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::super::txn;
use super::{fenced_for_version, respond, txn_outcome_code};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: AddPartitionsToTxnRequest = decode_body(frame)?;
    let requested: Vec<TopicPartition> = req
        .v3_and_below_topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| TopicPartition::new(t.name.as_str(), *p)))
        .collect();
    let unknown: Vec<bool> = {
        let reg = ctx.view();
        requested
            .iter()
            .map(|tp| !reg.get(&tp.topic).is_some_and(|m| tp.partition >= 0 && tp.partition < m.partitions))
            .collect()
    };
    let txn_id = req.v3_and_below_transactional_id.to_string();
    let codes: Vec<i16> = if txn_id.is_empty() {
        vec![error_code::INVALID_REQUEST; requested.len()]
    } else if unknown.iter().any(|u| *u) {
        unknown
            .iter()
            .map(|u| if *u { error_code::UNKNOWN_TOPIC_OR_PARTITION } else { error_code::OPERATION_NOT_ATTEMPTED })
            .collect()
    } else {
        let producer =
            ProducerIdAndEpoch { producer_id: req.v3_and_below_producer_id.0, epoch: req.v3_and_below_producer_epoch };
        let op = TxnOp::AddPartitions { txn_id, producer, partitions: requested.clone(), now_ms: now_ms() };
        let code = fenced_for_version(txn_outcome_code(&txn::call(ctx, op, None).await), frame.api_version, 2);
        vec![code; requested.len()]
    };
    let mut codes = codes.into_iter();
    let results = req
        .v3_and_below_topics
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
        .collect();
    respond(
        ApiKey::AddPartitionsToTxn,
        frame,
        &AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results),
    )
}
