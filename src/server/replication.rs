//! Replication on each shard: a manager task that acts on registry changes (roles of
//! the partitions this shard hosts), starts a fetcher for each follower partition and
//! sends the ISR changes its leader partitions propose; and the fetchers themselves.
//!
//! A fetcher runs on the shard that owns the follower replica and talks straight to the
//! leader (another node, or another core of this one), as a Kafka follower does:
//! OffsetForLeaderEpoch first, truncating by leader epoch (never by high watermark),
//! then Fetch (v15) with its broker id and broker epoch (KIP-903: the leader refuses a
//! dead incarnation's fetches and names each ISR member's epoch to the coordinator),
//! appending what comes byte for byte and learning the leader's high watermark. It stops
//! when its partition's leader or epoch changes (a new fetcher starts for the new epoch).

use std::rc::Rc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_partition_request::{BrokerState, PartitionData, TopicData};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ReplicaState};
use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
use kafka_protocol::messages::{
    AlterPartitionRequest, ApiKey, BrokerId, FetchRequest, OffsetForLeaderEpochRequest, TopicName,
};

use crate::coordinator::registry::RegistryError;
use crate::model::TopicPartition;
use crate::protocol::error_code;
use crate::replication::{truncation_offset, IsrProposal, NO_BROKER_EPOCH};
use crate::shard::{FetcherStart, IsrOutcome};

use super::context::ShardContext;
use super::now_ms;
use super::peer::Peer;

/// How often the manager looks at registry changes and fetcher starts.
const manager_interval_ms: u64 = 50;
/// How often leaders look at their ISR.
const isr_check_interval_ms: u64 = 250;
/// A follower's fetch long-poll (Kafka's replica.fetch.wait.max.ms).
const replica_fetch_wait_ms: i32 = 500;
/// Bytes per partition per fetch (Kafka's replica.fetch.max.bytes).
const replica_fetch_bytes_max: i32 = 1024 * 1024;
/// Pause after an error before a fetcher tries again (replica.fetch.backoff.ms).
const replica_fetch_backoff_ms: u64 = 200;
/// The Fetch version followers send: the first with the follower's broker epoch
/// (ReplicaState, KIP-903).
const replica_fetch_version: i16 = 15;
/// A replica request's answer may take this long (the long-poll included).
const replica_request_timeout_ms: u64 = 10_000;

pub async fn manager(ctx: Rc<ShardContext>) {
    let mut last_isr_check = Instant::now();
    while !ctx.stopping.get() {
        glommio::timer::sleep(Duration::from_millis(manager_interval_ms)).await;
        let (starts, opens) = {
            let mut shard = ctx.shard.borrow_mut();
            shard.sync_registry();
            (shard.take_fetcher_starts(), shard.take_open_jobs())
        };
        start_opens(&ctx, opens);
        for start in starts {
            let ctx = ctx.clone();
            glommio::spawn_local(async move { fetcher(ctx, start).await }).detach();
        }
        if last_isr_check.elapsed() >= Duration::from_millis(isr_check_interval_ms) {
            last_isr_check = Instant::now();
            let proposals = ctx.shard.borrow_mut().isr_proposals(now_ms());
            for (tp, proposal) in proposals {
                let ctx = ctx.clone();
                glommio::spawn_local(async move { alter_isr(ctx, tp, proposal).await }).detach();
            }
        }
    }
}

/// Open the logs of newly hosted partitions on the blocking pool, then install them
/// (with their roles; followers get their fetchers).
pub(super) fn start_opens(ctx: &Rc<ShardContext>, opens: Vec<crate::shard::OpenJob>) {
    if opens.is_empty() {
        return;
    }
    let ctx = ctx.clone();
    glommio::spawn_local(async move {
        let started_ms = now_ms();
        let opened = glommio::executor().spawn_blocking(move || crate::shard::open_logs(opens, started_ms)).await;
        let starts = {
            let mut shard = ctx.shard.borrow_mut();
            shard.install_opened_later(opened, now_ms());
            shard.take_fetcher_starts()
        };
        for start in starts {
            let ctx = ctx.clone();
            glommio::spawn_local(async move { fetcher(ctx, start).await }).detach();
        }
        ctx.wakeup();
    })
    .detach();
}

/// Send an ISR change to the active coordinator (here, or on another broker) and hand
/// the answer to the partition.
async fn alter_isr(ctx: Rc<ShardContext>, tp: TopicPartition, proposal: IsrProposal) {
    let me = ctx.config.node_id;
    tracing::info!(partition = %tp, isr = ?proposal.new_isr, "proposing an ISR change");
    let active = ctx.view().is_active();
    let sent = proposal.clone();
    let isr_with_epochs: Vec<(i32, i64)> =
        proposal.new_isr.iter().copied().zip(proposal.broker_epochs.iter().copied()).collect();
    // Err((outcome, why)): Refused when the coordinator answered no, Unknown when there
    // was no answer (the change may have been committed).
    let result: Result<(Vec<i32>, i32), (IsrOutcome, String)> = if active {
        let (topic, p) = (tp.topic.clone(), tp.partition);
        ctx.metadata
            .write(move |reg| {
                reg.alter_partition(&topic, p, me, proposal.leader_epoch, proposal.partition_epoch, &isr_with_epochs)
                    .map(|s| (s.isr, s.partition_epoch))
                    .map_err(|e| match e {
                        RegistryError::Store(_) | RegistryError::Corrupt { .. } => (IsrOutcome::Unknown, e.to_string()),
                        _ => (IsrOutcome::Refused, e.to_string()),
                    })
            })
            .await
    } else {
        let Some(topic_id) = ctx.view().get(&tp.topic).map(|m| m.id) else {
            return;
        };
        let partition = tp.partition;
        super::forward::with_coordinator(&ctx, move |conn, _| {
            // v3 carries the ISR with broker epochs (KIP-903), v2 as plain ids.
            let unknown = |e: crate::client::Error| (IsrOutcome::Unknown, e.to_string());
            let version = conn.version(ApiKey::AlterPartition).map_err(unknown)?;
            let mut data = PartitionData::default()
                .with_partition_index(partition)
                .with_leader_epoch(proposal.leader_epoch)
                .with_partition_epoch(proposal.partition_epoch);
            if version >= 3 {
                data.new_isr_with_epochs = isr_with_epochs
                    .iter()
                    .map(|(b, epoch)| BrokerState::default().with_broker_id(BrokerId(*b)).with_broker_epoch(*epoch))
                    .collect();
            } else {
                data.new_isr = proposal.new_isr.iter().map(|b| BrokerId(*b)).collect();
            }
            let req = AlterPartitionRequest::default()
                .with_broker_id(BrokerId(me))
                .with_broker_epoch(-1)
                .with_topics(vec![TopicData::default().with_topic_id(topic_id).with_partitions(vec![data])]);
            let (_, resp) = conn.call(&req).map_err(unknown)?;
            let refused = |code: i16| (IsrOutcome::Refused, format!("error code {code}"));
            if resp.error_code != 0 {
                return Err(refused(resp.error_code));
            }
            let p = resp
                .topics
                .first()
                .and_then(|t| t.partitions.first())
                .ok_or_else(|| (IsrOutcome::Unknown, "empty AlterPartition answer".to_string()))?;
            if p.error_code != 0 {
                return Err(refused(p.error_code));
            }
            Ok((p.isr.iter().map(|b| b.0).collect(), p.partition_epoch))
        })
        .await
        .unwrap_or_else(|e| Err((IsrOutcome::Unknown, e)))
    };
    let outcome = match result {
        Ok((isr, partition_epoch)) => IsrOutcome::Committed(isr, partition_epoch),
        Err((outcome, why)) => {
            tracing::warn!(partition = %tp, error = %why, refused = (outcome == IsrOutcome::Refused), "ISR change not committed");
            outcome
        }
    };
    ctx.shard.borrow_mut().isr_result(&tp, &sent, outcome);
}

/// One follower partition's fetcher (see the module comment).
async fn fetcher(ctx: Rc<ShardContext>, start: FetcherStart) {
    let FetcherStart { tp, leader, leader_epoch } = start;
    let me = ctx.config.node_id;
    let mut peer: Option<Peer> = None;
    let mut session = FollowerSession::default();
    let mut truncated = false;
    let mut last_error = String::new();
    let mut paused_for_disk = false;
    tracing::debug!(partition = %tp, leader, leader_epoch, "fetcher started");
    loop {
        if ctx.stopping.get() || !ctx.shard.borrow().follows(&tp, leader, leader_epoch) {
            tracing::debug!(partition = %tp, leader, leader_epoch, "fetcher stopped");
            return;
        }
        // Below the free-space floor a follower takes no more data (it falls out of the
        // ISR, as a slow one does) rather than fill the disk and take its log offline.
        if let Some(reason) = ctx.disk.produce_refusal() {
            if !paused_for_disk {
                tracing::warn!(partition = %tp, leader, %reason, "replica fetch paused: disk below the free-space floor");
                paused_for_disk = true;
            }
            glommio::timer::sleep(Duration::from_millis(replica_fetch_backoff_ms)).await;
            continue;
        }
        if paused_for_disk {
            tracing::info!(partition = %tp, leader, "replica fetch resumed: disk above the free-space floor");
            paused_for_disk = false;
        }
        let step = async {
            if peer.is_none() {
                session = FollowerSession::default();
                let addr = {
                    let reg = ctx.view();
                    reg.broker_info(leader).map(|b| format!("{}:{}", b.endpoint.host, b.endpoint.port))
                };
                let addr = addr.ok_or_else(|| format!("leader {leader} is not a known broker"))?;
                peer = Some(Peer::connect(&addr, &format!("spate-replica-{me}")).await?);
            }
            let conn = peer.as_mut().expect("connected above");
            if !truncated {
                truncated = truncate(&ctx, conn, &tp, leader, leader_epoch).await?;
                return Ok(());
            }
            if fetch(&ctx, conn, &mut session, &tp, leader, leader_epoch).await? == FetchOutcome::Retruncate {
                truncated = false;
                glommio::timer::sleep(Duration::from_millis(replica_fetch_backoff_ms)).await;
            }
            Ok(())
        };
        match step.await {
            Ok(()) => last_error.clear(),
            Err(e) => {
                if e != last_error {
                    tracing::warn!(partition = %tp, leader, error = %e, "replica fetch failed; retrying");
                    last_error = e;
                }
                peer = None;
                glommio::timer::sleep(Duration::from_millis(replica_fetch_backoff_ms)).await;
            }
        }
    }
}

/// One round of truncation by leader epoch. Returns true when done (our latest epoch
/// is one the leader has, and we end where it ends in the leader's log).
async fn truncate(
    ctx: &ShardContext,
    conn: &mut Peer,
    tp: &TopicPartition,
    leader: i32,
    leader_epoch: i32,
) -> Result<bool, String> {
    let state = ctx.shard.borrow().replica_state(tp).ok_or("partition gone")?;
    let Some(epoch) = state.latest_epoch else {
        // No epochs (nothing written here with one): only the high watermark is proven.
        ctx.shard
            .borrow_mut()
            .replica_truncate(tp, leader, leader_epoch, state.high_watermark.min(state.log_end_offset))
            .map_err(|e| e.to_string())?;
        return Ok(true);
    };
    let req = OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(ctx.config.node_id)).with_topics(vec![
        OffsetForLeaderTopic::default().with_topic(TopicName(crate::client::sb(&tp.topic))).with_partitions(vec![
            OffsetForLeaderPartition::default()
                .with_partition(tp.partition)
                .with_current_leader_epoch(leader_epoch)
                .with_leader_epoch(epoch),
        ]),
    ]);
    let resp = conn.call(3, &req, Duration::from_millis(replica_request_timeout_ms)).await?;
    let p = resp.topics.first().and_then(|t| t.partitions.first()).ok_or("empty OffsetForLeaderEpoch answer")?;
    if p.error_code != 0 {
        return Err(format!("OffsetForLeaderEpoch answered error code {}", p.error_code));
    }
    let offset = {
        let shard = ctx.shard.borrow();
        truncation_offset(
            state.log_end_offset,
            state.high_watermark,
            Some(epoch),
            (p.leader_epoch, p.end_offset),
            |e| shard.local_epoch_end(tp, e),
        )
    };
    ctx.shard.borrow_mut().replica_truncate(tp, leader, leader_epoch, offset).map_err(|e| e.to_string())?;
    // KIP-279: when the leader answered an earlier epoch, ask again with our new latest.
    let done = p.leader_epoch == epoch || offset >= state.log_end_offset || p.leader_epoch < 0;
    Ok(done)
}

#[derive(Debug, PartialEq, Eq)]
enum FetchOutcome {
    Fetched,
    /// The leader does not have our fetch offset: truncate by epoch again.
    Retruncate,
}

/// A follower's incremental fetch session with its leader (KIP-227): after the first
/// full request, the partition is named only when its fetch position moved, and the
/// leader answers with it only when something is new.
#[derive(Debug, Default)]
struct FollowerSession {
    id: i32,
    next_epoch: i32,
    /// (fetch offset, log start offset) last sent.
    sent: Option<(i64, i64)>,
}

async fn fetch(
    ctx: &ShardContext,
    conn: &mut Peer,
    session: &mut FollowerSession,
    tp: &TopicPartition,
    leader: i32,
    leader_epoch: i32,
) -> Result<FetchOutcome, String> {
    let state = ctx.shard.borrow().replica_state(tp).ok_or("partition gone")?;
    let position = (state.log_end_offset, state.log_start_offset);
    let me = ctx.config.node_id;
    // v15 names the topic by id and this incarnation by its broker epoch (KIP-903): what
    // the coordinator has for us, which is this incarnation's registration once roles are
    // taken (`ClusterView::may_take_roles`).
    let (topic_id, broker_epoch) = {
        let view = ctx.view();
        let topic_id = view.get(&tp.topic).map(|m| m.id).ok_or("topic gone")?;
        (topic_id, view.broker_info(me).map_or(NO_BROKER_EPOCH, |b| b.registration_epoch))
    };
    let mut req = FetchRequest::default()
        .with_replica_state(ReplicaState::default().with_replica_id(BrokerId(me)).with_replica_epoch(broker_epoch))
        .with_max_wait_ms(replica_fetch_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(replica_fetch_bytes_max)
        .with_session_id(session.id)
        .with_session_epoch(if session.id == 0 { 0 } else { session.next_epoch });
    if session.id == 0 || session.sent != Some(position) {
        req.topics =
            vec![FetchTopic::default().with_topic_id(topic_id).with_partitions(vec![FetchPartition::default()
                .with_partition(tp.partition)
                .with_current_leader_epoch(leader_epoch)
                .with_fetch_offset(state.log_end_offset)
                .with_log_start_offset(state.log_start_offset)
                .with_partition_max_bytes(replica_fetch_bytes_max)])];
    }
    let resp = conn.call(replica_fetch_version, &req, Duration::from_millis(replica_request_timeout_ms)).await?;
    if resp.error_code != 0 {
        // FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH: start a new session.
        *session = FollowerSession::default();
        return Err(format!("Fetch answered error code {} (fetch session reset)", resp.error_code));
    }
    if session.id == 0 {
        session.id = resp.session_id;
        session.next_epoch = 1;
    } else {
        session.next_epoch = if session.next_epoch == i32::MAX { 1 } else { session.next_epoch + 1 };
    }
    session.sent = (session.id != 0).then_some(position);
    let Some(p) = resp.responses.iter().flat_map(|t| t.partitions.iter()).find(|p| p.partition_index == tp.partition)
    else {
        return Ok(FetchOutcome::Fetched); // nothing new in the session
    };
    match p.error_code {
        error_code::NONE => {
            let records = p.records.clone().unwrap_or_default();
            ctx.shard
                .borrow_mut()
                .replica_append(tp, leader, leader_epoch, &records, p.high_watermark, now_ms())
                .map_err(|e| format!("append: {e}"))?;
            ctx.disk.note_appended(records.len() as u64);
            Ok(FetchOutcome::Fetched)
        }
        error_code::OFFSET_OUT_OF_RANGE => {
            // Our log end is not in the leader's log: truncate by epoch again (never
            // throw away what may be committed; starting over below the leader's log start
            // after retention is not handled yet).
            tracing::warn!(partition = %tp, fetch_offset = state.log_end_offset, "fetch offset out of the leader's range: truncating by epoch again");
            Ok(FetchOutcome::Retruncate)
        }
        code => Err(format!("Fetch answered error code {code}")),
    }
}
