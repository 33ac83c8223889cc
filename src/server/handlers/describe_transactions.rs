//! DescribeTransactions (v0): each id's state as its coordinator holds it (acknowledged
//! writes only). An id this broker does not coordinate is NOT_COORDINATOR (the admin
//! client asks each id's coordinator), an unknown one TRANSACTIONAL_ID_NOT_FOUND.
//!
//! As Kafka: an id needs DESCRIBE on it (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and
//! the partitions listed are only those of topics the principal may DESCRIBE.

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::{
    ApiKey, DescribeTransactionsRequest, DescribeTransactionsResponse, ProducerId as WireProducerId,
};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclOperation, ResourceType};
use crate::shard::TxnOp;

use super::super::context::ShardContext;
use super::super::txn::{self, TxnOutcome};
use super::{authz, respond, str_bytes, txn_outcome_code};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeTransactionsRequest = decode_body(frame)?;
    let mut states = Vec::with_capacity(req.transactional_ids.len());
    for id in &req.transactional_ids {
        let base = TransactionState::default()
            .with_transactional_id(id.clone())
            .with_producer_id(WireProducerId(-1))
            .with_producer_epoch(-1)
            .with_transaction_start_time_ms(-1)
            .with_transaction_state(str_bytes(""));
        let view = ctx.view();
        if !authz::authorize(ctx, frame, &view, AclOperation::Describe, ResourceType::TransactionalId, id.as_str()) {
            states.push(base.with_error_code(error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED));
            continue;
        }
        let outcome = txn::call(ctx, TxnOp::Describe { txn_id: id.to_string() }, None).await;
        states.push(match outcome {
            TxnOutcome::Describe(Some(r)) => {
                let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
                let describable = |topic: &str| {
                    authz::authorize_quietly(ctx, frame, &view, AclOperation::Describe, ResourceType::Topic, topic)
                };
                for tp in r.partitions.iter().filter(|tp| describable(&tp.topic)) {
                    topics.entry(tp.topic.as_str()).or_default().push(tp.partition);
                }
                base.with_transaction_state(str_bytes(txn::state_name(r.state)))
                    .with_transaction_timeout_ms(r.timeout_ms)
                    .with_transaction_start_time_ms(r.start_ms)
                    .with_producer_id(WireProducerId(r.producer_id))
                    .with_producer_epoch(r.producer_epoch)
                    .with_topics(
                        topics
                            .into_iter()
                            .map(|(t, ps)| {
                                TopicData::default().with_topic(crate::client::topic_name(t)).with_partitions(ps)
                            })
                            .collect(),
                    )
            }
            TxnOutcome::Describe(None) => base.with_error_code(error_code::TRANSACTIONAL_ID_NOT_FOUND),
            other => base.with_error_code(match txn_outcome_code(&other) {
                error_code::NONE => error_code::UNKNOWN_SERVER_ERROR,
                code => code,
            }),
        });
    }
    respond(
        ApiKey::DescribeTransactions,
        frame,
        &DescribeTransactionsResponse::default().with_transaction_states(states),
    )
}
