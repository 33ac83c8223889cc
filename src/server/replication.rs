//! Replication on each shard: a manager task that acts on registry changes (roles of
//! the partitions this shard hosts), starts a fetcher for each follower partition and
//! sends the ISR changes its leader partitions propose; and the fetchers themselves.
//!
//! Each shard runs one fetcher per source broker, carrying every follower partition of
//! this shard that broker leads over one connection and one incremental fetch session
//! (Kafka's ReplicaFetcherThread; here per core, as the partitions are). For each
//! partition it does what a Kafka follower does: OffsetForLeaderEpoch first (one
//! request for all partitions that need it), truncating by leader epoch (never by high
//! watermark), then Fetch (v15) with its broker id and broker epoch (KIP-903: the
//! leader refuses a dead incarnation's fetches and names each ISR member's epoch to the
//! coordinator), appending what comes byte for byte and learning the leader's high
//! watermark. What to do for each partition (ask, truncate where, fetch, pause after
//! an error, start over below the leader's log start) is decided by its replica machine
//! (`replication::Replica`, through the shard); this file owns the connections, the
//! fetch session and the timers. A partition leaves its fetcher when its leader or
//! epoch changes (it enters the new leader's fetcher, truncating again); an error on one
//! partition pauses that partition only; the fetcher ends when it carries none.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_partition_request::{BrokerState, PartitionData, TopicData};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic, ReplicaState};
use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
use kafka_protocol::messages::{
    AlterPartitionRequest, ApiKey, BrokerId, FetchRequest, OffsetForLeaderEpochRequest, TopicName,
};

use crate::coordinator::registry::RegistryError;
use crate::model::{BrokerEpoch, LeaderEpoch, NodeId, PartitionEpoch, TopicPartition};
use crate::protocol::error_code;
use crate::replication::{FollowerLog, FollowerStep, IsrProposal, OutOfRange, NO_BROKER_EPOCH};
use crate::shard::{FetcherStart, IsrOutcome};

use super::context::ShardContext;
use super::now_ms;
use super::peer::Peer;
use super::throttle;
use crate::config::THROTTLED_RATE_UNLIMITED;

/// How often the manager looks at registry changes and fetcher starts.
const manager_interval_ms: u64 = 50;
/// How often leaders look at their ISR.
const isr_check_interval_ms: u64 = 250;
/// A follower's fetch long-poll (Kafka's replica.fetch.wait.max.ms).
const replica_fetch_wait_ms: i32 = 500;
/// Bytes per partition per fetch (Kafka's replica.fetch.max.bytes).
const replica_fetch_bytes_max: i32 = 1024 * 1024;
/// Bytes per fetch answer, all partitions together (Kafka's
/// replica.fetch.response.max.bytes).
const replica_fetch_response_bytes_max: i32 = 10 * 1024 * 1024;
/// Pause after a connection error before a fetcher tries again (replica.fetch.backoff.ms;
/// an error on one partition pauses it as long, in its replica machine).
const replica_fetch_backoff_ms: u64 = crate::replication::REPLICA_FETCH_BACKOFF_MS as u64;
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
        start_fetchers(&ctx, starts);
        start_group_loads(&ctx);
        super::txn::start_loads(&ctx);
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
    // A stopping shard opens nothing more: its logs are about to close (the partitions
    // open at the next start).
    if opens.is_empty() || ctx.stopping.get() {
        return;
    }
    let ctx = ctx.clone();
    glommio::spawn_local(async move {
        let started_ms = now_ms();
        let opened = ctx.run_blocking(move || crate::shard::open_logs(opens, started_ms)).await;
        let starts = {
            let mut shard = ctx.shard.borrow_mut();
            shard.install_opened_later(opened, now_ms());
            shard.take_fetcher_starts()
        };
        start_fetchers(&ctx, starts);
        start_group_loads(&ctx);
        super::txn::start_loads(&ctx);
        ctx.wakeup();
    })
    .detach();
}

/// Load the groups of the `__consumer_offsets` partitions this shard began to lead: the
/// log is read on the blocking pool, a bounded chunk at a time, and replayed on the
/// shard between reads (its group requests get COORDINATOR_LOAD_IN_PROGRESS meanwhile).
pub(super) fn start_group_loads(ctx: &Rc<ShardContext>) {
    let loads = ctx.shard.borrow_mut().take_group_loads();
    for load in loads {
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            let started = Instant::now();
            loop {
                if ctx.stopping.get() {
                    return;
                }
                let step = ctx.shard.borrow_mut().group_load_next(&load);
                let crate::shard::GroupLoadStep::Read(plan) = step else { break };
                let delay = Duration::from_millis(ctx.config.test_group_load_delay_ms);
                let read = ctx
                    .run_blocking(move || {
                        if !delay.is_zero() {
                            std::thread::sleep(delay); // tests only
                        }
                        plan.read_to_vec()
                    })
                    .await;
                ctx.shard.borrow_mut().group_load_apply(&load, read, now_ms());
            }
            tracing::debug!(partition = %load.tp, load_ms = started.elapsed().as_millis() as u64, "group load over");
        })
        .detach();
    }
}

/// Send an ISR change to the active coordinator (here, or on another broker) and hand
/// the answer to the partition.
async fn alter_isr(ctx: Rc<ShardContext>, tp: TopicPartition, proposal: IsrProposal) {
    let me = NodeId(ctx.config.node_id);
    tracing::info!(partition = %tp, isr = ?proposal.new_isr, "proposing an ISR change");
    let active = ctx.view().is_active();
    let sent = proposal.clone();
    let isr_with_epochs: Vec<(NodeId, BrokerEpoch)> =
        proposal.new_isr.iter().copied().zip(proposal.broker_epochs.iter().copied()).collect();
    // Err((outcome, why)): Refused when the coordinator answered no, Unknown when there
    // was no answer (the change may have been committed).
    let result: Result<(Vec<NodeId>, PartitionEpoch), (IsrOutcome, String)> = if active {
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
                .with_leader_epoch(proposal.leader_epoch.0)
                .with_partition_epoch(proposal.partition_epoch.0);
            if version >= 3 {
                data.new_isr_with_epochs = isr_with_epochs
                    .iter()
                    .map(|(b, epoch)| BrokerState::default().with_broker_id(BrokerId(b.0)).with_broker_epoch(epoch.0))
                    .collect();
            } else {
                data.new_isr = proposal.new_isr.iter().map(|b| BrokerId(b.0)).collect();
            }
            let req = AlterPartitionRequest::default()
                .with_broker_id(BrokerId(me.0))
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
            Ok((p.isr.iter().map(|b| NodeId(b.0)).collect(), PartitionEpoch(p.partition_epoch)))
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

/// The partitions one fetcher carries, with the leader epoch each is followed in
/// (shared between the shard's replication tasks and that fetcher). What to do for each
/// (truncate, fetch, wait after an error) is its replica machine's decision, asked
/// through the shard (`Shard::follower_step`).
pub type FetcherPartitions = Rc<RefCell<BTreeMap<TopicPartition, LeaderEpoch>>>;

/// Hand follower partitions to their fetchers: this shard has one fetcher per source
/// broker, carrying every partition of this shard that broker leads, over one
/// connection and one fetch session (Kafka's ReplicaFetcherThread, per core). A new
/// leader epoch re-enters its partition (its replica machine truncates again).
pub(super) fn start_fetchers(ctx: &Rc<ShardContext>, starts: Vec<FetcherStart>) {
    for FetcherStart { tp, leader, leader_epoch } in starts {
        if let Some(parts) = ctx.fetchers.borrow().get(&leader) {
            parts.borrow_mut().insert(tp, leader_epoch);
            continue;
        }
        let parts: FetcherPartitions = Rc::new(RefCell::new(BTreeMap::from([(tp, leader_epoch)])));
        ctx.fetchers.borrow_mut().insert(leader, parts.clone());
        // (No borrow held here: the new task may run before this returns.)
        let ctx = ctx.clone();
        glommio::spawn_local(async move { fetcher(ctx, leader, parts).await }).detach();
    }
}

/// The fetcher of the partitions this shard follows on broker `leader` (see the module
/// comment). It ends when it carries none.
async fn fetcher(ctx: Rc<ShardContext>, leader: NodeId, parts: FetcherPartitions) {
    let me = ctx.config.node_id;
    let mut peer: Option<Peer> = None;
    let mut session = FollowerSession::default();
    let mut last_error = String::new();
    let mut paused_for_disk = false;
    tracing::debug!(%leader, partitions = parts.borrow().len(), "fetcher started");
    loop {
        // Once stopping, the shard is being closed (and held): nothing more to fetch.
        if !ctx.stopping.get() {
            // Partitions that moved (new leader, new epoch: re-entered by
            // `start_fetchers`) or are gone leave this fetcher.
            let shard = ctx.shard.borrow();
            parts.borrow_mut().retain(|tp, epoch| shard.follows(tp, leader, *epoch));
        }
        if ctx.stopping.get() || parts.borrow().is_empty() {
            let mut fetchers = ctx.fetchers.borrow_mut();
            if fetchers.get(&leader).is_some_and(|p| Rc::ptr_eq(p, &parts)) {
                fetchers.remove(&leader);
            }
            tracing::debug!(%leader, "fetcher stopped");
            return;
        }
        // Below the free-space floor a follower takes no more data (it falls out of the
        // ISR, as a slow one does) rather than fill the disk and take its log offline.
        if let Some(reason) = ctx.disk.produce_refusal() {
            if !paused_for_disk {
                tracing::warn!(%leader, %reason, "replica fetch paused: disk below the free-space floor");
                paused_for_disk = true;
            }
            glommio::timer::sleep(Duration::from_millis(replica_fetch_backoff_ms)).await;
            continue;
        }
        if paused_for_disk {
            tracing::info!(%leader, "replica fetch resumed: disk above the free-space floor");
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
                peer = Some(
                    Peer::connect(&addr, &format!("spate-replica-{me}"), ctx.config.inter_broker_security()?).await?,
                );
            }
            let conn = peer.as_mut().expect("connected above");
            truncate(&ctx, conn, leader, &parts).await?;
            let idle = fetch(&ctx, conn, &mut session, leader, &parts).await?;
            if idle {
                // Nothing may fetch now (all waiting to retry): do not spin.
                glommio::timer::sleep(Duration::from_millis(replica_fetch_backoff_ms)).await;
            }
            Ok::<(), String>(())
        };
        match step.await {
            Ok(()) => last_error.clear(),
            Err(e) => {
                if e != last_error {
                    tracing::warn!(%leader, partitions = parts.borrow().len(), error = %e,
                        "replica fetch failed; retrying");
                    last_error = e;
                }
                peer = None;
                glommio::timer::sleep(Duration::from_millis(replica_fetch_backoff_ms)).await;
            }
        }
    }
}

/// What the replica machines of the fetcher's partitions do next, one call per
/// partition: (partition, leader epoch, step, log position).
fn next_steps(
    ctx: &ShardContext,
    leader: NodeId,
    parts: &FetcherPartitions,
) -> Vec<(TopicPartition, LeaderEpoch, FollowerStep, FollowerLog)> {
    let now = now_ms();
    let parts: Vec<(TopicPartition, LeaderEpoch)> = parts.borrow().iter().map(|(tp, e)| (tp.clone(), *e)).collect();
    let mut shard = ctx.shard.borrow_mut();
    parts
        .into_iter()
        .filter_map(|(tp, epoch)| {
            let (step, log) = shard.follower_step(&tp, leader, epoch, now)?;
            Some((tp, epoch, step, log))
        })
        .collect()
}

/// An error on one partition of a fetcher: its replica machine pauses it and makes it
/// truncate again; logged once per new error; the other partitions go on.
fn partition_failed(ctx: &ShardContext, tp: &TopicPartition, leader: NodeId, leader_epoch: LeaderEpoch, error: String) {
    if ctx.shard.borrow_mut().follower_failed(tp, leader, leader_epoch, now_ms(), error.clone()) {
        tracing::warn!(partition = %tp, %leader, %error, "replica fetch failed; retrying");
    }
}

/// One round of truncation by leader epoch for the partitions whose replica machine
/// asks for it, in one OffsetForLeaderEpoch request; the machine decides where each
/// truncates (and whether it asks again: KIP-279).
async fn truncate(
    ctx: &ShardContext,
    conn: &mut Peer,
    leader: NodeId,
    parts: &FetcherPartitions,
) -> Result<(), String> {
    let asked: Vec<(TopicPartition, LeaderEpoch, LeaderEpoch)> = next_steps(ctx, leader, parts)
        .into_iter()
        .filter_map(|(tp, epoch, step, _)| match step {
            FollowerStep::AskEpoch { latest_epoch } => Some((tp, epoch, latest_epoch)),
            _ => None,
        })
        .collect();
    if asked.is_empty() {
        return Ok(());
    }
    let mut topics: Vec<OffsetForLeaderTopic> = Vec::new();
    for (tp, leader_epoch, epoch) in &asked {
        let partition = OffsetForLeaderPartition::default()
            .with_partition(tp.partition)
            .with_current_leader_epoch(leader_epoch.0)
            .with_leader_epoch(epoch.0);
        match topics.iter_mut().find(|t| t.topic.as_str() == tp.topic.as_str()) {
            Some(t) => t.partitions.push(partition),
            None => topics.push(
                OffsetForLeaderTopic::default()
                    .with_topic(TopicName(crate::client::sb(&tp.topic)))
                    .with_partitions(vec![partition]),
            ),
        }
    }
    let req = OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(ctx.config.node_id)).with_topics(topics);
    let resp = conn.call(3, &req, Duration::from_millis(replica_request_timeout_ms)).await?;
    for (tp, leader_epoch, epoch) in asked {
        let answer = resp
            .topics
            .iter()
            .filter(|t| t.topic.as_str() == tp.topic.as_str())
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition == tp.partition);
        let Some(p) = answer else {
            partition_failed(ctx, &tp, leader, leader_epoch, "not in the OffsetForLeaderEpoch answer".into());
            continue;
        };
        if p.error_code != 0 {
            let error = format!("OffsetForLeaderEpoch answered error code {}", p.error_code);
            partition_failed(ctx, &tp, leader, leader_epoch, error);
            continue;
        }
        let truncated = ctx.shard.borrow_mut().follower_epoch_answer(
            &tp,
            leader,
            leader_epoch,
            epoch,
            (LeaderEpoch(p.leader_epoch), p.end_offset),
        );
        if let Err(e) = truncated {
            partition_failed(ctx, &tp, leader, leader_epoch, e.to_string());
        }
    }
    Ok(())
}

/// Nothing is appended past a truncation before it is durable (`PartitionLog::truncate_to`
/// leaves the fsyncs to the group-commit round, off the data core): wait for the rounds
/// that make the truncations of `ready` durable. A partition whose round failed (its log
/// is offline now) leaves `ready`.
async fn truncations_durable(
    ctx: &ShardContext,
    leader: NodeId,
    ready: &mut Vec<(TopicPartition, LeaderEpoch, FollowerLog)>,
) {
    let mut failed = Vec::new();
    loop {
        let waits: Vec<_> = {
            let mut shard = ctx.shard.borrow_mut();
            ready
                .iter()
                .filter(|(tp, _, _)| !failed.contains(tp))
                .filter_map(|(tp, epoch, _)| shard.truncation_flush(tp).map(|rx| (tp.clone(), *epoch, rx)))
                .collect()
        };
        if waits.is_empty() {
            break;
        }
        ctx.wakeup();
        for (tp, epoch, rx) in waits {
            match rx.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    partition_failed(ctx, &tp, leader, epoch, format!("truncation fsync: {e}"));
                    failed.push(tp);
                }
                Err(_) => {
                    partition_failed(ctx, &tp, leader, epoch, "truncation fsync: partition gone".into());
                    failed.push(tp);
                }
            }
        }
    }
    ready.retain(|(tp, _, _)| !failed.contains(tp));
}

/// A follower's incremental fetch session with its leader (KIP-227): after the first
/// full request, a partition is named only when its fetch position moved (or it is new),
/// partitions that left are named as forgotten, and the leader answers with a partition
/// only when something is new.
#[derive(Debug, Default)]
struct FollowerSession {
    id: i32,
    next_epoch: i32,
    /// Per partition in the session: (fetch offset, log start offset) last sent.
    sent: HashMap<TopicPartition, (i64, i64)>,
}

/// One Fetch (v15) for every truncated partition of the fetcher. Returns true when no
/// partition could be fetched (nothing was sent).
async fn fetch(
    ctx: &ShardContext,
    conn: &mut Peer,
    session: &mut FollowerSession,
    leader: NodeId,
    parts: &FetcherPartitions,
) -> Result<bool, String> {
    let me = NodeId(ctx.config.node_id);
    // Position of every partition that may fetch now.
    let mut ready: Vec<(TopicPartition, LeaderEpoch, FollowerLog)> = next_steps(ctx, leader, parts)
        .into_iter()
        .filter(|(_, _, step, _)| *step == FollowerStep::Fetch)
        .map(|(tp, epoch, _, log)| (tp, epoch, log))
        .collect();
    truncations_durable(ctx, leader, &mut ready).await;
    // Replication throttle (follower side): throttled partitions of which this broker is
    // not an in-sync replica sit this fetch out while this shard's follower rate is
    // exceeded.
    let follower_rate = throttle::shard_rate(&ctx.view(), me, throttle::FOLLOWER_RATE, ctx.nr_shards);
    let throttled = |view: &crate::coordinator::view::ClusterView, tp: &TopicPartition| {
        follower_rate != THROTTLED_RATE_UNLIMITED
            && view
                .get(&tp.topic)
                .is_some_and(|m| throttle::throttled(&m.configs, throttle::FOLLOWER_REPLICAS, tp.partition, me))
            && !view.partition(&tp.topic, tp.partition).is_some_and(|(_, s)| s.isr.contains(&me))
    };
    if follower_rate != THROTTLED_RATE_UNLIMITED
        && ctx.replication_throttle.borrow_mut().follower.exceeded(follower_rate, now_ms())
    {
        let view = ctx.view();
        ready.retain(|(tp, _, _)| !throttled(&view, tp));
    }
    if ready.is_empty() && session.sent.is_empty() {
        return Ok(true);
    }
    // v15 names topics by id and this incarnation by its broker epoch (KIP-903): what the
    // coordinator has for us, which is this incarnation's registration once roles are
    // taken (`ClusterView::may_take_roles`).
    let view = ctx.view();
    let broker_epoch = view.broker_info(me).map_or(NO_BROKER_EPOCH, |b| b.registration_epoch);
    let mut req = FetchRequest::default()
        .with_replica_state(ReplicaState::default().with_replica_id(BrokerId(me.0)).with_replica_epoch(broker_epoch.0))
        .with_max_wait_ms(replica_fetch_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(replica_fetch_response_bytes_max)
        .with_session_id(session.id)
        .with_session_epoch(if session.id == 0 { 0 } else { session.next_epoch });
    let full = session.id == 0;
    if full {
        session.sent.clear();
    }
    let mut sending: Vec<(TopicPartition, (i64, i64))> = Vec::new();
    for (tp, leader_epoch, state) in &ready {
        let position = (state.log_end_offset, state.log_start_offset);
        if !full && session.sent.get(tp) == Some(&position) {
            continue;
        }
        let Some(topic_id) = view.get(&tp.topic).map(|m| m.id) else { continue };
        let partition = FetchPartition::default()
            .with_partition(tp.partition)
            .with_current_leader_epoch(leader_epoch.0)
            .with_fetch_offset(state.log_end_offset)
            .with_log_start_offset(state.log_start_offset)
            .with_partition_max_bytes(replica_fetch_bytes_max);
        match req.topics.iter_mut().find(|t| t.topic_id == topic_id) {
            Some(t) => t.partitions.push(partition),
            None => req.topics.push(FetchTopic::default().with_topic_id(topic_id).with_partitions(vec![partition])),
        }
        sending.push((tp.clone(), position));
    }
    // Partitions in the session that may not fetch now (left, or truncating again).
    let forgotten: Vec<TopicPartition> =
        session.sent.keys().filter(|tp| !ready.iter().any(|(r, _, _)| r == *tp)).cloned().collect();
    for tp in &forgotten {
        session.sent.remove(tp);
        let Some(topic_id) = view.get(&tp.topic).map(|m| m.id) else { continue };
        match req.forgotten_topics_data.iter_mut().find(|t| t.topic_id == topic_id) {
            Some(t) => t.partitions.push(tp.partition),
            None => req
                .forgotten_topics_data
                .push(ForgottenTopic::default().with_topic_id(topic_id).with_partitions(vec![tp.partition])),
        }
    }
    drop(view);
    if ready.is_empty() && session.sent.is_empty() {
        // Only forgetting left: the session is dropped by starting a new one next time.
        *session = FollowerSession::default();
        return Ok(true);
    }
    let resp = conn.call(replica_fetch_version, &req, Duration::from_millis(replica_request_timeout_ms)).await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            *session = FollowerSession::default();
            return Err(e);
        }
    };
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
    if session.id == 0 {
        session.sent.clear(); // no session: every request names every partition
    } else {
        session.sent.extend(sending);
    }
    let ready_epochs: HashMap<&TopicPartition, LeaderEpoch> = ready.iter().map(|(tp, epoch, _)| (tp, *epoch)).collect();
    let view = ctx.view();
    for t in &resp.responses {
        let Some(topic) = view.by_id(t.topic_id).map(|(name, _)| name.to_string()) else { continue };
        for p in &t.partitions {
            let tp = TopicPartition::new(topic.as_str(), p.partition_index);
            let Some(&leader_epoch) = ready_epochs.get(&tp) else { continue };
            match p.error_code {
                error_code::NONE => {
                    let records = p.records.clone().unwrap_or_default();
                    if !records.is_empty() && throttled(&view, &tp) {
                        ctx.replication_throttle.borrow_mut().follower.record(records.len() as u64, now_ms());
                    }
                    let appended = ctx.shard.borrow_mut().replica_append(
                        &tp,
                        leader,
                        leader_epoch,
                        &records,
                        p.high_watermark,
                        now_ms(),
                    );
                    match appended {
                        Ok(_) => {
                            ctx.disk.note_appended(records.len() as u64);
                            // The leader's log start moved (DeleteRecords): ours follows.
                            if ctx.shard.borrow_mut().follower_log_start(&tp, p.log_start_offset) {
                                ctx.wakeup();
                            }
                        }
                        Err(e) => {
                            session.sent.remove(&tp);
                            partition_failed(ctx, &tp, leader, leader_epoch, format!("append: {e}"));
                        }
                    }
                }
                error_code::OFFSET_OUT_OF_RANGE => {
                    session.sent.remove(&tp);
                    // Below the leader's log start (retention removed what we would
                    // fetch next)? Then start over there, as Kafka's follower does
                    // (it asks the leader with ListOffsets too).
                    let start = match leader_log_start(ctx, conn, &tp, leader_epoch).await {
                        Ok(start) => start,
                        Err(e) => {
                            partition_failed(ctx, &tp, leader, leader_epoch, e);
                            continue;
                        }
                    };
                    let decided = ctx.shard.borrow_mut().follower_out_of_range(&tp, leader, leader_epoch, start);
                    match decided {
                        Ok(OutOfRange::StartOver(_)) => {}
                        Ok(OutOfRange::TruncateAgain) => {
                            tracing::warn!(partition = %tp, "fetch offset out of the leader's range: truncating by epoch again");
                            let error = "fetch offset out of the leader's range".to_string();
                            partition_failed(ctx, &tp, leader, leader_epoch, error);
                        }
                        Err(e) => partition_failed(ctx, &tp, leader, leader_epoch, format!("start over: {e}")),
                    }
                }
                code => {
                    session.sent.remove(&tp);
                    partition_failed(ctx, &tp, leader, leader_epoch, format!("Fetch answered error code {code}"));
                }
            }
        }
    }
    Ok(false)
}

/// The leader's log start offset for `tp` (ListOffsets, earliest), as a follower asks
/// when its fetch offset is out of the leader's range.
async fn leader_log_start(
    ctx: &ShardContext,
    conn: &mut Peer,
    tp: &TopicPartition,
    leader_epoch: LeaderEpoch,
) -> Result<i64, String> {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::ListOffsetsRequest;
    const EARLIEST: i64 = -2;
    let req = ListOffsetsRequest::default().with_replica_id(BrokerId(ctx.config.node_id)).with_topics(vec![
        ListOffsetsTopic::default().with_name(TopicName(crate::client::sb(&tp.topic))).with_partitions(vec![
            ListOffsetsPartition::default()
                .with_partition_index(tp.partition)
                .with_current_leader_epoch(leader_epoch.0)
                .with_timestamp(EARLIEST),
        ]),
    ]);
    let resp = conn.call(4, &req, Duration::from_millis(replica_request_timeout_ms)).await?;
    let p = resp
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == tp.partition)
        .ok_or("empty ListOffsets answer")?;
    if p.error_code != 0 {
        return Err(format!("ListOffsets answered error code {}", p.error_code));
    }
    Ok(p.offset)
}
