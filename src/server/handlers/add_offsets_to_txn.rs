//! AddOffsetsToTxn (v0-4): the group's `__consumer_offsets` partition joins the id's
//! transaction (as Kafka's coordinator does), so its TxnOffsetCommits are committed or
//! aborted by the transaction's markers. v4 only says the client knows
//! TRANSACTION_ABORTABLE; transaction version 2 clients send none (TxnOffsetCommit v5).
//!
//! Needs WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then
//! READ on the group (GROUP_AUTHORIZATION_FAILED), as Kafka's KafkaApis checks them.

use bytes::Bytes;
use kafka_protocol::messages::{AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, ApiKey};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{group_partition, TxnOp};
use crate::txn::coordinator::ProducerIdAndEpoch;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::super::txn;
use super::{authz, fenced_for_version, respond, txn_outcome_code};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: AddOffsetsToTxnRequest = decode_body(frame)?;
    let txn_id = req.transactional_id.to_string();
    let code = if txn_id.is_empty() {
        error_code::INVALID_REQUEST
    } else if !authz::may_write_transactional_id(ctx, frame, &txn_id) {
        error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    } else if !authz::may_read_group(ctx, frame, req.group_id.as_str()) {
        error_code::GROUP_AUTHORIZATION_FAILED
    } else {
        let producer = ProducerIdAndEpoch { producer_id: req.producer_id.0, epoch: req.producer_epoch };
        let partitions = vec![group_partition(req.group_id.as_str())];
        let op = TxnOp::AddPartitions { txn_id, producer, partitions, now_ms: now_ms() };
        fenced_for_version(txn_outcome_code(&txn::call(ctx, op, None).await), frame.api_version, 2)
    };
    respond(ApiKey::AddOffsetsToTxn, frame, &AddOffsetsToTxnResponse::default().with_error_code(code))
}
