//! Produce: each partition's record set goes to its owner shard, which validates and
//! appends it. acks=0 gets no answer; acks=1 is answered after the append (and after
//! the fsync when the operator chose `--fsync always` or the topic's flush policy is
//! due); acks=-1 also waits until the high watermark covers it (the in-sync replicas
//! have it), within the request timeout.
//!
//! Memory under a slow disk: every partition's append is awaited here (written, then
//! fsynced when asked) before the request is done, acks=0 included, and the request
//! keeps its frame's share of `queued.max.request.bytes` until then (connection.rs). So
//! record bytes staged in the append ring or waiting for an fdatasync are always part
//! of a reserved frame: their total never exceeds that budget, and once it is used up
//! connections stop reading, which slows producers to the disk's rate.

use std::time::Duration;

use bytes::Bytes;
use futures::future::{select, Either};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ProduceResponse};

use crate::config::FsyncMode;
use crate::log::LogError;
use crate::model::TopicPartition;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{DurableWait, PartitionError, PartitionOp, PartitionReply, ReplicatedWait};
use std::sync::atomic::Ordering;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{partition_error_code, respond, str_bytes};

/// The longest acks=all wait we honour (Kafka's request.timeout.ms default is 30 s).
const produce_timeout_ms_max: i32 = 300_000;

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Option<Bytes>, ProtocolError> {
    let req: ProduceRequest = decode_body(frame)?;
    let durable = ctx.config.fsync == FsyncMode::Always;
    let acks_valid = matches!(req.acks, -1..=1);
    let version = frame.api_version;
    let mut responses = Vec::with_capacity(req.topic_data.len());
    for t in &req.topic_data {
        let topic = t.name.as_str();
        let calls = t.partition_data.iter().map(|p| async move {
            if !acks_valid {
                return Err((error_code::INVALID_REQUIRED_ACKS, None));
            }
            if topic == crate::group::OFFSETS_TOPIC {
                return Err((
                    error_code::INVALID_TOPIC_EXCEPTION,
                    Some("cannot produce to an internal topic".to_string()),
                ));
            }
            let Some(records) = p.records.as_ref().filter(|r| !r.is_empty()) else {
                return Err((error_code::CORRUPT_MESSAGE, Some("empty record set".to_string())));
            };
            // A disk short of free space refuses produce, retriably: KAFKA_STORAGE_ERROR is
            // what Kafka answers when a log dir cannot take writes, and every client
            // (Java: an InvalidMetadataException; librdkafka) retries it until
            // delivery.timeout.ms, so producers resume by themselves once space is freed.
            if let Some(reason) = ctx.disk.produce_refusal() {
                return Err((error_code::KAFKA_STORAGE_ERROR, Some(reason)));
            }
            let op = PartitionOp::Produce {
                tp: TopicPartition::new(topic, p.index),
                records: records.clone(),
                now_ms: now_ms(),
                durable,
                acks: req.acks,
            };
            match ctx.call(op).await {
                Ok(PartitionReply::Produced { info, log_start_offset, written, durable, replicated, duplicate }) => {
                    if duplicate {
                        tracing::debug!(topic, partition = p.index, base_offset = %info.base_offset,
                            "duplicate idempotent batch answered with its original offsets");
                        ctx.metrics.shard(ctx.id).producer_batches_duplicate.fetch_add(1, Ordering::Relaxed);
                    }
                    let timeout = Duration::from_millis(req.timeout_ms.clamp(0, produce_timeout_ms_max) as u64);
                    await_append(written, durable, replicated, timeout).await?;
                    ctx.disk.note_appended(info.bytes as u64);
                    ctx.metrics.add_topic_bytes(ctx.id, topic, info.bytes as u64, 0);
                    Ok((info, log_start_offset))
                }
                Ok(other) => unreachable!("Produce answered {other:?}"),
                Err(e) => {
                    if matches!(&e, PartitionError::Log(LogError::Producer(_) | LogError::InvalidProducerFields(_))) {
                        tracing::warn!(topic, partition = p.index, error = %e, "idempotent batch refused");
                        ctx.metrics.shard(ctx.id).producer_batches_refused.fetch_add(1, Ordering::Relaxed);
                    } else {
                        tracing::debug!(topic, partition = p.index, error = %e, "produce refused");
                    }
                    Err((partition_error_code(&e), Some(e.to_string())))
                }
            }
        });
        let results = futures::future::join_all(calls).await;
        let partition_responses = t
            .partition_data
            .iter()
            .zip(results)
            .map(|(p, result)| {
                let r = PartitionProduceResponse::default().with_index(p.index);
                match result {
                    Ok((info, log_start_offset)) => {
                        let r = r.with_base_offset(info.base_offset.0).with_log_append_time_ms(info.log_append_time_ms);
                        if version >= 5 {
                            r.with_log_start_offset(log_start_offset.0)
                        } else {
                            r
                        }
                    }
                    Err((code, message)) => {
                        let r = r
                            .with_error_code(code)
                            .with_base_offset(-1)
                            .with_log_append_time_ms(-1)
                            .with_log_start_offset(-1);
                        if version >= 8 {
                            r.with_error_message(message.map(str_bytes))
                        } else {
                            r
                        }
                    }
                }
            })
            .collect();
        responses.push(
            TopicProduceResponse::default().with_name(t.name.clone()).with_partition_responses(partition_responses),
        );
    }
    if req.acks == 0 {
        return Ok(None);
    }
    respond(ApiKey::Produce, frame, &ProduceResponse::default().with_responses(responses)).map(Some)
}

/// An append's waits, as its answer needs them: in the file first (io_uring), then
/// durable if asked, then (acks=all) until the in-sync replicas have it, within
/// `timeout`. Err: the error code and message to answer with.
pub(super) async fn await_append(
    written: Option<DurableWait>,
    durable: Option<DurableWait>,
    replicated: Option<ReplicatedWait>,
    timeout: Duration,
) -> Result<(), (i16, Option<String>)> {
    for wait in written.into_iter().chain(durable) {
        match wait.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err((error_code::KAFKA_STORAGE_ERROR, Some(e))),
            Err(_) => return Err((error_code::KAFKA_STORAGE_ERROR, Some("write abandoned".into()))),
        }
    }
    if let Some(wait) = replicated {
        let timer = Box::pin(glommio::timer::sleep(timeout));
        match select(wait, timer).await {
            Either::Left((Ok(Ok(())), _)) => {}
            Either::Left((Ok(Err(code)), _)) => return Err((code, None)),
            Either::Left((Err(_), _)) => {
                return Err((error_code::NOT_LEADER_OR_FOLLOWER, Some("partition moved".into())))
            }
            Either::Right(_) => {
                return Err((
                    error_code::REQUEST_TIMED_OUT,
                    Some("the in-sync replicas did not confirm in time".into()),
                ))
            }
        }
    }
    Ok(())
}
