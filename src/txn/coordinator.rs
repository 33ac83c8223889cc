//! The transaction coordinator's state, one machine per transactional id (Kafka's
//! `TransactionMetadata` and `TransactionCoordinator`), pure: events in (a client's
//! InitProducerId, AddPartitionsToTxn / AddOffsetsToTxn, EndTxn; the outcome of writing
//! the new state to `__transaction_state`; the markers written; the clock), decisions out
//! (answer now, or write this state first; send these markers). No I/O and no clock
//! reads: the broker persists, sends markers and keeps time; the simulation can drive the
//! same code.
//!
//! Protocol, as Kafka's (transaction version 1; version 2 below):
//! - Every change is first written to the id's `__transaction_state` partition; only when
//!   the write is acknowledged (`written`) does the state move and the client get its
//!   answer. One change is in flight per id; requests meanwhile get
//!   CONCURRENT_TRANSACTIONS, which clients retry.
//! - InitProducerId bumps the epoch (a new producer id when the epoch would overflow),
//!   fencing the previous producer; with an ongoing transaction it fences first
//!   (PrepareEpochFence) and aborts that transaction, and the client retries.
//! - EndTxn moves Ongoing to PrepareCommit or PrepareAbort (the client is answered once
//!   that is written), then markers go to every partition of the transaction, then
//!   CompleteCommit or CompleteAbort is written. A retried EndTxn of a completed
//!   transaction is answered with success.
//! - An ongoing transaction past its timeout is aborted with a bumped epoch, fencing its
//!   producer (`expire`).
//! - KIP-890 part 1's verification: `verify_partitions` (partition leaders ask before a
//!   producer's first transactional batch in a partition).
//! - Transaction version 2 (KIP-890 part 2, `end_txn_v2`, EndTxn v5): every
//!   transaction's end bumps the epoch. Prepare* is written at epoch E+1 and the markers
//!   carry E+1, so a late batch of the ended transaction (at E) is refused by every
//!   partition; the client is answered with the producer id and epoch its Complete* state
//!   will hold, (id, E+1), or a new id at epoch 0 when E+1 would exhaust the epoch
//!   (NextProducerId). A retry (the client's epoch one below, or the old id at the last
//!   epoch) is recognised: CONCURRENT_TRANSACTIONS until Complete* is written, then the
//!   same answer. An abort with no transaction open is written too (an empty abort). The
//!   partitions join through the leaders (Produce v12, TxnOffsetCommit v5), which call
//!   `add_partitions` for the client.
//! - Not here yet: expiring idle transactional ids (`transactional.id.expiration.ms`, the
//!   Dead state and its tombstone).
//!
//! States and the states they may be entered from (Kafka's `TransactionState`):
//!
//! | state             | id | from                                   |
//! |-------------------|----|----------------------------------------|
//! | Empty             | 0  | Empty, CompleteCommit, CompleteAbort   |
//! | Ongoing           | 1  | Ongoing, Empty, CompleteCommit, CompleteAbort |
//! | PrepareCommit     | 2  | Ongoing                                |
//! | PrepareAbort      | 3  | Ongoing, PrepareEpochFence; Empty, CompleteCommit, CompleteAbort (an empty abort, v2) |
//! | CompleteCommit    | 4  | PrepareCommit                          |
//! | CompleteAbort     | 5  | PrepareAbort                           |
//! | Dead              | 6  | Empty, CompleteCommit, CompleteAbort   |
//! | PrepareEpochFence | 7  | Ongoing                                |

use std::collections::{BTreeSet, HashMap};

use crate::model::TopicPartition;

/// Kafka's `transaction.max.timeout.ms` default: 15 minutes.
pub const TRANSACTION_MAX_TIMEOUT_MS: i32 = 15 * 60 * 1000;
/// No producer id / epoch (Kafka's NO_PRODUCER_ID, NO_PRODUCER_EPOCH).
pub const NO_PRODUCER_ID: i64 = -1;
pub const NO_PRODUCER_EPOCH: i16 = -1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

impl TxnState {
    /// The id stored in `__transaction_state` (TransactionStatus).
    pub fn id(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    pub fn from_id(id: i8) -> Option<TxnState> {
        Some(match id {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::Dead,
            7 => TxnState::PrepareEpochFence,
            _ => return None,
        })
    }

    /// Whether a transition from `from` to `self` is allowed (the table above).
    pub fn may_follow(self, from: TxnState) -> bool {
        use TxnState::*;
        match self {
            Empty => matches!(from, Empty | CompleteCommit | CompleteAbort),
            Ongoing => matches!(from, Ongoing | Empty | CompleteCommit | CompleteAbort),
            PrepareCommit => from == Ongoing,
            PrepareAbort => matches!(from, Ongoing | PrepareEpochFence | Empty | CompleteCommit | CompleteAbort),
            CompleteCommit => from == PrepareCommit,
            CompleteAbort => from == PrepareAbort,
            Dead => matches!(from, Empty | CompleteCommit | CompleteAbort),
            PrepareEpochFence => from == Ongoing,
        }
    }

    /// No transaction is open: a new one may start, the id may expire.
    pub fn is_idle(self) -> bool {
        matches!(self, TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort)
    }
}

/// What `__transaction_state` holds for one transactional id (TransactionLogValue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnRecord {
    pub producer_id: i64,
    /// The producer id this id had before its epoch ran out and it got `producer_id`
    /// (KIP-360: a retry of that InitProducerId names it), or -1.
    pub previous_producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<TopicPartition>,
    pub last_update_ms: i64,
    /// When the open transaction started (its first partition), or -1.
    pub start_ms: i64,
    /// Transaction version 2, a Prepare* state whose epoch ran out: the producer id its
    /// Complete* state moves to (at epoch 0), else -1 (Kafka's NextProducerId).
    pub next_producer_id: i64,
    /// The transaction version of the client that ended the last transaction: 2 once an
    /// EndTxn v5 did (Kafka's ClientTransactionVersion), else 0.
    pub client_version: i16,
}

/// A producer id and epoch as a client holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdAndEpoch {
    pub producer_id: i64,
    pub epoch: i16,
}

/// Refusals, each Kafka's error code of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    #[error("another change of this transactional id is in progress")]
    ConcurrentTransactions,
    #[error("the transaction is not in a state for this request")]
    InvalidTxnState,
    #[error("the producer was fenced by a newer epoch")]
    ProducerFenced,
    #[error("the producer id does not belong to this transactional id")]
    InvalidProducerIdMapping,
    #[error("transaction.timeout.ms is above transaction.max.timeout.ms, or not positive")]
    InvalidTransactionTimeout,
}

impl TxnError {
    pub fn code(self) -> i16 {
        match self {
            TxnError::ConcurrentTransactions => 51,
            TxnError::InvalidTxnState => 48,
            TxnError::ProducerFenced => 90,
            TxnError::InvalidProducerIdMapping => 49,
            TxnError::InvalidTransactionTimeout => 50,
        }
    }
}

/// What a request needs before its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<T> {
    /// Answered now, nothing to write.
    Answer(T),
    /// Write this record for the id (then call `written`, which gives the answer).
    Write(TxnRecord),
}

/// What follows an acknowledged (or failed) write of the id's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The answer to the request that asked for the write, if a client waits for one.
    pub answer: Option<Result<Answer, TxnError>>,
    /// Markers to write to every partition of the transaction (then `markers_written`).
    pub markers: Option<Markers>,
}

/// The answer a write completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// InitProducerId: the producer's id and epoch.
    Producer(ProducerIdAndEpoch),
    /// AddPartitionsToTxn, AddOffsetsToTxn, EndTxn: done.
    Done,
}

/// Commit or abort markers to write, with this producer id and epoch, to each partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Markers {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub commit: bool,
    pub partitions: Vec<TopicPartition>,
    /// The transaction version of the client that ended it (Kafka's
    /// ClientTransactionVersion): WriteTxnMarkers v2 carries it, and from 2 the
    /// partition takes the marker only above the epoch its data was written at.
    pub transaction_version: i8,
}

/// The write in flight for an id, and who waits for it.
#[derive(Debug, Clone)]
struct Pending {
    record: TxnRecord,
    /// The client's answer once written (None: nobody waits, e.g. a timeout abort).
    answer: Option<Result<Answer, TxnError>>,
}

#[derive(Debug, Clone)]
struct Txn {
    /// As last written and acknowledged.
    record: TxnRecord,
    pending: Option<Pending>,
}

/// Every transactional id this coordinator owns (the ids of the `__transaction_state`
/// partitions this broker leads).
#[derive(Debug)]
pub struct TxnCoordinator {
    txns: HashMap<String, Txn>,
    max_timeout_ms: i32,
}

impl TxnCoordinator {
    pub fn new(max_timeout_ms: i32) -> Self {
        TxnCoordinator { txns: HashMap::new(), max_timeout_ms }
    }

    /// The acknowledged record of `txn_id` (DescribeTransactions, ListTransactions).
    pub fn get(&self, txn_id: &str) -> Option<&TxnRecord> {
        self.txns.get(txn_id).map(|t| &t.record)
    }

    pub fn ids(&self) -> impl Iterator<Item = (&String, &TxnRecord)> {
        self.txns.iter().map(|(id, t)| (id, &t.record))
    }

    /// A record read back from `__transaction_state` at load (None: a tombstone).
    /// Later records replace earlier ones; an open transaction resumes where it was
    /// (the caller sends the markers of a Prepare* state again, see `resume`).
    pub fn load(&mut self, txn_id: &str, record: Option<TxnRecord>) {
        match record {
            Some(record) if record.state != TxnState::Dead => {
                self.txns.insert(txn_id.to_string(), Txn { record, pending: None });
            }
            _ => {
                self.txns.remove(txn_id);
            }
        }
    }

    /// Forget every id `belongs` names (the broker stopped leading their partition):
    /// writes in flight for them are forgotten too. Returns how many were dropped.
    pub fn unload(&mut self, mut belongs: impl FnMut(&str) -> bool) -> usize {
        let before = self.txns.len();
        self.txns.retain(|id, _| !belongs(id));
        before - self.txns.len()
    }

    /// Whether a write for `txn_id` is in flight.
    pub fn is_pending(&self, txn_id: &str) -> bool {
        self.txns.get(txn_id).is_some_and(|t| t.pending.is_some())
    }

    /// After a load: the markers of every transaction that was being completed (a
    /// Prepare* state) must be written again, as Kafka's new coordinator does.
    pub fn resume(&self) -> Vec<(String, Markers)> {
        let mut out: Vec<(String, Markers)> = self
            .txns
            .iter()
            .filter_map(|(id, t)| {
                let commit = match t.record.state {
                    TxnState::PrepareCommit => true,
                    TxnState::PrepareAbort => false,
                    _ => return None,
                };
                Some((id.clone(), markers_of(&t.record, commit)))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// InitProducerId with a transactional id. `expected`: the id and epoch the client
    /// already has (KIP-360; None for a new producer). `allocate` hands out a new
    /// producer id (a fresh id, or after the epoch is exhausted).
    pub fn init_producer_id(
        &mut self,
        txn_id: &str,
        timeout_ms: i32,
        expected: Option<ProducerIdAndEpoch>,
        now_ms: i64,
        allocate: &mut dyn FnMut() -> i64,
    ) -> Result<Decision<ProducerIdAndEpoch>, TxnError> {
        if timeout_ms <= 0 || timeout_ms > self.max_timeout_ms {
            return Err(TxnError::InvalidTransactionTimeout);
        }
        let Some(txn) = self.txns.get_mut(txn_id) else {
            let record = TxnRecord {
                producer_id: allocate(),
                previous_producer_id: NO_PRODUCER_ID,
                producer_epoch: 0,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                last_update_ms: now_ms,
                start_ms: -1,
                next_producer_id: NO_PRODUCER_ID,
                client_version: 0,
            };
            let answer = Answer::Producer(ProducerIdAndEpoch { producer_id: record.producer_id, epoch: 0 });
            let placeholder = TxnRecord { state: TxnState::Empty, producer_epoch: NO_PRODUCER_EPOCH, ..record.clone() };
            self.txns.insert(
                txn_id.to_string(),
                Txn {
                    record: placeholder,
                    pending: Some(Pending { record: record.clone(), answer: Some(Ok(answer)) }),
                },
            );
            return Ok(Decision::Write(record));
        };
        if txn.pending.is_some() {
            return Err(TxnError::ConcurrentTransactions);
        }
        let current = &txn.record;
        if let Some(expected) = expected {
            // KIP-360: a producer that lost track of its state asks to go on with the id
            // and epoch it had; only the current ones (or a retry that already bumped
            // them) qualify, anything else was fenced.
            let is_current = expected.producer_id == current.producer_id && expected.epoch == current.producer_epoch;
            // The answer to that very request was lost: the id and epoch it bumped from.
            let is_retry_of_bump = (expected.producer_id == current.producer_id
                && expected.epoch + 1 == current.producer_epoch)
                || (current.producer_epoch == 0 && expected.producer_id == current.previous_producer_id);
            if !is_current && !is_retry_of_bump {
                return Err(TxnError::ProducerFenced);
            }
            if is_retry_of_bump && !is_current && current.state.is_idle() {
                let id = ProducerIdAndEpoch { producer_id: current.producer_id, epoch: current.producer_epoch };
                return Ok(Decision::Answer(id));
            }
        }
        match current.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence => {
                Err(TxnError::ConcurrentTransactions)
            }
            TxnState::Dead => Err(TxnError::ConcurrentTransactions),
            TxnState::Ongoing => {
                // Fence the producer of the open transaction and abort it; the client
                // retries and finds the abort done.
                let fenced = bump_epoch(current, allocate);
                let record = TxnRecord { state: TxnState::PrepareAbort, last_update_ms: now_ms, ..fenced };
                txn.pending =
                    Some(Pending { record: record.clone(), answer: Some(Err(TxnError::ConcurrentTransactions)) });
                Ok(Decision::Write(record))
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                let bumped = bump_epoch(current, allocate);
                let record = TxnRecord {
                    timeout_ms,
                    state: TxnState::Empty,
                    partitions: BTreeSet::new(),
                    last_update_ms: now_ms,
                    start_ms: -1,
                    ..bumped
                };
                let answer = ProducerIdAndEpoch { producer_id: record.producer_id, epoch: record.producer_epoch };
                txn.pending = Some(Pending { record: record.clone(), answer: Some(Ok(Answer::Producer(answer))) });
                Ok(Decision::Write(record))
            }
        }
    }

    /// AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets partition):
    /// the transaction starts with its first partition.
    pub fn add_partitions(
        &mut self,
        txn_id: &str,
        producer: ProducerIdAndEpoch,
        partitions: &[TopicPartition],
        now_ms: i64,
    ) -> Result<Decision<()>, TxnError> {
        // Markers in flight: wait, before the producer is checked, since a transaction
        // version 2 client already holds the id and epoch its Complete* state will
        // (Kafka's pending Complete* transition).
        if self
            .txns
            .get(txn_id)
            .is_some_and(|t| matches!(t.record.state, TxnState::PrepareCommit | TxnState::PrepareAbort))
        {
            return Err(TxnError::ConcurrentTransactions);
        }
        let txn = self.checked(txn_id, producer)?;
        let current = &txn.record;
        match current.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence => {
                return Err(TxnError::ConcurrentTransactions)
            }
            TxnState::Dead => return Err(TxnError::InvalidTxnState),
            TxnState::Ongoing if partitions.iter().all(|tp| current.partitions.contains(tp)) => {
                return Ok(Decision::Answer(()));
            }
            _ => {}
        }
        let starting = current.state != TxnState::Ongoing;
        let mut record = current.clone();
        if starting {
            record.partitions.clear();
            record.start_ms = now_ms;
        }
        record.partitions.extend(partitions.iter().cloned());
        record.state = TxnState::Ongoing;
        record.last_update_ms = now_ms;
        txn.pending = Some(Pending { record: record.clone(), answer: Some(Ok(Answer::Done)) });
        Ok(Decision::Write(record))
    }

    /// AddPartitionsToTxn v4+ with verify_only (KIP-890 part 1): a partition leader asks,
    /// before a producer's first transactional batch there, whether each partition is in
    /// the producer's open transaction, as the last written state says (a write in
    /// flight does not count: the leader checks again at its append). Per partition,
    /// whether it is; a transaction in Prepare* is ConcurrentTransactions, as in Kafka.
    /// Changes nothing.
    pub fn verify_partitions(
        &self,
        txn_id: &str,
        producer: ProducerIdAndEpoch,
        partitions: &[TopicPartition],
    ) -> Result<Vec<bool>, TxnError> {
        let txn = self.txns.get(txn_id).ok_or(TxnError::InvalidProducerIdMapping)?;
        let record = &txn.record;
        if record.producer_id != producer.producer_id {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        if record.producer_epoch != producer.epoch {
            return Err(TxnError::ProducerFenced);
        }
        if matches!(record.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
            return Err(TxnError::ConcurrentTransactions);
        }
        let ongoing = record.state == TxnState::Ongoing;
        Ok(partitions.iter().map(|tp| ongoing && record.partitions.contains(tp)).collect())
    }

    /// EndTxn: commit or abort the open transaction. Answered once its Prepare* state is
    /// written; the markers follow (`written` says which).
    pub fn end_txn(
        &mut self,
        txn_id: &str,
        producer: ProducerIdAndEpoch,
        commit: bool,
        now_ms: i64,
    ) -> Result<Decision<()>, TxnError> {
        let txn = self.checked(txn_id, producer)?;
        let current = &txn.record;
        match (current.state, commit) {
            (TxnState::Ongoing, _) => {}
            // A retry of an EndTxn that went through.
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => return Ok(Decision::Answer(())),
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                return Err(TxnError::ConcurrentTransactions)
            }
            (TxnState::PrepareEpochFence, _) => return Err(TxnError::ConcurrentTransactions),
            _ => return Err(TxnError::InvalidTxnState),
        }
        let record = TxnRecord {
            state: if commit { TxnState::PrepareCommit } else { TxnState::PrepareAbort },
            last_update_ms: now_ms,
            ..current.clone()
        };
        txn.pending = Some(Pending { record: record.clone(), answer: Some(Ok(Answer::Done)) });
        Ok(Decision::Write(record))
    }

    /// EndTxn v5+ (transaction version 2, see the module comment): commit or abort with
    /// an epoch bump. Answered, once Prepare* is written, with the producer id and epoch
    /// the client goes on with; the markers follow. Checks in Kafka's order: a write in
    /// flight, the producer id, the epoch, then the state. `allocate` is called only
    /// when the epoch is exhausted.
    pub fn end_txn_v2(
        &mut self,
        txn_id: &str,
        producer: ProducerIdAndEpoch,
        commit: bool,
        now_ms: i64,
        allocate: &mut dyn FnMut() -> i64,
    ) -> Result<Decision<ProducerIdAndEpoch>, TxnError> {
        use TxnState::*;
        let txn = self.txns.get_mut(txn_id).ok_or(TxnError::InvalidProducerIdMapping)?;
        if txn.pending.is_some() {
            return Err(TxnError::ConcurrentTransactions);
        }
        let current = &txn.record;
        // The answer to an EndTxn that rotated the producer id was lost.
        let retry_on_overflow = current.previous_producer_id == producer.producer_id
            && producer.epoch == i16::MAX - 1
            && current.producer_epoch == 0;
        if current.producer_id != producer.producer_id && !retry_on_overflow {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        // The answer to an EndTxn that bumped the epoch was lost.
        let retry_on_bump = !retry_on_overflow && current.producer_epoch == producer.epoch.wrapping_add(1);
        let is_retry = retry_on_bump || retry_on_overflow;
        let valid_epoch = match current.state {
            Ongoing | Empty | Dead | PrepareEpochFence => producer.epoch == current.producer_epoch,
            PrepareCommit | PrepareAbort => retry_on_bump,
            CompleteCommit | CompleteAbort => is_retry || producer.epoch == current.producer_epoch,
        };
        if !valid_epoch {
            return Err(TxnError::ProducerFenced);
        }
        let now_holds = ProducerIdAndEpoch { producer_id: current.producer_id, epoch: current.producer_epoch };
        // Whether this ends an open transaction (else: an abort with none open).
        let open = match (current.state, commit) {
            (Ongoing, _) => true,
            (PrepareCommit, true) | (PrepareAbort, false) => return Err(TxnError::ConcurrentTransactions),
            (CompleteCommit, true) | (CompleteAbort, false) if is_retry => return Ok(Decision::Answer(now_holds)),
            (Empty | CompleteCommit | CompleteAbort, false) if !is_retry => false,
            _ => return Err(TxnError::InvalidTxnState),
        };
        let next_producer_id = if current.producer_epoch >= i16::MAX - 1 { allocate() } else { NO_PRODUCER_ID };
        let record = TxnRecord {
            producer_epoch: current.producer_epoch.saturating_add(1),
            next_producer_id,
            client_version: 2,
            state: if commit { PrepareCommit } else { PrepareAbort },
            last_update_ms: now_ms,
            partitions: if open { current.partitions.clone() } else { BTreeSet::new() },
            start_ms: if open { current.start_ms } else { now_ms },
            ..current.clone()
        };
        let done = completed(&record);
        let answer = ProducerIdAndEpoch { producer_id: done.producer_id, epoch: done.producer_epoch };
        txn.pending = Some(Pending { record: record.clone(), answer: Some(Ok(Answer::Producer(answer))) });
        Ok(Decision::Write(record))
    }

    /// The write `txn_id` asked for was acknowledged (`ok`) or failed. On success the
    /// state moves; the waiting client gets its answer; a Prepare* state sends its
    /// markers. A failed write changes nothing (the client is told to retry).
    pub fn written(&mut self, txn_id: &str, ok: bool) -> Written {
        let Some(txn) = self.txns.get_mut(txn_id) else {
            return Written { answer: None, markers: None };
        };
        let Some(pending) = txn.pending.take() else {
            return Written { answer: None, markers: None };
        };
        if !ok {
            if txn.record.producer_epoch == NO_PRODUCER_EPOCH {
                // A new id whose first write failed: forget it.
                self.txns.remove(txn_id);
            }
            return Written { answer: pending.answer.map(|_| Err(TxnError::ConcurrentTransactions)), markers: None };
        }
        let new_id = txn.record.producer_epoch == NO_PRODUCER_EPOCH;
        assert!(
            new_id || pending.record.state.may_follow(txn.record.state),
            "{txn_id}: {:?} -> {:?}",
            txn.record.state,
            pending.record.state
        );
        txn.record = pending.record;
        let markers = match txn.record.state {
            TxnState::PrepareCommit => Some(markers_of(&txn.record, true)),
            TxnState::PrepareAbort => Some(markers_of(&txn.record, false)),
            _ => None,
        };
        Written { answer: pending.answer, markers }
    }

    /// Every marker of the transaction being completed is written: write its Complete*
    /// state (then `written`).
    pub fn markers_written(&mut self, txn_id: &str, now_ms: i64) -> Option<TxnRecord> {
        let txn = self.txns.get_mut(txn_id)?;
        if txn.pending.is_some() {
            return None;
        }
        let state = match txn.record.state {
            TxnState::PrepareCommit => TxnState::CompleteCommit,
            TxnState::PrepareAbort => TxnState::CompleteAbort,
            _ => return None,
        };
        let record = TxnRecord {
            state,
            partitions: BTreeSet::new(),
            last_update_ms: now_ms,
            start_ms: -1,
            ..completed(&txn.record)
        };
        txn.pending = Some(Pending { record: record.clone(), answer: None });
        Some(record)
    }

    /// Open transactions past their timeout at `now_ms`: each is aborted with a bumped
    /// epoch (its producer is fenced), as Kafka's coordinator does. Returns the records
    /// to write (then `written`, whose markers abort the transaction).
    pub fn expire(&mut self, now_ms: i64, allocate: &mut dyn FnMut() -> i64) -> Vec<(String, TxnRecord)> {
        let mut out = Vec::new();
        for (id, txn) in self.txns.iter_mut() {
            let r = &txn.record;
            if txn.pending.is_some() || r.state != TxnState::Ongoing || now_ms - r.start_ms <= r.timeout_ms as i64 {
                continue;
            }
            let fenced = bump_epoch(r, allocate);
            let record = TxnRecord { state: TxnState::PrepareAbort, last_update_ms: now_ms, ..fenced };
            txn.pending = Some(Pending { record: record.clone(), answer: None });
            out.push((id.clone(), record));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The id's transaction, if `producer` is its current producer.
    fn checked(&mut self, txn_id: &str, producer: ProducerIdAndEpoch) -> Result<&mut Txn, TxnError> {
        let txn = self.txns.get_mut(txn_id).ok_or(TxnError::InvalidProducerIdMapping)?;
        if txn.record.producer_id != producer.producer_id {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        if producer.epoch != txn.record.producer_epoch {
            return Err(TxnError::ProducerFenced);
        }
        if txn.pending.is_some() {
            return Err(TxnError::ConcurrentTransactions);
        }
        Ok(txn)
    }
}

/// The next epoch of `r`'s producer; past the largest epoch, a new producer id at 0.
fn bump_epoch(r: &TxnRecord, allocate: &mut dyn FnMut() -> i64) -> TxnRecord {
    if r.producer_epoch >= i16::MAX - 1 {
        TxnRecord { previous_producer_id: r.producer_id, producer_id: allocate(), producer_epoch: 0, ..r.clone() }
    } else {
        TxnRecord { producer_epoch: r.producer_epoch + 1, ..r.clone() }
    }
}

/// The producer of `r`'s Complete* state: a Prepare* state with a next producer id
/// moves to it at epoch 0 (transaction version 2's rotation).
fn completed(r: &TxnRecord) -> TxnRecord {
    if r.next_producer_id == NO_PRODUCER_ID {
        return r.clone();
    }
    TxnRecord {
        previous_producer_id: r.producer_id,
        producer_id: r.next_producer_id,
        producer_epoch: 0,
        next_producer_id: NO_PRODUCER_ID,
        ..r.clone()
    }
}

fn markers_of(r: &TxnRecord, commit: bool) -> Markers {
    Markers {
        producer_id: r.producer_id,
        producer_epoch: r.producer_epoch,
        commit,
        partitions: r.partitions.iter().cloned().collect(),
        transaction_version: r.client_version.clamp(0, i8::MAX.into()) as i8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "tx-1";

    fn ids() -> impl FnMut() -> i64 {
        let mut next = 1000;
        move || {
            next += 1;
            next
        }
    }

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    /// Write whatever is decided and acknowledge it; returns what followed.
    fn write<T: std::fmt::Debug>(c: &mut TxnCoordinator, d: Result<Decision<T>, TxnError>) -> Written {
        match d {
            Ok(Decision::Write(_)) => c.written(ID, true),
            other => panic!("expected a write, got {other:?}"),
        }
    }

    fn producer(c: &mut TxnCoordinator, now: i64, alloc: &mut dyn FnMut() -> i64) -> ProducerIdAndEpoch {
        let d = c.init_producer_id(ID, 60_000, None, now, alloc);
        match write(c, d).answer {
            Some(Ok(Answer::Producer(p))) => p,
            other => panic!("{other:?}"),
        }
    }

    fn state(c: &TxnCoordinator) -> TxnState {
        c.get(ID).unwrap().state
    }

    #[test]
    fn a_commit_goes_through_prepare_markers_and_complete() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        let p = producer(&mut c, 0, &mut alloc);
        assert_eq!(p, ProducerIdAndEpoch { producer_id: 1001, epoch: 0 });
        assert_eq!(state(&c), TxnState::Empty);

        let d = c.add_partitions(ID, p, &[tp(0), tp(1)], 10);
        assert_eq!(write(&mut c, d).answer, Some(Ok(Answer::Done)));
        assert_eq!((state(&c), c.get(ID).unwrap().start_ms), (TxnState::Ongoing, 10));
        // Already in the transaction: nothing to write.
        assert_eq!(c.add_partitions(ID, p, &[tp(1)], 11), Ok(Decision::Answer(())));
        let d = c.add_partitions(ID, p, &[tp(2)], 12);
        write(&mut c, d);
        assert_eq!(c.get(ID).unwrap().start_ms, 10, "the transaction started with its first partition");

        let d = c.end_txn(ID, p, true, 20);
        let w = write(&mut c, d);
        assert_eq!(w.answer, Some(Ok(Answer::Done)));
        let markers = w.markers.expect("commit markers");
        assert_eq!((markers.producer_id, markers.producer_epoch, markers.commit), (1001, 0, true));
        assert_eq!(markers.partitions, vec![tp(0), tp(1), tp(2)]);
        assert_eq!(state(&c), TxnState::PrepareCommit);
        // Meanwhile: a retried commit waits, an abort is refused, no new transaction.
        assert_eq!(c.end_txn(ID, p, true, 21), Err(TxnError::ConcurrentTransactions));
        assert_eq!(c.end_txn(ID, p, false, 21), Err(TxnError::InvalidTxnState));
        assert_eq!(c.add_partitions(ID, p, &[tp(0)], 21), Err(TxnError::ConcurrentTransactions));

        let complete = c.markers_written(ID, 30).expect("complete");
        assert_eq!((complete.state, complete.partitions.len()), (TxnState::CompleteCommit, 0));
        assert_eq!(c.written(ID, true), Written { answer: None, markers: None });
        assert_eq!(state(&c), TxnState::CompleteCommit);
        // A retry of the commit that went through succeeds; an abort of it is refused.
        assert_eq!(c.end_txn(ID, p, true, 31), Ok(Decision::Answer(())));
        assert_eq!(c.end_txn(ID, p, false, 31), Err(TxnError::InvalidTxnState));
        // The next transaction starts afresh.
        let d = c.add_partitions(ID, p, &[tp(5)], 40);
        write(&mut c, d);
        let r = c.get(ID).unwrap();
        assert_eq!(
            (r.state, r.start_ms, r.partitions.iter().cloned().collect::<Vec<_>>()),
            (TxnState::Ongoing, 40, vec![tp(5)])
        );
    }

    #[test]
    fn one_write_in_flight_per_id_and_a_failed_write_changes_nothing() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        let p = producer(&mut c, 0, &mut alloc);
        assert!(matches!(c.add_partitions(ID, p, &[tp(0)], 1), Ok(Decision::Write(_))));
        assert_eq!(c.add_partitions(ID, p, &[tp(1)], 1), Err(TxnError::ConcurrentTransactions));
        assert_eq!(c.end_txn(ID, p, true, 1), Err(TxnError::ConcurrentTransactions));
        assert_eq!(c.init_producer_id(ID, 60_000, None, 1, &mut alloc), Err(TxnError::ConcurrentTransactions));
        let w = c.written(ID, false);
        assert_eq!(w.answer, Some(Err(TxnError::ConcurrentTransactions)), "retriable");
        assert_eq!(state(&c), TxnState::Empty);
        // A new id whose first write fails is forgotten.
        assert!(matches!(c.init_producer_id("tx-2", 60_000, None, 1, &mut alloc), Ok(Decision::Write(_))));
        c.written("tx-2", false);
        assert!(c.get("tx-2").is_none());
    }

    #[test]
    fn init_producer_id_fences_the_previous_producer() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        let old = producer(&mut c, 0, &mut alloc);
        let new = producer(&mut c, 1, &mut alloc);
        assert_eq!(new, ProducerIdAndEpoch { producer_id: old.producer_id, epoch: 1 });
        assert_eq!(c.add_partitions(ID, old, &[tp(0)], 2), Err(TxnError::ProducerFenced));
        assert_eq!(c.end_txn(ID, old, true, 2), Err(TxnError::ProducerFenced));
        let stranger = ProducerIdAndEpoch { producer_id: 7, epoch: 1 };
        assert_eq!(c.add_partitions(ID, stranger, &[tp(0)], 2), Err(TxnError::InvalidProducerIdMapping));
        assert_eq!(c.add_partitions("unknown", new, &[tp(0)], 2), Err(TxnError::InvalidProducerIdMapping));
    }

    #[test]
    fn init_producer_id_during_a_transaction_aborts_it_with_a_fencing_epoch() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        let zombie = producer(&mut c, 0, &mut alloc);
        let d = c.add_partitions(ID, zombie, &[tp(0), tp(3)], 5);
        write(&mut c, d);
        let d = c.init_producer_id(ID, 60_000, None, 6, &mut alloc);
        let w = write(&mut c, d);
        assert_eq!(w.answer, Some(Err(TxnError::ConcurrentTransactions)), "the new producer retries");
        let markers = w.markers.expect("abort markers");
        assert_eq!((markers.commit, markers.producer_epoch), (false, 1), "written with the fencing epoch");
        assert_eq!(markers.partitions, vec![tp(0), tp(3)]);
        assert_eq!(c.end_txn(ID, zombie, true, 7), Err(TxnError::ProducerFenced));
        assert_eq!(c.init_producer_id(ID, 60_000, None, 7, &mut alloc), Err(TxnError::ConcurrentTransactions));
        c.markers_written(ID, 8).unwrap();
        c.written(ID, true);
        assert_eq!(state(&c), TxnState::CompleteAbort);
        let p = producer(&mut c, 9, &mut alloc);
        assert_eq!(p, ProducerIdAndEpoch { producer_id: zombie.producer_id, epoch: 2 });
    }

    #[test]
    fn an_open_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        let p = producer(&mut c, 0, &mut alloc);
        let d = c.add_partitions(ID, p, &[tp(0)], 1_000);
        write(&mut c, d);
        assert!(c.expire(61_000, &mut alloc).is_empty(), "60 s is not past the timeout");
        let expired = c.expire(61_001, &mut alloc);
        assert_eq!(expired.len(), 1);
        assert_eq!((expired[0].1.state, expired[0].1.producer_epoch), (TxnState::PrepareAbort, 1));
        assert!(c.expire(70_000, &mut alloc).is_empty(), "already being aborted");
        let w = c.written(ID, true);
        assert_eq!(w.answer, None, "nobody waits for a timeout");
        assert!(!w.markers.unwrap().commit);
        assert_eq!(c.end_txn(ID, p, true, 70_001), Err(TxnError::ProducerFenced));
        c.markers_written(ID, 70_002).unwrap();
        c.written(ID, true);
        assert_eq!(state(&c), TxnState::CompleteAbort);
    }

    #[test]
    fn timeouts_above_the_maximum_are_refused() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        for t in [0, -1, TRANSACTION_MAX_TIMEOUT_MS + 1] {
            assert_eq!(c.init_producer_id(ID, t, None, 0, &mut alloc), Err(TxnError::InvalidTransactionTimeout));
        }
        assert!(c.init_producer_id(ID, TRANSACTION_MAX_TIMEOUT_MS, None, 0, &mut alloc).is_ok());
    }

    #[test]
    fn an_exhausted_epoch_moves_to_a_new_producer_id() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        let first = producer(&mut c, 0, &mut alloc);
        let mut r = c.get(ID).unwrap().clone();
        r.producer_epoch = i16::MAX - 1;
        c.load(ID, Some(r));
        let next = producer(&mut c, 1, &mut alloc);
        assert_eq!(next.epoch, 0);
        assert_ne!(next.producer_id, first.producer_id);
        assert_eq!(c.get(ID).unwrap().previous_producer_id, first.producer_id);
    }

    #[test]
    fn kip_360_a_producer_naming_its_id_and_epoch_goes_on_and_a_stale_one_is_fenced() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        let p = producer(&mut c, 0, &mut alloc);
        let d = c.init_producer_id(ID, 60_000, Some(p), 1, &mut alloc);
        let bumped = match write(&mut c, d).answer {
            Some(Ok(Answer::Producer(b))) => b,
            other => panic!("{other:?}"),
        };
        assert_eq!(bumped, ProducerIdAndEpoch { producer_id: p.producer_id, epoch: 1 });
        // Its answer lost, the producer asks again with what it had: same answer, no write.
        assert_eq!(c.init_producer_id(ID, 60_000, Some(p), 2, &mut alloc), Ok(Decision::Answer(bumped)));
        // An epoch older than that was fenced.
        let d = c.init_producer_id(ID, 60_000, Some(bumped), 3, &mut alloc);
        write(&mut c, d);
        assert_eq!(c.init_producer_id(ID, 60_000, Some(p), 4, &mut alloc), Err(TxnError::ProducerFenced));
    }

    #[test]
    fn a_loaded_transaction_being_completed_sends_its_markers_again() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let record = TxnRecord {
            producer_id: 5,
            previous_producer_id: NO_PRODUCER_ID,
            producer_epoch: 3,
            timeout_ms: 60_000,
            state: TxnState::PrepareCommit,
            partitions: [tp(1), tp(0)].into_iter().collect(),
            last_update_ms: 10,
            start_ms: 5,
            next_producer_id: NO_PRODUCER_ID,
            client_version: 0,
        };
        c.load("a", Some(record.clone()));
        c.load("b", Some(TxnRecord { state: TxnState::Ongoing, ..record.clone() }));
        c.load("c", Some(record.clone()));
        c.load("c", None); // a tombstone after it
        let resumed = c.resume();
        assert_eq!(resumed.len(), 1);
        assert_eq!(resumed[0].0, "a");
        assert_eq!(
            resumed[0].1,
            Markers {
                producer_id: 5,
                producer_epoch: 3,
                commit: true,
                partitions: vec![tp(0), tp(1)],
                transaction_version: 0
            }
        );
        assert!(c.get("c").is_none());
        c.markers_written("a", 20).unwrap();
        c.written("a", true);
        assert_eq!(c.get("a").unwrap().state, TxnState::CompleteCommit);
    }

    fn end_v2(c: &mut TxnCoordinator, p: ProducerIdAndEpoch, commit: bool, now: i64) -> Written {
        let mut no_ids = || panic!("no producer id is needed");
        let d = c.end_txn_v2(ID, p, commit, now, &mut no_ids);
        write(c, d)
    }

    fn complete(c: &mut TxnCoordinator, now: i64) {
        c.markers_written(ID, now).expect("complete");
        c.written(ID, true);
    }

    #[test]
    fn v2_every_end_bumps_the_epoch_and_markers_carry_the_bumped_one() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        let p = producer(&mut c, 0, &mut alloc);
        let d = c.add_partitions(ID, p, &[tp(0)], 1);
        write(&mut c, d);
        let w = end_v2(&mut c, p, true, 2);
        let next = ProducerIdAndEpoch { producer_id: p.producer_id, epoch: 1 };
        assert_eq!(w.answer, Some(Ok(Answer::Producer(next))), "answered with the epoch to go on with");
        let m = w.markers.expect("markers");
        assert_eq!((m.producer_epoch, m.commit, m.partitions.clone()), (1, true, vec![tp(0)]));
        assert_eq!(c.get(ID).unwrap().client_version, 2);
        // Markers in flight: a retry (the old epoch) and the next transaction wait.
        let mut no_ids = || panic!("no producer id is needed");
        assert_eq!(c.end_txn_v2(ID, p, true, 3, &mut no_ids), Err(TxnError::ConcurrentTransactions));
        assert_eq!(c.add_partitions(ID, next, &[tp(1)], 3), Err(TxnError::ConcurrentTransactions));
        // The bumped epoch ending a transaction it has not begun yet is fenced.
        assert_eq!(c.end_txn_v2(ID, next, true, 3, &mut no_ids), Err(TxnError::ProducerFenced));
        complete(&mut c, 4);
        let r = c.get(ID).unwrap();
        assert_eq!((r.state, r.producer_epoch), (TxnState::CompleteCommit, 1));
        // A retry whose answer was lost: the same answer, nothing written; the opposite
        // outcome is refused.
        assert_eq!(c.end_txn_v2(ID, p, true, 5, &mut no_ids), Ok(Decision::Answer(next)));
        assert_eq!(c.end_txn_v2(ID, p, false, 5, &mut no_ids), Err(TxnError::InvalidTxnState));
        // The old epoch cannot open a transaction; the new one can.
        assert_eq!(c.add_partitions(ID, p, &[tp(1)], 6), Err(TxnError::ProducerFenced));
        let d = c.add_partitions(ID, next, &[tp(1)], 6);
        write(&mut c, d);
        let w = end_v2(&mut c, next, false, 7);
        assert_eq!(w.answer, Some(Ok(Answer::Producer(ProducerIdAndEpoch { producer_id: p.producer_id, epoch: 2 }))));
        assert_eq!(w.markers.map(|m| (m.producer_epoch, m.commit)), Some((2, false)));
    }

    #[test]
    fn v2_an_abort_with_no_transaction_open_is_written_and_bumps_too() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        let p = producer(&mut c, 0, &mut alloc);
        let mut no_ids = || panic!("no producer id is needed");
        assert_eq!(c.end_txn_v2(ID, p, true, 1, &mut no_ids), Err(TxnError::InvalidTxnState), "nothing to commit");
        let w = end_v2(&mut c, p, false, 1);
        assert_eq!(w.answer, Some(Ok(Answer::Producer(ProducerIdAndEpoch { producer_id: p.producer_id, epoch: 1 }))));
        assert_eq!(w.markers.map(|m| m.partitions.len()), Some(0), "no partition to mark");
        complete(&mut c, 2);
        assert_eq!(state(&c), TxnState::CompleteAbort);
        let stranger = ProducerIdAndEpoch { producer_id: 7, epoch: 0 };
        assert_eq!(c.end_txn_v2(ID, stranger, false, 3, &mut no_ids), Err(TxnError::InvalidProducerIdMapping));
    }

    #[test]
    fn v2_an_exhausted_epoch_moves_to_a_new_producer_id_at_the_end() {
        let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut alloc = ids();
        let first = producer(&mut c, 0, &mut alloc);
        let mut r = c.get(ID).unwrap().clone();
        r.producer_epoch = i16::MAX - 1;
        c.load(ID, Some(r));
        let old = ProducerIdAndEpoch { producer_id: first.producer_id, epoch: i16::MAX - 1 };
        let d = c.add_partitions(ID, old, &[tp(0)], 1);
        write(&mut c, d);
        let d = c.end_txn_v2(ID, old, true, 2, &mut || 5000);
        let w = write(&mut c, d);
        let rotated = ProducerIdAndEpoch { producer_id: 5000, epoch: 0 };
        assert_eq!(w.answer, Some(Ok(Answer::Producer(rotated))));
        assert_eq!(w.markers.map(|m| (m.producer_id, m.producer_epoch)), Some((first.producer_id, i16::MAX)));
        assert_eq!(c.get(ID).unwrap().next_producer_id, 5000, "kept in the Prepare state for a new coordinator");
        complete(&mut c, 3);
        let r = c.get(ID).unwrap();
        assert_eq!((r.producer_id, r.producer_epoch, r.previous_producer_id), (5000, 0, first.producer_id));
        let mut no_ids = || panic!("no producer id is needed");
        assert_eq!(c.end_txn_v2(ID, old, true, 4, &mut no_ids), Ok(Decision::Answer(rotated)), "a retry");
        let d = c.add_partitions(ID, rotated, &[tp(0)], 5);
        write(&mut c, d);
    }

    #[test]
    fn the_transition_table_is_kafkas() {
        use TxnState::*;
        let all = [Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, Dead, PrepareEpochFence];
        for s in all {
            assert_eq!(TxnState::from_id(s.id()), Some(s));
        }
        assert_eq!(TxnState::from_id(8), None);
        let allowed: Vec<(TxnState, TxnState)> = all
            .iter()
            .flat_map(|&to| all.iter().filter(move |&&from| to.may_follow(from)).map(move |&from| (from, to)))
            .collect();
        assert_eq!(allowed.len(), 3 + 4 + 1 + 5 + 1 + 1 + 3 + 1);
        assert!(!CompleteCommit.may_follow(PrepareAbort) && !Ongoing.may_follow(PrepareCommit));
    }
}
