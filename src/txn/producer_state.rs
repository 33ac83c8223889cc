//! The producer state of one partition replica, as Kafka keeps it (`ProducerStateManager`,
//! `ProducerAppendInfo`, `ProducerStateEntry`): for each producer id its epoch and the
//! metadata of its last `limits::producer_batches_max` (5) batches.
//!
//! Events in, decisions out; no I/O, no clock (time is an argument). Owned by the
//! partition's log, so by the partition's owner shard.
//!
//! Rules (Kafka 3.x, KIP-98 and KIP-360), checked on the leader for batches from clients:
//! - a batch whose producer id, epoch and sequence range match one of the producer's
//!   last 5 batches is a duplicate: answered with that batch's offsets, not appended;
//! - an epoch below the producer's current one is `InvalidProducerEpoch`;
//! - a new epoch (above the current) must start at sequence 0 (`OutOfOrderSequence`
//!   otherwise), unless the producer is unknown;
//! - within an epoch, a batch must start right after the last one (`last + 1`; after
//!   `i32::MAX` comes 0), else `OutOfOrderSequence`;
//! - an unknown producer (never seen, expired, or every batch of it removed by retention)
//!   is accepted at any sequence, as Kafka accepts it.
//!
//! Followers and recovery apply batches without these checks (`apply`): the leader
//! already decided, and every replica must end with the same state from the same log.
//!
//! Invariants: at most `producer_batches_max` batches per producer, oldest first, with
//! increasing last offsets; at most `partition_producers_max` producers.
//!
//! # `.snapshot` format, version 1 (Kafka's `ProducerStateManager`, byte for byte)
//!
//! File name: the 20-digit offset the snapshot was taken at (the state of every batch
//! below it), then `.snapshot`, in the partition directory. Big-endian:
//!
//! ```text
//! off len field
//!   0   2 version                i16  = 1
//!   2   4 crc                    u32  CRC32C of every byte after this field
//!   6   4 entry count            i32
//!  10  46 entries, each:
//!         producer id            i64
//!         producer epoch         i16
//!         last sequence          i32
//!         last offset            i64  (of the producer's last batch)
//!         offset delta           i32  (last offset - first offset of that batch)
//!         timestamp              i64  (max timestamp of that batch)
//!         coordinator epoch      i32  (-1: no transaction)
//!         current txn first off  i64  (-1: no open transaction)
//! ```
//!
//! Only the last batch of each producer is kept, as in Kafka: after a restart a retry
//! of an older in-flight batch is out of order rather than a duplicate (clients then
//! bump their epoch). A file whose CRC, version, length or count does not check out is
//! refused (`decode_snapshot` errs), never trusted.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::model::{limits, ProducerEpoch, ProducerId};

/// Kafka's `RecordBatch.NO_SEQUENCE`.
pub const NO_SEQUENCE: i32 = -1;
/// The `.snapshot` format version written and read.
pub const SNAPSHOT_VERSION: i16 = 1;
/// Bytes before the entries: version, crc, count.
pub const SNAPSHOT_HEADER_BYTES: usize = 10;
/// Bytes per snapshot entry.
pub const SNAPSHOT_ENTRY_BYTES: usize = 46;

/// `sequence + increment`, wrapping after `i32::MAX` to 0 (Kafka's
/// `DefaultRecordBatch.incrementSequence`). `increment >= 0`.
pub fn increment_sequence(sequence: i32, increment: i32) -> i32 {
    debug_assert!(increment >= 0);
    if sequence > i32::MAX - increment {
        increment - (i32::MAX - sequence) - 1
    } else {
        sequence + increment
    }
}

/// `sequence - decrement`, the inverse (Kafka's `DefaultRecordBatch.decrementSequence`).
pub fn decrement_sequence(sequence: i32, decrement: i32) -> i32 {
    debug_assert!(decrement >= 0);
    if sequence < decrement {
        i32::MAX - (decrement - sequence) + 1
    } else {
        sequence - decrement
    }
}

/// `next` follows `last` (Kafka's `inSequence`).
fn in_sequence(last: i32, next: i32) -> bool {
    next as i64 == last as i64 + 1 || (next == 0 && last == i32::MAX)
}

/// An idempotent batch, from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerBatch {
    pub producer_id: ProducerId,
    pub epoch: ProducerEpoch,
    pub first_seq: i32,
    /// `lastOffsetDelta`: records in the batch - 1.
    pub offset_delta: i32,
    pub max_timestamp_ms: i64,
    /// Part of a transaction (attributes bit 4): the first one of a producer opens a
    /// transaction in this partition, its marker closes it.
    pub transactional: bool,
}

impl ProducerBatch {
    pub fn last_seq(&self) -> i32 {
        increment_sequence(self.first_seq, self.offset_delta.max(0))
    }
}

/// What is remembered of one appended batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMetadata {
    pub last_seq: i32,
    pub last_offset: i64,
    pub offset_delta: i32,
    pub timestamp_ms: i64,
}

impl BatchMetadata {
    pub fn first_seq(&self) -> i32 {
        decrement_sequence(self.last_seq, self.offset_delta.max(0))
    }

    pub fn first_offset(&self) -> i64 {
        self.last_offset - self.offset_delta as i64
    }
}

/// One producer id's state in one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerEntry {
    pub epoch: ProducerEpoch,
    /// Oldest first, at most `producer_batches_max`.
    pub batches: VecDeque<BatchMetadata>,
    pub last_timestamp_ms: i64,
    /// -1 until transactions exist.
    pub coordinator_epoch: i32,
    /// -1: no open transaction.
    pub current_txn_first_offset: i64,
}

impl ProducerEntry {
    fn empty() -> Self {
        ProducerEntry {
            epoch: ProducerEpoch::NONE,
            batches: VecDeque::new(),
            last_timestamp_ms: -1,
            coordinator_epoch: -1,
            current_txn_first_offset: -1,
        }
    }

    pub fn last_seq(&self) -> i32 {
        self.batches.back().map_or(NO_SEQUENCE, |b| b.last_seq)
    }

    /// The offset of this producer's last batch (-1 with none).
    pub fn last_offset(&self) -> i64 {
        self.batches.back().map_or(-1, |b| b.last_offset)
    }

    fn find_duplicate(&self, batch: &ProducerBatch) -> Option<BatchMetadata> {
        if batch.epoch != self.epoch {
            return None;
        }
        let last_seq = batch.last_seq();
        self.batches.iter().find(|m| m.first_seq() == batch.first_seq && m.last_seq == last_seq).copied()
    }

    /// Kafka's `addBatch`: a new epoch forgets the old epoch's batches.
    fn add_batch(&mut self, batch: &ProducerBatch, last_offset: i64) {
        if batch.epoch != self.epoch {
            self.epoch = batch.epoch;
            self.batches.clear();
        }
        if self.batches.len() == limits::producer_batches_max {
            self.batches.pop_front();
        }
        self.batches.push_back(BatchMetadata {
            last_seq: batch.last_seq(),
            last_offset,
            offset_delta: batch.offset_delta,
            timestamp_ms: batch.max_timestamp_ms,
        });
        self.last_timestamp_ms = batch.max_timestamp_ms;
        assert!(self.batches.len() <= limits::producer_batches_max);
    }
}

/// What the leader does with a record set's idempotent batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Append (then `apply` each batch with its assigned offset).
    Append,
    /// Already appended: answer with this batch's offsets, append nothing.
    Duplicate(BatchMetadata),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProducerStateError {
    /// -> UNKNOWN_PRODUCER_ID: an id no InitProducerId ever issued.
    #[error("producer id {producer_id} was never issued")]
    UnknownProducerId { producer_id: ProducerId },
    /// -> INVALID_PRODUCER_EPOCH (PRODUCER_FENCED for old Produce versions).
    #[error("producer {producer_id}: epoch {epoch} is older than the current epoch {current}")]
    InvalidProducerEpoch { producer_id: ProducerId, epoch: ProducerEpoch, current: ProducerEpoch },
    /// -> INVALID_TXN_STATE: a plain batch from a producer with an open transaction
    /// here (Kafka: "Expected transactional write from producer").
    #[error("producer {producer_id}: a non-transactional batch while its transaction is open")]
    InvalidTxnState { producer_id: ProducerId },
    /// -> TRANSACTION_COORDINATOR_FENCED: a marker from an older coordinator epoch.
    #[error("producer {producer_id}: marker from coordinator epoch {coordinator_epoch}, older than {current}")]
    CoordinatorFenced { producer_id: ProducerId, coordinator_epoch: i32, current: i32 },
    /// -> OUT_OF_ORDER_SEQUENCE_NUMBER.
    #[error(
        "producer {producer_id} epoch {epoch}: sequence {first_seq} does not follow {last_seq} (current epoch {current})"
    )]
    OutOfOrderSequence {
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        first_seq: i32,
        last_seq: i32,
        current: ProducerEpoch,
    },
}

/// A transaction that ended in this partition: its producer, its first offset here and
/// the offset of its marker (Kafka's `CompletedTxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletedTxn {
    pub producer_id: ProducerId,
    pub first_offset: i64,
    pub last_offset: i64,
    pub aborted: bool,
    /// The partition's first unstable offset once this transaction ended: the first
    /// offset of the oldest transaction still open, else `last_offset + 1` (what Kafka
    /// stores as an aborted transaction's `lastStableOffset`).
    pub last_stable_offset: i64,
}

/// Every producer's state in one partition replica.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerStates {
    producers: HashMap<ProducerId, ProducerEntry>,
    /// The open transactions, by first offset (Kafka's `ongoingTxns`); always the
    /// entries whose `current_txn_first_offset >= 0`.
    ongoing: BTreeMap<i64, ProducerId>,
    /// Transactions whose marker may not be replicated yet: (first offset, marker
    /// offset), in marker order (Kafka's `unreplicatedTxns`). They hold the last stable
    /// offset until the high watermark passes the marker; at most
    /// `ENDED_UNREPLICATED_MAX` are remembered (the oldest go first).
    ended: VecDeque<(i64, i64)>,
}

/// Ended transactions remembered until the high watermark passes their marker.
const ENDED_UNREPLICATED_MAX: usize = 4096;

impl ProducerStates {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    pub fn get(&self, producer_id: ProducerId) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    /// Every producer, by id.
    pub fn entries(&self) -> Vec<(ProducerId, &ProducerEntry)> {
        let mut v: Vec<_> = self.producers.iter().map(|(id, e)| (*id, e)).collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }

    /// The leader's decision for the idempotent batches of one record set, in order
    /// (Kafka's `analyzeAndValidateProducerState` for a client append). A duplicate of
    /// any batch makes the whole set a duplicate, as in Kafka. Several batches of one
    /// producer in one set are checked against each other. Changes nothing.
    ///
    /// `producer_id_bound`: ids at or above it were never issued (None: not known);
    /// a batch carrying one is `UnknownProducerId`.
    pub fn check(
        &self,
        batches: &[ProducerBatch],
        producer_id_bound: Option<i64>,
    ) -> Result<Verdict, ProducerStateError> {
        if let Some(b) = batches.iter().find(|b| producer_id_bound.is_some_and(|bound| b.producer_id.0 >= bound)) {
            return Err(ProducerStateError::UnknownProducerId { producer_id: b.producer_id });
        }
        for b in batches {
            if let Some(dup) = self.producers.get(&b.producer_id).and_then(|e| e.find_duplicate(b)) {
                return Ok(Verdict::Duplicate(dup));
            }
        }
        // Kafka's `updatedEntry`: the state as the earlier batches of this set leave it.
        let mut updated: HashMap<ProducerId, ProducerEntry> = HashMap::new();
        for b in batches {
            let current = self.producers.get(&b.producer_id);
            let current_epoch = current.map_or(ProducerEpoch::NONE, |e| e.epoch);
            let entry = updated.entry(b.producer_id).or_insert_with(|| {
                let mut e = ProducerEntry::empty();
                e.epoch = current_epoch;
                e
            });
            if b.epoch < entry.epoch {
                return Err(ProducerStateError::InvalidProducerEpoch {
                    producer_id: b.producer_id,
                    epoch: b.epoch,
                    current: entry.epoch,
                });
            }
            let out_of_order = |last_seq| ProducerStateError::OutOfOrderSequence {
                producer_id: b.producer_id,
                epoch: b.epoch,
                first_seq: b.first_seq,
                last_seq,
                current: entry.epoch,
            };
            if b.first_seq < 0 {
                return Err(out_of_order(entry.last_seq()));
            }
            let open_txn = current.is_some_and(|c| c.current_txn_first_offset >= 0 && c.epoch == b.epoch);
            if !b.transactional && open_txn {
                return Err(ProducerStateError::InvalidTxnState { producer_id: b.producer_id });
            }
            if b.epoch != entry.epoch {
                // A new epoch starts at 0, unless nothing is known of the producer.
                if b.first_seq != 0 && entry.epoch != ProducerEpoch::NONE {
                    return Err(out_of_order(NO_SEQUENCE));
                }
            } else {
                let last_seq = if !entry.batches.is_empty() {
                    entry.last_seq()
                } else if current.is_some_and(|c| c.epoch == b.epoch) {
                    current.map_or(NO_SEQUENCE, |c| c.last_seq())
                } else {
                    NO_SEQUENCE
                };
                if !(current_epoch == ProducerEpoch::NONE || in_sequence(last_seq, b.first_seq)) {
                    return Err(out_of_order(last_seq));
                }
            }
            entry.add_batch(b, -1);
        }
        Ok(Verdict::Append)
    }

    /// Record an appended batch at `last_offset` (leader after `check`, follower,
    /// recovery). No validation: every replica applies the same batches the same way.
    /// A transactional batch opens the producer's transaction here if none is open.
    pub fn apply(&mut self, batch: &ProducerBatch, last_offset: i64) {
        let entry = self.entry_for(batch.producer_id);
        if let Some(last) = entry.batches.back() {
            assert!(last_offset > last.last_offset || last_offset < 0, "producer batch offsets go backwards");
        }
        entry.add_batch(batch, last_offset);
        if batch.transactional && entry.current_txn_first_offset < 0 && last_offset >= 0 {
            let first = last_offset - batch.offset_delta as i64;
            entry.current_txn_first_offset = first;
            self.ongoing.insert(first, batch.producer_id);
        }
        assert!(self.producers.len() <= limits::partition_producers_max);
    }

    /// The entry of `producer_id`, made if need be; at `partition_producers_max`
    /// producers the one idle longest is forgotten first, as expiry would have (one
    /// without an open transaction if there is one).
    fn entry_for(&mut self, producer_id: ProducerId) -> &mut ProducerEntry {
        if !self.producers.contains_key(&producer_id) && self.producers.len() >= limits::partition_producers_max {
            let oldest = |open: bool| {
                self.producers
                    .iter()
                    .filter(|(_, e)| open || e.current_txn_first_offset < 0)
                    .min_by_key(|(_, e)| e.last_timestamp_ms)
                    .map(|(id, _)| *id)
            };
            if let Some(id) = oldest(false).or_else(|| oldest(true)) {
                self.remove(id);
            }
        }
        self.producers.entry(producer_id).or_insert_with(ProducerEntry::empty)
    }

    fn remove(&mut self, producer_id: ProducerId) {
        if let Some(e) = self.producers.remove(&producer_id) {
            if e.current_txn_first_offset >= 0 {
                self.ongoing.remove(&e.current_txn_first_offset);
            }
        }
    }

    /// The leader's check of an end-of-transaction marker for `producer_id` at `epoch`
    /// from coordinator epoch `coordinator_epoch` (Kafka's `appendEndTxnMarker` checks):
    /// an epoch older than the producer's is `InvalidProducerEpoch`, a coordinator epoch
    /// older than the last marker's is `CoordinatorFenced`. Changes nothing.
    ///
    /// From transaction version 2 (KIP-890 part 2: the coordinator bumps the epoch as it
    /// ends each transaction, so its markers are above the epoch the data was written
    /// at), the epoch must be above the producer's (KIP-1228), so that a late marker
    /// cannot end the next transaction, already written at that epoch. The one exception
    /// is a marker retried after it was written: its epoch is the producer's and no
    /// transaction is open here (or the epoch is at its maximum), as Kafka 4.4 allows.
    pub fn check_marker(
        &self,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        coordinator_epoch: i32,
        transaction_version: i8,
    ) -> Result<(), ProducerStateError> {
        let Some(e) = self.producers.get(&producer_id) else { return Ok(()) };
        let strict = transaction_version >= 2;
        let stale = if strict { epoch <= e.epoch } else { epoch < e.epoch };
        let retried = strict && epoch == e.epoch && (e.current_txn_first_offset < 0 || epoch.0 == i16::MAX);
        if stale && !retried {
            return Err(ProducerStateError::InvalidProducerEpoch { producer_id, epoch, current: e.epoch });
        }
        if coordinator_epoch < e.coordinator_epoch {
            return Err(ProducerStateError::CoordinatorFenced {
                producer_id,
                coordinator_epoch,
                current: e.coordinator_epoch,
            });
        }
        Ok(())
    }

    /// Record an end-of-transaction marker at `offset` (leader after `check_marker`,
    /// follower, recovery): the producer's open transaction here, if any, ends. A marker
    /// with no open transaction ends an empty one at its own offset, as in Kafka. A newer
    /// epoch forgets the older epoch's batches (`maybeUpdateProducerEpoch`).
    pub fn apply_marker(
        &mut self,
        producer_id: ProducerId,
        epoch: ProducerEpoch,
        commit: bool,
        coordinator_epoch: i32,
        offset: i64,
        timestamp_ms: i64,
    ) -> CompletedTxn {
        let entry = self.entry_for(producer_id);
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        let first_offset = if entry.current_txn_first_offset >= 0 { entry.current_txn_first_offset } else { offset };
        let was_open = entry.current_txn_first_offset >= 0;
        entry.current_txn_first_offset = -1;
        entry.coordinator_epoch = coordinator_epoch;
        entry.last_timestamp_ms = timestamp_ms;
        if was_open {
            self.ongoing.remove(&first_offset);
            if self.ended.len() == ENDED_UNREPLICATED_MAX {
                self.ended.pop_front();
            }
            self.ended.push_back((first_offset, offset));
        }
        let last_stable_offset = self.first_unstable_offset().unwrap_or(offset + 1);
        CompletedTxn { producer_id, first_offset, last_offset: offset, aborted: !commit, last_stable_offset }
    }

    /// The first offset of the oldest open transaction (the last stable offset is the
    /// lower of this and the high watermark).
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.ongoing.keys().next().copied()
    }

    /// The last stable offset under `high_watermark`: below it every transaction has
    /// ended and its marker is replicated (Kafka: min(first unstable offset, HW)).
    /// Forgets ended transactions whose marker is below `high_watermark`.
    pub fn last_stable_offset(&mut self, high_watermark: i64) -> i64 {
        while self.ended.front().is_some_and(|(_, marker)| *marker < high_watermark) {
            self.ended.pop_front();
        }
        self.stable_offset(high_watermark)
    }

    /// `last_stable_offset` without forgetting anything (for a read-only view).
    pub fn stable_offset(&self, high_watermark: i64) -> i64 {
        let ended = self.ended.iter().filter(|(_, marker)| *marker >= high_watermark).map(|(first, _)| *first).min();
        [Some(high_watermark), self.first_unstable_offset(), ended].into_iter().flatten().min().expect("hw")
    }

    /// How many transactions are open here.
    pub fn ongoing_count(&self) -> usize {
        self.ongoing.len()
    }

    /// The open transactions: (first offset, producer id), oldest first.
    pub fn ongoing(&self) -> impl Iterator<Item = (i64, ProducerId)> + '_ {
        self.ongoing.iter().map(|(o, p)| (*o, *p))
    }

    /// Forget producers idle for `expiration_ms` (`producer.id.expiration.ms`) with no
    /// open transaction, by their last batch's timestamp (Kafka's `isProducerExpired`).
    /// Returns how many were removed.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| {
            e.current_txn_first_offset >= 0 || now_ms.saturating_sub(e.last_timestamp_ms) < expiration_ms
        });
        before - self.producers.len()
    }

    /// Each live producer's epoch and the last offset of its last batch (-1 with none),
    /// by producer id: what the cleaner keeps so that a rebuild from the log finds every
    /// live producer at its epoch (`log::cleaner::LiveProducer`).
    pub fn live(&self) -> std::collections::HashMap<i64, (i16, i64)> {
        self.producers.iter().map(|(id, e)| (id.0, (e.epoch.0, e.last_offset()))).collect()
    }

    /// Forget producers whose last batch lies below `log_start_offset` (retention
    /// removed it; Kafka's `evictUnretainedProducers`). Unlike Kafka, a producer with no
    /// batch (its last entry a marker that bumped its epoch) stays until it expires
    /// (`expire`): forgetting it would let its old epoch write again.
    pub fn remove_before(&mut self, log_start_offset: i64) -> usize {
        let gone: Vec<_> = self
            .producers
            .iter()
            .filter(|(_, e)| !e.batches.is_empty() && e.last_offset() < log_start_offset)
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            self.remove(*id);
        }
        gone.len()
    }

    /// The `.snapshot` bytes (format above), producers by id.
    pub fn encode_snapshot(&self) -> Vec<u8> {
        let entries = self.entries();
        let mut body = Vec::with_capacity(4 + entries.len() * SNAPSHOT_ENTRY_BYTES);
        body.extend_from_slice(&(entries.len() as i32).to_be_bytes());
        for (id, e) in entries {
            let last = e.batches.back();
            body.extend_from_slice(&id.0.to_be_bytes());
            body.extend_from_slice(&e.epoch.0.to_be_bytes());
            body.extend_from_slice(&last.map_or(NO_SEQUENCE, |b| b.last_seq).to_be_bytes());
            body.extend_from_slice(&last.map_or(-1i64, |b| b.last_offset).to_be_bytes());
            body.extend_from_slice(&last.map_or(0i32, |b| b.offset_delta).to_be_bytes());
            body.extend_from_slice(&e.last_timestamp_ms.to_be_bytes());
            body.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
            body.extend_from_slice(&e.current_txn_first_offset.to_be_bytes());
        }
        let mut out = Vec::with_capacity(6 + body.len());
        out.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Read the bytes of the snapshot taken at `offset` (`<offset>.snapshot`): decodable
    /// (`decode_snapshot`), and every producer's last batch below `offset`. Untrusted:
    /// any mismatch is an error, never a panic.
    pub fn decode_snapshot_at(bytes: &[u8], offset: i64) -> Result<ProducerStates, String> {
        let states = Self::decode_snapshot(bytes)?;
        match states
            .entries()
            .into_iter()
            .find(|(_, e)| e.last_offset() >= offset || e.current_txn_first_offset >= offset)
        {
            Some((id, e)) => Err(format!("producer {id} has a batch at {} in a snapshot at {offset}", e.last_offset())),
            None => Ok(states),
        }
    }

    /// Read a `.snapshot` file's bytes. Untrusted: any mismatch is an error, never a panic.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<ProducerStates, String> {
        if bytes.len() < SNAPSHOT_HEADER_BYTES {
            return Err(format!("{} bytes, shorter than the header", bytes.len()));
        }
        let version = i16::from_be_bytes([bytes[0], bytes[1]]);
        if version != SNAPSHOT_VERSION {
            return Err(format!("version {version}, expected {SNAPSHOT_VERSION}"));
        }
        let crc = u32::from_be_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
        let computed = crc32c::crc32c(&bytes[6..]);
        if crc != computed {
            return Err(format!("crc {crc:#010x} but computed {computed:#010x}"));
        }
        let count = i32::from_be_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]);
        if count < 0 || count as usize > limits::producer_snapshot_entries_max {
            return Err(format!("entry count {count}"));
        }
        let expected = SNAPSHOT_HEADER_BYTES + count as usize * SNAPSHOT_ENTRY_BYTES;
        if bytes.len() != expected {
            return Err(format!("{} bytes for {count} entries ({expected} expected)", bytes.len()));
        }
        let mut states = ProducerStates::new();
        for chunk in bytes[SNAPSHOT_HEADER_BYTES..].chunks_exact(SNAPSHOT_ENTRY_BYTES) {
            let i64_at = |at: usize| i64::from_be_bytes(chunk[at..at + 8].try_into().expect("8 bytes"));
            let i32_at = |at: usize| i32::from_be_bytes(chunk[at..at + 4].try_into().expect("4 bytes"));
            let id = ProducerId(i64_at(0));
            let epoch = ProducerEpoch(i16::from_be_bytes([chunk[8], chunk[9]]));
            let (last_seq, last_offset, offset_delta) = (i32_at(10), i64_at(14), i32_at(22));
            let timestamp_ms = i64_at(26);
            if id.0 < 0 || offset_delta < 0 || last_offset < -1 || states.producers.contains_key(&id) {
                return Err(format!("bad entry: producer {id} offset {last_offset} delta {offset_delta}"));
            }
            let mut batches = VecDeque::new();
            if last_offset >= 0 {
                batches.push_back(BatchMetadata { last_seq, last_offset, offset_delta, timestamp_ms });
            }
            let current_txn_first_offset = i64_at(38);
            if current_txn_first_offset < -1 || states.ongoing.contains_key(&current_txn_first_offset) {
                return Err(format!("bad entry: producer {id} transaction at {current_txn_first_offset}"));
            }
            if current_txn_first_offset >= 0 {
                states.ongoing.insert(current_txn_first_offset, id);
            }
            let entry = ProducerEntry {
                epoch,
                batches,
                last_timestamp_ms: timestamp_ms,
                coordinator_epoch: i32_at(34),
                current_txn_first_offset,
            };
            states.producers.insert(id, entry);
        }
        Ok(states)
    }
}

/// Seeds and replays for the proptests below (shared with tests/*.rs).
#[cfg(test)]
#[path = "../../tests/proptest_config/mod.rs"]
mod proptest_config;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn batch(id: i64, epoch: i16, first_seq: i32, records: i32, ts: i64) -> ProducerBatch {
        ProducerBatch {
            producer_id: ProducerId(id),
            epoch: ProducerEpoch(epoch),
            first_seq,
            offset_delta: records - 1,
            max_timestamp_ms: ts,
            transactional: false,
        }
    }

    /// The leader's path: check, then apply at the next offsets. Returns the verdict or
    /// the error, and the offsets given.
    struct Leader {
        states: ProducerStates,
        log_end: i64,
    }

    impl Leader {
        fn new() -> Self {
            Leader { states: ProducerStates::new(), log_end: 0 }
        }

        fn send(&mut self, b: ProducerBatch) -> Result<(i64, i64, bool), ProducerStateError> {
            match self.states.check(&[b], None)? {
                Verdict::Duplicate(m) => Ok((m.first_offset(), m.last_offset, true)),
                Verdict::Append => {
                    let first = self.log_end;
                    let last = first + b.offset_delta as i64;
                    self.states.apply(&b, last);
                    self.log_end = last + 1;
                    Ok((first, last, false))
                }
            }
        }
    }

    #[test]
    fn in_order_batches_are_appended_and_retries_answered_with_their_offsets() {
        let mut l = Leader::new();
        assert_eq!(l.send(batch(7, 0, 0, 3, 10)), Ok((0, 2, false)));
        assert_eq!(l.send(batch(7, 0, 3, 2, 11)), Ok((3, 4, false)));
        assert_eq!(l.send(batch(7, 0, 0, 3, 10)), Ok((0, 2, true)), "retry of the first batch");
        assert_eq!(l.send(batch(7, 0, 3, 2, 11)), Ok((3, 4, true)));
        assert_eq!(l.log_end, 5);
    }

    #[test]
    fn transaction_version_2_markers_must_be_above_the_producers_epoch() {
        let (id, ours) = (ProducerId(7), |e: i16| ProducerEpoch(e));
        let mut l = Leader::new();
        let txn = |epoch, seq| ProducerBatch { transactional: true, ..batch(7, epoch, seq, 1, 10) };
        // A transaction written at epoch 3.
        l.send(txn(3, 0)).unwrap();
        // Version 1: the marker at the data's epoch is taken, an older one is not.
        assert!(l.states.check_marker(id, ours(3), 0, 1).is_ok());
        assert!(l.states.check_marker(id, ours(2), 0, 1).is_err());
        // Version 2: the coordinator bumped the epoch to end it; the data's epoch is stale.
        assert!(matches!(
            l.states.check_marker(id, ours(3), 0, 2),
            Err(ProducerStateError::InvalidProducerEpoch { .. })
        ));
        assert!(l.states.check_marker(id, ours(4), 0, 2).is_ok());
        let end = l.log_end;
        l.states.apply_marker(id, ours(4), true, 0, end, 11);
        l.log_end += 1;
        // The same marker again, nothing open: a retry after a lost answer, taken.
        assert!(l.states.check_marker(id, ours(4), 0, 2).is_ok());
        // The next transaction is written at epoch 4: a late marker of epoch 4 must not end it.
        l.send(txn(4, 0)).unwrap();
        assert!(matches!(
            l.states.check_marker(id, ours(4), 0, 2),
            Err(ProducerStateError::InvalidProducerEpoch { .. })
        ));
        assert!(l.states.check_marker(id, ours(4), 0, 1).is_ok(), "version 1 keeps Kafka's older check");
        assert!(l.states.check_marker(id, ours(5), 0, 2).is_ok());
    }

    #[test]
    fn duplicates_outside_the_five_batch_window_are_out_of_order() {
        let mut l = Leader::new();
        for i in 0..6 {
            l.send(batch(1, 0, i, 1, 0)).unwrap();
        }
        // Batches 1..=5 are remembered; batch 0 fell out of the window.
        for i in 1..6 {
            assert_eq!(l.send(batch(1, 0, i, 1, 0)), Ok((i as i64, i as i64, true)));
        }
        assert!(matches!(l.send(batch(1, 0, 0, 1, 0)), Err(ProducerStateError::OutOfOrderSequence { .. })));
    }

    #[test]
    fn a_gap_is_out_of_order() {
        let mut l = Leader::new();
        l.send(batch(1, 0, 0, 5, 0)).unwrap();
        assert_eq!(
            l.send(batch(1, 0, 6, 1, 0)),
            Err(ProducerStateError::OutOfOrderSequence {
                producer_id: ProducerId(1),
                epoch: ProducerEpoch(0),
                first_seq: 6,
                last_seq: 4,
                current: ProducerEpoch(0)
            })
        );
        // A partial overlap (not one of the remembered batches) too.
        assert!(matches!(l.send(batch(1, 0, 2, 3, 0)), Err(ProducerStateError::OutOfOrderSequence { .. })));
        assert_eq!(l.send(batch(1, 0, 5, 1, 0)), Ok((5, 5, false)));
    }

    #[test]
    fn stale_epoch_is_fenced_and_a_new_epoch_starts_at_zero() {
        let mut l = Leader::new();
        l.send(batch(1, 3, 0, 2, 0)).unwrap();
        assert!(matches!(l.send(batch(1, 2, 2, 1, 0)), Err(ProducerStateError::InvalidProducerEpoch { .. })));
        // Epoch bump (KIP-360): sequence restarts at 0.
        assert!(matches!(l.send(batch(1, 4, 2, 1, 0)), Err(ProducerStateError::OutOfOrderSequence { .. })));
        assert_eq!(l.send(batch(1, 4, 0, 1, 0)), Ok((2, 2, false)));
        // The old epoch's batches are no longer duplicates: its epoch is stale.
        assert!(matches!(l.send(batch(1, 3, 0, 2, 0)), Err(ProducerStateError::InvalidProducerEpoch { .. })));
        assert_eq!(l.states.get(ProducerId(1)).unwrap().batches.len(), 1);
    }

    #[test]
    fn unknown_producers_are_accepted_at_any_sequence() {
        let mut l = Leader::new();
        assert_eq!(l.send(batch(9, 5, 1234, 2, 0)), Ok((0, 1, false)));
        assert_eq!(l.send(batch(9, 5, 1236, 1, 0)), Ok((2, 2, false)));
        // Retention removes it: unknown again, accepted wherever it is.
        assert_eq!(l.states.remove_before(3), 1);
        assert_eq!(l.send(batch(9, 5, 4000, 1, 0)), Ok((3, 3, false)));
    }

    #[test]
    fn sequences_wrap_at_int32_max() {
        assert_eq!(increment_sequence(i32::MAX, 1), 0);
        assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
        assert_eq!(decrement_sequence(1, 3), i32::MAX - 1);
        let mut l = Leader::new();
        l.send(batch(1, 0, i32::MAX - 2, 3, 0)).unwrap(); // MAX-2..=MAX
        assert_eq!(l.send(batch(1, 0, 0, 2, 0)), Ok((3, 4, false)));
        // A batch that itself wraps: MAX-1, MAX, 0.
        let mut l = Leader::new();
        l.send(batch(2, 0, i32::MAX - 1, 3, 0)).unwrap();
        assert_eq!(l.states.get(ProducerId(2)).unwrap().last_seq(), 0);
        assert_eq!(l.send(batch(2, 0, i32::MAX - 1, 3, 0)), Ok((0, 2, true)));
        assert_eq!(l.send(batch(2, 0, 1, 1, 0)), Ok((3, 3, false)));
    }

    #[test]
    fn several_batches_in_one_set_are_checked_against_each_other() {
        let l = {
            let mut l = Leader::new();
            l.send(batch(1, 0, 0, 1, 0)).unwrap();
            l
        };
        let ok = [batch(1, 0, 1, 2, 0), batch(1, 0, 3, 1, 0), batch(2, 0, 0, 1, 0)];
        assert_eq!(l.states.check(&ok, None), Ok(Verdict::Append));
        let gap = [batch(1, 0, 1, 2, 0), batch(1, 0, 4, 1, 0)];
        assert!(l.states.check(&gap, None).is_err());
        let dup = [batch(1, 0, 0, 1, 0), batch(1, 0, 1, 1, 0)];
        assert!(matches!(l.states.check(&dup, None), Ok(Verdict::Duplicate(_))));
    }

    #[test]
    fn negative_sequence_is_refused() {
        let l = Leader::new();
        assert!(matches!(
            l.states.check(&[batch(1, 0, -5, 1, 0)], None),
            Err(ProducerStateError::OutOfOrderSequence { .. })
        ));
    }

    #[test]
    fn ids_never_issued_are_unknown() {
        let l = Leader::new();
        assert_eq!(l.states.check(&[batch(999, 0, 0, 1, 0)], Some(1000)), Ok(Verdict::Append));
        assert_eq!(
            l.states.check(&[batch(1000, 0, 0, 1, 0)], Some(1000)),
            Err(ProducerStateError::UnknownProducerId { producer_id: ProducerId(1000) })
        );
    }

    #[test]
    fn producers_expire_after_the_expiration_time() {
        let mut l = Leader::new();
        l.send(batch(1, 0, 0, 1, 1_000)).unwrap();
        l.send(batch(2, 0, 0, 1, 5_000)).unwrap();
        assert_eq!(l.states.expire(10_999, 10_000), 0);
        assert_eq!(l.states.expire(11_000, 10_000), 1);
        assert!(l.states.get(ProducerId(1)).is_none());
        // Expired: its next batch is accepted at any sequence.
        assert_eq!(l.send(batch(1, 0, 77, 1, 12_000)), Ok((2, 2, false)));
    }

    #[test]
    fn followers_apply_without_checking_and_end_in_the_same_state() {
        let mut leader = Leader::new();
        let mut follower = ProducerStates::new();
        for b in [batch(1, 0, 0, 2, 1), batch(1, 0, 2, 2, 2), batch(2, 1, 0, 1, 3)] {
            let (_, last, dup) = leader.send(b).unwrap();
            assert!(!dup);
            follower.apply(&b, last);
        }
        assert_eq!(follower, leader.states);
    }

    #[test]
    fn snapshot_fixture_matches_kafkas_layout() {
        let mut s = ProducerStates::new();
        s.apply(&batch(0x0102, 3, 10, 2, 0x55), 41);
        let bytes = s.encode_snapshot();
        let body: Vec<u8> = [
            &1i32.to_be_bytes()[..],
            &0x0102i64.to_be_bytes(),
            &3i16.to_be_bytes(),
            &11i32.to_be_bytes(),
            &41i64.to_be_bytes(),
            &1i32.to_be_bytes(),
            &0x55i64.to_be_bytes(),
            &(-1i32).to_be_bytes(),
            &(-1i64).to_be_bytes(),
        ]
        .concat();
        let mut expected = vec![0, 1];
        expected.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        expected.extend_from_slice(&body);
        assert_eq!(bytes, expected);
        assert_eq!(bytes.len(), SNAPSHOT_HEADER_BYTES + SNAPSHOT_ENTRY_BYTES);
        let back = ProducerStates::decode_snapshot(&bytes).unwrap();
        let e = back.get(ProducerId(0x0102)).unwrap();
        assert_eq!((e.epoch, e.last_seq(), e.last_offset()), (ProducerEpoch(3), 11, 41));
        assert_eq!(e.batches[0].first_seq(), 10);
    }

    #[test]
    fn corrupt_snapshots_are_refused() {
        let mut s = ProducerStates::new();
        s.apply(&batch(5, 0, 0, 1, 0), 0);
        s.apply(&batch(6, 0, 0, 1, 0), 1);
        let good = s.encode_snapshot();
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[i] ^= 1 << bit;
                assert!(ProducerStates::decode_snapshot(&bad).is_err(), "flip of bit {bit} of byte {i} accepted");
            }
        }
        for len in 0..good.len() {
            assert!(ProducerStates::decode_snapshot(&good[..len]).is_err(), "torn at {len} accepted");
        }
    }

    #[test]
    fn a_snapshot_holding_a_batch_at_or_past_its_offset_is_refused() {
        let mut s = ProducerStates::new();
        s.apply(&batch(5, 0, 0, 3, 0), 2);
        s.apply(&batch(6, 0, 0, 1, 0), 7);
        let bytes = s.encode_snapshot();
        assert_eq!(ProducerStates::decode_snapshot_at(&bytes, 8), Ok(ProducerStates::decode_snapshot(&bytes).unwrap()));
        for offset in [0, 3, 7] {
            assert!(ProducerStates::decode_snapshot_at(&bytes, offset).is_err(), "accepted at {offset}");
        }
    }

    proptest! {
        #![proptest_config(super::proptest_config::config(256))]
        /// A producer sending batches and retrying any of its recent ones: every new batch
        /// is appended once, a retry inside the 5-batch window gets the original offsets,
        /// one outside it is out of order; nothing is appended twice.
        #[test]
        fn retries_are_deduplicated(ops in proptest::collection::vec((0u8..10, 1i32..4, 0usize..8), 1..80),
                                    start_seq in prop_oneof![Just(0i32), Just(i32::MAX - 20)]) {
            let mut l = Leader::new();
            let mut sent: Vec<(ProducerBatch, i64, i64)> = Vec::new();
            let mut next_seq = start_seq;
            for (kind, records, back) in ops {
                if kind < 6 || sent.is_empty() {
                    let b = batch(42, 0, next_seq, records, 0);
                    let (first, last, dup) = l.send(b).unwrap();
                    prop_assert!(!dup);
                    prop_assert_eq!(last - first + 1, records as i64);
                    next_seq = increment_sequence(next_seq, records);
                    sent.push((b, first, last));
                } else {
                    let back = back.min(sent.len() - 1);
                    let (b, first, last) = sent[sent.len() - 1 - back];
                    let end = l.log_end;
                    let r = l.send(b);
                    if back < limits::producer_batches_max {
                        prop_assert_eq!(r, Ok((first, last, true)));
                    } else {
                        let is_out_of_order = matches!(r, Err(ProducerStateError::OutOfOrderSequence { .. }));
                        prop_assert!(is_out_of_order);
                    }
                    prop_assert_eq!(l.log_end, end);
                }
            }
            let total: i64 = sent.iter().map(|(b, _, _)| b.offset_delta as i64 + 1).sum();
            prop_assert_eq!(l.log_end, total);
        }

        #[test]
        fn snapshot_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = ProducerStates::decode_snapshot(&bytes);
        }

        #[test]
        fn snapshot_round_trips_the_last_batch(
            producers in proptest::collection::btree_map(0i64..1000, (0i16..10, 0i32..1000, 1i32..10, 0i64..1_000_000), 0..20)) {
            let mut s = ProducerStates::new();
            let mut offset = 0;
            for (id, (epoch, seq, records, ts)) in &producers {
                offset += *records as i64;
                s.apply(&batch(*id, *epoch, *seq, *records, *ts), offset);
            }
            let back = ProducerStates::decode_snapshot(&s.encode_snapshot()).unwrap();
            prop_assert_eq!(back, s);
        }
    }
}
