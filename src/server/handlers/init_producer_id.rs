//! InitProducerId (v0-5) for idempotent producers: a new producer id with epoch 0, from
//! the block the active coordinator reserved in `/latest_producer_id_block` (a broker
//! that is not the coordinator forwards the request, `server/forward.rs`).
//!
//! The id and epoch a request carries (v3+, KIP-360) are checked as Kafka's
//! `KafkaApis.handleInitProducerIdRequest` checks them: both -1 (a first request) or
//! both set; one without the other is INVALID_REQUEST. A producer without a
//! transactional id then always gets a new id with epoch 0, whatever id and epoch it
//! passed (Kafka's `TransactionCoordinator.handleInitProducerId`: "if the transactional
//! id is null, then always blindly accept the request and return a new producerId").
//! Nothing tracks a non-transactional producer's epoch outside the partitions it wrote
//! to, so the broker cannot verify that the caller owns the id it names; handing out
//! epoch + 1 on its word would let any client fence another producer's id. An
//! idempotent client bumps its epoch itself (the Java client does so locally, KIP-360)
//! and asks for a new id when the epoch is exhausted; the partitions check the epochs
//! of the batches (`txn::producer_state`).
//!
//! With a transactional id the request goes to the id's transaction coordinator (this
//! broker when it leads the id's `__transaction_state` partition, else NOT_COORDINATOR;
//! never forwarded to the active coordinator), which bumps the epoch, fencing the
//! previous producer, or hands out a new id (`txn::coordinator::init_producer_id`; the
//! id comes from the same allocator, `server/txn.rs`). An empty transactional id is
//! INVALID_REQUEST, a transaction.timeout.ms above transaction.max.timeout.ms (15 min)
//! INVALID_TRANSACTION_TIMEOUT; PRODUCER_FENCED is INVALID_PRODUCER_EPOCH below v4, as
//! Kafka answers older clients.

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProducerId as WireProducerId};

use crate::coordinator::registry::RegistryError;
use crate::model::{ProducerEpoch, ProducerId};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use crate::shard::TxnOp;
use crate::txn::coordinator::{Answer, ProducerIdAndEpoch};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::super::txn::{self, TxnOutcome};
use super::{respond, txn_outcome_code};

/// What an InitProducerId request gets, from its fields alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// A new producer id, epoch 0.
    NewProducerId,
    /// The transaction coordinator of the id decides.
    Transactional,
    /// Refused with this error code.
    Refuse(i16),
}

/// Kafka's rules for the request's transactional id, producer id and producer epoch
/// (the last two are -1 below v3, where the request has no such fields).
fn decide(transactional_id: Option<&str>, producer_id: i64, producer_epoch: i16) -> Decision {
    let no_id = producer_id == ProducerId::NONE.0;
    let no_epoch = producer_epoch == ProducerEpoch::NONE.0;
    if no_id != no_epoch {
        return Decision::Refuse(error_code::INVALID_REQUEST);
    }
    match transactional_id {
        Some("") => Decision::Refuse(error_code::INVALID_REQUEST),
        Some(_) => Decision::Transactional,
        None => Decision::NewProducerId,
    }
}

/// Ask `txn_id`'s coordinator; a new id or an exhausted epoch needs a producer id from
/// the allocator first.
async fn transactional(ctx: &ShardContext, req: &InitProducerIdRequest, txn_id: &str) -> Result<(i64, i16), i16> {
    let expected = (req.producer_id.0 != ProducerId::NONE.0)
        .then_some(ProducerIdAndEpoch { producer_id: req.producer_id.0, epoch: req.producer_epoch });
    let mut allocated = None;
    loop {
        let op = TxnOp::InitProducerId {
            txn_id: txn_id.to_string(),
            timeout_ms: req.transaction_timeout_ms,
            expected,
            allocated,
            now_ms: now_ms(),
        };
        match txn::call(ctx, op, None).await {
            TxnOutcome::NeedProducerId if allocated.is_none() => match txn::allocate_producer_id(ctx).await {
                Ok(id) => allocated = Some(id),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot issue a producer id");
                    return Err(error_code::COORDINATOR_NOT_AVAILABLE);
                }
            },
            TxnOutcome::Answer(Ok(Answer::Producer(p))) => return Ok((p.producer_id, p.epoch)),
            other => return Err(txn_outcome_code(&other)),
        }
    }
}

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: InitProducerIdRequest = decode_body(frame)?;
    let decision = decide(req.transactional_id.as_deref().map(|s| &**s), req.producer_id.0, req.producer_epoch);
    // Kafka's handleInitProducerIdRequest: WRITE on the transactional id; without one,
    // IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679).
    let decision = {
        use crate::security::acl::{AclOperation, ResourceType};
        let view = ctx.view();
        match req.transactional_id.as_deref().map(|s| &**s) {
            Some(id)
                if !super::authz::authorize(
                    ctx,
                    frame,
                    &view,
                    AclOperation::Write,
                    ResourceType::TransactionalId,
                    id,
                ) =>
            {
                Decision::Refuse(error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            }
            None if !super::authz::authorize_any(ctx, frame, &view, AclOperation::Write, ResourceType::Topic)
                && !super::authz::authorize_cluster(ctx, frame, &view, AclOperation::IdempotentWrite) =>
            {
                Decision::Refuse(error_code::CLUSTER_AUTHORIZATION_FAILED)
            }
            _ => decision,
        }
    };
    let outcome: Result<(ProducerId, ProducerEpoch), i16> = match decision {
        Decision::Transactional => {
            let txn_id = req.transactional_id.as_deref().map(|s| &**s).unwrap_or_default();
            transactional(ctx, &req, txn_id).await.map(|(id, epoch)| (ProducerId(id), ProducerEpoch(epoch))).map_err(
                |code| match code {
                    error_code::PRODUCER_FENCED if frame.api_version < 4 => error_code::INVALID_PRODUCER_EPOCH,
                    code => code,
                },
            )
        }
        Decision::Refuse(code) => {
            tracing::debug!(transactional_id = ?req.transactional_id, producer_id = req.producer_id.0,
                producer_epoch = req.producer_epoch, code, "InitProducerId refused");
            Err(code)
        }
        Decision::NewProducerId => match ctx.metadata.write(|reg| reg.next_producer_id()).await {
            Ok(id) => Ok((id, ProducerEpoch(0))),
            Err(e) => {
                tracing::warn!(error = %e, "cannot issue a producer id");
                Err(match e {
                    RegistryError::NotController(_) => error_code::NOT_COORDINATOR,
                    _ => error_code::COORDINATOR_NOT_AVAILABLE,
                })
            }
        },
    };
    let body = match outcome {
        Ok((id, epoch)) => {
            tracing::debug!(producer_id = %id, producer_epoch = %epoch, "producer id issued");
            InitProducerIdResponse::default().with_producer_id(WireProducerId(id.0)).with_producer_epoch(epoch.0)
        }
        Err(code) => InitProducerIdResponse::default()
            .with_error_code(code)
            .with_producer_id(WireProducerId(-1))
            .with_producer_epoch(-1),
    };
    respond(ApiKey::InitProducerId, frame, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_request_gets_a_new_id() {
        assert_eq!(decide(None, -1, -1), Decision::NewProducerId);
    }

    #[test]
    fn a_producer_passing_its_id_and_epoch_gets_a_new_id_as_in_kafka() {
        // Kafka: a null transactional id "always blindly" gets a new id, epoch 0; the
        // broker cannot tell a producer's current epoch from a claimed one.
        assert_eq!(decide(None, 7, 0), Decision::NewProducerId);
        assert_eq!(decide(None, 7, 41), Decision::NewProducerId);
        // An exhausted epoch, and ids and epochs no one was ever issued: a new id too,
        // never the claimed id with a bumped epoch.
        assert_eq!(decide(None, 7, i16::MAX - 1), Decision::NewProducerId);
        assert_eq!(decide(None, 7, i16::MAX), Decision::NewProducerId);
        assert_eq!(decide(None, i64::MAX, 3), Decision::NewProducerId);
    }

    #[test]
    fn an_id_without_an_epoch_or_an_epoch_without_an_id_is_an_invalid_request() {
        assert_eq!(decide(None, 7, -1), Decision::Refuse(error_code::INVALID_REQUEST));
        assert_eq!(decide(None, -1, 0), Decision::Refuse(error_code::INVALID_REQUEST));
        assert_eq!(decide(Some("tx"), -1, 5), Decision::Refuse(error_code::INVALID_REQUEST));
    }

    #[test]
    fn other_negative_ids_and_epochs_are_ids_and_epochs_kafka_passes_on() {
        // Kafka compares with -1 only; with no transactional id the values are then ignored.
        assert_eq!(decide(None, -5, -5), Decision::NewProducerId);
        assert_eq!(decide(None, i64::MIN, i16::MIN), Decision::NewProducerId);
    }

    #[test]
    fn a_transactional_id_goes_to_its_coordinator_and_an_empty_one_is_invalid() {
        assert_eq!(decide(Some("tx"), -1, -1), Decision::Transactional);
        assert_eq!(decide(Some("tx"), 7, 2), Decision::Transactional);
        assert_eq!(decide(Some(""), -1, -1), Decision::Refuse(error_code::INVALID_REQUEST));
    }
}
