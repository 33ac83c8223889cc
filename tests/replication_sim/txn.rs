//! Transactions in the replication simulation: a transactional producer, the transaction
//! coordinator (spate's real, pure `txn::coordinator::TxnCoordinator`) on a node of its
//! own, the leaders' side of WriteTxnMarkers, a read_committed reader, and invariants
//! 8-10 (see the module comment of replication_sim.rs).
//!
//! The coordinator is one node whose writes to `__transaction_state` are modelled as
//! acknowledged at once (`written(true)` right after each decision). It fails over now
//! and then as a new leader of that partition would take over (the network path to
//! another broker and the partition's own replication are left to the integration
//! tests): a new machine `load`s the last record written, the coordinator epoch grows,
//! the marker round in flight is dropped and `resume` starts it again, while the old
//! epoch's requests may still land. Everything it says to the client and to the leaders goes
//! through the simulated network (delayed, lost, duplicated; WriteTxnMarkers is never
//! duplicated, being one request on one TCP connection, and its timeout is above the
//! network's largest delay, so no request lands after the coordinator gave up on it).
//! It learns each partition's leader from the controller at every round of markers (a
//! fresh metadata view) and retries markers as `server::txn::send_markers` does: one
//! request per partition leader, with a doubling backoff, until every partition answered.

use std::collections::{BTreeSet, HashMap};

use spate::model::TopicPartition;
use spate::txn::coordinator::{Answer, Decision, Markers, TxnCoordinator, TRANSACTION_MAX_TIMEOUT_MS};

use super::*;

/// The one transactional id of the simulated client.
const TXN_ID: &str = "sim-txn";
/// The producer's transaction.timeout.ms (short, so that a killed producer's
/// transaction is aborted by the coordinator within a seed).
const TXN_TIMEOUT_MS: i32 = 5_000;
/// How often the coordinator looks for transactions past their timeout (stands for
/// Kafka's 10 s `transaction.abort.timed.out.transaction.cleanup.interval.ms`).
const TXN_EXPIRE_INTERVAL_MS: u64 = 200;
/// Chance per step (while faults run), in 10,000ths, that the coordinator fails over.
const COORDINATOR_FAILOVER_PER_10K: u64 = 3;
/// A client's request to the coordinator is sent again after this without an answer.
const TXN_REQUEST_TIMEOUT_MS: u64 = 1_000;
/// A WriteTxnMarkers request is given up after this (above the network's largest delay).
const MARKER_REQUEST_TIMEOUT_MS: u64 = 1_000;
/// Backoff between marker rounds with partitions left, doubling up to the max
/// (`server::txn`'s `marker_retry_backoff_ms`).
const MARKER_RETRY_BACKOFF_MS: u64 = 100;
const MARKER_RETRY_BACKOFF_MS_MAX: u64 = 2_000;
/// Batches per transaction at most.
const TXN_BATCHES_MAX: u64 = 6;
/// Percent of transactions whose producer process dies once their batches are written
/// (before EndTxn).
const TXN_DIES_PCT: u64 = 10;
/// Percent of transactions the client commits (the others it aborts).
const TXN_COMMIT_PCT: u64 = 75;
/// Producer ids the coordinator hands out start above this.
const TXN_PRODUCER_IDS_FROM: i64 = 5_000;

/// A client's request to the transaction coordinator.
#[derive(Debug, Clone)]
pub(super) enum TxnRequest {
    /// A new producer instance (no id and epoch of its own yet: `expected` is None).
    InitProducerId,
    /// AddPartitionsToTxn for one partition; `txn` is the client's count of its
    /// transactions (simulation bookkeeping, not on the wire).
    AddPartitions {
        producer: ProducerIdAndEpoch,
        partition: usize,
        txn: u64,
    },
    EndTxn {
        producer: ProducerIdAndEpoch,
        commit: bool,
    },
}

// ---- The coordinator ----

/// Markers being written for the transaction being completed.
struct MarkerRound {
    markers: Markers,
    /// Partition -> the request in flight there (request, sent at), if any.
    left: BTreeMap<usize, Option<(u64, u64)>>,
    next_ms: u64,
    backoff_ms: u64,
}

/// The transaction coordinator's broker, as `server::txn` drives the machine.
pub(super) struct TxnCoordinatorNode {
    machine: TxnCoordinator,
    last_producer_id: i64,
    /// The client's transaction that the id's open transaction is (bookkeeping: set when
    /// AddPartitionsToTxn is written, taken when the transaction's outcome is decided).
    open_txn: Option<u64>,
    round: Option<MarkerRound>,
    next_expire_ms: u64,
    /// The `__transaction_state` partition's leader epoch, carried by every marker.
    coordinator_epoch: i32,
}

impl TxnCoordinatorNode {
    pub(super) fn new() -> Self {
        Self {
            machine: TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS),
            last_producer_id: TXN_PRODUCER_IDS_FROM,
            open_txn: None,
            round: None,
            next_expire_ms: 0,
            coordinator_epoch: 0,
        }
    }

    /// Idle: no write or marker in flight, no transaction open.
    fn idle(&self) -> bool {
        self.round.is_none()
            && !self.machine.is_pending(TXN_ID)
            && self.machine.get(TXN_ID).is_none_or(|r| r.state.is_idle())
    }
}

// ---- The transactional producer ----

/// A batch of the open transaction, until it is acknowledged.
struct TxnBatch {
    batch: ProducerBatch,
    ids: Vec<u64>,
    /// The request that carries it now and when it was sent.
    inflight: Option<(u64, u64)>,
    send_at_ms: u64,
    sends: u32,
}

struct OpenTxn {
    number: u64,
    /// Batches still to write before ending it.
    batches_left: u64,
    commit: bool,
    /// The process dies instead of ending it.
    dies: bool,
    /// Partitions AddPartitionsToTxn was answered for.
    added: BTreeSet<usize>,
    /// Per partition, oldest first; one in flight at a time.
    pending: Vec<VecDeque<TxnBatch>>,
}

/// What the producer does next about its transaction.
enum Next {
    Init,
    Begin,
    Write(ProducerIdAndEpoch),
    End(ProducerIdAndEpoch, bool),
    Forget,
    Wait,
}

enum Phase {
    /// The process died; a new instance starts at `restart_ms`.
    Dead {
        restart_ms: u64,
    },
    /// A new instance: InitProducerId until answered.
    Init,
    Ready {
        producer: ProducerIdAndEpoch,
        open: Option<OpenTxn>,
    },
}

/// A transactional producer at acks=all (the Java client's `TransactionManager`, one
/// `transactional.id`), transaction version 1: InitProducerId, then per transaction
/// AddPartitionsToTxn before the first batch to a partition, idempotent transactional
/// batches (sequences per partition within the epoch, kept across transactions), and
/// EndTxn once every batch is acknowledged (commit or abort, the seed's choice), as
/// the client flushes before it ends a transaction. One request to the coordinator at a
/// time, resent after `TXN_REQUEST_TIMEOUT_MS`; CONCURRENT_TRANSACTIONS is retried. A
/// batch whose answer is lost or retriable is sent again unchanged; one batch in flight
/// per partition (where Kafka allows 5: a simplification that keeps a transaction's
/// batches in order without the epoch bumps the idempotent producer exercises).
/// Fenced (INVALID_PRODUCER_EPOCH from a leader, PRODUCER_FENCED from the coordinator:
/// the coordinator aborted its transaction after the timeout), or refused a batch
/// otherwise, it starts over as a new instance whose InitProducerId aborts whatever was
/// open. Sometimes the process dies mid-transaction and comes back later: its
/// transaction ends by the coordinator's timeout or by the new instance's
/// InitProducerId.
pub(super) struct TxnProducer {
    /// The settle phase: no new transaction; the open one goes on to its end.
    pub(super) settling: bool,
    /// After the faults: no process dies any more.
    pub(super) immortal: bool,
    phase: Phase,
    /// The coordinator request in flight: (request id, request, sent at).
    request: Option<(u64, TxnRequest, u64)>,
    retry_at_ms: u64,
    next_seq: Vec<i32>,
    /// Produce request -> (partition, epoch, first sequence) of its batch.
    requests: BTreeMap<u64, (usize, ProducerEpoch, i32)>,
    next_txn: u64,
}

impl TxnProducer {
    pub(super) fn new(partitions: usize) -> Self {
        Self {
            settling: false,
            immortal: false,
            phase: Phase::Init,
            request: None,
            retry_at_ms: 0,
            next_seq: vec![0; partitions],
            requests: BTreeMap::new(),
            next_txn: 1,
        }
    }

    /// A new instance of the process: it knows nothing but its transactional id.
    fn start_over(&mut self) {
        self.phase = Phase::Init;
        self.request = None;
        self.requests.clear();
        self.next_seq.iter_mut().for_each(|s| *s = 0);
    }
}

// ---- What the checker remembers ----

/// (transaction, first offset, last offset) of each batch of a transaction in a log.
type LoggedBatches = Vec<(u64, i64, i64)>;

/// One partition's committed log as a read_committed reader sees it, scanned once.
#[derive(Default)]
struct TxnScan {
    scanned: usize,
    /// Transactions with data in the committed log and no marker there yet: producer ->
    /// (first offset, its batches as (transaction, first offset, last offset)).
    open: BTreeMap<ProducerId, (i64, LoggedBatches)>,
    /// `straddled[l]`: a read ending at `l` would hold part of an ended transaction
    /// (some of its records below `l`, its marker at or above).
    straddled: Vec<bool>,
    /// The newest producer epoch each producer showed in this partition's committed log.
    epochs: HashMap<ProducerId, ProducerEpoch>,
    /// Transactions whose marker is in this partition's committed log.
    ended: BTreeSet<u64>,
}

pub(super) struct TxnHistory {
    /// The client's transaction -> committed (true) or aborted, as the coordinator decided.
    decided: BTreeMap<u64, bool>,
    /// (transaction, partition) AddPartitionsToTxn wrote.
    added: BTreeSet<(u64, usize)>,
    /// (producer, epoch, partition) of every marker the coordinator sent.
    markers_sent: BTreeSet<(ProducerId, ProducerEpoch, usize)>,
    /// (transaction, partition) -> its acknowledged batches (first offset, last offset).
    acked: BTreeMap<(u64, usize), Vec<(i64, i64)>>,
    scans: Vec<TxnScan>,
    /// (broker, incarnation, partition, leader epoch) -> its last stable offset as leader.
    leader_lsos: BTreeMap<(NodeId, u32, usize, LeaderEpoch), i64>,
}

impl TxnHistory {
    pub(super) fn new(partitions: usize) -> Self {
        Self {
            decided: BTreeMap::new(),
            added: BTreeSet::new(),
            markers_sent: BTreeSet::new(),
            acked: BTreeMap::new(),
            scans: (0..partitions).map(|_| TxnScan { straddled: vec![false], ..TxnScan::default() }).collect(),
            leader_lsos: BTreeMap::new(),
        }
    }
}

impl Default for TxnHistory {
    fn default() -> Self {
        Self::new(0)
    }
}

/// What a read_committed consumer gets from `records` (a leader's log) read from 0 up
/// to `last_stable_offset`, as Kafka's consumer does: the leader reads below the last
/// stable offset and lists the aborted transactions in that range (its aborted
/// transaction index, built from the ABORT markers in its log: producer and first
/// offset); the consumer drops the data batches of those transactions and every marker.
/// Returns the record ids it hands to the application.
fn read_committed(records: &[Record], last_stable_offset: i64) -> Vec<u64> {
    // The aborted index: (producer, first offset, marker offset) of each aborted transaction.
    let mut first: HashMap<ProducerId, i64> = HashMap::new();
    let mut aborted: Vec<(ProducerId, i64, i64)> = Vec::new();
    for (offset, r) in records.iter().enumerate() {
        let offset = offset as i64;
        if let Some((b, 0)) = r.batch.filter(|(b, _)| b.transactional) {
            first.entry(b.producer_id).or_insert(offset);
        }
        if let Some(m) = r.marker {
            let start = first.remove(&m.producer_id).unwrap_or(offset);
            if !m.commit {
                aborted.push((m.producer_id, start, offset));
            }
        }
    }
    let end = (last_stable_offset.max(0) as usize).min(records.len());
    records[..end]
        .iter()
        .enumerate()
        .filter(|(offset, r)| {
            let offset = *offset as i64;
            let in_aborted = r.batch.is_some_and(|(b, _)| {
                aborted.iter().any(|&(id, start, marker)| id == b.producer_id && start <= offset && offset < marker)
            });
            r.marker.is_none() && !in_aborted
        })
        .map(|(_, r)| r.id)
        .collect()
}

impl Sim {
    fn coordinator(&mut self) -> &mut TxnCoordinatorNode {
        self.coordinator.as_mut().expect("a transactional seed has a coordinator")
    }

    /// The settle phase begins: a dead producer process comes back at once, and no
    /// process dies any more.
    pub(super) fn txn_settle(&mut self) {
        let now = self.now_ms;
        let producer = self.txn_producer();
        producer.immortal = true;
        if let Phase::Dead { restart_ms } = &mut producer.phase {
            *restart_ms = now;
        }
    }

    fn txn_producer(&mut self) -> &mut TxnProducer {
        self.client.txn.as_mut().expect("a transactional seed has a transactional producer")
    }

    // ---- The coordinator node ----

    pub(super) fn coordinator_receive(&mut self, from: Node, body: Body) {
        match body {
            Body::Txn { req, request } => {
                let result = self.coordinator_request(request);
                self.send(Node::TxnCoordinator, from, Body::TxnAnswer { req, result });
            }
            Body::WriteTxnMarkerAnswer { req, partition, result } => self.marker_answer(req, partition, result),
            other => panic!("the transaction coordinator got {other:?}"),
        }
    }

    /// One client request, as `server::txn::serve` runs it: the machine's decision, and
    /// when it asks for a write, the write (acknowledged at once) and its answer.
    fn coordinator_request(&mut self, request: TxnRequest) -> Result<Option<ProducerIdAndEpoch>, TxnError> {
        let now = self.now_ms as i64;
        let c = self.coordinator.as_mut().expect("coordinator");
        let TxnCoordinatorNode { machine, last_producer_id, open_txn, .. } = c;
        let mut allocate = || {
            *last_producer_id += 1;
            *last_producer_id
        };
        let decision = match request {
            TxnRequest::InitProducerId => {
                match machine.init_producer_id(TXN_ID, TXN_TIMEOUT_MS, None, now, &mut allocate)? {
                    Decision::Answer(id) => Decision::Answer(Some(id)),
                    Decision::Write(r) => Decision::Write(r),
                }
            }
            TxnRequest::AddPartitions { producer, partition, txn } => {
                let tp = TopicPartition::new(TOPIC, partition as i32);
                match machine.add_partitions(TXN_ID, producer, &[tp], now)? {
                    Decision::Answer(()) => Decision::Answer(None),
                    Decision::Write(r) => {
                        *open_txn = Some(txn);
                        self.hist.txn.added.insert((txn, partition));
                        Decision::Write(r)
                    }
                }
            }
            TxnRequest::EndTxn { producer, commit } => match machine.end_txn(TXN_ID, producer, commit, now)? {
                Decision::Answer(()) => Decision::Answer(None),
                Decision::Write(r) => Decision::Write(r),
            },
        };
        match decision {
            Decision::Answer(a) => Ok(a),
            Decision::Write(_) => match self.coordinator_written() {
                Some(Ok(Answer::Producer(id))) => Ok(Some(id)),
                Some(Ok(Answer::Done)) => Ok(None),
                Some(Err(e)) => Err(e),
                None => unreachable!("a client's request waits for its write"),
            },
        }
    }

    /// The write the machine asked for is acknowledged (at once, see the module
    /// comment); a Prepare* state starts its markers.
    fn coordinator_written(&mut self) -> Option<Result<Answer, TxnError>> {
        let written = self.coordinator().machine.written(TXN_ID, true);
        if let Some(markers) = written.markers {
            self.start_markers(markers);
        }
        written.answer
    }

    /// The outcome of the open transaction is decided (PrepareCommit or PrepareAbort
    /// written): its markers go to every partition the transaction added.
    fn start_markers(&mut self, markers: Markers) {
        let now = self.now_ms;
        let c = self.coordinator();
        let txn = c.open_txn.take();
        if c.round.is_some() {
            self.violation(format!("markers {markers:?} while another transaction's are being written"));
            return;
        }
        let partitions: Vec<usize> = markers.partitions.iter().map(|tp| tp.partition as usize).collect();
        let left = partitions.iter().map(|p| (*p, None)).collect();
        c.round =
            Some(MarkerRound { markers: markers.clone(), left, next_ms: now, backoff_ms: MARKER_RETRY_BACKOFF_MS });
        let Some(txn) = txn else {
            self.violation(format!("markers {markers:?} for no open transaction"));
            return;
        };
        self.note(format!(
            "coordinator: transaction {txn} ({}, epoch {}) {} in {partitions:?}",
            markers.producer_id,
            markers.producer_epoch,
            if markers.commit { "commits" } else { "aborts" }
        ));
        if let Some(earlier) = self.hist.txn.decided.insert(txn, markers.commit) {
            self.violation(format!("transaction {txn} decided twice ({earlier}, then {})", markers.commit));
        }
        let (id, epoch) = (ProducerId(markers.producer_id), ProducerEpoch(markers.producer_epoch));
        for p in partitions {
            if !self.hist.txn.added.contains(&(txn, p)) {
                self.violation(format!("a marker for p{p}, which transaction {txn} never added"));
            }
            self.hist.txn.markers_sent.insert((id, epoch, p));
        }
    }

    /// A new coordinator takes over: it loads the id's last record, and resumes the
    /// markers of a transaction being completed (`TxnCoordinator::resume`).
    fn coordinator_failover(&mut self) {
        let now = self.now_ms;
        let c = self.coordinator();
        let record = c.machine.get(TXN_ID).cloned();
        c.machine = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        c.machine.load(TXN_ID, record);
        c.coordinator_epoch += 1;
        c.round = c.machine.resume().into_iter().next().map(|(_, markers)| MarkerRound {
            left: markers.partitions.iter().map(|tp| (tp.partition as usize, None)).collect(),
            markers,
            next_ms: now,
            backoff_ms: MARKER_RETRY_BACKOFF_MS,
        });
        let (epoch, resumed) = (c.coordinator_epoch, c.round.is_some());
        self.note(format!("coordinator fails over to epoch {epoch} (markers resumed: {resumed})"));
        self.count("coordinator failovers");
    }

    pub(super) fn coordinator_timers(&mut self) {
        let now = self.now_ms;
        if self.knobs.fault_per_mille > 0 && self.rng.below(10_000) < COORDINATOR_FAILOVER_PER_10K {
            self.coordinator_failover();
        }
        if now >= self.coordinator().next_expire_ms {
            self.coordinator().next_expire_ms = now + TXN_EXPIRE_INTERVAL_MS;
            let c = self.coordinator();
            let TxnCoordinatorNode { machine, last_producer_id, .. } = c;
            let mut allocate = || {
                *last_producer_id += 1;
                *last_producer_id
            };
            let expired = machine.expire(now as i64, &mut allocate);
            for _ in expired {
                self.count("transactions aborted by the coordinator's timeout");
                let written = self.coordinator_written();
                assert!(written.is_none(), "nobody waits for a timeout's abort");
            }
        }
        let Some(round) = self.coordinator().round.as_mut() else { return };
        for slot in round.left.values_mut() {
            if slot.is_some_and(|(_, sent)| now >= sent + MARKER_REQUEST_TIMEOUT_MS) {
                *slot = None;
                round.next_ms = round.next_ms.max(now + round.backoff_ms);
            }
        }
        if now < round.next_ms {
            return;
        }
        let due: Vec<usize> = round.left.iter().filter(|(_, s)| s.is_none()).map(|(p, _)| *p).collect();
        let m = round.markers.clone();
        let coordinator_epoch = self.coordinator().coordinator_epoch;
        for p in due {
            let leader = self.controller.partition_state(TOPIC, p as i32).expect("partition").leader;
            if leader == NO_LEADER {
                continue;
            }
            let req = self.req();
            let round = self.coordinator().round.as_mut().expect("round");
            round.left.insert(p, Some((req, now)));
            let body = Body::WriteTxnMarker {
                req,
                partition: p,
                producer_id: ProducerId(m.producer_id),
                epoch: ProducerEpoch(m.producer_epoch),
                commit: m.commit,
                coordinator_epoch,
                transaction_version: m.transaction_version,
            };
            self.send(Node::TxnCoordinator, Node::Broker(leader), body);
        }
    }

    /// A leader's answer to WriteTxnMarkers: done there, or to retry after the backoff.
    /// Once every partition has its marker, the Complete* state is written.
    fn marker_answer(&mut self, req: u64, p: usize, result: Result<(), Refusal>) {
        let now = self.now_ms;
        let Some(round) = self.coordinator().round.as_mut() else { return };
        let Some(slot) = round.left.get_mut(&p) else { return };
        if slot.map(|(q, _)| q) != Some(req) {
            return;
        }
        match result {
            Ok(()) => {
                round.left.remove(&p);
                self.count("markers written");
                if self.coordinator().round.as_ref().is_some_and(|r| r.left.is_empty()) {
                    self.coordinator().round = None;
                    if self.coordinator().machine.markers_written(TXN_ID, now as i64).is_some() {
                        let written = self.coordinator_written();
                        assert!(written.is_none(), "nobody waits for a Complete* state");
                    }
                }
            }
            Err(e @ (Refusal::InvalidProducerEpoch | Refusal::CoordinatorFenced)) => {
                // Only a newer coordinator could have written a newer epoch there, and
                // this one is the newest.
                let m = round.markers.clone();
                self.violation(format!("p{p}: the newest coordinator's marker {m:?} refused: {e:?}"));
            }
            Err(_) => {
                *slot = None;
                round.next_ms = now + round.backoff_ms;
                round.backoff_ms = (round.backoff_ms * 2).min(MARKER_RETRY_BACKOFF_MS_MAX);
                self.count("marker retries");
            }
        }
    }

    // ---- The leader's side of WriteTxnMarkers ----

    /// `PartitionOp::WriteMarker`: the leader (acks=all, so only with enough in-sync
    /// replicas) checks the marker against the producer state (`check_marker`, as
    /// `PartitionLog::append_marker_shared`), appends it (every replica applies it with
    /// `apply_marker`, see `Log::append`), and answers once the high watermark passes it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_write_txn_marker(
        &mut self,
        b: &mut Broker,
        req: u64,
        p: usize,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        commit: bool,
        coordinator_epoch: i32,
        transaction_version: i8,
    ) {
        let (me, now) = (b.id, self.now_ms);
        let unchecked = self.knobs.markers_unapplied;
        let r = &mut b.replicas[p];
        let refuse = |result: Refusal| Body::WriteTxnMarkerAnswer { req, partition: p, result: Err(result) };
        let leader_epoch = match r.machine.may_append(true) {
            Ok(e) => e.0,
            Err(AppendRefusal::NotEnoughReplicas { .. }) => {
                self.send(Node::Broker(me), Node::TxnCoordinator, refuse(Refusal::NotEnoughReplicas));
                return;
            }
            Err(AppendRefusal::NotLeader) => {
                self.send(Node::Broker(me), Node::TxnCoordinator, refuse(Refusal::NotLeader));
                return;
            }
        };
        if !unchecked {
            if let Err(e) = r.log.producers.check_marker(producer_id, epoch, coordinator_epoch, transaction_version) {
                self.note(format!("b{me} p{p} refuses a marker of {producer_id} epoch {epoch}: {e}"));
                self.count(match e {
                    ProducerStateError::CoordinatorFenced { .. } => "markers refused: older coordinator epoch",
                    _ => "markers refused: older producer epoch",
                });
                self.send(Node::Broker(me), Node::TxnCoordinator, refuse(Refusal::from(e)));
                return;
            }
        }
        self.client.next_id += 1;
        let id = self.client.next_id;
        let marker = TxnMarker { producer_id, epoch, commit, coordinator_epoch, timestamp_ms: now as i64 };
        let offset = r.log.leo();
        if let Err(e) = r.log.append(Record { leader_epoch, id, batch: None, txn: None, marker: Some(marker) }) {
            self.violation(format!("b{me} p{p} marker append: {e}"));
            return;
        }
        let waiter = Waiter { req, base_offset: offset, leader_epoch, marker_of: Some(p) };
        let answers = r.machine.wait_for_high_watermark(offset, waiter, r.log.leo());
        deliver(me, answers, &mut self.out);
        let what = if commit { "COMMIT" } else { "ABORT" };
        self.note(format!("b{me} p{p} appends {what} of {producer_id} epoch {epoch} at {offset}"));
    }

    // ---- The transactional producer ----

    pub(super) fn txn_client_timers(&mut self, silent: bool) {
        let now = self.now_ms;
        let produce_pct = self.knobs.produce_pct;
        let partitions = self.knobs.partitions as u64;
        if let Phase::Dead { restart_ms } = self.txn_producer().phase {
            if now < restart_ms {
                return;
            }
            self.note("client: a new transactional producer instance starts".to_string());
            self.txn_producer().start_over();
        }
        let producer = self.txn_producer();
        let dies = match &producer.phase {
            Phase::Ready { open: Some(t), .. } => t.dies && t.batches_left == 0 && !producer.immortal,
            _ => false,
        };
        if dies {
            let restart_ms = now + self.rng.below(2 * TXN_TIMEOUT_MS as u64);
            self.note(format!("client: the transactional producer dies mid-transaction; back at {restart_ms}"));
            self.count("transactional producers killed");
            let producer = self.txn_producer();
            producer.phase = Phase::Dead { restart_ms };
            producer.request = None;
            producer.requests.clear();
            return;
        }
        // The coordinator request: resent when unanswered; else the next one, if due.
        if let Some((_, request, sent)) = self.txn_producer().request.clone() {
            if now >= sent + TXN_REQUEST_TIMEOUT_MS {
                self.txn_request(request);
            }
        } else if now >= self.txn_producer().retry_at_ms {
            let settling = self.txn_producer().settling;
            let next = match &self.txn_producer().phase {
                Phase::Dead { .. } => unreachable!("handled above"),
                Phase::Init => Next::Init,
                Phase::Ready { open: None, .. } => Next::Begin,
                Phase::Ready { producer: id, open: Some(t) } => {
                    if t.batches_left > 0 && !settling {
                        Next::Write(*id)
                    } else if t.added.is_empty() {
                        // Nothing was added: the client ends it without the coordinator
                        // (as the Java client skips EndTxn for a transaction never started).
                        Next::Forget
                    } else if t.pending.iter().all(|q| q.is_empty()) {
                        Next::End(*id, t.commit)
                    } else {
                        Next::Wait
                    }
                }
            };
            match next {
                Next::Init => self.txn_request(TxnRequest::InitProducerId),
                Next::Begin => {
                    if !settling && !silent && self.rng.chance(produce_pct) {
                        let batches_left = 1 + self.rng.below(TXN_BATCHES_MAX);
                        let commit = self.rng.chance(TXN_COMMIT_PCT);
                        let dies = self.rng.chance(TXN_DIES_PCT);
                        let producer = self.txn_producer();
                        let number = producer.next_txn;
                        producer.next_txn += 1;
                        let open = OpenTxn {
                            number,
                            batches_left,
                            commit,
                            dies,
                            added: BTreeSet::new(),
                            pending: (0..partitions).map(|_| VecDeque::new()).collect(),
                        };
                        if let Phase::Ready { open: slot, .. } = &mut producer.phase {
                            *slot = Some(open);
                        }
                    }
                }
                Next::Write(id) => {
                    if self.rng.chance(produce_pct) {
                        let p = self.rng.below(partitions) as usize;
                        let n = 1 + self.rng.below(PRODUCE_RECORDS_MAX) as usize;
                        self.txn_write(id, p, n);
                    }
                }
                Next::End(id, commit) => self.txn_request(TxnRequest::EndTxn { producer: id, commit }),
                Next::Forget => {
                    if let Phase::Ready { open, .. } = &mut self.txn_producer().phase {
                        *open = None;
                    }
                }
                Next::Wait => {}
            }
        }
        self.txn_send();
    }

    /// Write `n` records to `p` in the open transaction: AddPartitionsToTxn first if
    /// `p` is new to it; nothing while a batch is in flight there.
    fn txn_write(&mut self, id: ProducerIdAndEpoch, p: usize, n: usize) {
        let now = self.now_ms;
        let next_id = self.client.next_id;
        let producer = self.txn_producer();
        let Phase::Ready { open: Some(t), .. } = &mut producer.phase else { return };
        if !t.added.contains(&p) {
            let txn = t.number;
            self.txn_request(TxnRequest::AddPartitions { producer: id, partition: p, txn });
            return;
        }
        if !t.pending[p].is_empty() {
            return;
        }
        let ids: Vec<u64> = (0..n as u64).map(|i| next_id + 1 + i).collect();
        let batch = ProducerBatch {
            producer_id: ProducerId(id.producer_id),
            epoch: ProducerEpoch(id.epoch),
            first_seq: producer.next_seq[p],
            offset_delta: n as i32 - 1,
            max_timestamp_ms: now as i64,
            transactional: true,
        };
        producer.next_seq[p] = increment_sequence(batch.first_seq, n as i32);
        t.batches_left -= 1;
        t.pending[p].push_back(TxnBatch { batch, ids, inflight: None, send_at_ms: now, sends: 0 });
        self.client.next_id += n as u64;
    }

    fn txn_request(&mut self, request: TxnRequest) {
        let req = self.req();
        let now = self.now_ms;
        self.txn_producer().request = Some((req, request.clone(), now));
        self.send(Node::Client, Node::TxnCoordinator, Body::Txn { req, request });
    }

    /// Send the head batch of each partition when due (new, or its answer timed out).
    fn txn_send(&mut self) {
        let now = self.now_ms;
        let leaders = self.client.leaders.clone();
        let producer = self.client.txn.as_mut().expect("transactional");
        let Phase::Ready { open: Some(t), .. } = &mut producer.phase else { return };
        let number = t.number;
        let mut due = Vec::new();
        for (p, queue) in t.pending.iter_mut().enumerate() {
            let Some(b) = queue.front_mut() else { continue };
            if b.inflight.is_some_and(|(_, sent)| now >= sent + PRODUCE_TIMEOUT_MS) {
                b.inflight = None;
                b.send_at_ms = now;
            }
            if b.inflight.is_none() && now >= b.send_at_ms && leaders[p] != NO_LEADER {
                due.push(p);
            }
        }
        for p in due {
            let req = self.req();
            let producer = self.client.txn.as_mut().expect("transactional");
            let Phase::Ready { open: Some(t), .. } = &mut producer.phase else { unreachable!() };
            let b = t.pending[p].front_mut().expect("due");
            let retry = b.sends > 0;
            b.sends += 1;
            b.inflight = Some((req, now));
            producer.requests.insert(req, (p, b.batch.epoch, b.batch.first_seq));
            let body = Body::Produce { req, partition: p, ids: b.ids.clone(), batch: Some(b.batch), txn: Some(number) };
            if retry {
                self.count("transactional retries");
            }
            self.send(Node::Client, Node::Broker(leaders[p]), body);
        }
    }

    pub(super) fn txn_produce_answer(&mut self, req: u64, result: Result<(i64, i32), Refusal>) {
        let now = self.now_ms;
        let producer = self.txn_producer();
        let Some(&(p, epoch, first_seq)) = producer.requests.get(&req) else { return };
        let Phase::Ready { open: Some(t), .. } = &mut producer.phase else { return };
        let number = t.number;
        let Some(b) = t.pending[p].front_mut().filter(|b| b.batch.epoch == epoch && b.batch.first_seq == first_seq)
        else {
            return;
        };
        let current = b.inflight.is_some_and(|(q, _)| q == req);
        match result {
            Ok((base_offset, leader_epoch)) => {
                let b = t.pending[p].pop_front().expect("front");
                producer.requests.retain(|_, r| r.0 != p);
                let last = base_offset + b.ids.len() as i64 - 1;
                self.hist.txn.acked.entry((number, p)).or_default().push((base_offset, last));
                for (i, &id) in b.ids.iter().enumerate() {
                    let record =
                        Record { leader_epoch, id, batch: Some((b.batch, i as i32)), txn: Some(number), marker: None };
                    self.acked(p, base_offset + i as i64, record);
                }
            }
            Err(Refusal::CoordinatorFenced) => self.violation(format!("p{p}: a produce answered {result:?}")),
            Err(
                e @ (Refusal::InvalidProducerEpoch
                | Refusal::OutOfOrderSequence
                | Refusal::UnknownProducerId
                | Refusal::InvalidTxnState),
            ) => {
                // Fenced (the coordinator aborted the transaction) or a fatal refusal:
                // a new instance, whose InitProducerId aborts what is open.
                let batch = b.batch;
                self.note(format!("client: p{p} {batch:?} refused ({e:?}); the producer starts over"));
                self.count(if e == Refusal::InvalidProducerEpoch {
                    "transactional producers fenced"
                } else {
                    "transactional batches refused"
                });
                self.txn_producer().start_over();
            }
            Err(_) => {
                if current {
                    b.inflight = None;
                    b.send_at_ms = now + RETRY_BACKOFF_MS;
                }
            }
        }
    }

    pub(super) fn txn_answer(&mut self, req: u64, result: Result<Option<ProducerIdAndEpoch>, TxnError>) {
        let now = self.now_ms;
        let Some(producer) = self.client.txn.as_mut() else { return };
        let Some((q, request, _)) = producer.request.clone() else { return };
        if q != req {
            return;
        }
        producer.request = None;
        match (request, result) {
            (TxnRequest::InitProducerId, Ok(Some(id))) => {
                producer.phase = Phase::Ready { producer: id, open: None };
                producer.next_seq.iter_mut().for_each(|s| *s = 0);
                self.note(format!("client: transactional producer {} epoch {}", id.producer_id, id.epoch));
            }
            (_, Err(TxnError::ConcurrentTransactions)) => producer.retry_at_ms = now + RETRY_BACKOFF_MS,
            (TxnRequest::AddPartitions { partition, .. }, Ok(_)) => {
                if let Phase::Ready { open: Some(t), .. } = &mut producer.phase {
                    t.added.insert(partition);
                }
            }
            (TxnRequest::AddPartitions { .. } | TxnRequest::EndTxn { .. }, Err(TxnError::ProducerFenced)) => {
                self.note("client: fenced by the coordinator; the producer starts over".to_string());
                self.count("transactional producers fenced");
                self.txn_producer().start_over();
            }
            (TxnRequest::EndTxn { commit, .. }, Ok(_)) => {
                let Phase::Ready { open, .. } = &mut producer.phase else { return };
                let Some(t) = open.take() else { return };
                let decided = self.hist.txn.decided.get(&t.number).copied();
                self.count(if commit { "transactions committed" } else { "transactions aborted by the client" });
                if decided != Some(commit) {
                    self.violation(format!(
                        "EndTxn({commit}) of transaction {} succeeded, decided {decided:?}",
                        t.number
                    ));
                }
            }
            (request, result) => self.violation(format!("client: {request:?} answered {result:?}")),
        }
    }

    // ---- Invariants 8 and 9 ----

    /// 8. What a read_committed reader gets holds every committed transaction whole or
    ///    not at all, and no aborted one: every marker in the committed log ends the
    ///    batches of one transaction, with the outcome the coordinator decided, after all
    ///    its acknowledged batches there; no transaction ends twice in a partition; no
    ///    leader's last stable offset cuts a transaction (some of its records below, its
    ///    marker at or above). No marker is written for a partition the coordinator did
    ///    not add, and a fenced (older epoch) producer's batches and markers are refused.
    /// 9. A leader's last stable offset never goes back within its epoch, never exceeds
    ///    its high watermark, and never passes an open transaction's first offset.
    pub(super) fn check_transactions(&mut self) -> Result<(), String> {
        for p in 0..self.knobs.partitions {
            self.scan_committed(p)?;
        }
        let ignores_lso = self.knobs.reader_ignores_lso;
        for b in self.brokers.iter().filter(|b| b.up) {
            for (p, r) in b.replicas.iter().enumerate() {
                let Role::Leader(l) = r.machine.role() else { continue };
                let hw = r.high_watermark();
                // `PartitionLog::stable_offset` (the log starts at 0 here).
                let lso = if ignores_lso { hw } else { r.log.producers.stable_offset(hw).min(hw) };
                if !(0..=hw).contains(&lso) {
                    return Err(format!("b{} p{p}: last stable offset {lso} outside [0, high watermark {hw}]", b.id));
                }
                let last = self.hist.txn.leader_lsos.entry((b.id, b.incarnation, p, l.leader_epoch())).or_insert(lso);
                if lso < *last {
                    return Err(format!("b{} p{p}: leader's last stable offset went back {} -> {lso}", b.id, *last));
                }
                *last = lso;
                let scan = &self.hist.txn.scans[p];
                if scan.straddled.get(lso as usize) == Some(&true) {
                    return Err(format!(
                        "b{} p{p}: last stable offset {lso} cuts an ended transaction (a read_committed reader \
                         gets part of it): {:?}",
                        b.id,
                        &r.log.records[(lso as usize).saturating_sub(3)..r.log.records.len().min(lso as usize + 3)]
                    ));
                }
                if let Some((id, (first, _))) = scan.open.iter().find(|(_, (first, _))| *first < lso) {
                    return Err(format!(
                        "b{} p{p}: last stable offset {lso} cuts the open transaction of {id} starting at {first}",
                        b.id
                    ));
                }
            }
        }
        Ok(())
    }

    /// Read the new part of `p`'s committed log as a reader would, checking each marker.
    fn scan_committed(&mut self, p: usize) -> Result<(), String> {
        let committed = &self.hist.committed[p];
        let h = &mut self.hist.txn;
        let scan = &mut h.scans[p];
        scan.straddled.resize(committed.len() + 1, false);
        for (offset, &r) in committed.iter().enumerate().skip(scan.scanned) {
            let o = offset as i64;
            if let Some((b, i)) = r.batch.filter(|(b, _)| b.transactional) {
                let newest = scan.epochs.entry(b.producer_id).or_insert(b.epoch);
                if b.epoch < *newest {
                    return Err(format!("p{p}: a fenced producer's batch {b:?} at {o}, after epoch {newest}"));
                }
                *newest = b.epoch;
                if i == b.offset_delta {
                    let txn = r.txn.ok_or_else(|| format!("p{p}: {r:?} at {o} in no transaction"))?;
                    let first = o - b.offset_delta as i64;
                    scan.open.entry(b.producer_id).or_insert((first, Vec::new())).1.push((txn, first, o));
                }
            }
            let Some(m) = r.marker else { continue };
            let newest = scan.epochs.entry(m.producer_id).or_insert(m.epoch);
            if m.epoch < *newest {
                return Err(format!("p{p}: a marker of a fenced epoch {m:?} at {o}, after epoch {newest}"));
            }
            *newest = m.epoch;
            if !h.markers_sent.contains(&(m.producer_id, m.epoch, p)) {
                return Err(format!("p{p}: marker {m:?} at {o}, which the coordinator never sent to p{p}"));
            }
            let Some((first, batches)) = scan.open.remove(&m.producer_id) else { continue };
            for l in first + 1..=o {
                scan.straddled[l as usize] = true;
            }
            let txns: BTreeSet<u64> = batches.iter().map(|b| b.0).collect();
            if txns.len() != 1 {
                return Err(format!("p{p}: the marker at {o} ends batches of transactions {txns:?}"));
            }
            let txn = *txns.first().expect("one");
            let decided = h.decided.get(&txn).copied();
            if decided != Some(m.commit) {
                let what = if m.commit { "COMMIT" } else { "ABORT" };
                return Err(format!(
                    "p{p}: {what} at {o} ends transaction {txn}, which the coordinator decided {decided:?}"
                ));
            }
            if !scan.ended.insert(txn) {
                return Err(format!("p{p}: transaction {txn} ends a second time, at {o} (it was split)"));
            }
            for &(a_first, a_last) in h.acked.get(&(txn, p)).into_iter().flatten() {
                if !batches.iter().any(|&(_, f, l)| (f, l) == (a_first, a_last)) {
                    return Err(format!(
                        "p{p}: transaction {txn}'s acknowledged batch [{a_first}, {a_last}] is not under its marker at {o}"
                    ));
                }
            }
        }
        scan.scanned = committed.len();
        Ok(())
    }

    // ---- Invariant 10 ----

    /// 10. After the faults, once every transaction has ended and its markers are
    ///     written, every partition's last stable offset reaches its high watermark, and
    ///     a read_committed reader of the leader gets exactly the acknowledged records
    ///     of the committed transactions, in log order, each once.
    pub(super) fn transactions_settled(&self) -> Result<(), String> {
        let c = self.coordinator.as_ref().expect("coordinator");
        let producer = self.client.txn.as_ref().expect("transactional");
        if matches!(producer.phase, Phase::Ready { open: Some(_), .. }) || !c.idle() {
            return Err(format!(
                "liveness: transactions did not end: coordinator {:?}, markers left {:?}",
                c.machine.get(TXN_ID).map(|r| r.state),
                c.round.as_ref().map(|r| r.left.keys().collect::<Vec<_>>())
            ));
        }
        for p in 0..self.knobs.partitions {
            let leader = self.controller.partition_state(TOPIC, p as i32).expect("partition").leader;
            let r = &self.brokers[index(leader)].replicas[p];
            let hw = r.high_watermark();
            let lso = r.log.producers.stable_offset(hw).min(hw);
            if lso != hw {
                return Err(format!(
                    "liveness: p{p}: the last stable offset {lso} stays below the high watermark {hw} once every \
                     transaction ended (open here: {:?})",
                    r.log.producers.ongoing().collect::<Vec<_>>()
                ));
            }
            let read = read_committed(&r.log.records, lso);
            let mut want: Vec<(i64, u64)> = self
                .hist
                .acked
                .iter()
                .filter(|(q, _, rec)| *q == p && rec.txn.is_some_and(|t| self.hist.txn.decided.get(&t) == Some(&true)))
                .map(|(_, offset, rec)| (*offset, rec.id))
                .collect();
            want.sort();
            let want: Vec<u64> = want.into_iter().map(|(_, id)| id).collect();
            if read != want {
                return Err(format!(
                    "p{p}: a read_committed reader gets {read:?}, the committed transactions' records are {want:?}"
                ));
            }
        }
        Ok(())
    }
}

/// Transactional seeds (`run_seed`: every fourth seed).
pub(super) fn is_transactional(seed: u64) -> bool {
    seed.is_multiple_of(4)
}

#[test]
fn read_committed_drops_aborted_transactions_and_markers_and_stops_at_the_last_stable_offset() {
    let id = ProducerId(7);
    let batch = |seq| ProducerBatch {
        producer_id: id,
        epoch: ProducerEpoch(0),
        first_seq: seq,
        offset_delta: 0,
        max_timestamp_ms: 0,
        transactional: true,
    };
    let data =
        |n: u64, seq| Record { leader_epoch: 0, id: n, batch: Some((batch(seq), 0)), txn: Some(n), marker: None };
    let marker = |n: u64, commit| Record {
        leader_epoch: 0,
        id: n,
        batch: None,
        txn: None,
        marker: Some(TxnMarker {
            producer_id: id,
            epoch: ProducerEpoch(0),
            commit,
            coordinator_epoch: 0,
            timestamp_ms: 0,
        }),
    };
    let log = [data(1, 0), marker(2, false), data(3, 1), data(4, 2), marker(5, true), data(6, 3)];
    assert_eq!(read_committed(&log, 6), [3, 4, 6]);
    assert_eq!(read_committed(&log, 5), [3, 4]);
    assert_eq!(read_committed(&log, 1), Vec::<u64>::new());
    // An aborted transaction whose marker lies beyond the read is still dropped (the
    // leader's aborted index covers its whole log).
    assert_eq!(read_committed(&log[..2], 1), Vec::<u64>::new());
}
