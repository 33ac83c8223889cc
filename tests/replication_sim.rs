//! Seeded deterministic simulation of ISR replication, on one thread with no I/O: the real
//! controller (`spate::coordinator::controller::Controller`), three brokers whose
//! partitions (RF=3, min.insync.replicas=2) each run spate's real replica machine
//! (`replication::Replica`: role, high watermark, acks=all waiters, the follower's
//! truncate and fetch decisions, with `LeaderState` inside) and keep the real
//! producer state (`txn::producer_state::ProducerStates`), and an acks=all producer
//! (plain, idempotent with retries, or transactional, driving spate's real transaction
//! coordinator `txn::coordinator::TxnCoordinator`), all talking through a seeded network that
//! delays, reorders, loses and duplicates messages. Brokers crash (losing the unsynced
//! suffix of their logs), restart as a new incarnation, and are cut off from everyone or
//! from the controller alone; the controller fences brokers that stop heartbeating,
//! moves leaders within the ISR and elects preferred leaders; brokers act on snapshots
//! of its state that may arrive late or not at all.
//!
//! What the broker does around the machine is what `src/shard/replica.rs` and
//! `src/server/replication.rs` do, and no more: it feeds the machine the controller's
//! partition states (a snapshot applies to every partition), leaders' appends, follower
//! fetches (with the request's leader epoch, KIP-320, and the follower's broker epoch,
//! KIP-903), AlterPartition answers and the clock, and carries out what comes back:
//! record a new leader epoch at the log end, answer acks=all produces, truncate, append,
//! send OffsetForLeaderEpoch or Fetch, propose an ISR change as AlterPartition with each
//! member's broker epoch. The fetcher's sockets and timers are the simulated network's
//! (one request at a time per partition; a request with no answer is dropped and retried
//! after a backoff). A broker checkpoints its high watermarks at each flush and restarts
//! with them, as spate's `replication-offset-checkpoint`. As shipped, a refused
//! AlterPartition goes to `on_isr_change_refused` and a lost one to
//! `on_isr_change_failed`; half the seeds instead report refusals as lost answers too.
//!
//! Logs are records (leader epoch, id) with a synced prefix; brokers sync every
//! `flush_interval_ms`. The leader epoch cache is a model of Kafka's
//! `LeaderEpochFileCache` (`assign`, `endOffsetFor`, and `UnifiedLog.truncateTo`, which
//! cuts the cache even when no record goes), checked against the records after every
//! change; spate's own `LeaderEpochCache` is fed alongside as `PartitionLog` feeds it and
//! must hold the same entries and give the same OffsetForLeaderEpoch answers at every
//! step. That `PartitionLog::truncate_to` and `Shard::replica_truncate` really cut the
//! cache at the log end is tested on the real code (tests/log_replica.rs
//! `truncation_at_the_log_end_cuts_an_epoch_with_no_record_behind_it`, src/shard/replica.rs
//! `a_follower_truncation_at_its_log_end_cuts_the_epoch_started_there`).
//!
//! Fault model (the one under which Kafka promises that an acks=all record survives):
//! at most one broker crashed or cut off at a time; a fault ends when the broker is
//! reachable again (after a crash: once the controller processed its new registration,
//! which takes the old incarnation out of every ISR; after a cut: once the controller
//! processed a heartbeat from it, since until then its session may still expire for the
//! cut: seed 16354 had the controller fence a broker just after its cut ended while
//! another broker crashed, two faults at once). A crash loses the unsynced suffix
//! unless the broker is the last ISR member of a partition (then it is a process crash
//! that keeps the page cache: losing that data would be a second failure). Registrations
//! and heartbeats are not lost at random, so that only a faulty broker gets fenced.
//! Messages to or from a crashed broker die with it (its connections are reset). A
//! restarted broker acts on no snapshot older than its registration, as in Kafka; spate
//! does the same (`ClusterView::may_take_roles`: a restarted mirror takes no replicated
//! role from its cached snapshot until its link has registered it), tested on the real
//! code in src/coordinator/registry.rs and src/shard/replica.rs
//! (`a_restarted_*_takes_replicated_roles_only_once_registered`).
//!
//! Invariants, checked after every step:
//! 1. no two brokers act as leader of a partition in the same leader epoch;
//! 2. leader epochs only grow: on the controller and in every broker's role;
//! 3. the committed log (every record that was below some replica's high watermark, at
//!    its offset) never changes; every acknowledged record is in it; the current leader
//!    (per the controller, acting in the controller's epoch) holds all of it;
//! 4. log matching: every replica's log below its high watermark is the committed log;
//! 5. high watermark <= log end offset everywhere; a leader's high watermark never moves
//!    back within its epoch (one incarnation leads an epoch);
//! 6. a follower's truncation never removes a committed record it holds;
//! 7. with the idempotent producer: no record is twice in the committed log (so, with 3.,
//!    every acknowledged record is there exactly once, at the offset its answer gave),
//!    batches are whole, and within a producer epoch each committed batch follows the
//!    previous one (no duplicate, gap or reordering); a retry answered as a duplicate
//!    points at that batch. The transactional producer's batches are held to the same.
//! 8. with the transactional producer, what a read_committed reader gets holds a
//!    committed transaction whole or not at all, and an aborted one never: each marker
//!    in the committed log ends the batches of one transaction, with the outcome the
//!    coordinator decided, after every acknowledged batch of it in that partition; no
//!    transaction ends twice in a partition; no leader's last stable offset (the real
//!    `ProducerStates::stable_offset(hw)`, as `PartitionLog::stable_offset`) cuts a
//!    transaction (records below it, its marker at or above). No marker is written for a
//!    partition the coordinator did not add; a fenced producer's (older epoch) batches and
//!    markers never follow a newer epoch in the committed log. (This holds for the one
//!    transactional producer here. With several whose transactions interleave, Kafka's
//!    last stable offset, the first offset of the oldest open transaction, can fall
//!    inside a committed transaction that began earlier and ended later, whose front a
//!    reader then gets before its back.)
//! 9. a leader's last stable offset never goes back within its epoch, never exceeds its
//!    high watermark, and never passes the first offset of a transaction still open in
//!    the committed log (derived from the records, not from the producer state);
//! 10. (settle phase) once every transaction has ended (committed, aborted by the client,
//!     or aborted by the coordinator's timeout) and its markers are acknowledged, every
//!     partition's last stable offset reaches its high watermark, and a read_committed
//!     reader of each leader (`txn::read_committed`: up to the last stable offset,
//!     dropping the aborted transactions the ABORT markers in the log name, as the
//!     aborted index does, and the markers) gets exactly the acknowledged records of the
//!     committed transactions, in log order.
//!
//! The idempotent producer (odd seeds; even seeds run the plain producer, exactly as
//! before it existed) sends each batch again, unchanged, whenever its answer is lost,
//! late or a retriable error, up to 5 batches in flight per partition (see
//! `IdempotentProducer`). Leaders check each batch with `ProducerStates::check` as
//! `PartitionLog::append_inner` does (refused, a duplicate answered with its original
//! offsets once the high watermark covers them, or appended); every replica applies the
//! batches it appends; logs roll every `segment_records` records with a `.snapshot`
//! (`encode_snapshot`), kept through crashes; a crash or truncation rebuilds the state as
//! `log::producers::rebuild` does (`decode_snapshot_at` of the newest snapshot at or
//! below the log end, then a replay), so a restarted leader remembers only the last batch
//! before its snapshot, as Kafka's does. Logs are cut and fetched at batch boundaries.
//! The network reorders requests that one TCP connection would keep in order, so a
//! leader that knows nothing of the producer may take a later batch first (Kafka accepts
//! an unknown producer at any sequence); the earlier one then gets OUT_OF_ORDER_SEQUENCE
//! and the producer bumps its epoch, giving up what was not acknowledged.
//!
//! The transactional producer (every fourth seed, `txn::is_transactional`; the others
//! run as before it existed) is the Java client's with one `transactional.id` (see
//! `txn::TxnProducer`): InitProducerId, AddPartitionsToTxn before a partition's first
//! batch, idempotent transactional batches (one in flight per partition), EndTxn commit
//! or abort (the seed's draw) once every batch is acknowledged; some of its processes
//! die mid-transaction and come back later, so that the coordinator's timeout (`expire`)
//! or the new instance's InitProducerId aborts the transaction and fences them. The
//! coordinator is one node of its own whose `__transaction_state` writes are
//! acknowledged at once; it fails over now and then (a new machine loads the last
//! record, the coordinator epoch grows, `resume` sends the markers again); its answers
//! and its WriteTxnMarkers go through the network, and it retries markers as
//! `server::txn` does. Leaders check a marker with `check_marker` and append it with
//! acks=all, as `PartitionOp::WriteMarker`; every replica applies it (`apply_marker`)
//! and rebuilds replay markers as `log::producers::rebuild` does.
//!
//! Partition reassignment (every third seed, `reassign`): an
//! operator drops one of a partition's three replicas, gives a two-replica partition
//! its third back or moves it there (one replica added onto the broker without a log
//! and one removed in the same step, as 1,2,3 -> 2,3,4), or cancels a move, through
//! the real controller's
//! `alter_reassignment`, while the faults go on. A broker the move leaves out deletes
//! its replica as the shard does (its waiters fail, its log goes; what it had below its
//! high watermark stays in the committed history); one added starts empty and copies
//! the leader's log; leaders take the new replica list from the snapshots (the real
//! `LeaderState`). The settle phase gives every partition its three replicas back.
//!
//! Then a settle phase (no faults, no loss) checks liveness: records are acknowledged
//! again, every ISR fills up and every replica ends with its leader's log; with the
//! transactional producer, every transaction ends and invariant 10 holds.
//!
//! Simplified away: log start offsets and retention, producer expiry, consumers but the
//! read_committed reader model, the `__transaction_state` partition's replication and a
//! coordinator on another broker (the integration tests cover them), controller
//! failover (`controller_sim.rs` covers it), reassignment onto a fourth broker. Messages from a crashed broker die with it, so a dead incarnation's late
//! fetch never reaches a leader here (`LeaderState`'s unit tests cover its refusal).
//!
//! `sim_seeds` runs `SEEDS_DEFAULT` seeds of `STEPS_PER_SEED` steps on the available
//! cores, and under `scripts/test` a window of `SEEDS_EXPLORED` more that moves with the
//! commit (`SPATE_TEST_SEED`, tests/explore/mod.rs). A failure prints its seed and the last events; replay it with
//! `SPATE_SIM_SEED=<seed> cargo test --profile ci --test replication_sim sim_seeds --
//! --nocapture`. `SPATE_SIM_SEEDS=<n>` runs seeds 0..n. Seeds past the default ones
//! that once failed stay as regression seeds (`sim_seed_*`). The `sim_catches_*` tests
//! put a known bug back into what the simulated broker does around the machine
//! (followers that send no broker epoch; leaders that append retries again; markers
//! appended without `check_marker`/`apply_marker`; read_committed reads up to the high
//! watermark instead of the last stable offset) and check that the invariants catch it. The scripted tests at the end replay,
//! on a fixed schedule, KIP-101 (`kip101_*`: truncation to the high watermark loses an
//! acknowledged record, truncation by leader epoch keeps it), KIP-279 (`kip279_*`), a
//! restarted follower rejoining the ISR (`a_restarted_follower_rejoins_the_isr_only_after_fetching`)
//! and an idempotent retry after a failover (`a_retry_after_a_failover_*`).

#[path = "explore/mod.rs"]
mod explore;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::rc::Rc;

use spate::coordinator::controller::{
    Change, Controller, ControllerConfig, ControllerError, Endpoint, PartitionState, NO_LEADER,
};
use spate::log::leader_epoch::{LeaderEpochCache, UNDEFINED_EPOCH};
use spate::model::{BrokerEpoch, LeaderEpoch, NodeId, PartitionEpoch, ProducerEpoch, ProducerId};
use spate::replication::{
    truncation_offset, AckError, Answers, AppendRefusal, FetchRefusal, FollowerFetchError, FollowerLog, FollowerStep,
    IsrOutcome, IsrProposal, OutOfRange, Role, RoleError, Truncation, NO_BROKER_EPOCH, UNDEFINED_OFFSET,
};
use spate::txn::coordinator::{ProducerIdAndEpoch, TxnError};
use spate::txn::producer_state::{increment_sequence, ProducerBatch, ProducerStateError, ProducerStates, Verdict};
use uuid::Uuid;

/// The transactional producer, the transaction coordinator node, the read_committed
/// reader and invariants 8-10 (tests/replication_sim/txn.rs).
#[path = "replication_sim/txn.rs"]
mod txn;

// ---- Knobs ----

const BROKER_IDS: [NodeId; 3] = [B1, B2, B3];
const B1: NodeId = NodeId(1);
const B2: NodeId = NodeId(2);
const B3: NodeId = NodeId(3);
const TOPIC: &str = "t";
const MIN_INSYNC_REPLICAS: usize = 2;
const SESSION_TIMEOUT_MS: u64 = 2_000;
const HEARTBEAT_INTERVAL_MS: u64 = 200;
const REPLICA_LAG_TIME_MAX_MS: i64 = 1_500;
const ISR_CHECK_INTERVAL_MS: u64 = 250;
/// The controller pushes its state on every change and at least this often.
const SNAPSHOT_INTERVAL_MS: u64 = 1_000;
const RETRY_BACKOFF_MS: u64 = 50;
/// A follower's pause after an empty fetch (stands for the fetch long-poll).
const FETCH_IDLE_MS: u64 = 20;
const PRODUCE_INFLIGHT_MAX: usize = 6;
const PRODUCE_RECORDS_MAX: u64 = 3;
const PRODUCE_TIMEOUT_MS: u64 = 1_500;
/// An idempotent producer's batches in flight per partition (Kafka caps
/// max.in.flight.requests.per.connection at 5 with idempotence: the 5-batch window).
const IDEMPOTENT_BATCHES_IN_FLIGHT_MAX: usize = 5;
const PRODUCER_ID: ProducerId = ProducerId(4_000);
const MESSAGES_IN_FLIGHT_MAX: usize = 100_000;
const STEPS_PER_SEED: usize = 20_000;
const SETTLE_PRODUCE_MS: u64 = 4_000;
/// Once faults and production stop, the replicas converge within this of the last
/// progress (a new maximum of the records the replicas hold)...
const SETTLE_QUIET_MS_MAX: u64 = 60_000;
/// ...and within this in all.
const SETTLE_MS_MAX: u64 = 600_000;
const SETTLE_STEP_MS: u64 = 10;
const FAULT_MS_MAX: u64 = 4_000;
const QUIET_MS_MAX: u64 = 1_500;
const BURST_MS_MAX: u64 = 2_000;
const SILENCE_MS_MAX: u64 = 4_000;
const TRACE_EVENTS_MAX: usize = 80;
/// Fixed seeds `sim_seeds` runs: about 5 s on two cores optimised (`--profile ci` or
/// `--release`); an unoptimised build is some twelve times slower (`SPATE_SIM_SEEDS=100`
/// for a quick look).
const SEEDS_DEFAULT: u64 = 1_000;
/// Seeds past the fixed ones that `sim_seeds` explores when `SPATE_TEST_SEED` is set
/// (tests/explore/mod.rs): a new window each commit.
const SEEDS_EXPLORED: u64 = 1_000;
const SIM_THREADS_MAX: usize = 8;
/// Idempotent seeds `sim_catches_appended_retries` runs.
const IDEMPOTENCE_GUARD_SEEDS: u64 = 20;
/// Transactional seeds each `sim_catches_*` test of transactions runs.
const TXN_GUARD_SEEDS: u64 = 10;

/// SplitMix64 (as in controller_sim.rs): small, seedable, good enough to drive a simulation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        spate::model::splitmix64(&mut self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn per_mille(&mut self, n: u64) -> bool {
        self.below(1000) < n
    }
}

/// How a follower truncates before fetching from a new leader. The simulation runs
/// spate's rule; the other two are the rules Kafka had before KIP-101 and KIP-279, for
/// the scripted scenarios to show what they would break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// The replica machine's OffsetForLeaderEpoch rounds (`Follower::on_epoch_answer`).
    Epoch,
    /// Before KIP-101: truncate to the high watermark.
    HighWatermark,
    /// KIP-101 without KIP-279: one round, to the leader's end offset for our latest epoch.
    Kip101Only,
}

/// One seed's draw of the tunable behaviour.
#[derive(Debug, Clone)]
struct Knobs {
    partitions: usize,
    /// Crashes may lose the unsynced suffix of a log.
    lossy: bool,
    delay_max_ms: u64,
    loss_pct: u64,
    dup_pct: u64,
    produce_pct: u64,
    fault_per_mille: u64,
    preferred_per_mille: u64,
    /// How often a broker syncs its logs (Kafka's log.flush.interval.ms); 0: every step.
    flush_interval_ms: u64,
    /// The client alternates bursts and silences (an idle partition's high watermark
    /// stays where its replicas left it).
    bursty: bool,
    step_ms_max: u64,
    /// Records per fetch answer (stands for replica.fetch.max.bytes).
    fetch_records_max: usize,
    /// Replica requests (OffsetForLeaderEpoch, Fetch, AlterPartition) time out after
    /// this, answered or not.
    request_timeout_ms: u64,
    rule: Rule,
    /// Leaders tell a refused AlterPartition (`on_isr_change_refused`) from one that got
    /// no answer; the network then does not duplicate AlterPartition (one TCP request).
    refusals: bool,
    /// The client is an idempotent producer that retries every batch whose answer is
    /// lost or refused (else a plain acks=all producer that gives up on a timeout).
    idempotent: bool,
    /// Records per log segment: producer state snapshots are taken at each roll.
    segment_records: i64,
    /// Leaders append retries again (`AsSpate::appends_retries`).
    appends_retries: bool,
    /// Followers send no broker epoch with their fetches (`AsSpate::no_broker_epochs`).
    no_broker_epochs: bool,
    /// The client is a transactional producer driving the transaction coordinator
    /// (chosen by `run_seed`, outside the main draw).
    transactional: bool,
    /// Brokers append markers without `check_marker`/`apply_marker` (`AsSpate`).
    markers_unapplied: bool,
    /// read_committed reads go up to the high watermark (`AsSpate::reader_ignores_lso`).
    reader_ignores_lso: bool,
    /// Per step, in thousandths: an operator reassigns a partition (drops one of three
    /// replicas, adds the missing one back, or cancels), drawn from `Sim::reassign_rng`.
    reassign_per_mille: u64,
}

impl Knobs {
    fn random(rng: &mut Rng) -> Self {
        Self {
            partitions: 1 + rng.below(3) as usize,
            lossy: rng.chance(70),
            delay_max_ms: 1 + rng.below(40),
            loss_pct: rng.below(10),
            dup_pct: rng.below(4),
            produce_pct: 15 + rng.below(50),
            fault_per_mille: 5 + rng.below(25),
            preferred_per_mille: rng.below(15),
            flush_interval_ms: 20 + rng.below(3_000),
            bursty: rng.chance(50),
            step_ms_max: 2 + rng.below(8),
            fetch_records_max: 1 + rng.below(32) as usize,
            request_timeout_ms: 40 + rng.below(300),
            rule: Rule::Epoch,
            refusals: rng.chance(50),
            // Chosen by `run_seed`, outside this draw.
            idempotent: false,
            segment_records: 0,
            appends_retries: false,
            no_broker_epochs: false,
            transactional: false,
            markers_unapplied: false,
            reader_ignores_lso: false,
            reassign_per_mille: 0,
        }
    }

    /// For scripted scenarios: 1 ms steps and hops, nothing random.
    fn scripted(rule: Rule) -> Self {
        Self {
            partitions: 1,
            lossy: false,
            delay_max_ms: 1,
            loss_pct: 0,
            dup_pct: 0,
            produce_pct: 0,
            fault_per_mille: 0,
            preferred_per_mille: 0,
            flush_interval_ms: 0,
            bursty: false,
            step_ms_max: 1,
            fetch_records_max: 32,
            request_timeout_ms: 300,
            rule,
            refusals: false,
            idempotent: false,
            segment_records: 16,
            appends_retries: false,
            no_broker_epochs: false,
            transactional: false,
            markers_unapplied: false,
            reader_ignores_lso: false,
            reassign_per_mille: 0,
        }
    }
}

// ---- Logs ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    leader_epoch: i32,
    /// Unique per produced record.
    id: u64,
    /// The idempotent producer's batch the record belongs to and its place in it; None
    /// for the plain producer's records and for markers.
    batch: Option<(ProducerBatch, i32)>,
    /// The transactional producer's transaction (the client's own count of them) the
    /// record was written in: simulation bookkeeping for the checker, not on the wire.
    txn: Option<u64>,
    /// A COMMIT or ABORT marker (a control batch of one record) instead of data.
    marker: Option<TxnMarker>,
}

/// The end-of-transaction marker's control batch: the producer it ends, the epoch and
/// coordinator epoch it carries, COMMIT or ABORT, and its timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TxnMarker {
    producer_id: ProducerId,
    epoch: ProducerEpoch,
    commit: bool,
    coordinator_epoch: i32,
    timestamp_ms: i64,
}

impl Record {
    /// Logs are cut, fetched and rolled at batch boundaries only.
    fn starts_batch(&self) -> bool {
        self.batch.is_none_or(|(_, i)| i == 0)
    }

    /// The batch this record ends, for the producer state (applied at its last offset).
    fn ends_batch(&self) -> Option<ProducerBatch> {
        self.batch.filter(|(b, i)| *i == b.offset_delta).map(|(b, _)| b)
    }
}

/// A replica's log: records, how much of it is synced, its leader epoch cache.
#[derive(Default)]
struct Log {
    records: Vec<Record>,
    /// The prefix that survives a lossy crash.
    synced: usize,
    /// (epoch, start offset), both strictly increasing: Kafka's LeaderEpochFileCache,
    /// fed from every appended record (`assign`), by a new leader at its log end, and cut
    /// at every truncation point, even one at or past the log end (Kafka's
    /// `UnifiedLog.truncateTo`: a new leader's entry with no record behind it goes).
    epochs: Vec<(i32, i64)>,
    /// Spate's own `LeaderEpochCache`, fed as `PartitionLog` feeds it (`assign_if_newer`,
    /// `truncate_from_end`, at or past the log end too): it must hold the model's
    /// entries after every change and answer OffsetForLeaderEpoch as the model does.
    spate: LeaderEpochCache,
    /// The prefix known to equal the committed log (kept by the checker).
    matches_committed: usize,
    /// The real producer state (`txn::producer_state`), fed as `PartitionLog` feeds it:
    /// every batch is applied at its last offset as it is appended (leader or
    /// follower); a crash or a truncation rebuilds it as `log::producers::rebuild`
    /// does, from the newest snapshot at or below the log end plus a replay.
    producers: ProducerStates,
    /// The `.snapshot` files, by offset: `encode_snapshot` bytes written at each segment
    /// roll (fsynced at once, so a crash keeps them; one beyond the recovered log end is
    /// deleted on recovery).
    snapshots: BTreeMap<i64, Vec<u8>>,
    /// Records per segment (stands for segment.bytes); 0: never roll.
    segment_records: i64,
    /// The base offset of the active segment.
    segment_base: i64,
    /// How often the producer state was rebuilt starting from a snapshot (for the summary).
    snapshot_reloads: u64,
    /// Markers are appended without `check_marker`/`apply_marker` (`AsSpate::markers_unapplied`).
    markers_unapplied: bool,
}

impl Log {
    fn leo(&self) -> i64 {
        self.records.len() as i64
    }

    fn latest_epoch(&self) -> Option<i32> {
        self.epochs.last().map(|e| e.0)
    }

    /// Kafka's `LeaderEpochFileCache.assign`: needed unless `epoch` is the latest and
    /// starts no earlier; entries it contradicts are removed first.
    fn assign(&mut self, epoch: i32, start: i64) {
        let needed = self.epochs.last().is_none_or(|&(e, s)| epoch != e || start < s);
        if needed {
            while self.epochs.last().is_some_and(|&(e, s)| e >= epoch || s >= start) {
                self.epochs.pop();
            }
            self.epochs.push((epoch, start));
        }
    }

    fn append(&mut self, record: Record) -> Result<(), String> {
        if let Some(last) = self.records.last() {
            if record.leader_epoch < last.leader_epoch {
                return Err(format!("append of epoch {} after epoch {}", record.leader_epoch, last.leader_epoch));
            }
        }
        let offset = self.leo();
        if record.starts_batch() && self.segment_records > 0 && offset - self.segment_base >= self.segment_records {
            // `PartitionLog::roll`: the new segment starts at this batch, with a snapshot
            // of the state of every batch below it.
            self.snapshots.insert(offset, self.producers.encode_snapshot());
            self.segment_base = offset;
        }
        self.records.push(record);
        if let Some(b) = record.ends_batch() {
            self.producers.apply(&b, offset);
        }
        if let Some(m) = record.marker.filter(|_| !self.markers_unapplied) {
            self.producers.apply_marker(m.producer_id, m.epoch, m.commit, m.coordinator_epoch, offset, m.timestamp_ms);
        }
        self.assign(record.leader_epoch, offset);
        self.spate.assign_if_newer(record.leader_epoch, offset);
        self.check_cache()
    }

    /// A new leader records that its epoch starts at its log end (Kafka's makeLeader,
    /// spate's `assign_leader_epoch`).
    fn assign_leader_epoch(&mut self, epoch: i32) -> Result<(), String> {
        if self.epochs.last().is_none_or(|&(l, _)| epoch > l) {
            self.assign(epoch, self.leo());
        }
        self.spate.assign_if_newer(epoch, self.leo());
        self.check_cache()
    }

    /// A follower's truncation. At or past the log end no record goes, but the cache is
    /// cut there (Kafka's `UnifiedLog.truncateTo`; spate's `PartitionLog::truncate_to`,
    /// which `Shard::replica_truncate` always calls, with the replica's high watermark).
    fn truncate(&mut self, len: i64, high_watermark: i64) -> Result<(), String> {
        let len = len.max(0);
        if len >= self.leo() {
            let leo = self.leo();
            self.epochs.retain(|&(_, s)| s < leo);
            self.spate.truncate_from_end(leo);
            return self.check_cache();
        }
        self.cut(len as usize, high_watermark)
    }

    /// A restart: the log as recovered (all of it, or its synced prefix), with the cache
    /// cut to it (an entry at the log end with no record behind it does not survive);
    /// `high_watermark`: the checkpointed one the new incarnation starts with.
    fn recover(&mut self, lossy: bool, high_watermark: i64) -> Result<(), String> {
        let len = if lossy { self.synced } else { self.records.len() };
        self.cut(len, high_watermark)
    }

    fn cut(&mut self, len: usize, high_watermark: i64) -> Result<(), String> {
        if self.records.get(len).is_some_and(|r| !r.starts_batch()) {
            return Err(format!("cut at {len}, inside a batch: {:?}", self.records[len]));
        }
        self.records.truncate(len);
        self.synced = self.synced.min(len);
        self.matches_committed = self.matches_committed.min(len);
        self.epochs.retain(|&(_, s)| s < len as i64);
        self.spate.truncate_from_end(len as i64);
        self.reload_producers(high_watermark)?;
        self.check_cache()
    }

    /// `log::producers::rebuild` (recovery, and `PartitionLog::truncate_to`): snapshots
    /// past the log end go; the newest one at or below `replay_from_bound` (the log end
    /// and the high watermark) that `decode_snapshot_at` accepts, then every batch from
    /// its offset. Rolls continue from the last snapshot kept.
    fn reload_producers(&mut self, high_watermark: i64) -> Result<(), String> {
        let leo = self.leo();
        self.snapshots.retain(|&offset, _| offset <= leo);
        self.segment_base = self.snapshots.keys().next_back().copied().unwrap_or(0);
        let bound = spate::log::producers::replay_from_bound(leo, i64::MAX, high_watermark);
        let (mut states, from) = match self.snapshots.range(..=bound).next_back() {
            Some((&offset, bytes)) => {
                let states = ProducerStates::decode_snapshot_at(bytes, offset)
                    .map_err(|e| format!("the snapshot at {offset} is refused: {e}"))?;
                self.snapshot_reloads += u64::from(!states.is_empty());
                (states, offset)
            }
            None => (ProducerStates::new(), 0),
        };
        for (offset, r) in self.records.iter().enumerate().skip(from as usize) {
            if let Some(b) = r.ends_batch() {
                states.apply(&b, offset as i64);
            }
            // The replay ends open transactions at their markers, as `producers::replay`.
            if let Some(m) = r.marker.filter(|_| !self.markers_unapplied) {
                states.apply_marker(
                    m.producer_id,
                    m.epoch,
                    m.commit,
                    m.coordinator_epoch,
                    offset as i64,
                    m.timestamp_ms,
                );
            }
        }
        self.producers = states;
        Ok(())
    }

    /// Where a read of at most `records_max` records from `offset` ends: whole batches
    /// only (at least one), as Kafka's fetch returns them.
    fn read_end(&self, offset: usize, records_max: usize) -> usize {
        let mut end = (offset + records_max.max(1)).min(self.records.len());
        while end < self.records.len() && !self.records[end].starts_batch() {
            end += 1;
        }
        end
    }

    /// OffsetForLeaderEpoch, answered by the model; spate's cache answers the same.
    fn end_offset_for(&self, requested: i32) -> (i32, i64) {
        let answer = end_offset_for(&self.epochs, requested, self.leo());
        assert_eq!(self.spate.end_offset_for(requested, self.leo()), answer, "{:?} asked {requested}", self.epochs);
        answer
    }

    /// The model describes the log: every epoch present in the records starts where the
    /// cache says, and nothing else is cached but a new leader's epoch at the log end;
    /// spate's cache holds the same entries.
    fn check_cache(&self) -> Result<(), String> {
        let spate: Vec<(i32, i64)> = self.spate.entries().iter().map(|e| (e.epoch, e.start_offset)).collect();
        if spate != self.epochs {
            return Err(format!("spate's epoch cache {spate:?} differs from Kafka's {:?}", self.epochs));
        }
        let mut derived: Vec<(i32, i64)> = Vec::new();
        for (i, r) in self.records.iter().enumerate() {
            if derived.last().is_none_or(|d| d.0 != r.leader_epoch) {
                derived.push((r.leader_epoch, i as i64));
            }
        }
        let covered: Vec<(i32, i64)> = self.epochs.iter().copied().filter(|e| e.1 < self.leo()).collect();
        if covered != derived || self.epochs.len() > derived.len() + 1 {
            return Err(format!("epoch cache {:?} does not describe the log's epochs {derived:?}", self.epochs));
        }
        Ok(())
    }
}

/// Kafka's `LeaderEpochFileCache.endOffsetFor`: the largest epoch <= `requested` and
/// where it ended (the start of the next higher epoch, the log end for the latest);
/// (-1, -1) when unknown; for an epoch older than all, itself and the first start.
fn end_offset_for(epochs: &[(i32, i64)], requested: i32, leo: i64) -> (i32, i64) {
    let undefined = (UNDEFINED_EPOCH, UNDEFINED_OFFSET);
    if requested == UNDEFINED_EPOCH {
        return undefined;
    }
    let Some(&(latest, _)) = epochs.last() else { return undefined };
    if latest == requested {
        return (requested, leo);
    }
    let Some(&(_, higher_start)) = epochs.iter().find(|e| e.0 > requested) else { return undefined };
    match epochs.iter().rev().find(|e| e.0 <= requested) {
        Some(&(floor, _)) => (floor, higher_start),
        None => (requested, higher_start),
    }
}

// ---- Messages ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Controller,
    Broker(NodeId),
    Client,
    /// The transaction coordinator (`txn::TxnCoordinatorNode`).
    TxnCoordinator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    NotLeader,
    FencedLeaderEpoch,
    UnknownLeaderEpoch,
    OffsetOutOfRange,
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
    OutOfOrderSequence,
    InvalidProducerEpoch,
    UnknownProducerId,
    InvalidTxnState,
    CoordinatorFenced,
}

impl From<ProducerStateError> for Refusal {
    /// The error codes `server::handlers` chooses for the producer state's refusals.
    fn from(e: ProducerStateError) -> Self {
        match e {
            ProducerStateError::OutOfOrderSequence { .. } => Refusal::OutOfOrderSequence,
            ProducerStateError::InvalidProducerEpoch { .. } => Refusal::InvalidProducerEpoch,
            ProducerStateError::UnknownProducerId { .. } => Refusal::UnknownProducerId,
            ProducerStateError::InvalidTxnState { .. } => Refusal::InvalidTxnState,
            ProducerStateError::CoordinatorFenced { .. } => Refusal::CoordinatorFenced,
        }
    }
}

/// The controller's state as brokers and the client see it.
#[derive(Debug)]
struct Snapshot {
    seq: u64,
    registration_epochs: BTreeMap<NodeId, BrokerEpoch>,
    assignment: Vec<Vec<NodeId>>,
    partitions: Vec<PartitionState>,
}

#[derive(Debug, Clone)]
struct Fetched {
    base_offset: i64,
    records: Vec<Record>,
    high_watermark: i64,
}

/// `Produce::batch`: the idempotent producer's batch header (None: the plain producer).
#[derive(Debug, Clone)]
enum Body {
    Register {
        incarnation: u32,
    },
    Registered {
        incarnation: u32,
        registration_epoch: BrokerEpoch,
    },
    Heartbeat {
        registration_epoch: BrokerEpoch,
    },
    Snapshot(Rc<Snapshot>),
    AlterPartition {
        req: u64,
        partition: usize,
        leader_epoch: LeaderEpoch,
        partition_epoch: PartitionEpoch,
        new_isr: Vec<(NodeId, BrokerEpoch)>,
    },
    AlterPartitionAnswer {
        req: u64,
        result: Result<(Vec<NodeId>, PartitionEpoch), String>,
    },
    EpochQuery {
        req: u64,
        partition: usize,
        current_leader_epoch: LeaderEpoch,
        leader_epoch: LeaderEpoch,
    },
    EpochAnswer {
        req: u64,
        partition: usize,
        result: Result<(LeaderEpoch, i64), Refusal>,
    },
    Fetch {
        req: u64,
        partition: usize,
        current_leader_epoch: LeaderEpoch,
        broker_epoch: BrokerEpoch,
        fetch_offset: i64,
    },
    FetchAnswer {
        req: u64,
        partition: usize,
        result: Result<Fetched, Refusal>,
    },
    Produce {
        req: u64,
        partition: usize,
        ids: Vec<u64>,
        batch: Option<ProducerBatch>,
        /// The transactional producer's transaction (bookkeeping, see `Record::txn`).
        txn: Option<u64>,
    },
    ProduceAnswer {
        req: u64,
        result: Result<(i64, i32), Refusal>,
    },
    /// A transaction request from the client to the coordinator, and its answer.
    Txn {
        req: u64,
        request: txn::TxnRequest,
    },
    TxnAnswer {
        req: u64,
        result: Result<Option<ProducerIdAndEpoch>, TxnError>,
    },
    /// WriteTxnMarkers for one partition, from the coordinator to its leader.
    WriteTxnMarker {
        req: u64,
        partition: usize,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        commit: bool,
        coordinator_epoch: i32,
        transaction_version: i8,
    },
    WriteTxnMarkerAnswer {
        req: u64,
        partition: usize,
        result: Result<(), Refusal>,
    },
}

struct Msg {
    at_ms: u64,
    seq: u64,
    from: Node,
    to: Node,
    body: Body,
}

// Earliest first in a max-heap.
impl Ord for Msg {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at_ms, other.seq).cmp(&(self.at_ms, self.seq))
    }
}
impl PartialOrd for Msg {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Msg {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ms, self.seq) == (other.at_ms, other.seq)
    }
}
impl Eq for Msg {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// The broker reaches no one.
    All,
    /// The broker reaches the other brokers and the client, not the controller.
    Controller,
}

#[derive(Default)]
struct Net {
    queue: BinaryHeap<Msg>,
    seq: u64,
    isolated: Option<(NodeId, Cut)>,
}

impl Net {
    fn cut(&self, from: Node, to: Node) -> bool {
        let Some((b, cut)) = self.isolated else { return false };
        let touches = from == Node::Broker(b) || to == Node::Broker(b);
        touches && (cut == Cut::All || from == Node::Controller || to == Node::Controller)
    }
}

/// A filter a scripted scenario sets: true drops the message.
type Filter = Box<dyn FnMut(Node, Node, &Body) -> bool>;

// ---- Brokers ----

/// A follower's fetcher as `server::replication::fetcher` runs it for one partition:
/// the sockets and timers only (what to do is the replica machine's decision).
#[derive(Debug, Default)]
struct FetchIo {
    /// (request, sent at) of the one request in flight.
    inflight: Option<(u64, u64)>,
    /// The epoch the OffsetForLeaderEpoch in flight asks about.
    asked_epoch: LeaderEpoch,
    next_ms: u64,
}

/// What answers an acks=all produce here.
#[derive(Debug)]
struct Waiter {
    req: u64,
    base_offset: i64,
    leader_epoch: i32,
    /// A WriteTxnMarkers request for this partition (answered to the coordinator), not a produce.
    marker_of: Option<usize>,
}

struct Replica {
    log: Log,
    /// Spate's replica machine, as the shard holds it for each partition.
    machine: spate::replication::Replica<Waiter>,
    io: FetchIo,
    /// The high watermark in the broker's checkpoint file (written at each flush).
    hw_checkpoint: i64,
}

impl Replica {
    fn new(segment_records: i64) -> Self {
        let log = Log { segment_records, ..Log::default() };
        let machine = spate::replication::Replica::new(0, MIN_INSYNC_REPLICAS);
        Self { log, machine, io: FetchIo::default(), hw_checkpoint: 0 }
    }

    /// `replica::high_watermark`.
    fn high_watermark(&self) -> i64 {
        self.machine.high_watermark(self.log.leo())
    }

    fn role_epoch(&self) -> Option<LeaderEpoch> {
        match self.machine.role() {
            Role::Leader(l) => Some(l.leader_epoch()),
            Role::Follower(f) => Some(f.leader_epoch),
            Role::None => None,
        }
    }

    fn follower_log(&self, latest_epoch: Option<LeaderEpoch>) -> FollowerLog {
        // No retention here: every log starts at 0.
        FollowerLog {
            log_end_offset: self.log.leo(),
            high_watermark: self.high_watermark(),
            log_start_offset: 0,
            latest_epoch,
        }
    }
}

/// `replica::deliver`: the machine's answers to acks=all produces go to the client.
fn deliver(me: NodeId, answers: Answers<Waiter>, out: &mut Vec<(Node, Node, Body)>) {
    for (w, result) in answers {
        let result = match result {
            Ok(()) => Ok((w.base_offset, w.leader_epoch)),
            Err(AckError::NotEnoughReplicasAfterAppend) => Err(Refusal::NotEnoughReplicasAfterAppend),
            Err(AckError::NotLeader) => Err(Refusal::NotLeader),
        };
        if let Some(partition) = w.marker_of {
            let body = Body::WriteTxnMarkerAnswer { req: w.req, partition, result: result.map(|_| ()) };
            out.push((Node::Broker(me), Node::TxnCoordinator, body));
            continue;
        }
        out.push((Node::Broker(me), Node::Client, Body::ProduceAnswer { req: w.req, result }));
    }
}

fn refusal(e: RoleError) -> Refusal {
    match e {
        RoleError::NotLeader => Refusal::NotLeader,
        RoleError::FencedLeaderEpoch { .. } => Refusal::FencedLeaderEpoch,
        RoleError::UnknownLeaderEpoch { .. } => Refusal::UnknownLeaderEpoch,
    }
}

struct Broker {
    id: NodeId,
    up: bool,
    incarnation: u32,
    registration_epoch: Option<BrokerEpoch>,
    snapshot_seq: u64,
    next_heartbeat_ms: u64,
    next_isr_check_ms: u64,
    next_flush_ms: u64,
    replicas: Vec<Replica>,
    /// AlterPartition requests in flight: request -> (partition, proposal, sent at).
    alters: BTreeMap<u64, (usize, IsrProposal, u64)>,
}

impl Broker {
    fn new(id: NodeId, partitions: usize, segment_records: i64) -> Self {
        Self {
            id,
            up: true,
            incarnation: 1,
            registration_epoch: None,
            snapshot_seq: 0,
            next_heartbeat_ms: 0,
            next_isr_check_ms: 0,
            next_flush_ms: 0,
            replicas: (0..partitions).map(|_| Replica::new(segment_records)).collect(),
            alters: BTreeMap::new(),
        }
    }
}

/// A batch of the idempotent producer, until it is acknowledged or given up.
struct PendingBatch {
    batch: ProducerBatch,
    ids: Vec<u64>,
    /// The request that carries it now, when it was sent, and whether every earlier
    /// batch of the partition was acknowledged by then.
    inflight: Option<(u64, u64, bool)>,
    /// Sent (again) at or after this, to whoever leads the partition then.
    send_at_ms: u64,
    sends: u32,
    acked: bool,
}

/// An idempotent producer at acks=all (librdkafka or the Java client with
/// enable.idempotence=true): per partition, sequences from 0 in the current epoch and
/// at most 5 batches in flight. A batch whose answer is lost, late or a retriable error
/// is sent again unchanged (same producer id, epoch and sequence) to whoever leads now.
/// OUT_OF_ORDER_SEQUENCE for a request sent once every earlier batch was acknowledged
/// means the leader's state does not follow those batches (the batch itself may be in
/// the log, out of the 5-batch window after a restart from a snapshot, or a leader that
/// knew nothing of the producer took a later batch first): the producer bumps its epoch
/// (KIP-360, as the Java client does for an idempotent producer) and starts the new
/// epoch at sequence 0. It gives up every batch not yet acknowledged (each is then in
/// the log at most once), where the Java client fails only the refused batch and sends
/// the others again under new sequences, which could write them twice. Other refusals
/// and timeouts are retried after `RETRY_BACKOFF_MS`.
struct IdempotentProducer {
    epoch: ProducerEpoch,
    next_seq: Vec<i32>,
    /// Per partition, oldest first; acknowledged batches leave from the front.
    pending: Vec<VecDeque<PendingBatch>>,
    /// Every request still of interest -> (partition, epoch, first sequence) of its batch.
    requests: BTreeMap<u64, (usize, ProducerEpoch, i32)>,
}

impl IdempotentProducer {
    fn new(partitions: usize) -> Self {
        Self {
            epoch: ProducerEpoch(0),
            next_seq: vec![0; partitions],
            pending: (0..partitions).map(|_| VecDeque::new()).collect(),
            requests: BTreeMap::new(),
        }
    }
}

struct Client {
    snapshot_seq: u64,
    leaders: Vec<NodeId>,
    /// request -> (partition, record ids, sent at)
    inflight: BTreeMap<u64, (usize, Vec<u64>, u64)>,
    next_id: u64,
    acked: u64,
    /// Bursty traffic: producing until, then silent until.
    burst_until_ms: u64,
    silent_until_ms: u64,
    /// With `Knobs::idempotent`, the producer is idempotent (and `inflight` unused).
    idempotent: Option<IdempotentProducer>,
    /// With `Knobs::transactional`, the producer is transactional (and `inflight` unused).
    txn: Option<txn::TxnProducer>,
}

enum Fault {
    Crash {
        broker: NodeId,
        restart_ms: u64,
        restarted: bool,
    },
    /// Cut off until `until_ms` (`healed`: the network is back); over once the controller
    /// has heard from the broker since.
    Isolate {
        broker: NodeId,
        until_ms: u64,
        healed: bool,
    },
}

/// What the checker remembers between steps.
#[derive(Default)]
struct History {
    /// Per partition: every record that was ever below some replica's high watermark.
    committed: Vec<Vec<Record>>,
    /// (partition, leader epoch) -> the broker that acted as its leader.
    leaders: BTreeMap<(usize, LeaderEpoch), NodeId>,
    /// (broker, partition) -> the highest leader epoch it acted on.
    role_epochs: BTreeMap<(NodeId, usize), LeaderEpoch>,
    /// (broker, incarnation, partition, leader epoch) -> its high watermark as leader.
    leader_hws: BTreeMap<(NodeId, u32, usize, LeaderEpoch), i64>,
    /// Per partition: the controller's (leader epoch, partition epoch).
    controller_epochs: Vec<(LeaderEpoch, PartitionEpoch)>,
    acked: Vec<(usize, i64, Record)>,
    /// Per partition: what of the committed log the idempotence checks have seen, the
    /// record ids in it, and the producer's last complete batch in it.
    idempotence_checked: Vec<usize>,
    committed_ids: Vec<std::collections::HashSet<u64>>,
    committed_last_batch: Vec<Option<ProducerBatch>>,
    /// How often things happened, for the summary of a replayed seed.
    counts: BTreeMap<&'static str, u64>,
    /// What invariants 8-10 remember (transactional seeds).
    txn: txn::TxnHistory,
}

struct Sim {
    knobs: Knobs,
    rng: Rng,
    /// The operator's reassignments draw from this, so that seeds without them run as
    /// they did before reassignment existed.
    reassign_rng: Rng,
    now_ms: u64,
    controller: Controller,
    /// The incarnation whose registration the controller processed, per broker.
    registered: BTreeMap<NodeId, u32>,
    /// When the controller last processed a registration or heartbeat, per broker.
    heard_ms: BTreeMap<NodeId, u64>,
    snapshot_seq: u64,
    next_snapshot_ms: u64,
    brokers: Vec<Broker>,
    client: Client,
    net: Net,
    out: Vec<(Node, Node, Body)>,
    filter: Option<Filter>,
    fault: Option<Fault>,
    /// A broker that lost its unsynced suffix in a lossy crash, until it registers
    /// again (see `reassign`).
    lossy_down: Option<NodeId>,
    quiet_until_ms: u64,
    next_req: u64,
    trace: VecDeque<String>,
    hist: History,
    violations: Vec<String>,
    /// The transaction coordinator (transactional seeds).
    coordinator: Option<txn::TxnCoordinatorNode>,
}

fn index(id: NodeId) -> usize {
    BROKER_IDS.iter().position(|b| *b == id).expect("a known broker")
}

impl Sim {
    fn new(mut rng: Rng, knobs: Knobs, assignment: Vec<Vec<NodeId>>) -> Self {
        assert_eq!(assignment.len(), knobs.partitions);
        let config = ControllerConfig {
            broker_session_timeout_ms: SESSION_TIMEOUT_MS,
            unclean_leader_election: false,
            ..ControllerConfig::default()
        };
        let mut controller = Controller::new(config);
        controller.becomes_active(1).expect("first controller epoch");
        let mut brokers = Vec::new();
        let mut registered = BTreeMap::new();
        for &id in &BROKER_IDS {
            controller.register_broker(id, Endpoint::new("sim", 9000 + id.0 as u16), None, 1, 0).expect("register");
            let mut b = Broker::new(id, knobs.partitions, knobs.segment_records);
            b.registration_epoch = controller.broker_epoch(id);
            b.next_heartbeat_ms = rng.below(HEARTBEAT_INTERVAL_MS);
            b.next_isr_check_ms = rng.below(ISR_CHECK_INTERVAL_MS);
            brokers.push(b);
            registered.insert(id, 1);
        }
        let configs = BTreeMap::from([("min.insync.replicas".to_string(), MIN_INSYNC_REPLICAS.to_string())]);
        controller.create_topic_with_assignment(TOPIC, Uuid::from_u128(1), assignment, configs).expect("topic");
        let partitions = knobs.partitions;
        let idempotent = knobs.idempotent.then(|| IdempotentProducer::new(partitions));
        let transactional = knobs.transactional;
        for b in &mut brokers {
            for r in &mut b.replicas {
                r.log.markers_unapplied = knobs.markers_unapplied;
            }
        }
        let mut sim = Self {
            knobs,
            rng,
            reassign_rng: Rng(0),
            now_ms: 0,
            controller,
            heard_ms: BROKER_IDS.iter().map(|id| (*id, 0)).collect(),
            registered,
            snapshot_seq: 0,
            next_snapshot_ms: SNAPSHOT_INTERVAL_MS,
            brokers,
            client: Client {
                snapshot_seq: 0,
                leaders: vec![NO_LEADER; partitions],
                inflight: BTreeMap::new(),
                next_id: 1,
                acked: 0,
                burst_until_ms: 0,
                silent_until_ms: 0,
                idempotent,
                txn: transactional.then(|| txn::TxnProducer::new(partitions)),
            },
            net: Net::default(),
            out: Vec::new(),
            filter: None,
            fault: None,
            lossy_down: None,
            quiet_until_ms: 1_000,
            next_req: 0,
            trace: VecDeque::new(),
            hist: History {
                committed: vec![Vec::new(); partitions],
                idempotence_checked: vec![0; partitions],
                committed_ids: vec![Default::default(); partitions],
                committed_last_batch: vec![None; partitions],
                controller_epochs: vec![(LeaderEpoch(0), PartitionEpoch(0)); partitions],
                txn: txn::TxnHistory::new(partitions),
                ..History::default()
            },
            violations: Vec::new(),
            coordinator: transactional.then(txn::TxnCoordinatorNode::new),
        };
        sim.broadcast();
        sim.flush();
        sim
    }

    fn count(&mut self, what: &'static str) {
        *self.hist.counts.entry(what).or_default() += 1;
    }

    fn note(&mut self, event: String) {
        if self.trace.len() == TRACE_EVENTS_MAX {
            self.trace.pop_front();
        }
        self.trace.push_back(format!("@{} {event}", self.now_ms));
    }

    fn violation(&mut self, v: String) {
        self.note(format!("VIOLATION {v}"));
        self.violations.push(v);
    }

    fn req(&mut self) -> u64 {
        self.next_req += 1;
        self.next_req
    }

    fn send(&mut self, from: Node, to: Node, body: Body) {
        self.out.push((from, to, body));
    }

    /// Hand what was sent to the network: cut links, the scenario's filter, loss,
    /// duplication, delay.
    fn flush(&mut self) {
        let out = std::mem::take(&mut self.out);
        for (from, to, body) in out {
            if self.net.cut(from, to) {
                continue;
            }
            if let Some(f) = self.filter.as_mut() {
                if f(from, to, &body) {
                    continue;
                }
            }
            let session = matches!(body, Body::Register { .. } | Body::Registered { .. } | Body::Heartbeat { .. });
            if !session && self.rng.chance(self.knobs.loss_pct) {
                continue;
            }
            // One TCP request each: AlterPartition when refusals are told apart, and
            // WriteTxnMarkers (a copy landing after the coordinator moved on would end
            // a later transaction).
            let once = (self.knobs.refusals && matches!(body, Body::AlterPartition { .. }))
                || matches!(body, Body::WriteTxnMarker { .. });
            let copies = if self.rng.chance(self.knobs.dup_pct) && !once { 2 } else { 1 };
            for _ in 0..copies {
                let at_ms = self.now_ms + 1 + self.rng.below(self.knobs.delay_max_ms);
                self.net.seq += 1;
                self.net.queue.push(Msg { at_ms, seq: self.net.seq, from, to, body: body.clone() });
            }
        }
        assert!(self.net.queue.len() <= MESSAGES_IN_FLIGHT_MAX, "network queue past its limit");
    }

    /// Run `f` on broker `i`, taken out of the sim so that `f` can use the rest of it.
    fn with_broker<R>(&mut self, i: usize, f: impl FnOnce(&mut Self, &mut Broker) -> R) -> R {
        let id = self.brokers[i].id;
        let mut b = std::mem::replace(&mut self.brokers[i], Broker::new(id, 0, 0));
        let r = f(self, &mut b);
        self.brokers[i] = b;
        r
    }

    // ---- The clock ----

    fn step(&mut self, dt_ms: u64) -> Result<(), String> {
        self.now_ms += dt_ms;
        self.deliver_due();
        self.faults();
        self.flush();
        self.controller_timers();
        for i in 0..self.brokers.len() {
            if self.brokers[i].up {
                self.with_broker(i, |sim, b| sim.broker_timers(b));
            }
        }
        self.client_timers();
        if self.coordinator.is_some() {
            self.coordinator_timers();
        }
        self.flush();
        self.check()
    }

    fn deliver_due(&mut self) {
        while self.net.queue.peek().is_some_and(|m| m.at_ms <= self.now_ms) {
            let m = self.net.queue.pop().expect("peeked");
            if self.net.cut(m.from, m.to) {
                continue;
            }
            match m.to {
                Node::Controller => self.controller_receive(m.from, m.body),
                Node::Client => self.client_receive(m.body),
                Node::TxnCoordinator => self.coordinator_receive(m.from, m.body),
                Node::Broker(id) => {
                    let i = index(id);
                    if self.brokers[i].up {
                        self.with_broker(i, |sim, b| sim.broker_receive(b, m.from, m.body));
                    }
                }
            }
        }
        self.flush();
    }

    // ---- Faults ----

    fn faults(&mut self) {
        match self.fault {
            None => {
                if self.now_ms >= self.quiet_until_ms && self.rng.per_mille(self.knobs.fault_per_mille) {
                    self.start_fault();
                }
            }
            Some(Fault::Crash { broker, restart_ms, restarted: false }) if self.now_ms >= restart_ms => {
                self.restart(broker);
                self.fault = Some(Fault::Crash { broker, restart_ms, restarted: true });
            }
            Some(Fault::Crash { broker, restarted: true, .. }) => {
                // Over once the controller has the new incarnation (and so took the old
                // one out of every ISR).
                if self.registered[&broker] == self.brokers[index(broker)].incarnation {
                    self.heal();
                }
            }
            Some(Fault::Isolate { broker, until_ms, healed: false }) if self.now_ms >= until_ms => {
                self.net.isolated = None;
                self.note(format!("b{broker} reachable again"));
                self.fault = Some(Fault::Isolate { broker, until_ms, healed: true });
            }
            Some(Fault::Isolate { broker, until_ms, healed: true }) => {
                // Over once the controller heard from it again: until then its session
                // may still expire for the cut (it is fenced after the network healed).
                if self.heard_ms[&broker] >= until_ms {
                    self.heal();
                }
            }
            Some(_) => {}
        }
    }

    fn start_fault(&mut self) {
        let id = BROKER_IDS[self.rng.below(BROKER_IDS.len() as u64) as usize];
        let until_ms = self.now_ms + 200 + self.rng.below(FAULT_MS_MAX);
        match self.rng.below(3) {
            0 => {
                // Losing unsynced data is only survivable when another ISR member has it.
                let last_isr_member =
                    self.controller.topic(TOPIC).expect("topic").partitions.iter().any(|s| s.isr == [id]);
                let lossy = self.knobs.lossy && !last_isr_member && self.rng.chance(70);
                self.count(if lossy { "lossy crashes" } else { "crashes" });
                self.crash(id, lossy);
                if lossy {
                    self.lossy_down = Some(id);
                }
                self.fault = Some(Fault::Crash { broker: id, restart_ms: until_ms, restarted: false });
            }
            n => {
                let cut = if n == 1 { Cut::All } else { Cut::Controller };
                self.count(if n == 1 { "cut off" } else { "cut from controller" });
                self.note(format!("FAULT b{id} cut off ({cut:?}) until {until_ms}"));
                self.net.isolated = Some((id, cut));
                self.fault = Some(Fault::Isolate { broker: id, until_ms, healed: false });
            }
        }
    }

    fn heal(&mut self) {
        self.note("fault over".to_string());
        self.fault = None;
        self.quiet_until_ms = self.now_ms + self.rng.below(QUIET_MS_MAX);
    }

    /// The broker dies: its state goes, its log keeps what it synced (or everything),
    /// its connections (messages in flight) die with it.
    fn crash(&mut self, id: NodeId, lossy: bool) {
        let b = &mut self.brokers[index(id)];
        assert!(b.up, "crash of a broker already down");
        b.up = false;
        b.alters.clear();
        let mut errors = Vec::new();
        for r in &mut b.replicas {
            if let Err(e) = r.log.recover(lossy, r.hw_checkpoint) {
                errors.push(e);
            }
            // A new incarnation: no role, no waiters, the checkpointed high watermark
            // (`insert_partition` takes it, never above the recovered log end).
            r.machine = spate::replication::Replica::new(r.hw_checkpoint, MIN_INSYNC_REPLICAS);
            r.io = FetchIo::default();
        }
        let lens: Vec<i64> = b.replicas.iter().map(|r| r.log.leo()).collect();
        self.note(format!("FAULT b{id} crashes (lossy: {lossy}); logs recover to {lens:?}"));
        for e in errors {
            self.violation(format!("b{id} recovery: {e}"));
        }
        self.net.queue.retain(|m| m.from != Node::Broker(id) && m.to != Node::Broker(id));
        self.out.retain(|m| m.0 != Node::Broker(id) && m.1 != Node::Broker(id));
    }

    /// A new incarnation starts; it registers before it acts on any metadata.
    fn restart(&mut self, id: NodeId) {
        let now = self.now_ms;
        let b = &mut self.brokers[index(id)];
        assert!(!b.up, "restart of a running broker");
        b.up = true;
        b.incarnation += 1;
        b.registration_epoch = None;
        b.snapshot_seq = 0;
        b.next_heartbeat_ms = now;
        b.next_isr_check_ms = now;
        let incarnation = b.incarnation;
        self.note(format!("b{id} restarts as incarnation {incarnation}"));
    }

    // ---- Controller ----

    fn snapshot(&mut self) -> Rc<Snapshot> {
        self.snapshot_seq += 1;
        let t = self.controller.topic(TOPIC).expect("topic");
        Rc::new(Snapshot {
            seq: self.snapshot_seq,
            registration_epochs: self.controller.brokers().map(|b| (b.id, b.registration_epoch)).collect(),
            assignment: t.assignment.clone(),
            partitions: t.partitions.clone(),
        })
    }

    fn broadcast(&mut self) {
        let s = self.snapshot();
        for id in BROKER_IDS {
            self.send(Node::Controller, Node::Broker(id), Body::Snapshot(s.clone()));
        }
        self.send(Node::Controller, Node::Client, Body::Snapshot(s));
    }

    fn controller_changed(&mut self, changes: Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        for ch in &changes {
            match ch {
                Change::PartitionChanged { partition, state, .. } => self.note(format!(
                    "controller: p{partition} leader {} epoch {} isr {:?} partition epoch {}",
                    state.leader, state.leader_epoch, state.isr, state.partition_epoch
                )),
                Change::BrokerFenced { id, .. } => self.note(format!("controller: b{id} fenced")),
                Change::BrokerUnfenced { id } => self.note(format!("controller: b{id} unfenced")),
                Change::BrokerRegistered { broker } => {
                    self.note(format!("controller: b{} registered, epoch {}", broker.id, broker.registration_epoch));
                    if self.lossy_down == Some(broker.id) {
                        self.lossy_down = None;
                    }
                }
                _ => {}
            }
        }
        self.broadcast();
    }

    fn controller_receive(&mut self, from: Node, body: Body) {
        let Node::Broker(b) = from else { return };
        let now = self.now_ms;
        match body {
            Body::Register { incarnation } => {
                self.heard_ms.insert(b, now);
                if self.registered[&b] != incarnation {
                    assert!(incarnation > self.registered[&b], "registration from an old incarnation");
                    let changes = self
                        .controller
                        .register_broker(b, Endpoint::new("sim", 9000 + b.0 as u16), None, 1, now)
                        .expect("register");
                    self.registered.insert(b, incarnation);
                    self.controller_changed(changes);
                }
                let registration_epoch = self.controller.broker_epoch(b).expect("registered");
                self.send(Node::Controller, from, Body::Registered { incarnation, registration_epoch });
            }
            Body::Heartbeat { registration_epoch } => {
                if self.controller.broker_epoch(b) == Some(registration_epoch) {
                    self.heard_ms.insert(b, now);
                    let changes = self.controller.heartbeat(b, now).expect("heartbeat of a registered broker");
                    self.controller_changed(changes);
                }
            }
            Body::AlterPartition { req, partition, leader_epoch, partition_epoch, new_isr } => {
                let result = self.controller.alter_partition(
                    TOPIC,
                    partition as i32,
                    b,
                    leader_epoch,
                    partition_epoch,
                    &new_isr,
                );
                let answer = match result {
                    Ok(changes) => {
                        let s = self.controller.partition_state(TOPIC, partition as i32).expect("partition");
                        let answer = Ok((s.isr.clone(), s.partition_epoch));
                        self.controller_changed(changes);
                        answer
                    }
                    Err(e) => Err(e.to_string()),
                };
                self.send(Node::Controller, from, Body::AlterPartitionAnswer { req, result: answer });
            }
            other => panic!("controller got {other:?}"),
        }
    }

    fn controller_timers(&mut self) {
        let changes = self.controller.tick(self.now_ms);
        self.controller_changed(changes);
        if self.knobs.reassign_per_mille > 0 && self.reassign_rng.per_mille(self.knobs.reassign_per_mille) {
            self.reassign();
        }
        if self.rng.per_mille(self.knobs.preferred_per_mille) {
            self.count("preferred elections");
            let changes = self.controller.elect_preferred_leaders();
            self.controller_changed(changes);
        }
        if self.now_ms >= self.next_snapshot_ms {
            self.next_snapshot_ms = self.now_ms + SNAPSHOT_INTERVAL_MS;
            self.broadcast();
        }
    }

    /// An operator's AlterPartitionReassignments for one partition: a partition on three
    /// brokers drops one; one on two gets the third (at a random place), either as a
    /// third replica or, half the time, as a move that drops one of the two in the same
    /// step; one being moved is sometimes cancelled instead. The controller refuses what Kafka's
    /// refuses (a target with no live broker, a cancel needing an unclean election).
    ///
    /// Not while a broker that lost its unsynced suffix has not registered again: the
    /// controller still counts it in the ISR, and a move or cancel that leaves it the
    /// only ISR member (as Kafka's would: ISR ∩ the new replicas) loses acknowledged
    /// records. The lossy crash itself is only drawn where another ISR member has them,
    /// and an operator taking that member away is outside the durability promise.
    fn reassign(&mut self) {
        if self.lossy_down.is_some() {
            self.count("reassignments held during a lossy crash");
            return;
        }
        let p = self.reassign_rng.below(self.knobs.partitions as u64) as usize;
        let t = self.controller.topic(TOPIC).expect("topic");
        let ongoing = t.reassignments.contains_key(&(p as i32));
        let current = t.target_replicas(p);
        let target = if ongoing && self.reassign_rng.chance(30) {
            None
        } else if current.len() == BROKER_IDS.len() {
            let mut target = current.clone();
            target.remove(self.reassign_rng.below(target.len() as u64) as usize);
            Some(target)
        } else {
            let mut target = current.clone();
            // Half the time a move at the same replication factor (kafka-reassign-
            // partitions' 1,2,3 -> 2,3,4): one replica leaves in the same step as the
            // missing broker is added, so the partition copies onto a broker with no
            // log while it drops another.
            if target.len() > 1 && self.reassign_rng.chance(50) {
                target.remove(self.reassign_rng.below(target.len() as u64) as usize);
                self.count("reassignment moves asked");
            }
            for id in BROKER_IDS.iter().filter(|id| !current.contains(id)) {
                let at = self.reassign_rng.below(target.len() as u64 + 1) as usize;
                target.insert(at, *id);
            }
            Some(target)
        };
        self.count("reassignments asked");
        match self.controller.alter_reassignment(TOPIC, p as i32, target.clone(), true) {
            Ok(changes) => {
                self.note(format!("operator: reassign p{p} {current:?} -> {target:?}"));
                self.controller_changed(changes);
            }
            Err(ControllerError::InvalidReplicaAssignment(e)) => self.note(format!("operator: refused: {e}")),
            Err(e) => self.violation(format!("reassign p{p} {current:?} -> {target:?}: {e}")),
        }
    }

    /// Settle: every partition goes back to all three brokers, so that the liveness
    /// check can ask each of them for the leader's log.
    fn reassign_back(&mut self) {
        self.knobs.reassign_per_mille = 0;
        for p in 0..self.knobs.partitions {
            let t = self.controller.topic(TOPIC).expect("topic");
            let mut target = t.target_replicas(p);
            if target.len() == BROKER_IDS.len() && !t.reassignments.contains_key(&(p as i32)) {
                continue;
            }
            let missing: Vec<NodeId> = BROKER_IDS.iter().copied().filter(|id| !target.contains(id)).collect();
            target.extend(missing);
            match self.controller.alter_reassignment(TOPIC, p as i32, Some(target.clone()), true) {
                Ok(changes) => {
                    self.note(format!("operator: p{p} back on {target:?}"));
                    self.controller_changed(changes);
                }
                Err(e) => self.violation(format!("settle: p{p} back on {target:?}: {e}")),
            }
        }
    }

    // ---- Brokers ----

    fn broker_receive(&mut self, b: &mut Broker, from: Node, body: Body) {
        match body {
            Body::Registered { incarnation, registration_epoch } => {
                if incarnation == b.incarnation && b.registration_epoch.is_none() {
                    b.registration_epoch = Some(registration_epoch);
                }
            }
            Body::Snapshot(s) => self.apply_snapshot(b, &s),
            Body::AlterPartitionAnswer { req, result } => {
                if let Some((p, proposal, _)) = b.alters.remove(&req) {
                    self.isr_result(b, p, &proposal, result.map_err(Some));
                }
            }
            Body::EpochQuery { req, partition, current_leader_epoch, leader_epoch } => {
                let r = &mut b.replicas[partition];
                // `PartitionOp::EpochEndOffset`: the log answers in its own (i32) epochs.
                let result = r.machine.leader(current_leader_epoch).map_err(refusal).map(|_| {
                    let (epoch, end) = r.log.end_offset_for(leader_epoch.0);
                    (LeaderEpoch(epoch), end)
                });
                self.send(Node::Broker(b.id), from, Body::EpochAnswer { req, partition, result });
            }
            Body::EpochAnswer { req, partition, result } => self.on_epoch_answer(b, partition, req, result),
            Body::Fetch { req, partition, current_leader_epoch, broker_epoch, fetch_offset } => {
                self.on_fetch(b, from, req, partition, current_leader_epoch, broker_epoch, fetch_offset)
            }
            Body::FetchAnswer { req, partition, result } => self.on_fetch_answer(b, partition, req, result),
            Body::Produce { req, partition, ids, batch, txn } => self.on_produce(b, req, partition, ids, batch, txn),
            Body::WriteTxnMarker {
                req,
                partition,
                producer_id,
                epoch,
                commit,
                coordinator_epoch,
                transaction_version,
            } => self.on_write_txn_marker(
                b,
                req,
                partition,
                producer_id,
                epoch,
                commit,
                coordinator_epoch,
                transaction_version,
            ),
            other => panic!("broker {} got {other:?}", b.id),
        }
    }

    /// Only snapshots taken after this incarnation registered count (a restarted broker
    /// acts on no metadata older than its registration), newest first.
    fn apply_snapshot(&mut self, b: &mut Broker, s: &Snapshot) {
        let Some(mine) = b.registration_epoch else { return };
        if s.seq <= b.snapshot_seq || s.registration_epochs.get(&b.id) != Some(&mine) {
            return;
        }
        b.snapshot_seq = s.seq;
        for p in 0..b.replicas.len() {
            self.refresh_role(b, p, &s.assignment[p], &s.partitions[p]);
        }
    }

    /// `Shard::set_role`: the replica machine takes the controller's state. A replica a
    /// reassignment moved off this broker is deleted as `Shard::sync_registry` does
    /// (`leave_partition`, then `DeletePartition`): its acks=all waiters fail, its log and
    /// high watermark checkpoint go; if it comes back it starts empty.
    fn refresh_role(&mut self, b: &mut Broker, p: usize, replicas: &[NodeId], state: &PartitionState) {
        let (me, now) = (b.id, self.now_ms);
        if !replicas.contains(&me) {
            let r = &mut b.replicas[p];
            if r.log.leo() > 0 || !matches!(r.machine.role(), Role::None) {
                // What it had below its high watermark was committed (it may have acked
                // it within this step, before `check` saw it): the history keeps it.
                let (hw, committed) = (r.high_watermark() as usize, &mut self.hist.committed[p]);
                if hw > committed.len() {
                    committed.extend_from_slice(&r.log.records[committed.len()..hw]);
                }
                let answers = r.machine.fail_waiters();
                deliver(me, answers, &mut self.out);
                b.replicas[p] = Replica::new(self.knobs.segment_records);
                b.replicas[p].log.markers_unapplied = self.knobs.markers_unapplied;
                self.count("replicas deleted after a move");
                self.note(format!("b{me} p{p}: moved away, deleted"));
            }
            return;
        }
        let r = &mut b.replicas[p];
        let leo = r.log.leo();
        let had_role = !matches!(r.machine.role(), Role::None);
        let change =
            r.machine.on_partition_state(me, Some((replicas, state)), leo, 0, now as i64, REPLICA_LAG_TIME_MAX_MS);
        if let Some(epoch) = change.record_leader_epoch {
            if let Err(e) = r.log.assign_leader_epoch(epoch.0) {
                self.violation(format!("b{me} p{p}: {e}"));
            }
        }
        deliver(me, change.answers, &mut self.out);
        if change.start_fetcher.is_some() {
            r.io = FetchIo { next_ms: now, ..FetchIo::default() };
        }
        if change.took_role {
            let note = match r.machine.role() {
                Role::Leader(l) => format!(
                    "b{me} p{p} leads epoch {} (isr {:?}, leo {leo}, hw {})",
                    l.leader_epoch(),
                    l.isr(),
                    l.high_watermark()
                ),
                Role::Follower(f) => format!("b{me} p{p} follows b{} in epoch {}", f.leader, f.leader_epoch),
                Role::None => unreachable!("a role was taken"),
            };
            self.note(note);
        } else if had_role && matches!(r.machine.role(), Role::None) {
            self.note(format!("b{me} p{p}: offline"));
        }
    }

    fn broker_timers(&mut self, b: &mut Broker) {
        let now = self.now_ms;
        if now >= b.next_heartbeat_ms {
            b.next_heartbeat_ms = now + HEARTBEAT_INTERVAL_MS;
            let body = match b.registration_epoch {
                Some(registration_epoch) => Body::Heartbeat { registration_epoch },
                None => Body::Register { incarnation: b.incarnation },
            };
            self.send(Node::Broker(b.id), Node::Controller, body);
        }
        if now >= b.next_flush_ms {
            b.next_flush_ms = now + self.knobs.flush_interval_ms;
            for r in &mut b.replicas {
                r.log.synced = r.log.records.len();
                r.hw_checkpoint = r.high_watermark();
            }
        }
        // AlterPartition timeouts: `isr_result(Err)`, as the shard is told.
        let timeout_ms = self.knobs.request_timeout_ms;
        let expired: Vec<u64> =
            b.alters.iter().filter(|(_, (_, _, sent))| now >= sent + timeout_ms).map(|(r, _)| *r).collect();
        for req in expired {
            let (p, proposal, _) = b.alters.remove(&req).expect("listed");
            self.isr_result(b, p, &proposal, Err(None));
        }
        if now >= b.next_isr_check_ms {
            b.next_isr_check_ms = now + ISR_CHECK_INTERVAL_MS;
            for p in 0..b.replicas.len() {
                let Some(proposal) = b.replicas[p].machine.isr_change(now as i64) else { continue };
                let req = self.req();
                self.note(format!(
                    "b{} p{p} proposes isr {:?} (leader epoch {}, partition epoch {})",
                    b.id, proposal.new_isr, proposal.leader_epoch, proposal.partition_epoch
                ));
                let body = Body::AlterPartition {
                    req,
                    partition: p,
                    leader_epoch: proposal.leader_epoch,
                    partition_epoch: proposal.partition_epoch,
                    new_isr: proposal.new_isr.iter().copied().zip(proposal.broker_epochs.iter().copied()).collect(),
                };
                b.alters.insert(req, (p, proposal, now));
                self.send(Node::Broker(b.id), Node::Controller, body);
            }
        }
        for p in 0..b.replicas.len() {
            self.fetcher_step(b, p);
        }
    }

    /// `Shard::isr_result`; `Err(None)`: no answer (timeout), `Err(Some(_))`: the
    /// controller refused. With `knobs.refusals` (as shipped) a refusal is
    /// `IsrOutcome::Refused`; without, it counts as a lost answer (`Unknown`).
    fn isr_result(
        &mut self,
        b: &mut Broker,
        p: usize,
        proposal: &IsrProposal,
        result: Result<(Vec<NodeId>, PartitionEpoch), Option<String>>,
    ) {
        let refusals = self.knobs.refusals;
        let me = b.id;
        let r = &mut b.replicas[p];
        if r.machine.leader_state().is_none() {
            return;
        }
        let outcome = match result {
            Ok((isr, partition_epoch)) => {
                self.note(format!("b{me} p{p}: isr {isr:?} committed at partition epoch {partition_epoch}"));
                self.count("isr changes");
                IsrOutcome::Committed(isr, partition_epoch)
            }
            Err(Some(e)) if refusals => {
                self.note(format!("b{me} p{p}: isr change refused: {e}"));
                self.count("isr change refusals");
                IsrOutcome::Refused
            }
            Err(e) => {
                self.note(format!("b{me} p{p}: isr change failed: {}", e.as_deref().unwrap_or("timed out")));
                self.count("isr change failures");
                IsrOutcome::Unknown
            }
        };
        let answers = r.machine.on_isr_result(proposal, outcome, r.log.leo());
        deliver(me, answers, &mut self.out);
    }

    /// One turn of a follower's fetcher (`server::replication::fetcher`): one request at
    /// a time; what it sends is the replica machine's step (truncation rounds first, then
    /// fetches from the log end).
    fn fetcher_step(&mut self, b: &mut Broker, p: usize) {
        let now = self.now_ms;
        let me = b.id;
        let rule = self.knobs.rule;
        let r = &mut b.replicas[p];
        let Some((leader, current_leader_epoch)) = r.machine.follower().map(|f| (f.leader, f.leader_epoch)) else {
            return;
        };
        if let Some((_, sent)) = r.io.inflight {
            if now >= sent + self.knobs.request_timeout_ms {
                // No answer: the connection is dropped and made again after the backoff.
                r.io.inflight = None;
                r.io.next_ms = now + RETRY_BACKOFF_MS;
            }
            return;
        }
        if now < r.io.next_ms {
            return;
        }
        // Before KIP-101 (the scripted `kip101_*` tests) a follower had no epochs to ask.
        let latest = if rule == Rule::HighWatermark { None } else { r.log.latest_epoch().map(LeaderEpoch) };
        let log = r.follower_log(latest);
        let f = r.machine.follower_mut(leader, current_leader_epoch).expect("follows");
        match f.step(now as i64, &log) {
            FollowerStep::Wait => {}
            FollowerStep::TruncateTo(offset) => {
                f.on_truncated(true);
                self.truncate_follower(me, p, r, offset);
            }
            FollowerStep::AskEpoch { latest_epoch } => {
                let req = self.req();
                r.io.inflight = Some((req, now));
                r.io.asked_epoch = latest_epoch;
                let body = Body::EpochQuery { req, partition: p, current_leader_epoch, leader_epoch: latest_epoch };
                self.send(Node::Broker(me), Node::Broker(leader), body);
            }
            FollowerStep::Fetch => {
                let req = self.req();
                r.io.inflight = Some((req, now));
                let broker_epoch = match b.registration_epoch {
                    Some(epoch) if !self.knobs.no_broker_epochs => epoch,
                    _ => NO_BROKER_EPOCH,
                };
                let fetch_offset = r.log.leo();
                let body = Body::Fetch { req, partition: p, current_leader_epoch, broker_epoch, fetch_offset };
                self.send(Node::Broker(me), Node::Broker(leader), body);
            }
        }
    }

    /// `Shard::replica_truncate`, checking that no committed record it holds goes.
    fn truncate_follower(&mut self, me: NodeId, p: usize, r: &mut Replica, offset: i64) {
        let leo = r.log.leo();
        if offset < leo {
            let committed = &self.hist.committed[p];
            let common = r.log.records.iter().zip(committed).take_while(|(a, b)| a == b).count() as i64;
            self.note(format!("b{me} p{p} truncates {leo} -> {offset}"));
            self.count("truncations");
            if offset < common {
                self.violation(format!(
                    "b{me} p{p} truncated to {offset}, dropping committed records up to {common} ({:?})",
                    &r.log.records[offset as usize..common as usize]
                ));
            }
        }
        let hw = r.high_watermark();
        if let Err(e) = r.log.truncate(offset, hw) {
            self.violation(format!("b{me} p{p}: {e}"));
        }
        r.machine.on_truncated(offset);
    }

    /// An error on the partition (`server::replication::partition_failed`): its machine
    /// pauses it and makes it truncate again.
    fn follower_failed(&mut self, r: &mut Replica, error: String) {
        let now = self.now_ms as i64;
        let Some((leader, epoch)) = r.machine.follower().map(|f| (f.leader, f.leader_epoch)) else { return };
        if let Some(f) = r.machine.follower_mut(leader, epoch) {
            f.on_error(now, RETRY_BACKOFF_MS as i64, error);
        }
    }

    /// The fetcher's `truncate`: one OffsetForLeaderEpoch round, decided by the machine
    /// (`Shard::follower_epoch_answer`).
    fn on_epoch_answer(&mut self, b: &mut Broker, p: usize, req: u64, result: Result<(LeaderEpoch, i64), Refusal>) {
        let (me, now, rule) = (b.id, self.now_ms, self.knobs.rule);
        let r = &mut b.replicas[p];
        if r.machine.follower().is_none() || r.io.inflight.map(|(q, _)| q) != Some(req) {
            return;
        }
        r.io.inflight = None;
        let (answer_epoch, answer_end) = match result {
            Ok(answer) => answer,
            Err(e) => {
                r.io.next_ms = now;
                self.follower_failed(r, format!("OffsetForLeaderEpoch answered {e:?}"));
                return;
            }
        };
        let epoch = r.io.asked_epoch;
        let log = r.follower_log(r.log.latest_epoch().map(LeaderEpoch));
        let (leo, hw) = (log.log_end_offset, log.high_watermark);
        let Truncation { offset, done } = match rule {
            Rule::Epoch => {
                let f = r.machine.follower().expect("checked above");
                f.on_epoch_answer(epoch, (answer_epoch, answer_end), &log, |e| r.log.end_offset_for(e.0).1)
            }
            // KIP-101 as first shipped (the scripted `kip279_*` tests): no second round.
            Rule::Kip101Only if answer_epoch == LeaderEpoch::UNDEFINED || answer_end == UNDEFINED_OFFSET => {
                Truncation { offset: hw.min(leo), done: true }
            }
            Rule::Kip101Only => Truncation { offset: answer_end.min(leo), done: true },
            Rule::HighWatermark => unreachable!("no OffsetForLeaderEpoch before KIP-101"),
        };
        if answer_epoch.get() >= 0 && answer_epoch < epoch {
            self.count("older epoch answers");
        }
        self.note(format!(
            "b{me} p{p} asked epoch {epoch}: leader has ({answer_epoch}, {answer_end}); truncate to {offset}{}",
            if done { "" } else { ", ask again" }
        ));
        self.truncate_follower(me, p, r, offset);
        let Some((leader, leader_epoch)) = r.machine.follower().map(|f| (f.leader, f.leader_epoch)) else { return };
        r.machine.follower_mut(leader, leader_epoch).expect("follows").on_truncated(done);
        r.io.next_ms = now;
    }

    /// The leader's side of a follower fetch (`PartitionOp::Fetch` with a replica id).
    #[allow(clippy::too_many_arguments)]
    fn on_fetch(
        &mut self,
        b: &mut Broker,
        from: Node,
        req: u64,
        p: usize,
        current_leader_epoch: LeaderEpoch,
        broker_epoch: BrokerEpoch,
        offset: i64,
    ) {
        let Node::Broker(follower) = from else { return };
        let (me, now) = (b.id, self.now_ms);
        let r = &mut b.replicas[p];
        let leo = r.log.leo();
        let result =
            match r.machine.on_follower_fetch(current_leader_epoch, follower, broker_epoch, offset, leo, now as i64) {
                Err(FetchRefusal::Role(e)) => Err(refusal(e)),
                // Not a replica, or a dead incarnation (KIP-903): NOT_LEADER_OR_FOLLOWER.
                Err(FetchRefusal::Follower(e)) => {
                    if matches!(e, FollowerFetchError::StaleBrokerEpoch { .. }) {
                        self.count("fetches from a dead incarnation");
                    }
                    Err(Refusal::NotLeader)
                }
                Ok((high_watermark, answers)) => {
                    deliver(me, answers, &mut self.out);
                    if offset < 0 || offset > leo {
                        Err(Refusal::OffsetOutOfRange)
                    } else {
                        let end = r.log.read_end(offset as usize, self.knobs.fetch_records_max);
                        let records = r.log.records[offset as usize..end].to_vec();
                        Ok(Fetched { base_offset: offset, records, high_watermark })
                    }
                }
            };
        self.send(Node::Broker(me), from, Body::FetchAnswer { req, partition: p, result });
    }

    /// The fetcher's `fetch`: append what came, learn the leader's high watermark.
    fn on_fetch_answer(&mut self, b: &mut Broker, p: usize, req: u64, result: Result<Fetched, Refusal>) {
        let (me, now) = (b.id, self.now_ms);
        let r = &mut b.replicas[p];
        let Some((leader, leader_epoch)) = r.machine.follower().map(|f| (f.leader, f.leader_epoch)) else { return };
        if r.io.inflight.map(|(q, _)| q) != Some(req) {
            return;
        }
        r.io.inflight = None;
        match result {
            Err(Refusal::OffsetOutOfRange) => {
                // `Shard::follower_out_of_range` with the leader's log start, which is 0
                // here (no retention): never below it, so truncate by epoch again.
                let log = r.follower_log(r.log.latest_epoch().map(LeaderEpoch));
                let f = r.machine.follower().expect("follows");
                match f.on_out_of_range(0, &log) {
                    OutOfRange::StartOver(start) => {
                        self.violation(format!("b{me} p{p}: starts over at {start} with no log start on the leader"))
                    }
                    OutOfRange::TruncateAgain => {
                        self.note(format!("b{me} p{p}: fetch offset out of range, truncating again"));
                        self.follower_failed(r, "fetch offset out of the leader's range".into());
                    }
                }
            }
            Err(e) => {
                r.io.next_ms = now;
                self.follower_failed(r, format!("Fetch answered {e:?}"));
            }
            Ok(fetched) => {
                r.io.next_ms = if fetched.records.is_empty() { now + FETCH_IDLE_MS } else { now };
                if fetched.base_offset != r.log.leo() {
                    self.violation(format!(
                        "b{me} p{p}: fetched records at {} onto a log ending at {}",
                        fetched.base_offset,
                        r.log.leo()
                    ));
                    return;
                }
                for record in fetched.records {
                    if let Err(e) = r.log.append(record) {
                        self.violation(format!("b{me} p{p} follower append: {e}"));
                        return;
                    }
                }
                r.machine.on_fetched(fetched.high_watermark, r.log.leo());
                r.machine.follower_mut(leader, leader_epoch).expect("follows").on_fetched();
            }
        }
    }

    /// `PartitionOp::Produce` with acks=all. An idempotent batch is checked against the
    /// producer state first (`PartitionLog::append_inner`): refused, or a retry answered
    /// with its original offsets once the high watermark covers them, or appended.
    #[allow(clippy::too_many_arguments)]
    fn on_produce(
        &mut self,
        b: &mut Broker,
        req: u64,
        p: usize,
        ids: Vec<u64>,
        batch: Option<ProducerBatch>,
        txn: Option<u64>,
    ) {
        let me = b.id;
        let r = &mut b.replicas[p];
        let leader_epoch = r.machine.may_append(true).map_err(|e| match e {
            AppendRefusal::NotEnoughReplicas { .. } => Refusal::NotEnoughReplicas,
            AppendRefusal::NotLeader => Refusal::NotLeader,
        });
        // The epoch the leader stamps into the batch header (the log's i32).
        let leader_epoch = match leader_epoch {
            Ok(e) => e.0,
            Err(e) => {
                self.send(Node::Broker(me), Node::Client, Body::ProduceAnswer { req, result: Err(e) });
                return;
            }
        };
        if let Some(batch) = batch {
            assert_eq!(batch.offset_delta as usize + 1, ids.len(), "a batch header counts its records");
            match r.log.producers.check(&[batch], None) {
                Err(e) => {
                    self.note(format!("b{me} p{p} refuses {ids:?}: {e}"));
                    let result = Err(Refusal::from(e));
                    self.send(Node::Broker(me), Node::Client, Body::ProduceAnswer { req, result });
                    return;
                }
                Ok(Verdict::Duplicate(_)) if self.knobs.appends_retries => {}
                Ok(Verdict::Duplicate(m)) => {
                    let base_offset = m.first_offset();
                    let original = r.log.records[base_offset as usize];
                    let same =
                        |o: Option<(ProducerBatch, i32)>| o.map(|(o, i)| (o.producer_id, o.epoch, o.first_seq, i));
                    if same(original.batch) != same(Some((batch, 0))) {
                        self.violation(format!(
                            "b{me} p{p}: {batch:?} answered as a retry of {original:?} at {base_offset}"
                        ));
                        return;
                    }
                    self.note(format!("b{me} p{p}: {ids:?} is a retry of the batch at {base_offset}"));
                    self.count("retries answered as duplicates");
                    let waiter = Waiter { req, base_offset, leader_epoch: original.leader_epoch, marker_of: None };
                    let answers = r.machine.wait_for_high_watermark(m.last_offset, waiter, r.log.leo());
                    deliver(me, answers, &mut self.out);
                    return;
                }
                Ok(Verdict::Append) => {}
            }
        }
        let base_offset = r.log.leo();
        for (i, &id) in ids.iter().enumerate() {
            let record = Record { leader_epoch, id, batch: batch.map(|b| (b, i as i32)), txn, marker: None };
            if let Err(e) = r.log.append(record) {
                self.violation(format!("b{me} p{p} leader append: {e}"));
                return;
            }
        }
        let leo = r.log.leo();
        let answers =
            r.machine.wait_for_high_watermark(leo - 1, Waiter { req, base_offset, leader_epoch, marker_of: None }, leo);
        deliver(me, answers, &mut self.out);
        self.note(format!("b{me} p{p} appends {ids:?} at {base_offset} in epoch {leader_epoch}"));
    }

    // ---- Client ----

    fn client_receive(&mut self, body: Body) {
        match body {
            Body::Snapshot(s) => {
                if s.seq > self.client.snapshot_seq {
                    self.client.snapshot_seq = s.seq;
                    self.client.leaders = s.partitions.iter().map(|st| st.leader).collect();
                }
            }
            Body::ProduceAnswer { req, result } if self.client.idempotent.is_some() => {
                self.idempotent_answer(req, result)
            }
            Body::ProduceAnswer { req, result } if self.client.txn.is_some() => self.txn_produce_answer(req, result),
            Body::TxnAnswer { req, result } => self.txn_answer(req, result),
            Body::ProduceAnswer { req, result } => {
                let Some((p, ids, _)) = self.client.inflight.remove(&req) else { return };
                if let Ok((base_offset, leader_epoch)) = result {
                    for (i, &id) in ids.iter().enumerate() {
                        self.acked(
                            p,
                            base_offset + i as i64,
                            Record { leader_epoch, id, batch: None, txn: None, marker: None },
                        );
                    }
                }
            }
            other => panic!("client got {other:?}"),
        }
    }

    fn acked(&mut self, p: usize, offset: i64, record: Record) {
        self.client.acked += 1;
        self.hist.acked.push((p, offset, record));
        let committed = self.hist.committed[p].get(offset as usize).copied();
        if committed != Some(record) {
            self.violation(format!("p{p}: acked {record:?} at {offset} but the committed log has {committed:?} there"));
        }
    }

    fn client_timers(&mut self) {
        let now = self.now_ms;
        self.client.inflight.retain(|_, (_, _, sent)| now < *sent + PRODUCE_TIMEOUT_MS);
        // A burst, then a silence; then the next burst.
        if self.knobs.bursty && now >= self.client.silent_until_ms {
            self.client.burst_until_ms = now + 100 + self.rng.below(BURST_MS_MAX);
            self.client.silent_until_ms = self.client.burst_until_ms + 100 + self.rng.below(SILENCE_MS_MAX);
        }
        let silent = self.knobs.bursty && now >= self.client.burst_until_ms;
        if self.client.txn.is_some() {
            self.txn_client_timers(silent);
            return;
        }
        if !silent && self.rng.chance(self.knobs.produce_pct) {
            let p = self.rng.below(self.knobs.partitions as u64) as usize;
            let n = 1 + self.rng.below(PRODUCE_RECORDS_MAX);
            if self.client.idempotent.is_some() {
                let _ = self.idempotent_batch(p, n as usize);
            } else {
                self.produce(p, n as usize);
            }
        }
        if self.client.idempotent.is_some() {
            self.idempotent_send();
        }
    }

    /// The idempotent producer makes a batch of `n` new records for `p`, unless 5 are
    /// in flight there; `idempotent_send` sends it. Returns the records' ids.
    fn idempotent_batch(&mut self, p: usize, n: usize) -> Vec<u64> {
        let now = self.now_ms;
        let producer = self.client.idempotent.as_mut().expect("idempotent");
        if producer.pending[p].len() >= IDEMPOTENT_BATCHES_IN_FLIGHT_MAX {
            return Vec::new();
        }
        let ids: Vec<u64> = (0..n as u64).map(|i| self.client.next_id + i).collect();
        self.client.next_id += n as u64;
        let batch = ProducerBatch {
            producer_id: PRODUCER_ID,
            epoch: producer.epoch,
            first_seq: producer.next_seq[p],
            offset_delta: n as i32 - 1,
            max_timestamp_ms: now as i64,
            transactional: false,
        };
        producer.next_seq[p] = increment_sequence(batch.first_seq, n as i32);
        producer.pending[p].push_back(PendingBatch {
            batch,
            ids: ids.clone(),
            inflight: None,
            send_at_ms: now,
            sends: 0,
            acked: false,
        });
        ids
    }

    /// Send every batch that is due: new ones, and those whose answer did not come
    /// within `PRODUCE_TIMEOUT_MS` (lost, or late) or was a retriable refusal.
    fn idempotent_send(&mut self) {
        let now = self.now_ms;
        let producer = self.client.idempotent.as_mut().expect("idempotent");
        let mut due = Vec::new();
        for (p, pending) in producer.pending.iter_mut().enumerate() {
            let mut all_before_acked = true;
            for (i, b) in pending.iter_mut().enumerate() {
                if !b.acked {
                    if b.inflight.is_some_and(|(_, sent, _)| now >= sent + PRODUCE_TIMEOUT_MS) {
                        b.inflight = None;
                        b.send_at_ms = now;
                    }
                    if b.inflight.is_none() && now >= b.send_at_ms && self.client.leaders[p] != NO_LEADER {
                        due.push((p, i, all_before_acked));
                    }
                }
                all_before_acked &= b.acked;
            }
        }
        for (p, i, as_head) in due {
            let req = self.req();
            let leader = self.client.leaders[p];
            let producer = self.client.idempotent.as_mut().expect("idempotent");
            let b = &mut producer.pending[p][i];
            let retry = b.sends > 0;
            b.sends += 1;
            b.inflight = Some((req, now, as_head));
            producer.requests.insert(req, (p, b.batch.epoch, b.batch.first_seq));
            let body = Body::Produce { req, partition: p, ids: b.ids.clone(), batch: Some(b.batch), txn: None };
            if retry {
                self.count("idempotent retries");
            }
            self.send(Node::Client, Node::Broker(leader), body);
        }
    }

    /// An answer to one of the idempotent producer's requests (maybe an old one of a
    /// batch sent since, or a copy the network made).
    fn idempotent_answer(&mut self, req: u64, result: Result<(i64, i32), Refusal>) {
        let now = self.now_ms;
        let producer = self.client.idempotent.as_mut().expect("idempotent");
        let Some(&(p, epoch, first_seq)) = producer.requests.get(&req) else { return };
        let pending = &mut producer.pending[p];
        let Some(i) = pending.iter().position(|b| b.batch.epoch == epoch && b.batch.first_seq == first_seq) else {
            return;
        };
        let b = &mut pending[i];
        if b.acked {
            return;
        }
        let current = b.inflight.is_some_and(|(q, _, _)| q == req);
        let sent_as_head = b.inflight.is_some_and(|(q, _, head)| q == req && head);
        match result {
            Ok((base_offset, leader_epoch)) => {
                b.acked = true;
                b.inflight = None;
                let (batch, ids) = (b.batch, b.ids.clone());
                while pending.front().is_some_and(|b| b.acked) {
                    pending.pop_front();
                }
                let in_flight: Vec<(ProducerEpoch, i32)> =
                    pending.iter().map(|b| (b.batch.epoch, b.batch.first_seq)).collect();
                producer.requests.retain(|_, r| r.0 != p || in_flight.contains(&(r.1, r.2)));
                for (i, &id) in ids.iter().enumerate() {
                    let record = Record { leader_epoch, id, batch: Some((batch, i as i32)), txn: None, marker: None };
                    self.acked(p, base_offset + i as i64, record);
                }
            }
            Err(Refusal::OutOfOrderSequence) if sent_as_head => {
                let batch = b.batch;
                let given_up: usize = producer.pending.iter().map(|q| q.len()).sum();
                producer.epoch = ProducerEpoch(producer.epoch.0 + 1);
                assert!(producer.epoch.0 < i16::MAX, "the simulation never exhausts an epoch");
                for q in &mut producer.pending {
                    q.clear();
                }
                producer.next_seq.iter_mut().for_each(|s| *s = 0);
                producer.requests.clear();
                let new_epoch = producer.epoch;
                self.note(format!(
                    "client: p{p} {batch:?} out of order; epoch bumped to {new_epoch}, {given_up} batches given up"
                ));
                self.count("producer epoch bumps");
                self.hist
                    .counts
                    .entry("batches given up")
                    .and_modify(|n| *n += given_up as u64)
                    .or_insert(given_up as u64);
            }
            Err(e @ (Refusal::InvalidProducerEpoch | Refusal::UnknownProducerId)) => {
                // Only the producer makes epochs, and the bound on ids is not simulated.
                let batch = b.batch;
                self.violation(format!("p{p}: {batch:?} of the current epoch refused: {e:?}"));
            }
            Err(e) => {
                if current {
                    b.inflight = None;
                    b.send_at_ms = now + RETRY_BACKOFF_MS;
                }
                if e == Refusal::OutOfOrderSequence {
                    self.count("out of order answers retried");
                }
            }
        }
    }

    /// The client sends `n` new records to whom it believes leads `p`.
    fn produce(&mut self, p: usize, n: usize) -> Vec<u64> {
        let leader = self.client.leaders[p];
        if leader == NO_LEADER || self.client.inflight.len() >= PRODUCE_INFLIGHT_MAX {
            return Vec::new();
        }
        let ids: Vec<u64> = (0..n as u64).map(|i| self.client.next_id + i).collect();
        self.client.next_id += n as u64;
        let req = self.req();
        self.client.inflight.insert(req, (p, ids.clone(), self.now_ms));
        self.send(
            Node::Client,
            Node::Broker(leader),
            Body::Produce { req, partition: p, ids: ids.clone(), batch: None, txn: None },
        );
        ids
    }

    // ---- Invariants ----

    fn check(&mut self) -> Result<(), String> {
        if let Some(v) = self.violations.first() {
            return Err(v.clone());
        }
        self.controller.check_invariants()?;
        let t = self.controller.topic(TOPIC).expect("topic");
        for (p, s) in t.partitions.iter().enumerate() {
            let (le, pe) = self.hist.controller_epochs[p];
            if s.leader_epoch < le || s.partition_epoch < pe {
                return Err(format!(
                    "p{p}: controller epochs went back ({le}, {pe}) -> ({}, {})",
                    s.leader_epoch, s.partition_epoch
                ));
            }
            self.hist.controller_epochs[p] = (s.leader_epoch, s.partition_epoch);
        }
        for b in self.brokers.iter().filter(|b| b.up) {
            for (p, r) in b.replicas.iter().enumerate() {
                let (hw, leo) = (r.high_watermark(), r.log.leo());
                if hw > leo || hw < 0 {
                    return Err(format!("b{} p{p}: high watermark {hw} outside [0, log end {leo}]", b.id));
                }
                if let Some(e) = r.role_epoch() {
                    let seen = self.hist.role_epochs.entry((b.id, p)).or_insert(e);
                    if e < *seen {
                        return Err(format!("b{} p{p}: acts in leader epoch {e} after {}", b.id, *seen));
                    }
                    *seen = e;
                }
                if let Role::Leader(l) = r.machine.role() {
                    let e = l.leader_epoch();
                    let leader = *self.hist.leaders.entry((p, e)).or_insert(b.id);
                    if leader != b.id {
                        return Err(format!("p{p}: b{leader} and b{} both lead epoch {e}", b.id));
                    }
                    let last = self.hist.leader_hws.entry((b.id, b.incarnation, p, e)).or_insert(hw);
                    if hw < *last {
                        return Err(format!("b{} p{p}: leader high watermark went back {} -> {hw}", b.id, *last));
                    }
                    *last = hw;
                }
                let committed = &mut self.hist.committed[p];
                if hw as usize > committed.len() {
                    committed.extend_from_slice(&r.log.records[committed.len()..hw as usize]);
                }
            }
        }
        for b in self.brokers.iter_mut().filter(|b| b.up) {
            for (p, r) in b.replicas.iter_mut().enumerate() {
                let committed = &self.hist.committed[p];
                let hw = r.high_watermark() as usize;
                let log = &mut r.log;
                let upto = log.records.len().min(committed.len());
                while log.matches_committed < upto
                    && log.records[log.matches_committed] == committed[log.matches_committed]
                {
                    log.matches_committed += 1;
                }
                let at = log.matches_committed;
                if hw > at {
                    return Err(format!(
                        "b{} p{p}: below its high watermark {hw}, offset {at} holds {:?}, committed {:?}",
                        b.id, log.records[at], committed[at]
                    ));
                }
                if let Role::Leader(l) = r.machine.role() {
                    let s = &t.partitions[p];
                    if s.leader == b.id && s.leader_epoch == l.leader_epoch() && at < committed.len() {
                        return Err(format!(
                            "b{} p{p}, leader in epoch {}, lacks committed offset {at} ({:?}); it has {:?}",
                            b.id,
                            s.leader_epoch,
                            committed[at],
                            log.records.get(at)
                        ));
                    }
                }
            }
        }
        if self.client.idempotent.is_some() || self.client.txn.is_some() {
            self.check_idempotence()?;
        }
        if self.client.txn.is_some() {
            self.check_transactions()?;
        }
        Ok(())
    }

    /// 7. With the idempotent producer, the committed log holds every record at most
    ///    once (with 3., every acknowledged record exactly once, at the offset its
    ///    answer gave), each batch whole, and within a producer epoch each batch right
    ///    after the previous one (no duplicate, gap or reordering); epochs never go back.
    fn check_idempotence(&mut self) -> Result<(), String> {
        for p in 0..self.knobs.partitions {
            let committed = &self.hist.committed[p];
            for offset in self.hist.idempotence_checked[p]..committed.len() {
                let r = committed[offset];
                if r.marker.is_some() {
                    continue;
                }
                if !self.hist.committed_ids[p].insert(r.id) {
                    let first = committed.iter().position(|c| c.id == r.id).expect("seen");
                    return Err(format!("p{p}: record {} committed twice, at {first} and {offset}: {r:?}", r.id));
                }
                let Some((b, i)) = r.batch else { return Err(format!("p{p}: a plain record {r:?} at {offset}")) };
                let previous = offset.checked_sub(1).map(|o| committed[o]);
                if i > 0 && previous.and_then(|c| c.batch) != Some((b, i - 1)) {
                    return Err(format!("p{p}: {r:?} at {offset} does not follow its batch's record {}", i - 1));
                }
                if i == 0 && previous.is_some_and(|c| c.marker.is_none() && c.ends_batch().is_none()) {
                    return Err(format!("p{p}: {r:?} at {offset} starts a batch inside another: {previous:?}"));
                }
                if i == 0 {
                    if let Some(last) = self.hist.committed_last_batch[p] {
                        let follows = increment_sequence(last.last_seq(), 1) == b.first_seq;
                        if b.epoch < last.epoch || (b.epoch == last.epoch && !follows) {
                            return Err(format!("p{p}: batch {b:?} at {offset} committed after {last:?}"));
                        }
                    }
                }
                if r.ends_batch().is_some() {
                    self.hist.committed_last_batch[p] = Some(b);
                }
            }
            self.hist.idempotence_checked[p] = committed.len();
        }
        Ok(())
    }

    /// After the faults: no faults, no loss; records get acknowledged again, every ISR
    /// fills up and every replica ends up with its leader's log.
    fn settle(&mut self) -> Result<(), String> {
        self.note("SETTLE".to_string());
        self.reassign_back();
        self.knobs.fault_per_mille = 0;
        self.knobs.preferred_per_mille = 0;
        self.knobs.bursty = false;
        self.knobs.loss_pct = 0;
        self.knobs.dup_pct = 0;
        self.knobs.produce_pct = self.knobs.produce_pct.max(10);
        if let Some(Fault::Crash { broker, restarted: false, .. }) = self.fault {
            self.fault = Some(Fault::Crash { broker, restart_ms: self.now_ms, restarted: false });
        }
        if let Some(Fault::Isolate { broker, healed: false, .. }) = self.fault {
            self.fault = Some(Fault::Isolate { broker, until_ms: self.now_ms, healed: false });
        }
        if self.client.txn.is_some() {
            self.txn_settle();
        }
        let acked = self.client.acked;
        for _ in 0..SETTLE_PRODUCE_MS / SETTLE_STEP_MS {
            self.step(SETTLE_STEP_MS)?;
        }
        if self.client.acked == acked {
            return Err("liveness: nothing was acknowledged after the faults ended".to_string());
        }
        self.knobs.produce_pct = 0;
        if let Some(producer) = self.client.txn.as_mut() {
            // No new transaction; the open one ends (or times out, if its producer was killed).
            producer.settling = true;
        }
        // Converged within SETTLE_QUIET_MS_MAX of the last progress: a replica that
        // copies a long log from nothing (one the settle's reassignment added back) at
        // `fetch_records_max` records a fetch takes as long as it takes, while a
        // partition stuck anywhere fails. Progress is a new maximum of the records
        // held over all replicas, which a loop of truncations and appends cannot fake.
        let (started, mut last_progress_ms, mut held_max) = (self.now_ms, self.now_ms, self.records_held());
        while self.now_ms - last_progress_ms < SETTLE_QUIET_MS_MAX && self.now_ms - started < SETTLE_MS_MAX {
            if self.converged().is_ok() {
                return Ok(());
            }
            self.step(SETTLE_STEP_MS)?;
            let held = self.records_held();
            if held > held_max {
                (held_max, last_progress_ms) = (held, self.now_ms);
            }
        }
        self.converged()
    }

    /// Records held over every replica of every partition.
    fn records_held(&self) -> usize {
        self.brokers.iter().flat_map(|b| &b.replicas).map(|r| r.log.records.len()).sum()
    }

    /// Every partition has a leader and a full ISR, every replica holds the leader's log
    /// and knows it committed.
    fn converged(&self) -> Result<(), String> {
        for p in 0..self.knobs.partitions {
            let s = self.controller.partition_state(TOPIC, p as i32).expect("partition");
            let recovered = s.leader != NO_LEADER && s.isr.len() == BROKER_IDS.len() && {
                let leader = &self.brokers[index(s.leader)].replicas[p].log.records;
                self.brokers.iter().all(|b| {
                    let r = &b.replicas[p];
                    b.up && r.log.records == *leader && r.high_watermark() == r.log.leo()
                })
            };
            if !recovered {
                return Err(format!("liveness: p{p} did not recover: {}", self.describe(p)));
            }
        }
        if self.client.txn.is_some() {
            self.transactions_settled()?;
        }
        Ok(())
    }

    /// Every replica of `p`, for failure reports.
    fn describe(&self, p: usize) -> String {
        let mut out = format!("p{p} on the controller: {:?}", self.controller.partition_state(TOPIC, p as i32));
        for b in &self.brokers {
            let r = &b.replicas[p];
            let role = match r.machine.role() {
                Role::Leader(l) => format!(
                    "leader epoch {} isr {:?} pending {:?} follower leos {:?}",
                    l.leader_epoch(),
                    l.isr(),
                    l.pending_change(),
                    BROKER_IDS.iter().map(|id| l.follower_leo(*id)).collect::<Vec<_>>()
                ),
                Role::Follower(f) => format!(
                    "follows b{} epoch {} truncated {} inflight {:?} next {}",
                    f.leader,
                    f.leader_epoch,
                    f.truncated(),
                    r.io.inflight,
                    r.io.next_ms
                ),
                Role::None => "no role".to_string(),
            };
            out.push_str(&format!(
                "\n  b{} up {} registration {:?} snapshot {}: leo {} hw {}, {role}",
                b.id,
                b.up,
                b.registration_epoch,
                b.snapshot_seq,
                r.log.leo(),
                r.high_watermark()
            ));
        }
        out
    }

    fn report(&self, e: &str) -> String {
        let events: Vec<&str> = self.trace.iter().map(|s| s.as_str()).collect();
        format!("@{} ms: {e}\nknobs: {:?}\nlast events:\n  {}", self.now_ms, self.knobs, events.join("\n  "))
    }
}

// ---- Random runs ----

/// Known bugs the simulated wiring can be run with, each to show that the invariants
/// catch it (`sim_catches_*`). Only for behaviour the simulation itself implements: a
/// bug in spate's own code is shown by a test of that code (see the module comment).
#[derive(Debug, Clone, Copy, Default)]
struct AsSpate {
    /// A leader that checks sequences and epochs but appends a retry of one of the
    /// producer's last 5 batches again instead of answering it with its offsets.
    appends_retries: bool,
    /// Followers fetch without their broker epoch (spate before KIP-903): leaders propose
    /// members with `NO_BROKER_EPOCH`, which the controller does not check.
    no_broker_epochs: bool,
    /// Brokers append end-of-transaction markers without `check_marker` and replicas
    /// never `apply_marker` (in appends, followers' copies and rebuilds alike): the
    /// producer state never sees a transaction end.
    markers_unapplied: bool,
    /// Leaders serve read_committed readers up to the high watermark, not the last
    /// stable offset.
    reader_ignores_lso: bool,
}

impl AsSpate {
    /// `SPATE_SIM_APPENDS_RETRIES=1`, `SPATE_SIM_NO_BROKER_EPOCHS=1`,
    /// `SPATE_SIM_MARKERS_UNAPPLIED=1`, `SPATE_SIM_READER_IGNORES_LSO=1`.
    fn from_env() -> Self {
        Self {
            appends_retries: std::env::var("SPATE_SIM_APPENDS_RETRIES").is_ok(),
            no_broker_epochs: std::env::var("SPATE_SIM_NO_BROKER_EPOCHS").is_ok(),
            markers_unapplied: std::env::var("SPATE_SIM_MARKERS_UNAPPLIED").is_ok(),
            reader_ignores_lso: std::env::var("SPATE_SIM_READER_IGNORES_LSO").is_ok(),
        }
    }
}

/// One seed: knobs and assignment drawn from it, `STEPS_PER_SEED` random steps, then the
/// settle phase. The producer (idempotent for odd seeds, plain for even ones) and the
/// segment size come from the seed outside the main draw, so a plain-producer seed runs
/// exactly as it did before the idempotent producer.
fn run_seed(seed: u64, as_spate: AsSpate) -> Result<Summary, String> {
    let mut rng = Rng(seed);
    let mut segment_rng = Rng(seed ^ 0x5e67_e475);
    // Reassignments (every third seed) draw from their own generator.
    let mut reassign_rng = Rng(seed ^ 0x7ea5_5167);
    let reassign_per_mille = if seed.is_multiple_of(3) { 1 + reassign_rng.below(3) } else { 0 };
    let knobs = Knobs {
        idempotent: seed % 2 == 1,
        transactional: txn::is_transactional(seed),
        appends_retries: as_spate.appends_retries,
        no_broker_epochs: as_spate.no_broker_epochs,
        markers_unapplied: as_spate.markers_unapplied,
        reader_ignores_lso: as_spate.reader_ignores_lso,
        segment_records: 4 + segment_rng.below(60) as i64,
        reassign_per_mille,
        ..Knobs::random(&mut rng)
    };
    let assignment: Vec<Vec<NodeId>> = (0..knobs.partitions)
        .map(|_| {
            let mut replicas = BROKER_IDS.to_vec();
            for i in (1..replicas.len()).rev() {
                replicas.swap(i, rng.below(i as u64 + 1) as usize);
            }
            replicas
        })
        .collect();
    let mut sim = Sim::new(rng, knobs, assignment);
    sim.reassign_rng = reassign_rng;
    for step in 0..STEPS_PER_SEED {
        let dt = 1 + sim.rng.below(sim.knobs.step_ms_max);
        sim.step(dt).map_err(|e| sim.report(&format!("step {step}: {e}")))?;
    }
    sim.settle().map_err(|e| sim.report(&e))?;
    let reloads = sim.brokers.iter().flat_map(|b| &b.replicas).map(|r| r.log.snapshot_reloads).sum();
    sim.hist.counts.insert("producer states rebuilt from a snapshot", reloads);
    Ok(Summary {
        simulated_ms: sim.now_ms,
        committed: sim.hist.committed.iter().map(|c| c.len()).collect(),
        acked: sim.client.acked,
        leader_epochs: sim.hist.leaders.len(),
        counts: sim.hist.counts,
    })
}

/// What a passing seed did (printed when one seed is replayed).
#[derive(Debug)]
#[allow(dead_code)] // read through Debug
struct Summary {
    simulated_ms: u64,
    committed: Vec<usize>,
    acked: u64,
    leader_epochs: usize,
    counts: BTreeMap<&'static str, u64>,
}

/// Run `seeds` on up to `SIM_THREADS_MAX` threads (each simulation is single-threaded
/// and deterministic); the lowest failing seed, with its report.
fn run_seeds(seeds: &[u64], as_spate: AsSpate) -> Option<(u64, String)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, SIM_THREADS_MAX);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..threads {
            let failures = &failures;
            scope.spawn(move || {
                for &seed in seeds.iter().skip(t).step_by(threads) {
                    if failures.lock().expect("lock").iter().any(|(s, _)| *s < seed) {
                        return;
                    }
                    let failure = match std::panic::catch_unwind(|| run_seed(seed, as_spate)) {
                        Ok(Ok(summary)) => {
                            if seeds.len() == 1 {
                                println!("seed {seed} passed: {summary:?}");
                            }
                            continue;
                        }
                        Ok(Err(e)) => e,
                        Err(_) => "panicked (see its message above)".to_string(),
                    };
                    failures.lock().expect("lock").push((seed, failure));
                }
            });
        }
    });
    failures.into_inner().expect("lock").into_iter().min_by_key(|(s, _)| *s)
}

/// `SPATE_SIM_SEED=<seed>` replays one seed; `SPATE_SIM_SEEDS=<n>` runs seeds 0..n (from
/// `SPATE_SIM_SEEDS_FROM=<m>` on, if set); `SPATE_TEST_SEED` adds its window of
/// `SEEDS_EXPLORED` seeds (tests/explore/mod.rs); see `AsSpate` for the other variables.
#[test]
fn sim_seeds() {
    let seeds: Vec<u64> = match std::env::var("SPATE_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("SPATE_SIM_SEED is a u64")],
        Err(_) => {
            let n: u64 = std::env::var("SPATE_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(SEEDS_DEFAULT);
            let from: u64 = std::env::var("SPATE_SIM_SEEDS_FROM").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
            (from..n).chain(explore::window("replication_sim", SEEDS_EXPLORED, 1)).collect()
        }
    };
    let as_spate = AsSpate::from_env();
    if let Some((seed, e)) = run_seeds(&seeds, as_spate) {
        panic!("replication simulation failed ({as_spate:?}); replay with SPATE_SIM_SEED={seed}\n{e}");
    }
}

/// Seed 16089 (beyond `SEEDS_DEFAULT`; reassignment moves) found the bug that
/// `LeaderState::on_isr_committed` fixed: broker 2 was reassigned away (deleting its
/// log, partition epoch 48) and back (49) while the leader saw neither state, only the
/// snapshots before and after, with 2 a replica in both. The leader kept what 2 had
/// fetched before its log went, proposed it into the ISR before it fetched again, and
/// 2 was elected with 18 of the committed records missing (invariant 3). A snapshot
/// that skips partition epochs now resets every follower outside the ISR. With that
/// reset removed this seed fails (as did seed 843 before the lossy-crash hold in
/// `reassign` changed its path); the unit test
/// `a_snapshot_that_skips_partition_epochs_forgets_the_progress_outside_the_isr` shows
/// the rule itself.
#[test]
fn sim_seed_16089_a_follower_moved_away_and_back_between_two_snapshots() {
    if let Err(e) = run_seed(16089, AsSpate::default()) {
        panic!("{e}");
    }
}

/// Seed 477875573592 (CI's explored window of 2026-12-06) found that the rule above
/// missed epochs the leader learnt from its own AlterPartition answers, which carry no
/// replicas: a reassignment [2, 3] -> [1, 2] finished (3 deleted its log) in the answer
/// to the leader's proposal, then [1, 2] -> [3, 1, 2] came in the very next snapshot.
/// With 3 a replica in both snapshots and no epoch skipped between them, the leader
/// kept 3's old progress, proposed it into the ISR before it fetched, and 3 was
/// elected with an empty log. `LeaderState` now counts from the epoch it last learnt
/// the replicas at (`replicas_epoch`); with `partition_epoch` in its place this seed
/// fails.
#[test]
fn sim_seed_477875573592_a_replica_removed_in_an_answer_and_added_back() {
    if let Err(e) = run_seed(477_875_573_592, AsSpate::default()) {
        panic!("{e}");
    }
}

/// Seed 35863512891 (explored by CI at 728574d): a reassignment removed replica 1 of
/// p1 and added it back (partition epochs 40 and 41) while the leader kept its leader
/// epoch. A fetch that 1 sent at offset 79 before it deleted its log reached the leader
/// after it had forgotten 1's progress, so the leader took the re-added, empty replica
/// into the ISR, and 1 was then elected without the committed records. The controller
/// now moves the leader epoch when a change removes a replica, as Kafka's
/// `PartitionChangeBuilder` does, which fences such fetches; without that bump this seed
/// fails.
#[test]
fn sim_seed_35863512891_a_removed_replicas_late_fetch_after_it_is_added_back() {
    if let Err(e) = run_seed(35_863_512_891, AsSpate::default()) {
        panic!("{e}");
    }
}

/// Seed 18288 (beyond `SEEDS_DEFAULT`) found the bug that `log::producers::rebuild`
/// fixed by replaying from at or below the high watermark: broker 3 restarted with a
/// checkpointed high watermark of 19 and a snapshot taken at a roll after the commit
/// marker (29) of a transaction that started at 16. The snapshot does not keep ended
/// transactions, so once 3 was elected its last stable offset was 19, inside the
/// committed transaction: a read_committed reader would get part of it (invariant 8).
/// With the snapshot chosen at or below the log end alone (the old rule) this seed
/// fails; `a_restart_with_a_stale_high_watermark_keeps_an_ended_transaction_whole`
/// (tests/log_transactions.rs) shows the same on a real `PartitionLog`.
#[test]
fn sim_seed_18288_a_restart_below_a_marker_loads_a_snapshot_taken_after_it() {
    if let Err(e) = run_seed(18288, AsSpate::default()) {
        panic!("{e}");
    }
}

/// Seed 11107 (beyond the `SEEDS_DEFAULT` that CI runs) found the bug that spate fixed
/// with broker epochs in Fetch and AlterPartition (Kafka's KIP-903;
/// `replication::LeaderState`, `Controller::alter_partition`): a follower outside the
/// ISR caught up, crashed and lost its unsynced suffix; its leader kept proposing to add
/// it on the fetch offset of its previous incarnation, the controller took that once it
/// registered again, and a preferred election made it leader without committed records
/// (invariant 3). Since the simulation drives spate's replica machine (whose follower
/// retruncates after a partition error, and whose brokers restart with their
/// checkpointed high watermarks) the seed takes another path, and no seed below 40,000
/// finds the bug without broker epochs; it stays as a regression seed, and the scripted
/// `sim_catches_a_restarted_follower_without_broker_epochs` shows the bug caught.
#[test]
fn sim_seed_11107_a_restarted_follower_rejoins_on_its_previous_incarnations_offset() {
    if let Err(e) = run_seed(11107, AsSpate::default()) {
        panic!("{e}");
    }
}

/// Seed 16354 (past `SEEDS_DEFAULT`) broke invariant 3 in a fault the model does not
/// allow: a broker's cut-off ended, the controller fenced it just after (its first
/// heartbeat since was not in yet) while another broker crashed and lost its unsynced
/// suffix: two faults at once, so the committed offset 199 was left on the fenced broker
/// alone. A cut-off now ends only once the controller has heard from the broker again.
#[test]
fn sim_seed_16354_a_fence_just_after_a_cut_is_part_of_that_fault() {
    if let Err(e) = run_seed(16354, AsSpate::default()) {
        panic!("{e}");
    }
}

/// The idempotence invariant (7.) has teeth: with leaders that append a retried batch
/// again instead of answering it with its original offsets, the idempotent producer's
/// retries end up in the committed log twice, and the first few idempotent seeds catch it.
#[test]
fn sim_catches_appended_retries() {
    let seeds: Vec<u64> = (0..IDEMPOTENCE_GUARD_SEEDS).map(|i| 2 * i + 1).collect();
    let found = run_seeds(&seeds, AsSpate { appends_retries: true, ..AsSpate::default() });
    let (seed, report) = found.expect("retries appended twice went unnoticed");
    assert!(report.contains("committed twice"), "seed {seed} failed otherwise: {report}");
}

/// Invariants 8 and 10 have teeth: with brokers that append markers without
/// `check_marker` and never `apply_marker` them, the producer state never sees a
/// transaction end. Every one of the first transactional seeds fails: those whose
/// producer was fenced accept its older epoch's batches after the abort marker (8), the
/// others end with a last stable offset stuck below the high watermark (10); both occur.
#[test]
fn sim_catches_markers_that_bypass_the_producer_state() {
    let as_spate = AsSpate { markers_unapplied: true, ..AsSpate::default() };
    let (mut fenced, mut stuck) = (0, 0);
    for seed in (0..TXN_GUARD_SEEDS * 4).filter(|s| txn::is_transactional(*s)) {
        let report = run_seed(seed, as_spate).err().unwrap_or_else(|| panic!("seed {seed}: the bypass went unnoticed"));
        if report.contains("a fenced producer's batch") {
            fenced += 1;
        } else if report.contains("stays below the high watermark") {
            stuck += 1;
        } else {
            panic!("seed {seed} failed otherwise: {report}");
        }
    }
    assert!(fenced > 0 && stuck > 0, "{fenced} seeds caught by invariant 8, {stuck} by invariant 10");
}

/// Invariant 8 has teeth: leaders that serve read_committed reads up to the high
/// watermark hand out parts of transactions that are still open or whose marker is not
/// replicated yet.
#[test]
fn sim_catches_a_reader_that_ignores_the_last_stable_offset() {
    let seeds: Vec<u64> = (0..TXN_GUARD_SEEDS * 4).filter(|s| txn::is_transactional(*s)).collect();
    let found = run_seeds(&seeds, AsSpate { reader_ignores_lso: true, ..AsSpate::default() });
    let (seed, report) = found.expect("reads past the last stable offset went unnoticed");
    assert!(report.contains("last stable offset") && report.contains("cuts"), "seed {seed} failed otherwise: {report}");
}

// ---- Scripted scenarios ----
//
// The same actors on a fixed schedule: one partition replicated on [1, 2, 3] (broker 1
// leads first), 1 ms hops, nothing lost but what a scenario's filter drops, invariants
// checked every millisecond.

const P0: usize = 0;

impl Sim {
    fn scripted(rule: Rule) -> Self {
        Self::new(Rng(1), Knobs::scripted(rule), vec![BROKER_IDS.to_vec()])
    }

    fn run_ms(&mut self, ms: u64) -> Result<(), String> {
        for _ in 0..ms {
            self.step(1).map_err(|e| self.report(&e))?;
        }
        Ok(())
    }

    fn run_until(&mut self, what: &str, ms_max: u64, done: impl Fn(&Sim) -> bool) -> Result<(), String> {
        for _ in 0..ms_max {
            if done(self) {
                return Ok(());
            }
            self.step(1).map_err(|e| self.report(&e))?;
        }
        Err(self.report(&format!("gave up waiting for {what}")))
    }

    fn set_filter(&mut self, f: impl FnMut(Node, Node, &Body) -> bool + 'static) {
        self.filter = Some(Box::new(f));
    }

    /// (leader epoch in the batch header, record id) of each record of `id`'s log.
    fn ids(&self, id: NodeId) -> Vec<(i32, u64)> {
        self.brokers[index(id)].replicas[P0].log.records.iter().map(|r| (r.leader_epoch, r.id)).collect()
    }

    fn leads(&self, id: NodeId, epoch: LeaderEpoch) -> bool {
        let b = &self.brokers[index(id)];
        b.up && matches!(b.replicas[P0].machine.role(), Role::Leader(l) if l.leader_epoch() == epoch)
    }

    fn truncated_as_follower(&self, id: NodeId, epoch: LeaderEpoch) -> bool {
        matches!(self.brokers[index(id)].replicas[P0].machine.role(), Role::Follower(f) if f.leader_epoch == epoch && f.truncated())
    }

    fn is_acked(&self, id: u64) -> bool {
        self.hist.acked.iter().any(|(_, _, r)| r.id == id)
    }

    fn is_registered(&self, id: NodeId) -> bool {
        let b = &self.brokers[index(id)];
        b.up && b.registration_epoch.is_some() && self.registered[&id] == b.incarnation
    }

    fn isr(&self) -> Vec<NodeId> {
        self.controller.partition_state(TOPIC, P0 as i32).expect("partition").isr.clone()
    }

    /// All three replicas hold `want`, and nothing else, after the faults end.
    fn converged_to(&mut self, want: &[(i32, u64)]) -> Result<(), String> {
        self.filter = None;
        self.run_ms(6_000)?;
        for id in BROKER_IDS {
            let got: Vec<u64> = self.ids(id).iter().map(|r| r.1).collect();
            let want: Vec<u64> = want.iter().map(|r| r.1).collect();
            if got != want {
                return Err(self.report(&format!("b{id} ends with records {got:?}, expected {want:?}")));
            }
        }
        if self.isr().len() != BROKER_IDS.len() {
            return Err(self.report(&format!("the isr stays {:?}", self.isr())));
        }
        Ok(())
    }
}

fn is_fetch_from(body: &Body, from: Node, who: &[NodeId]) -> bool {
    matches!(body, Body::Fetch { .. }) && who.iter().any(|id| from == Node::Broker(*id))
}

/// KIP-101, scenario 1 (a follower's high watermark lags the leader's): 1 leads, m1 and
/// m2 reach everyone, 1's high watermark passes m2 and m2 is acknowledged, but the fetch
/// answers that would tell 2 and 3 are lost (their high watermark stays 1). 1 dies; 2
/// leads; 3 truncates before following it, and does not fetch again. 1 comes back (out of
/// the ISR); 2 dies; 3 leads. Truncating to the high watermark drops m2 on 3 there, and 3
/// goes on to lead without it; truncating by leader epoch keeps it.
fn kip101_scenario(rule: Rule) -> Result<Sim, String> {
    let mut sim = Sim::scripted(rule);
    sim.run_ms(300)?;
    let m1 = sim.produce(P0, 1)[0];
    sim.run_until("m1 acked", 500, |s| s.is_acked(m1))?;
    sim.set_filter(|_, to, body| {
        matches!(body, Body::FetchAnswer { result: Ok(f), .. } if f.high_watermark >= 2) && to != Node::Broker(B1)
    });
    let m2 = sim.produce(P0, 1)[0];
    sim.run_until("m2 acked", 500, |s| s.is_acked(m2))?;
    for id in [B2, B3] {
        let r = &sim.brokers[index(id)].replicas[P0];
        assert_eq!((r.log.leo(), r.high_watermark()), (2, 1), "b{id} has m2 but not the high watermark that covers it");
    }
    // What a follower that truncates to its high watermark keeps: m1 only.
    assert_eq!(truncation_offset(2, 1, None, (LeaderEpoch::UNDEFINED, UNDEFINED_OFFSET), |_| 2), 1);

    sim.set_filter(|from, _, body| is_fetch_from(body, from, &[B1, B3]));
    sim.crash(B1, false);
    sim.run_until("2 leads epoch 1", 3_000, |s| s.leads(B2, LeaderEpoch(1)))?;
    sim.run_until("3 truncated", 500, |s| s.truncated_as_follower(B3, LeaderEpoch(1)))?;
    sim.restart(B1);
    sim.run_until("1 registered", 500, |s| s.is_registered(B1))?;
    sim.crash(B2, false);
    sim.run_until("3 leads epoch 2", 3_000, |s| s.leads(B3, LeaderEpoch(2)))?;
    sim.restart(B2);
    sim.converged_to(&[(0, m1), (0, m2)])?;
    Ok(sim)
}

#[test]
fn kip101_truncation_by_leader_epoch_keeps_an_acknowledged_record() {
    let sim = kip101_scenario(Rule::Epoch).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sim.ids(B3)[1].1, sim.hist.acked[1].2.id);
}

#[test]
fn kip101_truncation_to_the_high_watermark_loses_it() {
    let e = kip101_scenario(Rule::HighWatermark).err().expect("truncating to the high watermark must break");
    assert!(e.contains("b3 p0 truncated to 1, dropping committed records"), "{e}");
}

/// KIP-279 (the leader answers an older epoch than asked): 1 leads epoch 0; m1 reaches
/// everyone, m2 only 3 (2 does not fetch). 1 dies; 2 leads epoch 1 and appends m3 at
/// offset 1; 3 never hears of epoch 1. 1 comes back (kept out of the ISR); 2 dies before
/// 3 fetched from it; 3 leads epoch 2 with m2 at offset 1. 2 comes back with epoch 1,
/// which 3 never had: 3 answers epoch 0 ending at 2. One round (KIP-101 alone) keeps m3
/// where the leader has m2; a second round with the follower's own end of epoch 0 (1)
/// drops it.
fn kip279_scenario(rule: Rule) -> Result<Sim, String> {
    let mut sim = Sim::scripted(rule);
    sim.run_ms(300)?;
    let m1 = sim.produce(P0, 1)[0];
    sim.run_until("m1 acked", 500, |s| s.is_acked(m1))?;
    sim.set_filter(|from, _, body| is_fetch_from(body, from, &[B2]));
    let m2 = sim.produce(P0, 1)[0];
    sim.run_until("m2 on 3", 500, |s| s.ids(B3).len() == 2)?;

    sim.set_filter(|from, to, body| {
        is_fetch_from(body, from, &[B2]) || (matches!(body, Body::Snapshot(_)) && to == Node::Broker(B3))
    });
    sim.crash(B1, false);
    sim.run_until("2 leads epoch 1", 3_000, |s| s.leads(B2, LeaderEpoch(1)) && s.client.leaders[P0] == B2)?;
    let m3 = sim.produce(P0, 1)[0];
    sim.run_until("m3 on 2", 100, |s| s.ids(B2).len() == 2)?;
    sim.set_filter(|from, to, body| {
        (matches!(body, Body::Snapshot(_)) && to == Node::Broker(B3))
            || (matches!(body, Body::Fetch { .. } | Body::EpochQuery { .. }) && from == Node::Broker(B1))
    });
    sim.restart(B1);
    sim.run_until("1 registered", 500, |s| s.is_registered(B1))?;
    sim.crash(B2, false);
    sim.set_filter(|from, _, body| {
        matches!(body, Body::Fetch { .. } | Body::EpochQuery { .. }) && from == Node::Broker(B1)
    });
    sim.run_until("3 leads epoch 2", 3_000, |s| s.leads(B3, LeaderEpoch(2)))?;
    assert_eq!(sim.ids(B3), vec![(0, m1), (0, m2)]);
    assert_eq!(sim.ids(B2), vec![(0, m1), (1, m3)], "2 diverged from 3 at offset 1, in an epoch 3 never had");
    sim.restart(B2);
    sim.converged_to(&[(0, m1), (0, m2)])?;
    assert!(sim.hist.counts.contains_key("older epoch answers"), "the leader answered an older epoch than asked");
    Ok(sim)
}

#[test]
fn kip279_truncation_converges_where_the_leader_has_an_older_epoch() {
    kip279_scenario(Rule::Epoch).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn kip279_one_round_of_kip101_leaves_the_logs_diverged() {
    let e = kip279_scenario(Rule::Kip101Only).err().expect("a single round must leave 2 diverged");
    assert!(e.contains("b2 p0: below its high watermark"), "{e}");
}

/// A follower that crashed and lost its unsynced suffix comes back as a new incarnation;
/// the controller took it out of the ISR, but its leader still remembers the fetch offset
/// of its previous life. Before it fetches again it must not rejoin the ISR on that
/// offset (KIP-903): else, once the leader dies, the controller may elect a replica that
/// lacks acknowledged records.
fn restarted_follower_scenario() -> Result<Sim, String> {
    let mut sim = Sim::scripted(Rule::Epoch);
    sim.run_ms(300)?;
    // Nothing is synced from now on: 2's copy of what follows is in its page cache only.
    sim.knobs.flush_interval_ms = u64::MAX / 2;
    for b in &mut sim.brokers {
        b.next_flush_ms = u64::MAX / 2;
    }
    let ids = sim.produce(P0, 3);
    sim.run_until("records acked", 500, |s| ids.iter().all(|id| s.is_acked(*id)))?;
    sim.crash(B2, true);
    assert!(sim.ids(B2).is_empty(), "2 lost what it had not synced");
    sim.run_until("2 out of the isr", 3_000, |s| s.isr() == [B1, B3])?;
    sim.run_ms(300)?;
    // 2's new incarnation is slow to fetch.
    sim.set_filter(|from, _, body| {
        matches!(body, Body::Fetch { .. } | Body::EpochQuery { .. }) && from == Node::Broker(B2)
    });
    sim.restart(B2);
    sim.run_until("2 registered", 500, |s| s.is_registered(B2))?;
    if sim.run_until("2 back in the isr", 1_000, |s| s.isr().contains(&B2)).is_ok() {
        // 2 is in the ISR with an empty log. 1 dies; 2, first in the assignment, leads.
        sim.crash(B1, false);
        sim.run_until("a new leader", 3_000, |s| s.leads(B2, LeaderEpoch(1)) || s.leads(B3, LeaderEpoch(1)))?;
        return Err(sim.report("2 rejoined the isr on the fetch offset of its previous incarnation"));
    }
    let acked: Vec<(i32, u64)> = ids.iter().map(|id| (0, *id)).collect();
    sim.converged_to(&acked)?;
    Ok(sim)
}

#[test]
fn a_restarted_follower_rejoins_the_isr_only_after_fetching() {
    restarted_follower_scenario().unwrap_or_else(|e| panic!("{e}"));
}

/// A follower outside the ISR catches up, but the AlterPartition that would add it is
/// lost; it crashes and loses its unsynced suffix, and restarts. Its leader still has the
/// fetch offset of its previous life, and proposes to add it on that offset once the
/// controller is reachable again. With broker epochs (KIP-903) the proposal names the
/// previous incarnation and the controller refuses it; without, the restarted follower
/// would be in the ISR with an empty log (the bug seed 11107 found).
fn restarted_catching_up_follower_scenario(as_spate: AsSpate) -> Result<Sim, String> {
    let mut sim = Sim::scripted(Rule::Epoch);
    sim.knobs.no_broker_epochs = as_spate.no_broker_epochs;
    sim.run_ms(300)?;
    sim.knobs.flush_interval_ms = u64::MAX / 2;
    for b in &mut sim.brokers {
        b.next_flush_ms = u64::MAX / 2;
    }
    // 2 stops fetching and leaves the ISR; the records are acknowledged by 1 and 3.
    let from_2 = |from: Node, body: &Body| {
        from == Node::Broker(B2) && matches!(body, Body::Fetch { .. } | Body::EpochQuery { .. })
    };
    sim.set_filter(move |from, _, body| from_2(from, body));
    sim.run_until("2 out of the isr", 5_000, |s| s.isr() == [B1, B3])?;
    let ids = sim.produce(P0, 3);
    sim.run_until("records acked", 1_000, |s| ids.iter().all(|id| s.is_acked(*id)))?;
    // 2 catches up, but 1's AlterPartitions are lost.
    let alter_from_1 =
        |from: Node, body: &Body| from == Node::Broker(B1) && matches!(body, Body::AlterPartition { .. });
    sim.set_filter(move |from, _, body| alter_from_1(from, body));
    sim.run_until("2 caught up", 1_000, |s| {
        s.brokers[index(B1)].replicas[P0].machine.leader_state().and_then(|l| l.follower_leo(B2)) == Some(3)
    })?;
    sim.crash(B2, true);
    assert!(sim.ids(B2).is_empty(), "2 lost what it had not synced");
    sim.set_filter(move |from, _, body| from_2(from, body) || alter_from_1(from, body));
    sim.restart(B2);
    sim.run_until("2 registered", 3_000, |s| s.is_registered(B2))?;
    // 1's proposals reach the controller again; 2's new incarnation has not fetched.
    sim.set_filter(move |from, _, body| from_2(from, body));
    if sim.run_until("2 back in the isr", 2_000, |s| s.isr().contains(&B2)).is_ok() {
        return Err(sim.report("2 rejoined the isr on the fetch offset of its previous incarnation"));
    }
    sim.filter = None;
    let acked: Vec<(i32, u64)> = ids.iter().map(|id| (0, *id)).collect();
    sim.converged_to(&acked)?;
    Ok(sim)
}

#[test]
fn a_restarted_follower_is_not_added_on_its_previous_incarnations_offset() {
    restarted_catching_up_follower_scenario(AsSpate::default()).unwrap_or_else(|e| panic!("{e}"));
}

/// The same with followers that send no broker epoch (spate before KIP-903).
#[test]
fn sim_catches_a_restarted_follower_without_broker_epochs() {
    let as_spate = AsSpate { no_broker_epochs: true, ..AsSpate::default() };
    let e = restarted_catching_up_follower_scenario(as_spate).err().expect("the restarted follower rejoined unnoticed");
    assert!(e.contains("rejoined the isr on the fetch offset of its previous incarnation"), "{e}");
}

/// An idempotent producer's batch is committed but its answer is lost, and its leader
/// dies. The retry (same producer id, epoch and sequence) reaches the new leader, which
/// built the producer state from the batches it replicated and answers with the batch's
/// original offsets; the batch is in the log once. `appends_retries`: a leader that
/// appends the retry again instead.
fn idempotent_retry_scenario(appends_retries: bool) -> Result<Sim, String> {
    let mut sim = Sim::scripted(Rule::Epoch);
    sim.knobs.appends_retries = appends_retries;
    sim.client.idempotent = Some(IdempotentProducer::new(1));
    sim.run_ms(300)?;
    sim.set_filter(|_, to, body| to == Node::Client && matches!(body, Body::ProduceAnswer { .. }));
    let ids = sim.idempotent_batch(P0, 2);
    sim.run_until("the batch committed", 500, |s| s.hist.committed[P0].len() == 2)?;
    sim.filter = None;
    sim.crash(B1, false);
    sim.run_until("2 leads epoch 1", 3_000, |s| s.leads(B2, LeaderEpoch(1)))?;
    sim.run_until("the retry acked", 6_000, |s| ids.iter().all(|id| s.is_acked(*id)))?;
    sim.restart(B1);
    sim.converged_to(&[(0, ids[0]), (0, ids[1])])?;
    Ok(sim)
}

#[test]
fn a_retry_after_a_failover_is_answered_with_the_original_offsets() {
    let sim = idempotent_retry_scenario(false).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sim.hist.counts.get("retries answered as duplicates"), Some(&1));
    let acked: Vec<(i64, u64)> = sim.hist.acked.iter().map(|(_, offset, r)| (*offset, r.id)).collect();
    assert_eq!(acked, [(0, 1), (1, 2)], "acknowledged at the offsets the first leader gave");
}

#[test]
fn a_retry_after_a_failover_is_appended_twice_without_the_producer_state() {
    let e = idempotent_retry_scenario(true).err().expect("the retry was appended again");
    assert!(e.contains("committed twice"), "{e}");
}
