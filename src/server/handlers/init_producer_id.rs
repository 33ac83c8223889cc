//! InitProducerId (v0-5) for idempotent producers: a new producer id with epoch 0, from
//! the block the active coordinator reserved in `/latest_producer_id_block` (a broker
//! that is not the coordinator forwards the request, `server/forward.rs`). KIP-360: a
//! producer that passes its current id and epoch (v3+) keeps its id with epoch + 1, or
//! gets a new id when the epoch is exhausted.
//!
//! A transactional id is answered UNSUPPORTED_VERSION (fatal in every client):
//! transactions are not implemented, and FindCoordinator refuses transaction keys.

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProducerId as WireProducerId};

use crate::coordinator::registry::RegistryError;
use crate::model::{ProducerEpoch, ProducerId};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::respond;

/// The last epoch a bump may reach (Kafka keeps `Short.MaxValue` out of use).
const producer_epoch_bump_max: i16 = i16::MAX - 1;

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: InitProducerIdRequest = decode_body(frame)?;
    let outcome: Result<(ProducerId, ProducerEpoch), i16> = if req.transactional_id.is_some() {
        tracing::debug!(transactional_id = ?req.transactional_id, "InitProducerId for a transactional id refused");
        Err(error_code::UNSUPPORTED_VERSION)
    } else if req.producer_id.0 >= 0 && req.producer_epoch >= 0 && req.producer_epoch < producer_epoch_bump_max {
        // KIP-360 epoch bump: same id, next epoch.
        Ok((ProducerId(req.producer_id.0), ProducerEpoch(req.producer_epoch + 1)))
    } else {
        match ctx.metadata.write(|reg| reg.next_producer_id()).await {
            Ok(id) => Ok((id, ProducerEpoch(0))),
            Err(e) => {
                tracing::warn!(error = %e, "cannot issue a producer id");
                Err(match e {
                    RegistryError::NotController(_) => error_code::NOT_COORDINATOR,
                    _ => error_code::COORDINATOR_NOT_AVAILABLE,
                })
            }
        }
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
