//! The transaction coordinator's side of a shard: transactional ids whose
//! `__transaction_state` partition this shard owns and this broker leads, their
//! requests, and the appends of their records.
//!
//! Lifecycle of a partition's ids (as Kafka's `TransactionStateManager`): taking the
//! partition's leadership starts a load (the log read off the data core, a bounded chunk
//! at a time, `txn_load_next` / `txn_load_apply`; newest record per id wins, tombstones
//! remove); requests meanwhile are `Loading` (COORDINATOR_LOAD_IN_PROGRESS). Once
//! loaded, transactions caught in Prepare* get their markers again (`take_txn_resumes`).
//! Losing the leadership drops the ids and anything in flight for them (`Unavailable`,
//! NOT_COORDINATOR). Each load has an id: a write or marker round started under an older
//! load finds its id gone (`txn_written` answers None) and changes nothing.
//!
//! Every state change is appended with acks=all; the runtime waits for the record's
//! write and replication, then calls `txn_written` (the pure machine's `written`), as
//! offset commits do. The coordinator epoch sent with markers is the partition's leader
//! epoch when it was loaded.

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions};

use crate::log::LogError;
use crate::model::{Offset, TopicPartition};
use crate::txn::coordinator::{Answer, Decision, Markers, ProducerIdAndEpoch, TxnError, TxnRecord, TxnState, Written};
use crate::txn::{log_records, txn_partition_for, txn_topic_partitions, TXN_TOPIC};

use super::groups::GroupLoadStep;
use super::{DurableWait, PartitionError, PartitionOp, PartitionReply, ReplicatedWait, Shard};

/// Bytes read per step when loading a `__transaction_state` partition.
const txn_load_read_bytes_max: usize = 1024 * 1024;

/// The `__transaction_state` partition that holds a transactional id.
pub fn txn_partition(txn_id: &str) -> TopicPartition {
    TopicPartition::new(TXN_TOPIC, txn_partition_for(txn_id))
}

#[derive(Debug)]
pub enum TxnOp {
    InitProducerId {
        txn_id: String,
        timeout_ms: i32,
        /// KIP-360: the id and epoch the producer has (None: a new producer).
        expected: Option<ProducerIdAndEpoch>,
        /// A producer id the caller got from the allocator, for a new id or an exhausted
        /// epoch (asked for by `TxnReply::NeedProducerId`).
        allocated: Option<i64>,
        now_ms: i64,
    },
    /// AddPartitionsToTxn, and AddOffsetsToTxn with the group's offsets partition.
    AddPartitions {
        txn_id: String,
        producer: ProducerIdAndEpoch,
        partitions: Vec<TopicPartition>,
        now_ms: i64,
    },
    EndTxn {
        txn_id: String,
        producer: ProducerIdAndEpoch,
        commit: bool,
        now_ms: i64,
        /// EndTxn v5+: transaction version 2's epoch bump (`TxnCoordinator::end_txn_v2`).
        v2: bool,
        /// For v2 at an exhausted epoch: the next producer id, from the allocator (asked
        /// for by `TxnReply::NeedProducerId`).
        allocated: Option<i64>,
    },
    Describe {
        txn_id: String,
    },
    /// AddPartitionsToTxn v4+ verify_only: are these partitions in the producer's
    /// transaction (`TxnCoordinator::verify_partitions`)?
    Verify {
        txn_id: String,
        producer: ProducerIdAndEpoch,
        partitions: Vec<TopicPartition>,
    },
    /// Every id this shard coordinates (ListTransactions fans out to all shards).
    List,
}

impl TxnOp {
    /// The id whose coordinator must run this (None: any shard).
    pub fn txn_id(&self) -> Option<&str> {
        match self {
            TxnOp::InitProducerId { txn_id, .. }
            | TxnOp::AddPartitions { txn_id, .. }
            | TxnOp::EndTxn { txn_id, .. }
            | TxnOp::Describe { txn_id }
            | TxnOp::Verify { txn_id, .. } => Some(txn_id),
            TxnOp::List => None,
        }
    }
}

/// A record of an id appended to its partition: the runtime waits for `waits` and
/// `replicated`, then calls `txn_written(txn_id, load, ok)`.
#[derive(Debug)]
pub struct TxnWrite {
    pub txn_id: String,
    pub load: u64,
    pub waits: Vec<DurableWait>,
    pub replicated: Option<ReplicatedWait>,
}

#[derive(Debug)]
pub enum TxnReply {
    /// Answered now: nothing to write.
    Answer(Result<Answer, TxnError>),
    /// Written to the log; the answer follows `txn_written`.
    Write(TxnWrite),
    /// InitProducerId needs a new producer id: ask again with `allocated`.
    NeedProducerId,
    Describe(Option<TxnRecord>),
    List(Vec<(String, TxnRecord)>),
    /// Verify: per partition, whether it is in the transaction.
    Verified(Result<Vec<bool>, TxnError>),
    /// This broker does not lead the id's partition (yet, or any more).
    Unavailable,
    /// The id's partition is being loaded: COORDINATOR_LOAD_IN_PROGRESS.
    Loading,
}

/// A load of a `__transaction_state` partition (see the module comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnLoad {
    pub tp: TopicPartition,
    pub id: u64,
}

/// A `__transaction_state` partition this shard leads.
#[derive(Debug)]
pub(super) struct TxnPartition {
    /// Which load (a later leadership starts another).
    load: u64,
    /// The partition's leader epoch at the load: the coordinator epoch of its markers.
    coordinator_epoch: i32,
    /// The next offset to read, while loading.
    loading: Option<Offset>,
    loaded: usize,
    skipped: usize,
}

/// Markers to send for an id (after a Prepare* write, or at a load's end).
#[derive(Debug, Clone)]
pub struct TxnMarkers {
    pub txn_id: String,
    pub load: u64,
    pub coordinator_epoch: i32,
    pub markers: Markers,
}

/// Encode `__transaction_state` records as one uncompressed batch.
fn encode_batch(txn_id: &str, record: &TxnRecord, now_ms: i64) -> Result<Vec<u8>, LogError> {
    let records: Vec<Record> = vec![crate::protocol::plain_record(
        0,
        0,
        now_ms,
        Some(log_records::key(txn_id)),
        Some(log_records::value(record)),
        Default::default(),
    )];
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .map_err(|e| LogError::InvalidRecord(format!("encoding transaction state batch: {e}")))?;
    Ok(buf.to_vec())
}

impl Shard {
    /// Whether this shard may serve `tp`'s ids now: Err(reply) when not.
    fn txn_partition_ready(&self, tp: &TopicPartition) -> Result<u64, TxnReply> {
        assert!(self.owns(tp), "shard {} got transactions of {tp}, owned by another shard", self.id.0);
        if self.partitions.get(tp).is_none_or(|p| p.replica.leader_state().is_none()) {
            return Err(TxnReply::Unavailable);
        }
        match self.txn_partitions.get(&tp.partition) {
            None => Err(TxnReply::Unavailable),
            Some(p) if p.loading.is_some() => Err(TxnReply::Loading),
            Some(p) => Ok(p.load),
        }
    }

    /// Append `record` for `txn_id` with acks=all (and, under `--fsync always`, an fsync).
    /// A failed append is a failed write (`written(false)`), answered at once.
    fn append_txn_record(&mut self, txn_id: &str, load: u64, record: &TxnRecord, now_ms: i64) -> TxnReply {
        let tp = txn_partition(txn_id);
        let durable = self.fsync_always;
        let appended = encode_batch(txn_id, record, now_ms).map_err(PartitionError::Log).and_then(|batch| {
            self.execute(PartitionOp::Produce {
                tp: tp.clone(),
                records: Bytes::from(batch),
                now_ms,
                durable,
                acks: -1,
                verification: crate::log::TxnVerification::Off,
            })
        });
        match appended {
            Ok(PartitionReply::Produced { written, durable, replicated, .. }) => TxnReply::Write(TxnWrite {
                txn_id: txn_id.to_string(),
                load,
                waits: written.into_iter().chain(durable).collect(),
                replicated,
            }),
            Ok(other) => unreachable!("Produce answered {other:?}"),
            Err(e) => {
                tracing::warn!(partition = %tp, transactional_id = txn_id, error = %e, "transaction state not written");
                let w = self.txns.written(txn_id, false);
                TxnReply::Answer(w.answer.unwrap_or(Err(TxnError::ConcurrentTransactions)))
            }
        }
    }

    pub fn execute_txn(&mut self, op: TxnOp) -> TxnReply {
        let load = match op.txn_id() {
            Some(id) => match self.txn_partition_ready(&txn_partition(id)) {
                Ok(load) => load,
                Err(reply) => return reply,
            },
            None => 0,
        };
        match op {
            TxnOp::InitProducerId { txn_id, timeout_ms, expected, allocated, now_ms } => {
                // The machine allocates for a new id and for an exhausted epoch only:
                // the caller gets an id first, off this core.
                let needs_id = match self.txns.get(&txn_id) {
                    None => true,
                    Some(r) => r.producer_epoch >= i16::MAX - 1,
                };
                let timeout_ok = timeout_ms > 0 && timeout_ms <= self.txn_max_timeout_ms;
                if timeout_ok && needs_id && allocated.is_none() && !self.txns.is_pending(&txn_id) {
                    return TxnReply::NeedProducerId;
                }
                let mut allocated = allocated;
                let mut allocate = || allocated.take().expect("a producer id was allocated for this request");
                match self.txns.init_producer_id(&txn_id, timeout_ms, expected, now_ms, &mut allocate) {
                    Err(e) => TxnReply::Answer(Err(e)),
                    Ok(Decision::Answer(p)) => TxnReply::Answer(Ok(Answer::Producer(p))),
                    Ok(Decision::Write(record)) => self.append_txn_record(&txn_id, load, &record, now_ms),
                }
            }
            TxnOp::AddPartitions { txn_id, producer, partitions, now_ms } => {
                match self.txns.add_partitions(&txn_id, producer, &partitions, now_ms) {
                    Err(e) => TxnReply::Answer(Err(e)),
                    Ok(Decision::Answer(())) => TxnReply::Answer(Ok(Answer::Done)),
                    Ok(Decision::Write(record)) => self.append_txn_record(&txn_id, load, &record, now_ms),
                }
            }
            TxnOp::EndTxn { txn_id, producer, commit, now_ms, v2: false, .. } => {
                match self.txns.end_txn(&txn_id, producer, commit, now_ms) {
                    Err(e) => TxnReply::Answer(Err(e)),
                    Ok(Decision::Answer(())) => TxnReply::Answer(Ok(Answer::Done)),
                    Ok(Decision::Write(record)) => self.append_txn_record(&txn_id, load, &record, now_ms),
                }
            }
            TxnOp::EndTxn { txn_id, producer, commit, now_ms, v2: true, allocated } => {
                // The machine allocates only at an exhausted epoch with no write in
                // flight (`end_txn_v2`): the caller gets an id first, off this core.
                let exhausted = self.txns.get(&txn_id).is_some_and(|r| r.producer_epoch >= i16::MAX - 1);
                if exhausted && allocated.is_none() && !self.txns.is_pending(&txn_id) {
                    return TxnReply::NeedProducerId;
                }
                let mut allocated = allocated;
                let mut allocate = || allocated.take().expect("a producer id was allocated for this request");
                match self.txns.end_txn_v2(&txn_id, producer, commit, now_ms, &mut allocate) {
                    Err(e) => TxnReply::Answer(Err(e)),
                    Ok(Decision::Answer(p)) => TxnReply::Answer(Ok(Answer::Producer(p))),
                    Ok(Decision::Write(record)) => self.append_txn_record(&txn_id, load, &record, now_ms),
                }
            }
            TxnOp::Describe { txn_id } => TxnReply::Describe(self.txns.get(&txn_id).cloned()),
            TxnOp::Verify { txn_id, producer, partitions } => {
                TxnReply::Verified(self.txns.verify_partitions(&txn_id, producer, &partitions))
            }
            // While a load runs, the list is not whole (as ListGroups).
            TxnOp::List if self.txn_partitions.values().any(|p| p.loading.is_some()) => TxnReply::Loading,
            TxnOp::List => {
                let mut list: Vec<(String, TxnRecord)> =
                    self.txns.ids().map(|(id, r)| (id.clone(), r.clone())).collect();
                list.sort_by(|a, b| a.0.cmp(&b.0));
                TxnReply::List(list)
            }
        }
    }

    /// The write `execute_txn` (or `txn_markers_written`, `txn_tick`) started for
    /// `txn_id` under load `load` was acknowledged (`ok`) or failed. None when the load
    /// is over (the leadership moved): the client is told NOT_COORDINATOR.
    pub fn txn_written(&mut self, txn_id: &str, load: u64, ok: bool) -> Option<(Written, Option<TxnMarkers>)> {
        let tp = txn_partition(txn_id);
        let coordinator_epoch = match self.txn_partitions.get(&tp.partition) {
            Some(p) if p.load == load && p.loading.is_none() => p.coordinator_epoch,
            _ => return None,
        };
        let written = self.txns.written(txn_id, ok);
        let markers = written.markers.clone().map(|markers| TxnMarkers {
            txn_id: txn_id.to_string(),
            load,
            coordinator_epoch,
            markers,
        });
        Some((written, markers))
    }

    /// Every marker of `txn_id`'s transaction is written: append its Complete* state.
    /// None when there is nothing to write (the load is over, or the state moved on).
    pub fn txn_markers_written(&mut self, txn_id: &str, load: u64, now_ms: i64) -> Option<TxnReply> {
        let tp = txn_partition(txn_id);
        if !self.txn_partitions.get(&tp.partition).is_some_and(|p| p.load == load && p.loading.is_none()) {
            return None;
        }
        let record = self.txns.markers_written(txn_id, now_ms)?;
        Some(self.append_txn_record(txn_id, load, &record, now_ms))
    }

    /// Whether load `load` of `txn_id`'s partition is still current (marker rounds stop
    /// when it is not).
    pub fn txn_load_current(&self, txn_id: &str, load: u64) -> bool {
        let tp = txn_partition(txn_id);
        self.txn_partitions.get(&tp.partition).is_some_and(|p| p.load == load)
    }

    /// Open transactions past their timeout: each is aborted with a bumped epoch (its
    /// producer fenced). Returns the writes to complete (`txn_written`, whose markers
    /// abort the transaction). `spare_producer_id`: an id for an exhausted epoch; without
    /// one, a transaction whose epoch is exhausted waits for the next tick.
    /// Also whether a spare id is wanted (and missing).
    pub fn txn_tick(&mut self, now_ms: i64, spare_producer_id: &mut Option<i64>) -> (Vec<TxnReply>, bool) {
        if self.txn_partitions.values().any(|p| p.loading.is_some()) {
            return (Vec::new(), false); // a half-loaded id may look open
        }
        let exhausted = self.txns.ids().any(|(_, r)| {
            r.state == TxnState::Ongoing
                && now_ms - r.start_ms > r.timeout_ms as i64
                && r.producer_epoch >= i16::MAX - 1
        });
        if exhausted && spare_producer_id.is_none() {
            return (Vec::new(), true);
        }
        let mut allocate = || spare_producer_id.take().expect("checked above: a spare id when an epoch is exhausted");
        let expired = self.txns.expire(now_ms, &mut allocate);
        let mut out = Vec::new();
        for (txn_id, record) in expired {
            let tp = txn_partition(&txn_id);
            let Some(load) = self.txn_partitions.get(&tp.partition).map(|p| p.load) else { continue };
            tracing::info!(transactional_id = %txn_id, producer_id = record.producer_id,
                producer_epoch = record.producer_epoch, "transaction timed out: aborting it, fencing its producer");
            self.txn_timeouts += 1;
            out.push(self.append_txn_record(&txn_id, load, &record, now_ms));
        }
        (out, false)
    }

    /// What the metrics show of this shard's coordinator (`TxnCoordinatorStatus`). An
    /// open transaction is one in Ongoing, Prepare* or PrepareEpochFence: begun (its
    /// first partition added) and its markers not all written.
    pub(super) fn txn_status(&self) -> super::TxnCoordinatorStatus {
        let mut status = super::TxnCoordinatorStatus { timed_out: self.txn_timeouts, ..Default::default() };
        for (_, r) in self.txns.ids() {
            status.by_state[r.state.id() as usize] += 1;
            let open = !r.state.is_idle() && r.state != TxnState::Dead;
            if open && r.start_ms >= 0 {
                status.oldest_open_start_ms =
                    Some(status.oldest_open_start_ms.map_or(r.start_ms, |t| t.min(r.start_ms)));
            }
        }
        status
    }

    /// This broker took the leadership of `__transaction_state` partition `tp`: load its
    /// ids from the log (off the core, `take_txn_loads`), replacing what this shard held.
    pub(super) fn load_txn_partition(&mut self, tp: &TopicPartition) {
        let partition = tp.partition;
        self.txns.unload(|id| txn_partition_for(id) == partition);
        let Some(p) = self.partitions.get(tp) else { return };
        let Some(leader) = p.replica.leader_state() else { return };
        let coordinator_epoch = leader.leader_epoch().0;
        let id = self.next_txn_load_id;
        self.next_txn_load_id += 1;
        let offset = p.log.log_start_offset();
        self.txn_partitions.insert(
            partition,
            TxnPartition { load: id, coordinator_epoch, loading: Some(offset), loaded: 0, skipped: 0 },
        );
        self.txn_load_queue.push(TxnLoad { tp: tp.clone(), id });
    }

    /// This broker no longer leads `tp`: forget its ids and what is in flight for them.
    pub(super) fn unload_txn_partition(&mut self, tp: &TopicPartition) {
        let partition = tp.partition;
        self.txn_partitions.remove(&partition);
        let dropped = self.txns.unload(|id| txn_partition_for(id) == partition);
        if dropped > 0 {
            tracing::info!(partition = %tp, transactional_ids = dropped, "no longer coordinating these transactions");
        }
    }

    pub fn take_txn_loads(&mut self) -> Vec<TxnLoad> {
        std::mem::take(&mut self.txn_load_queue)
    }

    /// Markers of transactions caught in Prepare* by a finished load (to send again).
    pub fn take_txn_resumes(&mut self) -> Vec<TxnMarkers> {
        std::mem::take(&mut self.txn_resumes)
    }

    /// The next read of `load`, or Done when it is over (it ends here then) or stale.
    pub fn txn_load_next(&mut self, load: &TxnLoad) -> GroupLoadStep {
        loop {
            let Some(offset) =
                self.txn_partitions.get(&load.tp.partition).filter(|p| p.load == load.id).and_then(|p| p.loading)
            else {
                return GroupLoadStep::Done;
            };
            let Some(p) = self.partitions.get(&load.tp) else {
                self.txn_partitions.remove(&load.tp.partition);
                return GroupLoadStep::Done;
            };
            let end = p.log.log_end_offset();
            if offset >= end {
                self.finish_txn_load(&load.tp);
                return GroupLoadStep::Done;
            }
            match p.log.read(offset, txn_load_read_bytes_max, end, true) {
                Ok(plan) if plan.length_bytes > 0 => return GroupLoadStep::Read(plan),
                Ok(_) => {
                    let state = self.txn_partitions.get_mut(&load.tp.partition).expect("checked");
                    state.loading = Some(Offset(offset.0 + 1));
                }
                Err(LogError::OffsetOutOfRange { .. }) => {
                    self.finish_txn_load(&load.tp);
                    return GroupLoadStep::Done;
                }
                Err(e) => {
                    tracing::error!(partition = %load.tp, error = %e, "cannot load transactions");
                    self.finish_txn_load(&load.tp);
                    return GroupLoadStep::Done;
                }
            }
        }
    }

    /// The bytes `txn_load_next`'s plan read: replay the records they hold.
    pub fn txn_load_apply(&mut self, load: &TxnLoad, read: std::io::Result<Vec<u8>>) {
        let tp = &load.tp;
        let Some(offset) = self.txn_partitions.get(&tp.partition).filter(|p| p.load == load.id).and_then(|p| p.loading)
        else {
            return;
        };
        let replayed = read.map_err(|e| e.to_string()).and_then(|bytes| replay_batches(&mut self.txns, bytes, offset));
        match replayed {
            Ok((next, loaded, skipped)) => {
                let state = self.txn_partitions.get_mut(&tp.partition).expect("checked above");
                state.loaded += loaded;
                state.skipped += skipped;
                if next <= offset {
                    self.finish_txn_load(tp);
                } else {
                    state.loading = Some(next);
                }
            }
            Err(e) => {
                tracing::error!(partition = %tp, %offset, error = %e, "cannot read transaction state; stopping load");
                self.finish_txn_load(tp);
            }
        }
    }

    /// Run every queued load to its end here, reading on this thread (tools, tests).
    pub fn run_txn_loads_inline(&mut self) {
        for load in self.take_txn_loads() {
            while let GroupLoadStep::Read(plan) = self.txn_load_next(&load) {
                let read = plan.read_to_vec();
                self.txn_load_apply(&load, read);
            }
        }
    }

    fn finish_txn_load(&mut self, tp: &TopicPartition) {
        let Some(state) = self.txn_partitions.get_mut(&tp.partition) else { return };
        state.loading = None;
        let (load, coordinator_epoch) = (state.load, state.coordinator_epoch);
        if state.loaded + state.skipped > 0 {
            tracing::info!(partition = %tp, records = state.loaded, skipped = state.skipped, "loaded transaction state");
        }
        let partition = tp.partition;
        for (txn_id, markers) in self.txns.resume() {
            if txn_partition_for(&txn_id) == partition {
                self.txn_resumes.push(TxnMarkers { txn_id, load, coordinator_epoch, markers });
            }
        }
    }
}

/// Replay `__transaction_state` batches into `txns`: (next offset, loaded, skipped).
fn replay_batches(
    txns: &mut crate::txn::coordinator::TxnCoordinator,
    bytes: Vec<u8>,
    from: Offset,
) -> Result<(Offset, usize, usize), String> {
    crate::log::batch::check_batches_records(&bytes).map_err(|e| e.to_string())?;
    let mut buf = Bytes::from(bytes);
    let sets = kafka_protocol::records::RecordBatchDecoder::decode_all(&mut buf).map_err(|e| e.to_string())?;
    let (mut next, mut loaded, mut skipped) = (from, 0, 0);
    for set in sets {
        for r in set.records {
            next = next.max(Offset(r.offset + 1));
            if r.control {
                continue;
            }
            let Some(key) = r.key else { continue };
            match (log_records::decode_key(&key), log_records::decode_value(r.value.as_ref())) {
                (Ok(id), Ok(record)) => {
                    txns.load(&id, record);
                    loaded += 1;
                }
                (Err(e), _) | (_, Err(e)) => {
                    skipped += 1;
                    tracing::warn!(offset = r.offset, error = %e, "skipping transaction state record");
                }
            }
        }
    }
    Ok((next, loaded, skipped))
}

/// Whether `tp` is a `__transaction_state` partition.
pub fn is_txn_partition(tp: &TopicPartition) -> bool {
    tp.topic == TXN_TOPIC && tp.partition >= 0 && tp.partition < txn_topic_partitions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::coordinator::{TxnCoordinator, TxnState, NO_PRODUCER_ID, TRANSACTION_MAX_TIMEOUT_MS};

    fn record(state: TxnState, epoch: i16) -> TxnRecord {
        TxnRecord {
            producer_id: 7,
            previous_producer_id: NO_PRODUCER_ID,
            producer_epoch: epoch,
            timeout_ms: 60_000,
            state,
            partitions: [TopicPartition::new("t", 0)].into_iter().collect(),
            last_update_ms: 1,
            start_ms: 1,
            next_producer_id: NO_PRODUCER_ID,
            client_version: 0,
        }
    }

    fn tombstone(txn_id: &str) -> Vec<u8> {
        let records =
            vec![crate::protocol::plain_record(0, 0, 0, Some(log_records::key(txn_id)), None, Default::default())];
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
        buf.to_vec()
    }

    /// The batches a load reads, in log order: the newest record of an id wins, a
    /// tombstone removes it, and the next offset to read follows the last record.
    #[test]
    fn a_load_keeps_the_newest_record_per_id_and_drops_tombstoned_ids() {
        let mut log = Vec::new();
        log.extend(encode_batch("a", &record(TxnState::Ongoing, 0), 0).unwrap());
        log.extend(encode_batch("b", &record(TxnState::Empty, 0), 0).unwrap());
        log.extend(encode_batch("a", &record(TxnState::PrepareCommit, 0), 0).unwrap());
        log.extend(tombstone("b"));
        // Offsets as the log assigns them: one per batch here.
        let mut offset = 0i64;
        let mut pos = 0;
        while pos < log.len() {
            log[pos..pos + 8].copy_from_slice(&offset.to_be_bytes());
            let len = i32::from_be_bytes(log[pos + 8..pos + 12].try_into().unwrap()) as usize;
            pos += 12 + len;
            offset += 1;
        }
        let mut txns = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let (next, loaded, skipped) = replay_batches(&mut txns, log, Offset(0)).unwrap();
        assert_eq!((next, loaded, skipped), (Offset(4), 4, 0));
        assert_eq!(txns.get("a").map(|r| r.state), Some(TxnState::PrepareCommit));
        assert!(txns.get("b").is_none());
        let resumed = txns.resume();
        assert_eq!(resumed.len(), 1);
        assert!(resumed[0].1.commit);
    }

    #[test]
    fn malformed_bytes_stop_a_load_without_panicking() {
        let mut txns = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
        let mut bytes = encode_batch("a", &record(TxnState::Empty, 0), 0).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff; // the CRC no longer matches
        assert!(replay_batches(&mut txns, bytes, Offset(0)).is_err());
        assert!(txns.get("a").is_none());
    }

    #[test]
    fn ids_map_to_kafkas_partitions() {
        // Java: "my-group".hashCode() == -1906497762 -> abs % 50 = 12 (as the offsets topic).
        assert_eq!(txn_partition("my-group"), TopicPartition::new(TXN_TOPIC, 12));
        assert!(is_txn_partition(&txn_partition("anything")));
    }
}
