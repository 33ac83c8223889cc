//! EndTxn (v0-3): commit or abort the id's transaction. Answered once PrepareCommit or
//! PrepareAbort is written to `__transaction_state` (acks=all); the markers and the
//! Complete* state follow in the background (`server/txn.rs`), as in Kafka. A retry of
//! an EndTxn that went through succeeds; one still being completed gets
//! CONCURRENT_TRANSACTIONS (clients retry). v5's epoch bump per transaction (KIP-890
//! part 2) is not served.
//!
//! Needs WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, EndTxnRequest, EndTxnResponse};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::TxnOp;
use crate::txn::coordinator::ProducerIdAndEpoch;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::super::txn;
use super::{authz, fenced_for_version, respond, txn_outcome_code};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: EndTxnRequest = decode_body(frame)?;
    let txn_id = req.transactional_id.to_string();
    let code = if txn_id.is_empty() {
        error_code::INVALID_REQUEST
    } else if !authz::may_write_transactional_id(ctx, frame, &txn_id) {
        error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    } else {
        let producer = ProducerIdAndEpoch { producer_id: req.producer_id.0, epoch: req.producer_epoch };
        let op = TxnOp::EndTxn { txn_id: txn_id.clone(), producer, commit: req.committed, now_ms: now_ms() };
        let code = fenced_for_version(txn_outcome_code(&txn::call(ctx, op, None).await), frame.api_version, 2);
        tracing::debug!(transactional_id = %txn_id, commit = req.committed, code, "EndTxn");
        code
    };
    respond(ApiKey::EndTxn, frame, &EndTxnResponse::default().with_error_code(code))
}
