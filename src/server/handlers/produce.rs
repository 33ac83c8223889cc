//! Produce: each partition's record set goes to its owner shard, which validates and
//! appends it. acks=0 gets no answer; acks=1 is answered after the append (and after
//! the fsync when the operator chose `--fsync always` or the topic's flush policy is
//! due); acks=-1 also waits until the high watermark covers it (the in-sync replicas
//! have it), within the request timeout. v13 names topics by id (KIP-516); v10+ answers
//! NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH with the leader this broker knows and
//! its endpoint (KIP-951).
//!
//! Memory under a slow disk: every partition's append is awaited here (written, then
//! fsynced when asked) before the request is done, acks=0 included, and the request
//! keeps its frame's share of `queued.max.request.bytes` until then (connection.rs). So
//! record bytes staged in the append ring or waiting for an fdatasync are always part
//! of a reserved frame: their total never exceeds that budget, and once it is used up
//! connections stop reading, which slows producers to the disk's rate.

use std::time::Duration;

use futures::future::{select, Either};
use kafka_protocol::messages::produce_response::{
    self, BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, BrokerId, ProduceRequest, ProduceResponse};

use crate::config::FsyncMode;
use crate::log::{LogError, TxnVerification};
use crate::model::{NodeId, TopicPartition};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{txn_partition, DurableWait, PartitionError, PartitionOp, PartitionReply, ReplicatedWait, TxnOp};
use crate::txn::coordinator::ProducerIdAndEpoch;
use std::sync::atomic::Ordering;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::super::peer::Peer;
use super::super::txn::{self, TxnOutcome};
use super::{authz, partition_error_code, respond, str_bytes, txn_outcome_code};
use crate::protocol::zero_copy::Response;
use crate::security::acl::{AclOperation, ResourceType};
use crate::security::entity::QuotaKind;

/// The longest acks=all wait we honour (Kafka's request.timeout.ms default is 30 s).
const produce_timeout_ms_max: i32 = 300_000;

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Option<Response>, ProtocolError> {
    let req: ProduceRequest = decode_body(frame)?;
    let durable = ctx.config.fsync == FsyncMode::Always;
    let acks_valid = matches!(req.acks, -1..=1);
    let version = frame.api_version;
    let txn_id = req.transactional_id.as_ref().map(|t| t.as_str()).filter(|t| !t.is_empty());
    let mut responses = Vec::with_capacity(req.topic_data.len());
    // Authorization (Kafka's handleProduceRequest): WRITE on the transactional id for
    // the whole request, then WRITE on each topic.
    let view = ctx.view();
    let txn_denied = txn_id
        .is_some_and(|id| !authz::authorize(ctx, frame, &view, AclOperation::Write, ResourceType::TransactionalId, id));
    for t in &req.topic_data {
        // v13 names topics by id (KIP-516): an id this broker does not know is
        // UNKNOWN_TOPIC_ID, after the transactional id's authorization, as in Kafka.
        let by_id = (version >= first_topic_id_version).then(|| view.by_id(t.topic_id).map(|(name, _)| name.clone()));
        let topic = match &by_id {
            Some(Some(name)) => name.as_str(),
            Some(None) => "",
            None => t.name.as_str(),
        };
        let denied = if txn_denied {
            Some(error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        } else if by_id.as_ref().is_some_and(Option::is_none) {
            Some(error_code::UNKNOWN_TOPIC_ID)
        } else if !authz::authorize(ctx, frame, &view, AclOperation::Write, ResourceType::Topic, topic) {
            Some(error_code::TOPIC_AUTHORIZATION_FAILED)
        } else {
            None
        };
        let calls = t.partition_data.iter().map(|p| async move {
            if let Some(code) = denied {
                return Err((code, None, Vec::new()));
            }
            if !acks_valid {
                return Err((error_code::INVALID_REQUIRED_ACKS, None, Vec::new()));
            }
            if topic == crate::group::OFFSETS_TOPIC {
                return Err((
                    error_code::INVALID_TOPIC_EXCEPTION,
                    Some("cannot produce to an internal topic".to_string()),
                    Vec::new(),
                ));
            }
            let Some(records) = p.records.as_ref().filter(|r| !r.is_empty()) else {
                return Err((error_code::CORRUPT_MESSAGE, Some("empty record set".to_string()), Vec::new()));
            };
            // A disk short of free space refuses produce, retriably: KAFKA_STORAGE_ERROR is
            // what Kafka answers when a log dir cannot take writes, and every client
            // (Java: an InvalidMetadataException; librdkafka) retries it until
            // delivery.timeout.ms, so producers resume by themselves once space is freed.
            if let Some(reason) = ctx.disk.produce_refusal() {
                return Err((error_code::KAFKA_STORAGE_ERROR, Some(reason), Vec::new()));
            }
            let op = |verification| PartitionOp::Produce {
                tp: TopicPartition::new(topic, p.index),
                records: records.clone(),
                now_ms: now_ms(),
                durable,
                acks: req.acks,
                verification,
            };
            let first = if txn_id.is_some() { TxnVerification::Unverified } else { TxnVerification::Off };
            let mut reply = ctx.call(op(first)).await;
            // KIP-890 part 1: a producer's first transactional batch in this partition is
            // appended only once its coordinator says the partition is in the transaction.
            if let (
                Err(PartitionError::Log(LogError::TxnVerificationNeeded { producer_id, producer_epoch, guard })),
                Some(txn_id),
            ) = (&reply, txn_id)
            {
                let producer = ProducerIdAndEpoch { producer_id: *producer_id, epoch: *producer_epoch };
                let guard = *guard;
                let tp = TopicPartition::new(topic, p.index);
                // Boxed: the verification's state (a call to a remote coordinator) is
                // large and rarely needed; inline it would grow every partition's future.
                let delay_ms = ctx.config.test_txn_verification_delay_ms;
                if delay_ms > 0 {
                    glommio::timer::sleep(Duration::from_millis(delay_ms)).await; // tests only
                }
                if let Err((code, message)) =
                    Box::pin(verify_in_transaction(ctx, txn_id, producer, &tp, version)).await
                {
                    tracing::debug!(
                        topic,
                        partition = p.index,
                        transactional_id = txn_id,
                        code,
                        message,
                        "transactional batch refused: not verified in its transaction"
                    );
                    return Err((code, Some(message), Vec::new()));
                }
                reply = ctx.call(op(TxnVerification::Verified(guard))).await;
            }
            match reply {
                Ok(PartitionReply::Produced { info, log_start_offset, written, durable, replicated, duplicate }) => {
                    if duplicate {
                        tracing::info!(topic, partition = p.index, base_offset = %info.base_offset,
                            last_offset = %info.last_offset, "duplicate idempotent batch answered with its original offsets");
                        ctx.metrics.shard(ctx.id).producer_batches_duplicate.fetch_add(1, Ordering::Relaxed);
                    }
                    let timeout = Duration::from_millis(req.timeout_ms.clamp(0, produce_timeout_ms_max) as u64);
                    await_append(written, durable, replicated, timeout)
                        .await
                        .map_err(|(code, message)| (code, message, Vec::new()))?;
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
                    let record_errors = match &e {
                        PartitionError::Log(LogError::InvalidRecords { record_errors, .. }) => record_errors.clone(),
                        _ => Vec::new(),
                    };
                    Err((partition_error_code(&e), Some(e.to_string()), record_errors))
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
                    Err((code, message, record_errors)) => {
                        let r = r
                            .with_error_code(code)
                            .with_base_offset(-1)
                            .with_log_append_time_ms(-1)
                            .with_log_start_offset(-1);
                        if version >= 8 {
                            // KIP-467: the records refused, so the client fails only them.
                            r.with_error_message(message.map(str_bytes)).with_record_errors(
                                record_errors
                                    .into_iter()
                                    .map(|(index, why)| {
                                        BatchIndexAndErrorMessage::default()
                                            .with_batch_index(index)
                                            .with_batch_index_error_message(Some(str_bytes(why)))
                                    })
                                    .collect(),
                            )
                        } else {
                            r
                        }
                    }
                }
            })
            .collect();
        responses.push(
            TopicProduceResponse::default()
                .with_name(t.name.clone())
                .with_topic_id(t.topic_id)
                .with_partition_responses(partition_responses),
        );
    }
    drop(view);
    // Client quotas: the request's bytes against producer_byte_rate, recorded after the
    // append as Kafka does (the data is kept; the client is slowed down).
    let throttle_ms = super::super::quotas::record(ctx, frame, QuotaKind::Produce, frame.body.len() as u64);
    if req.acks == 0 {
        return Ok(None);
    }
    let mut body = ProduceResponse::default().with_responses(responses).with_throttle_time_ms(throttle_ms as i32);
    if version >= first_leader_hints_version {
        body.node_endpoints = produce_leader_hints(ctx, frame, &req, &mut body.responses);
    }
    let mut response = Response::from(respond(ApiKey::Produce, frame, &body)?);
    response.throttle_ms = throttle_ms;
    Ok(Some(response))
}

/// The first Produce version that names topics by id (KIP-516).
const first_topic_id_version: i16 = 13;
/// The first Produce version with KIP-951's leader hints.
const first_leader_hints_version: i16 = 10;

/// KIP-951: each partition answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH gets
/// the leader and leader epoch this broker knows; returns the endpoints of those leaders.
fn produce_leader_hints(
    ctx: &ShardContext,
    frame: &RequestFrame,
    req: &ProduceRequest,
    topics: &mut [TopicProduceResponse],
) -> Vec<produce_response::NodeEndpoint> {
    // Nothing to look up, and nothing allocated, unless a partition failed that way.
    let hinted =
        |t: &TopicProduceResponse| t.partition_responses.iter().any(|p| super::LeaderHints::wanted(p.error_code));
    if !topics.iter().any(hinted) {
        return Vec::new();
    }
    let mut hints = super::LeaderHints::new(ctx);
    for (t, asked) in topics.iter_mut().zip(&req.topic_data).filter(|(t, _)| hinted(t)) {
        let by_id = (frame.api_version >= first_topic_id_version).then(|| hints.topic_name(asked.topic_id)).flatten();
        let topic = by_id.unwrap_or_else(|| asked.name.to_string());
        for p in &mut t.partition_responses {
            if let Some((leader, epoch)) = hints.hint(p.error_code, &topic, p.index) {
                p.current_leader = produce_response::LeaderIdAndEpoch::default()
                    .with_leader_id(BrokerId(leader))
                    .with_leader_epoch(epoch);
            }
        }
    }
    hints
        .endpoints(ctx, frame)
        .into_iter()
        .map(|b| {
            produce_response::NodeEndpoint::default()
                .with_node_id(BrokerId(b.id))
                .with_host(str_bytes(b.host))
                .with_port(b.port)
                .with_rack(b.rack.map(str_bytes))
        })
        .collect()
}

/// How long a verification may wait for a coordinator on another broker.
const verify_timeout_ms: u64 = 5_000;
/// The AddPartitionsToTxn version a leader verifies (or adds) with (v4: batched, verify_only).
const verify_version: i16 = 4;
/// The first Produce version of transaction version 2 (the leader adds the partition).
const first_v2_version: i16 = 12;
/// The first Produce version that knows TRANSACTION_ABORTABLE.
const first_abortable_version: i16 = 11;
/// Transaction version 2: CONCURRENT_TRANSACTIONS from the coordinator (the last
/// transaction's markers are being written) is retried here every 20 ms for up to
/// 100 ms before the client gets it (Kafka's add.partitions.to.txn.retry.backoff.ms and
/// .max.ms defaults).
const add_retry_backoff_ms: u64 = 20;
const add_retry_max_ms: u64 = 100;

/// KIP-890, on a partition leader, before a producer's first transactional batch here.
/// Produce v12+ (transaction version 2, part 2): `tp` joins `producer`'s transaction
/// through `txn_id`'s coordinator (here or on its broker), for the client. Older
/// versions (part 1): the coordinator says whether `tp` is in the open transaction.
/// Err: the Produce error code, as Kafka maps the coordinator's: not in it is
/// TRANSACTION_ABORTABLE (v11) or INVALID_TXN_STATE (older), PRODUCER_FENCED is
/// INVALID_PRODUCER_EPOCH, and a coordinator that cannot answer now is
/// NOT_ENOUGH_REPLICAS, which every client retries; so is CONCURRENT_TRANSACTIONS for
/// part 1, while part 2 hands it on after its own retries.
async fn verify_in_transaction(
    ctx: &ShardContext,
    txn_id: &str,
    producer: ProducerIdAndEpoch,
    tp: &TopicPartition,
    version: i16,
) -> Result<(), (i16, String)> {
    let add = version >= first_v2_version;
    let started = std::time::Instant::now();
    let (code, why) = loop {
        let (code, why) = ask_coordinator(ctx, txn_id, producer, tp, add).await;
        if !add
            || code != error_code::CONCURRENT_TRANSACTIONS
            || started.elapsed().as_millis() as u64 >= add_retry_max_ms
        {
            break (code, why);
        }
        glommio::timer::sleep(Duration::from_millis(add_retry_backoff_ms)).await;
    };
    let code = match code {
        error_code::NONE => return Ok(()),
        error_code::TRANSACTION_ABORTABLE if version >= first_abortable_version => error_code::TRANSACTION_ABORTABLE,
        error_code::TRANSACTION_ABORTABLE => error_code::INVALID_TXN_STATE,
        error_code::PRODUCER_FENCED => error_code::INVALID_PRODUCER_EPOCH,
        error_code::CONCURRENT_TRANSACTIONS if add => error_code::CONCURRENT_TRANSACTIONS,
        error_code::CONCURRENT_TRANSACTIONS
        | error_code::COORDINATOR_LOAD_IN_PROGRESS
        | error_code::COORDINATOR_NOT_AVAILABLE
        | error_code::NOT_COORDINATOR
        | error_code::NETWORK_EXCEPTION => error_code::NOT_ENOUGH_REPLICAS,
        other => other,
    };
    let message = match code {
        error_code::INVALID_TXN_STATE | error_code::TRANSACTION_ABORTABLE => {
            "the partition was not added to the transaction".to_string()
        }
        _ if add => format!("unable to add the partition to the transaction: code {code} {why}"),
        _ => format!("unable to verify the partition is in the transaction: code {code} {why}"),
    };
    Err((code, message))
}

/// One question to `txn_id`'s coordinator: add `tp` (`add`) or is it in the transaction?
/// Its code, and why when it could not be asked.
pub(super) async fn ask_coordinator(
    ctx: &ShardContext,
    txn_id: &str,
    producer: ProducerIdAndEpoch,
    tp: &TopicPartition,
    add: bool,
) -> (i16, String) {
    if !txn::coordinates(ctx, txn_id) {
        return match verify_remote(ctx, txn_id, producer, tp, add).await {
            Ok(code) => (code, String::new()),
            Err(e) => (error_code::NETWORK_EXCEPTION, e),
        };
    }
    let (txn_id, partitions) = (txn_id.to_string(), vec![tp.clone()]);
    if add {
        let op = TxnOp::AddPartitions { txn_id, producer, partitions, now_ms: super::super::now_ms() };
        return (txn_outcome_code(&txn::call(ctx, op, None).await), String::new());
    }
    match txn::call(ctx, TxnOp::Verify { txn_id, producer, partitions }, None).await {
        TxnOutcome::Verified(Ok(in_txn)) if in_txn.first() == Some(&true) => (error_code::NONE, String::new()),
        TxnOutcome::Verified(Ok(_)) => (error_code::TRANSACTION_ABORTABLE, String::new()),
        other => (txn_outcome_code(&other), String::new()),
    }
}

/// AddPartitionsToTxn v4, verify_only unless `add`, to the broker leading `txn_id`'s
/// `__transaction_state` partition: its code for `tp`.
async fn verify_remote(
    ctx: &ShardContext,
    txn_id: &str,
    producer: ProducerIdAndEpoch,
    tp: &TopicPartition,
    add: bool,
) -> Result<i16, String> {
    use kafka_protocol::messages::add_partitions_to_txn_request::{
        AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
    };
    use kafka_protocol::messages::{AddPartitionsToTxnRequest, ProducerId as WireProducerId, TransactionalId};
    let coordinator_tp = txn_partition(txn_id);
    let leader: Option<NodeId> = ctx.view().leader_of(&coordinator_tp.topic, coordinator_tp.partition);
    let Some(leader) = leader else { return Ok(error_code::COORDINATOR_NOT_AVAILABLE) };
    let Some(addr) = txn::broker_address(ctx, leader) else { return Ok(error_code::COORDINATOR_NOT_AVAILABLE) };
    let request =
        AddPartitionsToTxnRequest::default().with_transactions(vec![AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(str_bytes(txn_id.to_string())))
            .with_producer_id(WireProducerId(producer.producer_id))
            .with_producer_epoch(producer.epoch)
            .with_verify_only(!add)
            .with_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(crate::client::topic_name(&tp.topic))
                .with_partitions(vec![tp.partition])])]);
    let mut peer = Peer::connect(&addr, "spate-txn-verify", ctx.config.inter_broker_security()?).await?;
    let response = peer.call(verify_version, &request, Duration::from_millis(verify_timeout_ms)).await?;
    if response.error_code != error_code::NONE {
        return Ok(response.error_code);
    }
    let code = response
        .results_by_transaction
        .iter()
        .filter(|t| t.transactional_id.as_str() == txn_id)
        .flat_map(|t| t.topic_results.iter().filter(|r| r.name.as_str() == tp.topic))
        .flat_map(|r| r.results_by_partition.iter().filter(|r| r.partition_index == tp.partition))
        .map(|r| r.partition_error_code)
        .next();
    code.ok_or_else(|| "the coordinator did not answer for the partition".to_string())
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
    if let Some(wait) = written {
        match wait.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err((error_code::KAFKA_STORAGE_ERROR, Some(e))),
            Err(_) => return Err((error_code::KAFKA_STORAGE_ERROR, Some("write abandoned".into()))),
        }
    }
    if let Some(wait) = durable {
        match wait.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err((error_code::KAFKA_STORAGE_ERROR, Some(e))),
            // A follower's truncation removed the records before a round synced them.
            Err(_) => return Err((error_code::NOT_LEADER_OR_FOLLOWER, Some("truncated before it was fsynced".into()))),
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
