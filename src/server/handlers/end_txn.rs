//! EndTxn (v0-5): commit or abort the id's transaction. Answered once PrepareCommit or
//! PrepareAbort is written to `__transaction_state` (acks=all); the markers and the
//! Complete* state follow in the background (`server/txn.rs`), as in Kafka. A retry of
//! an EndTxn that went through succeeds; one still being completed gets
//! CONCURRENT_TRANSACTIONS (clients retry).
//!
//! v5 is transaction version 2 (KIP-890 part 2, `TxnCoordinator::end_txn_v2`): the
//! epoch is bumped at every transaction's end and the answer carries the producer id
//! and epoch the client goes on with (a new id when the epoch ran out); v0-4 answer
//! none. v4 only says the client knows TRANSACTION_ABORTABLE.
//!
//! Needs WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, EndTxnRequest, EndTxnResponse, ProducerId as WireProducerId};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::TxnOp;
use crate::txn::coordinator::{Answer, ProducerIdAndEpoch, NO_PRODUCER_EPOCH, NO_PRODUCER_ID};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::super::txn::{self, TxnOutcome};
use super::{authz, fenced_for_version, respond, txn_outcome_code};

/// The first EndTxn version of transaction version 2.
const first_v2_version: i16 = 5;

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: EndTxnRequest = decode_body(frame)?;
    let txn_id = req.transactional_id.to_string();
    let v2 = frame.api_version >= first_v2_version;
    let (code, next) = if txn_id.is_empty() {
        (error_code::INVALID_REQUEST, None)
    } else if !authz::may_write_transactional_id(ctx, frame, &txn_id) {
        (error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None)
    } else {
        let producer = ProducerIdAndEpoch { producer_id: req.producer_id.0, epoch: req.producer_epoch };
        let outcome = end(ctx, &txn_id, producer, req.committed, v2).await;
        let next = match &outcome {
            TxnOutcome::Answer(Ok(Answer::Producer(p))) => Some(*p),
            _ => None,
        };
        let code = fenced_for_version(txn_outcome_code(&outcome), frame.api_version, 2);
        tracing::debug!(transactional_id = %txn_id, commit = req.committed, code, ?next, "EndTxn");
        (code, next)
    };
    let next = next.unwrap_or(ProducerIdAndEpoch { producer_id: NO_PRODUCER_ID, epoch: NO_PRODUCER_EPOCH });
    let response = EndTxnResponse::default()
        .with_error_code(code)
        .with_producer_id(WireProducerId(next.producer_id))
        .with_producer_epoch(next.epoch);
    respond(ApiKey::EndTxn, frame, &response)
}

/// The coordinator's outcome, with a producer id allocated first when a v2 end finds
/// the epoch exhausted.
async fn end(ctx: &ShardContext, txn_id: &str, producer: ProducerIdAndEpoch, commit: bool, v2: bool) -> TxnOutcome {
    let mut allocated = None;
    loop {
        let op = TxnOp::EndTxn { txn_id: txn_id.to_string(), producer, commit, now_ms: now_ms(), v2, allocated };
        match txn::call(ctx, op, None).await {
            TxnOutcome::NeedProducerId if allocated.is_none() => match txn::allocate_producer_id(ctx).await {
                Ok(id) => allocated = Some(id),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot issue a producer id");
                    return TxnOutcome::NotAvailable;
                }
            },
            other => return other,
        }
    }
}
