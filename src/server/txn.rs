//! The transaction coordinator's runtime: routes a request to the shard that owns the
//! transactional id's `__transaction_state` partition, completes the writes the pure
//! machine asks for (waiting for the record's write and its replication, acks=all, as
//! offset commits do), sends the markers of a transaction being completed and writes
//! its Complete* state, loads a partition's ids when this broker begins to lead it, and
//! aborts transactions past their timeout.
//!
//! Every write and every marker round runs in a task spawned on the owner shard: a
//! client that goes away mid-request cannot leave an id with a write in flight forever,
//! and nothing waits on the data core (marker requests go over glommio sockets,
//! `peer.rs`; a producer id comes from the registry's owner thread or, on a broker that
//! is not the active coordinator, from the active coordinator over the network).
//!
//! Markers (Kafka's `TransactionMarkerChannelManager`, simplified): one WriteTxnMarkers
//! request (v2, with the transaction's version) per partition leader, this broker included (through its own listener),
//! retried with backoff, with the leader the metadata names at each round, until every
//! partition has answered. A partition whose topic is gone, or whose leader answers that
//! it cannot hold markers (UNSUPPORTED_FOR_MESSAGE_FORMAT), needs none; a leader that
//! refuses the coordinator's epoch (TRANSACTION_COORDINATOR_FENCED, INVALID_PRODUCER_EPOCH)
//! means a newer coordinator owns the transaction: the round stops. A round also stops
//! when this broker stops leading the id's partition (the new leader resumes it).

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use futures::channel::oneshot;
use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
use kafka_protocol::messages::{
    FindCoordinatorRequest, InitProducerIdRequest, ProducerId as WireProducerId, WriteTxnMarkersRequest,
};

use crate::client::{sb, topic_name};
use crate::model::{NodeId, TopicPartition};
use crate::protocol::error_code;
use crate::shard::{owner_shard, txn_partition, TxnMarkers, TxnOp, TxnReply, TxnWrite};
use crate::txn::coordinator::{Answer, TxnError, TxnRecord};

use super::context::{ShardContext, ShardMessage};
use super::now_ms;
use super::peer::Peer;

/// Kafka's `transaction.state.log` append timeout (`offsets.commit.timeout.ms` for
/// offsets): how long a state change waits for the partition's in-sync replicas.
const txn_write_timeout_ms: u64 = 5_000;
/// How often open transactions are checked against their timeout (Kafka's
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms` is 10 s).
pub(super) const txn_tick_interval_ms: u64 = 1_000;
/// A WriteTxnMarkers request may take this long (the leader waits for its replicas).
const marker_request_timeout_ms: u64 = 30_000;
/// Backoff between marker rounds with partitions left, doubling up to the max.
const marker_retry_backoff_ms: u64 = 100;
const marker_retry_backoff_ms_max: u64 = 2_000;
/// The version of WriteTxnMarkers sent: v2 carries the transaction version (KIP-1228),
/// coded by `protocol::newer`.
const write_txn_markers_version: i16 = 2;
/// The version of FindCoordinator sent to the active coordinator (key and key_type).
const find_coordinator_version: i16 = 3;
/// The version of InitProducerId sent to the active coordinator for a producer id.
const init_producer_id_version: i16 = 4;

/// What a transaction request got; the handlers choose its Kafka error code.
#[derive(Debug)]
pub enum TxnOutcome {
    Answer(Result<Answer, TxnError>),
    Describe(Option<TxnRecord>),
    List(Vec<(String, TxnRecord)>),
    /// AddPartitionsToTxn verify_only: per partition, whether it is in the transaction.
    Verified(Result<Vec<bool>, TxnError>),
    /// InitProducerId for a new id or an exhausted epoch: allocate a producer id first.
    NeedProducerId,
    /// This broker does not lead the id's partition (or stopped during the write).
    NotCoordinator,
    /// The id's partition is being loaded.
    Loading,
    /// The state change was not replicated (too few in-sync replicas, timed out).
    NotAvailable,
}

/// Whether this broker leads `txn_id`'s `__transaction_state` partition.
pub fn coordinates(ctx: &ShardContext, txn_id: &str) -> bool {
    let tp = txn_partition(txn_id);
    let reg = ctx.view();
    reg.leader_of(&tp.topic, tp.partition) == Some(reg.local_broker_id())
}

/// Run `op` on its id's coordinator shard (`shard` for List).
pub async fn call(ctx: &ShardContext, op: TxnOp, shard: Option<crate::model::ShardId>) -> TxnOutcome {
    let owner = match op.txn_id() {
        Some(id) if !coordinates(ctx, id) => return TxnOutcome::NotCoordinator,
        Some(id) => owner_shard(&txn_partition(id), ctx.nr_shards),
        None => shard.unwrap_or(ctx.id),
    };
    let (reply, rx) = oneshot::channel();
    if owner == ctx.id {
        let Some(me) = ctx.rc() else { return TxnOutcome::NotCoordinator };
        serve(me, op, reply);
    } else if ctx.send_to(owner, ShardMessage::Txn { op, reply }).await.is_err() {
        return TxnOutcome::NotCoordinator;
    }
    rx.await.unwrap_or(TxnOutcome::NotCoordinator)
}

/// On the owner shard: run `op` in a task of its own (see the module comment).
pub fn serve(ctx: Rc<ShardContext>, op: TxnOp, reply: oneshot::Sender<TxnOutcome>) {
    glommio::spawn_local(async move {
        if let Some(id) = op.txn_id() {
            ctx.opened(&txn_partition(id)).await;
        }
        let step = ctx.shard.borrow_mut().execute_txn(op);
        ctx.wakeup();
        let outcome = match step {
            TxnReply::Answer(a) => TxnOutcome::Answer(a),
            TxnReply::Write(w) => complete_write(&ctx, w).await,
            TxnReply::NeedProducerId => TxnOutcome::NeedProducerId,
            TxnReply::Describe(r) => TxnOutcome::Describe(r),
            TxnReply::List(l) => TxnOutcome::List(l),
            TxnReply::Verified(v) => TxnOutcome::Verified(v),
            TxnReply::Unavailable => TxnOutcome::NotCoordinator,
            TxnReply::Loading => TxnOutcome::Loading,
        };
        let _ = reply.send(outcome);
    })
    .detach();
}

/// Wait for a state change's write and replication, then tell the machine; start the
/// markers it asks for. Returns the answer for the client that asked (if any).
async fn complete_write(ctx: &Rc<ShardContext>, w: TxnWrite) -> TxnOutcome {
    let failure = write_failure(w.waits, w.replicated).await;
    let written = ctx.shard.borrow_mut().txn_written(&w.txn_id, w.load, failure.is_none());
    let Some((written, markers)) = written else { return TxnOutcome::NotCoordinator };
    if let Some(markers) = markers {
        let ctx = ctx.clone();
        glommio::spawn_local(async move { send_markers(ctx, markers).await }).detach();
    }
    if let Some(failure) = failure {
        tracing::warn!(transactional_id = %w.txn_id, ?failure, "transaction state change not replicated");
        return failure;
    }
    TxnOutcome::Answer(written.answer.unwrap_or(Ok(Answer::Done)))
}

/// None when the record is written and replicated; else what to answer, as Kafka's
/// `TransactionStateManager` maps append errors.
async fn write_failure(
    waits: Vec<crate::shard::DurableWait>,
    replicated: Option<crate::shard::ReplicatedWait>,
) -> Option<TxnOutcome> {
    use futures::future::{select, Either};
    for wait in waits {
        if !matches!(wait.await, Ok(Ok(()))) {
            return Some(TxnOutcome::NotCoordinator);
        }
    }
    let wait = replicated?;
    let timer = Box::pin(glommio::timer::sleep(Duration::from_millis(txn_write_timeout_ms)));
    match select(wait, timer).await {
        Either::Left((Ok(Ok(())), _)) => None,
        Either::Left((Ok(Err(error_code::NOT_LEADER_OR_FOLLOWER)), _)) | Either::Left((Err(_), _)) => {
            Some(TxnOutcome::NotCoordinator)
        }
        Either::Left((Ok(Err(_)), _)) | Either::Right(_) => Some(TxnOutcome::NotAvailable),
    }
}

/// A Kafka error code a marker's partition answered, and what it means for the round.
enum MarkerResult {
    Done,
    Retry,
    /// A newer coordinator owns the transaction.
    Fenced,
}

fn marker_result(code: i16) -> MarkerResult {
    match code {
        error_code::NONE => MarkerResult::Done,
        // The partition's log cannot hold markers: the producer could not have written
        // transactional data there (Kafka drops the partition from the round too).
        error_code::UNSUPPORTED_FOR_MESSAGE_FORMAT => MarkerResult::Done,
        error_code::INVALID_PRODUCER_EPOCH | error_code::TRANSACTION_COORDINATOR_FENCED => MarkerResult::Fenced,
        _ => MarkerResult::Retry,
    }
}

/// Where to reach broker `id`.
pub(super) fn broker_address(ctx: &ShardContext, id: NodeId) -> Option<String> {
    let view = ctx.view();
    if let Some(b) = view.broker_info(id).filter(|b| b.is_live()) {
        return Some(format!("{}:{}", b.endpoint.host, b.endpoint.port));
    }
    (id.0 == ctx.config.node_id).then(|| ctx.config.advertised().to_string())
}

/// Write `m`'s markers to every partition of its transaction, then its Complete* state.
pub(super) async fn send_markers(ctx: Rc<ShardContext>, m: TxnMarkers) {
    let mut pending: BTreeSet<TopicPartition> = m.markers.partitions.iter().cloned().collect();
    let mut backoff_ms = marker_retry_backoff_ms;
    let started = std::time::Instant::now();
    tracing::debug!(transactional_id = %m.txn_id, commit = m.markers.commit, partitions = pending.len(), "sending markers");
    while !pending.is_empty() {
        if ctx.stopping.get() || !ctx.shard.borrow().txn_load_current(&m.txn_id, m.load) {
            return;
        }
        // By leader, as the metadata names them now.
        let mut by_leader: BTreeMap<NodeId, Vec<TopicPartition>> = BTreeMap::new();
        {
            let view = ctx.view();
            pending.retain(|tp| {
                let exists = view.get(&tp.topic).is_some_and(|t| tp.partition < t.partitions);
                if !exists {
                    tracing::info!(partition = %tp, transactional_id = %m.txn_id, "no marker: the partition is gone");
                }
                exists
            });
            for tp in &pending {
                if let Some(leader) = view.leader_of(&tp.topic, tp.partition) {
                    by_leader.entry(leader).or_default().push(tp.clone());
                }
            }
        }
        let rounds = by_leader.into_iter().map(|(leader, tps)| {
            let (ctx, m) = (ctx.clone(), &m);
            async move { (tps.clone(), write_markers(&ctx, leader, m, &tps).await) }
        });
        for (tps, result) in futures::future::join_all(rounds).await {
            match result {
                Ok(codes) => {
                    for (tp, code) in codes {
                        match marker_result(code) {
                            MarkerResult::Done => {
                                pending.remove(&tp);
                            }
                            MarkerResult::Retry => {
                                tracing::debug!(partition = %tp, transactional_id = %m.txn_id, code, "marker to retry")
                            }
                            MarkerResult::Fenced => {
                                tracing::warn!(partition = %tp, transactional_id = %m.txn_id, code,
                                    "markers refused: a newer coordinator owns this transaction");
                                return;
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(partitions = tps.len(), transactional_id = %m.txn_id, error = %e, "markers to retry")
                }
            }
        }
        if !pending.is_empty() {
            if started.elapsed() > Duration::from_secs(30) && backoff_ms >= marker_retry_backoff_ms_max {
                tracing::warn!(transactional_id = %m.txn_id, partitions = pending.len(),
                    "markers still not written; retrying");
            }
            glommio::timer::sleep(Duration::from_millis(backoff_ms)).await;
            backoff_ms = (backoff_ms * 2).min(marker_retry_backoff_ms_max);
        }
    }
    let step = ctx.shard.borrow_mut().txn_markers_written(&m.txn_id, m.load, now_ms());
    ctx.wakeup();
    if let Some(TxnReply::Write(w)) = step {
        complete_write(&ctx, w).await;
    }
}

/// One WriteTxnMarkers request to `leader` for `tps`: each partition's error code.
async fn write_markers(
    ctx: &ShardContext,
    leader: NodeId,
    m: &TxnMarkers,
    tps: &[TopicPartition],
) -> Result<Vec<(TopicPartition, i16)>, String> {
    let addr = broker_address(ctx, leader).ok_or_else(|| format!("broker {} is not live", leader.0))?;
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for tp in tps {
        topics.entry(tp.topic.as_str()).or_default().push(tp.partition);
    }
    let marker = WritableTxnMarker::default()
        .with_producer_id(WireProducerId(m.markers.producer_id))
        .with_producer_epoch(m.markers.producer_epoch)
        .with_transaction_result(m.markers.commit)
        .with_coordinator_epoch(m.coordinator_epoch)
        .with_topics(
            topics
                .into_iter()
                .map(|(t, ps)| WritableTxnMarkerTopic::default().with_name(topic_name(t)).with_partition_indexes(ps))
                .collect(),
        );
    let req = WriteTxnMarkersRequest::default().with_markers(vec![marker]);
    let mut peer = Peer::connect(&addr, "spate-txn-markers", ctx.config.inter_broker_security()?).await?;
    let versions = [m.markers.transaction_version];
    let body = |buf: &mut bytes::BytesMut| crate::protocol::newer::encode_write_txn_markers_v2(&req, &versions, buf);
    let timeout = Duration::from_millis(marker_request_timeout_ms);
    let resp = peer.call_with::<WriteTxnMarkersRequest>(write_txn_markers_version, body, timeout).await?;
    let mut codes = Vec::new();
    for result in resp.markers.iter().filter(|r| r.producer_id.0 == m.markers.producer_id) {
        for t in &result.topics {
            for p in &t.partitions {
                let tp = TopicPartition::new(t.name.as_str(), p.partition_index);
                if tps.contains(&tp) {
                    codes.push((tp, p.error_code));
                }
            }
        }
    }
    Ok(codes)
}

/// Start the loads of `__transaction_state` partitions this shard began to lead: the log
/// is read on the blocking pool a chunk at a time; afterwards the markers of
/// transactions caught in Prepare* are sent again.
pub(super) fn start_loads(ctx: &Rc<ShardContext>) {
    let loads = ctx.shard.borrow_mut().take_txn_loads();
    for load in loads {
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            loop {
                if ctx.stopping.get() {
                    return;
                }
                let step = ctx.shard.borrow_mut().txn_load_next(&load);
                let crate::shard::GroupLoadStep::Read(plan) = step else { break };
                let read = ctx.run_blocking(move || plan.read_to_vec()).await;
                ctx.shard.borrow_mut().txn_load_apply(&load, read);
            }
            resume_markers(&ctx);
        })
        .detach();
    }
}

fn resume_markers(ctx: &Rc<ShardContext>) {
    let resumes = ctx.shard.borrow_mut().take_txn_resumes();
    for m in resumes {
        tracing::info!(transactional_id = %m.txn_id, commit = m.markers.commit, "resuming the markers of a transaction");
        let ctx = ctx.clone();
        glommio::spawn_local(async move { send_markers(ctx, m).await }).detach();
    }
}

/// Abort transactions past their timeout, every `txn_tick_interval_ms`.
pub(super) async fn tick_loop(ctx: Rc<ShardContext>) {
    let mut spare: Option<i64> = None;
    while !ctx.stopping.get() {
        glommio::timer::sleep(Duration::from_millis(txn_tick_interval_ms)).await;
        let (writes, need_spare) = ctx.shard.borrow_mut().txn_tick(now_ms(), &mut spare);
        ctx.wakeup();
        for step in writes {
            if let TxnReply::Write(w) = step {
                let ctx = ctx.clone();
                glommio::spawn_local(async move {
                    complete_write(&ctx, w).await;
                })
                .detach();
            }
        }
        if need_spare && spare.is_none() {
            spare = allocate_producer_id(&ctx).await.ok();
        }
    }
}

/// On a broker that is not the active coordinator, before `__transaction_state`
/// exists: ask the active one for `txn_id`'s coordinator, which creates the topic there
/// (as Kafka's brokers have the controller create it). The answer is not used: this
/// broker's client retries and finds the topic once the metadata reaches it.
pub async fn create_topic_through_active(ctx: &ShardContext, txn_id: &str) -> Result<(), String> {
    let addr = {
        let view = ctx.view();
        let active = view.active_controller_id().ok_or("no active coordinator is known")?;
        let b = view.broker_info(active).ok_or("the active coordinator is not registered")?;
        format!("{}:{}", b.endpoint.host, b.endpoint.port)
    };
    let mut peer = Peer::connect(&addr, "spate-txn-coordinator", ctx.config.inter_broker_security()?).await?;
    let req = FindCoordinatorRequest::default().with_key_type(1).with_key(sb(txn_id));
    peer.call(find_coordinator_version, &req, Duration::from_millis(marker_request_timeout_ms)).await.map(|_| ())
}

/// A new producer id from the allocator: the registry's, on the active coordinator;
/// else the active coordinator's, through a (non-transactional) InitProducerId.
/// Err: the Kafka-level reason, NOT_COORDINATOR-like (the client retries).
pub async fn allocate_producer_id(ctx: &ShardContext) -> Result<i64, String> {
    let view = ctx.view();
    if view.is_active() {
        return ctx.metadata.write(|reg| reg.next_producer_id()).await.map(|id| id.0).map_err(|e| e.to_string());
    }
    let active = view.active_controller_id().ok_or("no active coordinator is known")?;
    let b = view.broker_info(active).ok_or("the active coordinator is not registered")?;
    let addr = format!("{}:{}", b.endpoint.host, b.endpoint.port);
    drop(view);
    let mut peer = Peer::connect(&addr, "spate-txn-coordinator", ctx.config.inter_broker_security()?).await?;
    let req = InitProducerIdRequest::default()
        .with_transactional_id(None) // the crate's default is Some("")
        .with_transaction_timeout_ms(-1)
        .with_producer_id(WireProducerId(-1))
        .with_producer_epoch(-1);
    let resp = peer.call(init_producer_id_version, &req, Duration::from_millis(marker_request_timeout_ms)).await?;
    match resp.error_code {
        error_code::NONE if resp.producer_id.0 >= 0 => Ok(resp.producer_id.0),
        code => Err(format!("the active coordinator answered error code {code}")),
    }
}

/// A state's name as DescribeTransactions and ListTransactions show it (Kafka's
/// `TransactionState.name`).
pub fn state_name(s: crate::txn::coordinator::TxnState) -> &'static str {
    use crate::txn::coordinator::TxnState::*;
    match s {
        Empty => "Empty",
        Ongoing => "Ongoing",
        PrepareCommit => "PrepareCommit",
        PrepareAbort => "PrepareAbort",
        CompleteCommit => "CompleteCommit",
        CompleteAbort => "CompleteAbort",
        Dead => "Dead",
        PrepareEpochFence => "PrepareEpochFence",
    }
}

pub fn state_from_name(name: &str) -> Option<crate::txn::coordinator::TxnState> {
    (0..8).filter_map(crate::txn::coordinator::TxnState::from_id).find(|s| state_name(*s) == name)
}
