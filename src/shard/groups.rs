//! The group coordinator's side of a shard: group operations for the groups whose
//! `__consumer_offsets` partition this shard owns, and the appends of their records.
//!
//! Transactional offset commits (TxnOffsetCommit) are appended as one transactional
//! batch carrying the producer's id and epoch; their offsets wait in the coordinator
//! (`group::txn_offsets`) until the producer's marker lands in the same partition
//! (`offsets_txn_marker`, called when WriteTxnMarkers appends one; a load reads the
//! markers itself).

use bytes::{Bytes, BytesMut};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions};

use crate::group::consumer::{ConsumerHeartbeat, ConsumerHeartbeatResponse, ConsumerRefusal, TopicsImage};
use crate::group::records as group_records;
use crate::group::{
    offsets_partition_for, offsets_topic_partitions, Deferred, Described, GroupError, JoinRequest, JoinResponse,
    ListedGroup, OffsetCommit, PendingRecord, SyncRequest, SyncResponse, OFFSETS_TOPIC,
};
use crate::log::LogError;
use crate::model::{Offset, ProducerEpoch, ProducerId, TopicPartition};
use crate::txn::producer_state::{increment_sequence, NO_SEQUENCE};

use futures::channel::oneshot;

use super::{replica, DurableWait, PartitionError, PartitionOp, PartitionReply, ReplicatedWait, Shard};

/// Bytes read per step when replaying an offsets partition at startup.
const offsets_load_read_bytes_max: usize = 1024 * 1024;

/// The `__consumer_offsets` partition that holds a group.
pub fn group_partition(group_id: &str) -> TopicPartition {
    TopicPartition::new(OFFSETS_TOPIC, offsets_partition_for(group_id, offsets_topic_partitions))
}

#[derive(Debug)]
pub enum GroupOp {
    Join {
        req: JoinRequest,
        now_ms: i64,
        new_member_id: String,
    },
    Sync {
        req: SyncRequest,
        now_ms: i64,
    },
    Heartbeat {
        group_id: String,
        member_id: String,
        instance: Option<String>,
        generation: i32,
        now_ms: i64,
    },
    Leave {
        group_id: String,
        members: Vec<(String, Option<String>)>,
        now_ms: i64,
    },
    Commit {
        group_id: String,
        member_id: String,
        instance: Option<String>,
        generation: i32,
        offsets: Vec<OffsetCommit>,
        now_ms: i64,
        durable: bool,
        /// OffsetCommit v9+: `generation` may be a consumer-protocol member's epoch.
        member_epochs: bool,
    },
    FetchOffsets {
        group_id: String,
        partitions: Option<Vec<(String, i32)>>,
        /// OffsetFetch v7+: partitions with offsets in an open transaction are answered
        /// UNSTABLE_OFFSET_COMMIT.
        require_stable: bool,
        /// OffsetFetch v9: the member asking, at its epoch (checked in consumer groups).
        member: Option<(String, i32)>,
    },
    /// ConsumerGroupHeartbeat (KIP-848); `new_member_id` names a member joining
    /// without one (v0).
    ConsumerHeartbeat {
        req: ConsumerHeartbeat,
        now_ms: i64,
        new_member_id: String,
        /// Whose DESCRIBE a regex resolved by this heartbeat keeps (None: no authorizer).
        describe: Option<Box<DescribeFilter>>,
    },
    /// TxnOffsetCommit: offsets that become visible when the producer's transaction
    /// commits.
    TxnCommit {
        group_id: String,
        producer_id: i64,
        producer_epoch: i16,
        member_id: String,
        instance: Option<String>,
        generation: i32,
        offsets: Vec<OffsetCommit>,
        now_ms: i64,
        durable: bool,
    },
    /// Every group this shard coordinates (ListGroups fans out to all shards).
    List,
    Describe {
        group_id: String,
    },
    /// DeleteGroups; the answer waits for the tombstones' write (and, when `durable`,
    /// their fsync), as Kafka answers after its local append.
    Delete {
        group_id: String,
        now_ms: i64,
        durable: bool,
    },
    /// OffsetDelete; waits as `Delete`.
    DeleteOffsets {
        group_id: String,
        partitions: Vec<(String, i32)>,
        now_ms: i64,
        durable: bool,
    },
    /// Waits for every record the group's offsets partition holds so far: replicated
    /// to its in-sync replicas (so written here), and fsynced when `durable`. SyncGroup
    /// answers after it, as Kafka answers once the group's metadata is stored.
    Stored {
        group_id: String,
        durable: bool,
    },
}

impl GroupOp {
    /// The group whose coordinator must run this (None: any shard, e.g. List).
    pub fn group_id(&self) -> Option<&str> {
        match self {
            GroupOp::Join { req, .. } => Some(&req.group_id),
            GroupOp::Sync { req, .. } => Some(&req.group_id),
            GroupOp::ConsumerHeartbeat { req, .. } => Some(&req.group_id),
            GroupOp::Heartbeat { group_id, .. }
            | GroupOp::Leave { group_id, .. }
            | GroupOp::Commit { group_id, .. }
            | GroupOp::TxnCommit { group_id, .. }
            | GroupOp::FetchOffsets { group_id, .. }
            | GroupOp::Describe { group_id }
            | GroupOp::Delete { group_id, .. }
            | GroupOp::DeleteOffsets { group_id, .. }
            | GroupOp::Stored { group_id, .. } => Some(group_id),
            GroupOp::List => None,
        }
    }
}

/// OffsetFetch's answer: per partition, the committed offset (None: none), or
/// UNSTABLE_OFFSET_COMMIT.
pub type OffsetList = Vec<(String, i32, Result<Option<group_records::StoredOffset>, GroupError>)>;

/// Why a TxnOffsetCommit was refused as a whole.
#[derive(Debug)]
pub enum TxnCommitRefusal {
    /// The group refused it (KIP-447's checks).
    Group(GroupError),
    /// Its batch was not appended (a fenced producer epoch, a moved leadership...).
    Append(PartitionError),
}

pub enum GroupReply {
    Join(Deferred<JoinResponse>),
    Sync(Deferred<SyncResponse>),
    Heartbeat(Result<(), GroupError>),
    Leave(Result<Vec<Result<(), GroupError>>, GroupError>),
    /// Per-partition results; `Err(Some(..))` on the whole request for a group error,
    /// `Err(None)` when the offsets could not be written.
    Commit {
        results: Result<Vec<Result<(), GroupError>>, Option<GroupError>>,
        /// The records' write, and their fsync when asked: the answer waits for all.
        waits: Vec<DurableWait>,
        /// The in-sync replicas having the records (acks=all, as Kafka writes offsets):
        /// a commit acknowledged survives the coordinator's broker.
        replicated: Option<ReplicatedWait>,
    },
    /// TxnOffsetCommit: as `Commit`; the offsets stay pending until the marker.
    TxnCommit {
        results: Result<Vec<Result<(), GroupError>>, TxnCommitRefusal>,
        waits: Vec<DurableWait>,
        replicated: Option<ReplicatedWait>,
    },
    /// Err: the whole fetch refused (OffsetFetch v9's member check).
    Offsets(Result<OffsetList, GroupError>),
    List(Vec<ListedGroup>),
    Describe(Option<Described>),
    /// `wrote`: the heartbeat changed the group's records; the answer waits until they
    /// are stored (`GroupOp::Stored`), as Kafka answers once its records are committed.
    ConsumerHeartbeat {
        result: Result<ConsumerHeartbeatResponse, ConsumerRefusal>,
        wrote: bool,
    },
    /// `waits`: the tombstones' write and fsync; None when they could not be appended.
    Delete {
        result: Result<(), GroupError>,
        waits: Option<Vec<DurableWait>>,
    },
    DeleteOffsets {
        result: Result<Vec<Result<(), GroupError>>, GroupError>,
        waits: Option<Vec<DurableWait>>,
    },
    /// `Stored`: the fsync wait (when asked and owed), and the wait for the in-sync
    /// replicas (None when nothing is written yet).
    Stored {
        waits: Vec<DurableWait>,
        replicated: Option<ReplicatedWait>,
    },
    /// This shard does not lead the group's offsets partition (yet, or any more): its
    /// groups are not loaded here. Answered COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR.
    Unavailable,
    /// This shard leads the group's offsets partition and is loading its groups from the
    /// log (off the core). Answered COORDINATOR_LOAD_IN_PROGRESS: clients retry.
    Loading,
}

/// The loading of a `__consumer_offsets` partition's groups, which this shard started
/// when it took the partition's leadership: the runtime reads the log off the data core
/// (`Shard::group_load_next`, a read plan; `Shard::group_load_apply`, the bytes read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLoad {
    pub tp: TopicPartition,
    /// Which load of the partition (a later leadership starts another).
    pub id: u64,
}

/// Where a load is.
#[derive(Debug)]
pub struct GroupLoadState {
    id: u64,
    /// The next offset to read.
    offset: Offset,
    loaded: usize,
    skipped: usize,
    /// Groups of the partition this shard held before and replaced.
    replaced: usize,
}

/// What a load does next.
pub enum GroupLoadStep {
    /// Read this (off the core) and hand the bytes to `group_load_apply`.
    Read(crate::log::ReadPlan),
    /// The load is over, or was replaced or cancelled (the leadership moved on).
    Done,
}

impl std::fmt::Debug for GroupReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupReply")
    }
}

/// The principal (and its address) of the heartbeat that resolves a group's subscription
/// regexes: the topics it may not DESCRIBE are left out of the resolution, which the
/// whole group then uses until the topics change (Kafka's
/// `TopicRegexResolver.filterTopicDescribeAuthorizedTopics`, with the triggering
/// member's request context). A left-out topic is not an attempt: no denial is logged.
#[derive(Debug, Clone)]
pub struct DescribeFilter {
    pub authorizer: std::sync::Arc<crate::security::acl::AuthorizerConfig>,
    pub principal: std::sync::Arc<crate::security::Principal>,
    pub host: String,
}

/// The shard's view of the cluster's topics, as a consumer group's assignor sees them.
struct ViewTopics<'a>(&'a super::ClusterView, Option<&'a DescribeFilter>);

impl TopicsImage for ViewTopics<'_> {
    fn topic(&self, name: &str) -> Option<(uuid::Uuid, i32)> {
        self.0.get(name).map(|t| (t.id, t.partitions))
    }

    /// Internal topics are never matched (Kafka's regex resolution leaves them out), nor
    /// those the heartbeat's principal may not describe.
    fn matching(&self, regex: &regex::Regex) -> Vec<String> {
        use crate::security::acl::{AclOperation, ResourceType};
        let described = |t: &str| {
            self.1.is_none_or(|f| {
                f.authorizer.authorize(
                    self.0.acls(),
                    &f.principal,
                    &f.host,
                    AclOperation::Describe,
                    ResourceType::Topic,
                    t,
                )
            })
        };
        self.0
            .topics()
            .map(|(name, _)| name)
            .filter(|t| !t.starts_with("__") && regex.is_match(t) && described(t))
            .cloned()
            .collect()
    }

    fn generation(&self) -> u64 {
        self.0.generation()
    }
}

/// Does a consumer-protocol subscription name this topic?
fn subscription_names(metadata: &[u8], topic: &str) -> bool {
    use kafka_protocol::messages::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::Decodable;
    let mut buf = Bytes::copy_from_slice(metadata);
    if buf.len() < 2 {
        return false;
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = bytes::Buf::get_i16(&mut buf);
    let version = version.clamp(0, 3);
    let shape = &crate::protocol::shape::CONSUMER_PROTOCOL_SUBSCRIPTION;
    if crate::protocol::shape::check_embedded(shape, version, &buf).is_err() {
        return false;
    }
    ConsumerProtocolSubscription::decode(&mut buf, version)
        .map(|s| s.topics.iter().any(|t| t.as_str() == topic))
        .unwrap_or(false)
}

/// A transactional batch's producer: id, epoch and the batch's base sequence.
#[derive(Debug, Clone, Copy)]
struct TxnProducer {
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
}

/// Encode `__consumer_offsets` records as one uncompressed batch; a transactional one
/// when `txn` names the producer.
fn encode_batch(recs: &[PendingRecord], now_ms: i64, txn: Option<TxnProducer>) -> Result<Vec<u8>, LogError> {
    let records: Vec<Record> = recs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut record = crate::protocol::plain_record(
                i as i64,
                0,
                now_ms,
                Some(r.key.clone()),
                r.value.clone(),
                Default::default(),
            );
            if let Some(t) = txn {
                record.transactional = true;
                record.producer_id = t.producer_id;
                record.producer_epoch = t.producer_epoch;
                record.sequence = increment_sequence(t.base_sequence, i as i32);
            }
            record
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .map_err(|e| LogError::InvalidRecord(format!("encoding offsets batch: {e}")))?;
    Ok(buf.to_vec())
}

impl Shard {
    /// Append group records to their offsets partition with `acks` (1 or -1), in a
    /// transactional batch of `txn`'s producer (id, epoch) when given. Returns the
    /// write and durability waits, with acks=-1 the replication wait, and the batch's
    /// base offset (-1 when there was nothing to append).
    fn append_group_records(
        &mut self,
        recs: &[PendingRecord],
        now_ms: i64,
        durable: bool,
        acks: i16,
        txn: Option<(i64, i16)>,
    ) -> Result<(Vec<DurableWait>, Option<ReplicatedWait>, i64), PartitionError> {
        let Some(first) = recs.first() else { return Ok((Vec::new(), None, -1)) };
        let tp = group_partition(&first.group_id);
        assert!(recs.iter().all(|r| group_partition(&r.group_id) == tp), "one group's records share a partition");
        let txn = txn.map(|(producer_id, producer_epoch)| TxnProducer {
            producer_id,
            producer_epoch,
            base_sequence: self.coordinator_sequence(&tp, producer_id, producer_epoch),
        });
        let batch = encode_batch(recs, now_ms, txn)?;
        match self.execute(PartitionOp::Produce {
            tp: tp.clone(),
            records: Bytes::from(batch),
            now_ms,
            durable,
            acks,
            verification: crate::log::TxnVerification::Off,
        })? {
            PartitionReply::Produced { duplicate: true, .. } => {
                // Cannot happen: the sequence continues the producer's last one here.
                Err(PartitionError::Log(LogError::InvalidRecord(format!(
                    "{tp}: the coordinator's transactional batch was taken for a duplicate"
                ))))
            }
            PartitionReply::Produced { info, written, durable, replicated, .. } => {
                Ok((written.into_iter().chain(durable).collect(), replicated, info.base_offset.0))
            }
            other => unreachable!("Produce answered {other:?}"),
        }
    }

    /// The base sequence of the group coordinator's next transactional batch of
    /// `producer_id` on offsets partition `tp`. Kafka writes 0 and skips the sequence
    /// check for its coordinator's appends (`AppendOrigin.COORDINATOR`); Spate's log
    /// checks every producer batch, so the coordinator continues the producer's
    /// sequence on this partition (0 for a new producer or a newer epoch). Only the
    /// coordinator writes a transactional producer's batches to `__consumer_offsets`,
    /// and this shard alone appends to it, so the check that follows passes.
    fn coordinator_sequence(&self, tp: &TopicPartition, producer_id: i64, producer_epoch: i16) -> i32 {
        let Some(p) = self.partitions.get(tp) else { return 0 };
        match p.log.producer_states().get(ProducerId(producer_id)) {
            Some(e) if e.epoch == ProducerEpoch(producer_epoch) && e.last_seq() != NO_SEQUENCE => {
                increment_sequence(e.last_seq(), 1)
            }
            _ => 0,
        }
    }

    /// Write what the coordinator produced (group metadata, tombstones), not waited for
    /// here (SyncGroup and a static member's JoinGroup then wait through
    /// `GroupOp::Stored`). Best effort: a failure is logged; the in-memory state stays
    /// authoritative until restart.
    fn flush_group_records(&mut self, now_ms: i64) {
        let _ = self.write_group_records(now_ms, false);
    }

    /// Write what the coordinator produced with acks=1 (an fsync too when `durable`):
    /// the write and fsync waits, or None when an append failed (logged).
    fn write_group_records(&mut self, now_ms: i64, durable: bool) -> Option<Vec<DurableWait>> {
        let pending = self.groups.take_pending_records();
        let mut by_group: Vec<(String, Vec<PendingRecord>)> = Vec::new();
        for r in pending {
            match by_group.iter_mut().find(|(g, _)| group_partition(g) == group_partition(&r.group_id)) {
                Some((_, v)) => v.push(r),
                None => by_group.push((r.group_id.clone(), vec![r])),
            }
        }
        let mut waits = Some(Vec::new());
        for (group, recs) in by_group {
            match self.append_group_records(&recs, now_ms, durable, 1, None) {
                Ok((w, _, _)) => {
                    if let Some(all) = waits.as_mut() {
                        all.extend(w);
                    }
                }
                Err(e) => {
                    tracing::error!(group, error = %e, "writing group records failed");
                    waits = None;
                }
            }
        }
        waits
    }

    /// `GroupOp::Stored` on offsets partition `tp` (led here: checked by the caller).
    fn stored_so_far(&mut self, tp: &TopicPartition, durable: bool) -> GroupReply {
        let p = self.partitions.get_mut(tp).expect("the group's partition is led here");
        let last = Offset(p.log.log_end_offset().0 - 1);
        if last.0 < 0 {
            return GroupReply::Stored { waits: Vec::new(), replicated: None };
        }
        let (tx, rx) = oneshot::channel();
        replica::wait_for_hw(p, last, tx);
        let mut waits = Vec::new();
        if durable && last >= p.log.recovery_point() {
            let (tx, rx) = oneshot::channel();
            p.durable_waiters.push((last, tx));
            super::note_durable_waiting(&mut self.durable_waiting, tp);
            waits.push(rx);
        }
        GroupReply::Stored { waits, replicated: Some(rx) }
    }

    pub fn execute_group(&mut self, op: GroupOp) -> GroupReply {
        if let Some(g) = op.group_id() {
            let tp = group_partition(g);
            assert!(self.owns(&tp), "shard {} got group {g} coordinated by another shard", self.id.0);
            if self.partitions.get(&tp).is_none_or(|p| p.replica.leader_state().is_none()) {
                return GroupReply::Unavailable;
            }
            if self.group_loads.contains_key(&tp.partition) {
                return GroupReply::Loading;
            }
        }
        let mut now = 0;
        let reply = match op {
            GroupOp::Join { req, now_ms, new_member_id } => {
                now = now_ms;
                GroupReply::Join(self.groups.join(req, now_ms, new_member_id))
            }
            GroupOp::Sync { req, now_ms } => {
                now = now_ms;
                GroupReply::Sync(self.groups.sync(req, now_ms))
            }
            GroupOp::Heartbeat { group_id, member_id, instance, generation, now_ms } => GroupReply::Heartbeat(
                self.groups.heartbeat(&group_id, &member_id, instance.as_deref(), generation, now_ms),
            ),
            GroupOp::Leave { group_id, members, now_ms } => {
                now = now_ms;
                GroupReply::Leave(self.groups.leave(&group_id, &members, now_ms))
            }
            GroupOp::Commit { group_id, member_id, instance, generation, offsets, now_ms, durable, member_epochs } => {
                let checked = self
                    .groups
                    .check_commit_version(&group_id, &member_id, member_epochs)
                    .and_then(|()| self.groups.validate_commit(&group_id, &member_id, instance.as_deref(), generation));
                match checked {
                    Err(e) => GroupReply::Commit { results: Err(Some(e)), waits: Vec::new(), replicated: None },
                    Ok(()) => {
                        let (recs, results) = self.groups.commit_records(&group_id, &offsets, now_ms);
                        match self.append_group_records(&recs, now_ms, durable, -1, None) {
                            Ok((waits, replicated, base_offset)) => {
                                for r in recs {
                                    match group_records::decode(&r.key, r.value.as_ref()) {
                                        Ok(rec) => self.groups.apply_record(rec, base_offset, now_ms),
                                        Err(e) => unreachable!("we just encoded this record: {e}"),
                                    }
                                }
                                GroupReply::Commit { results: Ok(results), waits, replicated }
                            }
                            Err(e) => {
                                tracing::error!(group = %group_id, error = %e, "offset commit not written");
                                GroupReply::Commit { results: Err(None), waits: Vec::new(), replicated: None }
                            }
                        }
                    }
                }
            }
            GroupOp::TxnCommit {
                group_id,
                producer_id,
                producer_epoch,
                member_id,
                instance,
                generation,
                offsets,
                now_ms,
                durable,
            } => self.txn_commit(
                &group_id,
                (producer_id, producer_epoch),
                (&member_id, instance.as_deref(), generation),
                &offsets,
                now_ms,
                durable,
            ),
            GroupOp::FetchOffsets { group_id, partitions, require_stable, member } => GroupReply::Offsets(
                self.groups
                    .validate_fetch(&group_id, member.as_ref().map(|(m, e)| (m.as_str(), *e)))
                    .map(|()| self.groups.fetch_offsets(&group_id, partitions.as_deref(), require_stable)),
            ),
            GroupOp::ConsumerHeartbeat { req, now_ms, new_member_id, describe } => {
                now = now_ms;
                let topics = ViewTopics(&self.view, describe.as_deref());
                let result = self.groups.consumer_heartbeat(&req, &topics, now_ms, &new_member_id);
                GroupReply::ConsumerHeartbeat { result, wrote: self.groups.has_pending_records() }
            }
            // While a load runs, the list is not whole (Kafka answers the same).
            GroupOp::List if !self.group_loads.is_empty() => GroupReply::Loading,
            GroupOp::List => GroupReply::List(self.groups.list()),
            GroupOp::Describe { group_id } => GroupReply::Describe(self.groups.describe(&group_id)),
            GroupOp::Delete { group_id, now_ms, durable } => {
                let result = self.groups.delete_group(&group_id);
                return GroupReply::Delete { result, waits: self.write_group_records(now_ms, durable) };
            }
            GroupOp::Stored { group_id, durable } => return self.stored_so_far(&group_partition(&group_id), durable),
            GroupOp::DeleteOffsets { group_id, partitions, now_ms, durable } => {
                let result = self.groups.delete_offsets(&group_id, &partitions, subscription_names);
                return GroupReply::DeleteOffsets { result, waits: self.write_group_records(now_ms, durable) };
            }
        };
        self.flush_group_records(now);
        reply
    }

    /// TxnOffsetCommit: checked by the group (KIP-447), appended as one transactional
    /// batch of the producer with acks=all, then pending in the coordinator until the
    /// producer's marker. The producer's epoch is checked by the log's append (a fenced
    /// one is refused there, as Kafka's coordinator append is). Producer id -1 is a
    /// plain commit (Kafka's behaviour).
    fn txn_commit(
        &mut self,
        group_id: &str,
        (producer_id, producer_epoch): (i64, i16),
        (member_id, instance, generation): (&str, Option<&str>, i32),
        offsets: &[OffsetCommit],
        now_ms: i64,
        durable: bool,
    ) -> GroupReply {
        let refused = |why| GroupReply::TxnCommit { results: Err(why), waits: Vec::new(), replicated: None };
        if let Err(e) = self.groups.validate_txn_commit(group_id, member_id, instance, generation) {
            return refused(TxnCommitRefusal::Group(e));
        }
        let (recs, results) = self.groups.commit_records(group_id, offsets, now_ms);
        // As Kafka (both coordinators: `isTxnOffsetCommit = producerId != NO_PRODUCER_ID`),
        // producer id -1 writes a plain commit, visible at once.
        let txn = (producer_id != crate::model::ProducerId::NONE.0).then_some((producer_id, producer_epoch));
        match self.append_group_records(&recs, now_ms, durable, -1, txn) {
            Ok((waits, replicated, base_offset)) => {
                for r in recs {
                    match group_records::decode(&r.key, r.value.as_ref()) {
                        Ok(rec) if txn.is_some() => self.groups.apply_txn_record(rec, producer_id, base_offset, now_ms),
                        Ok(rec) => self.groups.apply_record(rec, base_offset, now_ms),
                        Err(e) => unreachable!("we just encoded this record: {e}"),
                    }
                }
                GroupReply::TxnCommit { results: Ok(results), waits, replicated }
            }
            Err(e) => {
                tracing::warn!(group = group_id, producer_id, producer_epoch, error = %e,
                    "transactional offset commit not written");
                refused(TxnCommitRefusal::Append(e))
            }
        }
    }

    /// A marker of `producer_id`'s transaction (`committed`: COMMIT, else ABORT) was
    /// appended on offsets partition `tp`, which this shard leads (`PartitionOp::
    /// WriteMarker`, before it is replicated: the coordinator resends the same outcome
    /// to a new leader until it lands, and a new leader's load reads its own log): the producer's pending offsets of that partition's
    /// groups become committed (unless a later non-transactional commit of the same
    /// partition is there) or are dropped. While the partition loads, nothing is done
    /// here: the load reads the log to its end, the marker included. As Kafka, the
    /// producer's epoch is not compared.
    pub(super) fn offsets_txn_marker(
        &mut self,
        tp: &TopicPartition,
        producer_id: i64,
        producer_epoch: i16,
        committed: bool,
    ) {
        assert_eq!(tp.topic, OFFSETS_TOPIC, "a group marker on {tp}");
        assert!(self.owns(tp), "shard {} got the marker of {tp}, owned by another shard", self.id.0);
        if self.group_loads.contains_key(&tp.partition) {
            return;
        }
        let completed = self.groups.complete_txn(tp.partition, offsets_topic_partitions, producer_id, committed);
        tracing::debug!(partition = %tp, producer_id, producer_epoch, committed, completed,
            "transaction marker applied to pending offsets");
    }

    /// Timers of the groups this shard coordinates.
    pub fn group_tick(&mut self, now_ms: i64) {
        self.groups.tick(now_ms);
        self.flush_group_records(now_ms);
    }

    /// This broker took the leadership of offsets partition `tp` (at start, or from
    /// another broker): rebuild its groups and offsets from the log, replacing whatever
    /// this shard held of them. The log is read off the data core, a bounded chunk at a
    /// time (`take_group_loads`, `group_load_next`, `group_load_apply`); until the load
    /// is over the partition's group requests are answered COORDINATOR_LOAD_IN_PROGRESS,
    /// so nothing is answered from a half-loaded state.
    pub(super) fn load_group_partition(&mut self, tp: &TopicPartition, _now_ms: i64) {
        let replaced = self.groups.unload_partition(tp.partition, offsets_topic_partitions);
        let Some(p) = self.partitions.get(tp) else { return };
        let id = self.next_group_load_id;
        self.next_group_load_id += 1;
        let offset = p.log.log_start_offset();
        self.group_loads.insert(tp.partition, GroupLoadState { id, offset, loaded: 0, skipped: 0, replaced });
        self.group_load_queue.push(GroupLoad { tp: tp.clone(), id });
    }

    /// Group loads to run (the runtime reads for them off the core).
    pub fn take_group_loads(&mut self) -> Vec<GroupLoad> {
        std::mem::take(&mut self.group_load_queue)
    }

    /// Whether `tp`'s groups are being loaded.
    pub fn group_load_in_progress(&self, tp: &TopicPartition) -> bool {
        tp.topic == OFFSETS_TOPIC && self.group_loads.contains_key(&tp.partition)
    }

    /// The next read of `load`: a plan of at most `offsets_load_read_bytes_max` bytes, or
    /// Done when the load is over (it ends here then) or no longer current.
    pub fn group_load_next(&mut self, load: &GroupLoad) -> GroupLoadStep {
        loop {
            let Some(state) = self.group_loads.get(&load.tp.partition).filter(|s| s.id == load.id) else {
                return GroupLoadStep::Done;
            };
            let offset = state.offset;
            let Some(p) = self.partitions.get(&load.tp) else {
                self.group_loads.remove(&load.tp.partition);
                return GroupLoadStep::Done;
            };
            let end = p.log.log_end_offset();
            if offset >= end {
                self.finish_group_load(&load.tp);
                return GroupLoadStep::Done;
            }
            match p.log.read(offset, offsets_load_read_bytes_max, end, true) {
                Ok(plan) if plan.length_bytes > 0 => return GroupLoadStep::Read(plan),
                // A gap (e.g. after truncation): move to the next segment's batches.
                Ok(_) => self.group_loads.get_mut(&load.tp.partition).expect("checked").offset = Offset(offset.0 + 1),
                Err(LogError::OffsetOutOfRange { .. }) => {
                    self.finish_group_load(&load.tp);
                    return GroupLoadStep::Done;
                }
                Err(e) => {
                    tracing::error!(partition = %load.tp, error = %e, "cannot load groups");
                    self.finish_group_load(&load.tp);
                    return GroupLoadStep::Done;
                }
            }
        }
    }

    /// The bytes `group_load_next`'s plan read (off the core): replay the group and
    /// offset records they hold. A stale load (the leadership moved on) is ignored.
    pub fn group_load_apply(&mut self, load: &GroupLoad, read: std::io::Result<Vec<u8>>, now_ms: i64) {
        let Some(offset) = self.group_loads.get(&load.tp.partition).filter(|s| s.id == load.id).map(|s| s.offset)
        else {
            return;
        };
        let tp = &load.tp;
        let bytes = match read {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(partition = %tp, error = %e, "cannot load groups");
                self.finish_group_load(tp);
                return;
            }
        };
        let (next, loaded, skipped) =
            match self.groups.replay_batches(bytes, offset, tp.partition, offsets_topic_partitions, now_ms) {
                Ok(replayed) => replayed,
                Err(e) => {
                    tracing::error!(partition = %tp, %offset, error = %e, "malformed offsets batch; stopping load");
                    self.finish_group_load(tp);
                    return;
                }
            };
        let state = self.group_loads.get_mut(&tp.partition).expect("checked above");
        state.loaded += loaded;
        state.skipped += skipped;
        if next <= offset {
            self.finish_group_load(tp);
        } else {
            state.offset = next;
        }
    }

    /// Run every queued group load to its end here, reading on this thread (for tools
    /// and harnesses that have no blocking pool; the broker uses `take_group_loads`).
    pub fn run_group_loads_inline(&mut self, now_ms: i64) {
        for load in self.take_group_loads() {
            while let GroupLoadStep::Read(plan) = self.group_load_next(&load) {
                let read = plan.read_to_vec();
                self.group_load_apply(&load, read, now_ms);
            }
        }
    }

    fn finish_group_load(&mut self, tp: &TopicPartition) {
        let Some(state) = self.group_loads.remove(&tp.partition) else { return };
        if state.loaded + state.skipped + state.replaced > 0 {
            tracing::info!(partition = %tp, records = state.loaded, skipped = state.skipped,
                replaced_groups = state.replaced, "loaded groups and offsets");
        }
        // Restored groups must not write anything before they are touched.
        self.groups.discard_pending_records(tp.partition, offsets_topic_partitions);
    }

    /// This broker no longer leads offsets partition `tp`: forget its groups (their
    /// waiting requests are answered NOT_COORDINATOR; the new leader loads them).
    pub(super) fn unload_group_partition(&mut self, tp: &TopicPartition) {
        self.group_loads.remove(&tp.partition);
        let dropped = self.groups.unload_partition(tp.partition, offsets_topic_partitions);
        if dropped > 0 {
            tracing::info!(partition = %tp, groups = dropped, "no longer coordinating the groups of this partition");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::TopicConfig;
    use crate::coordinator::controller::Endpoint;
    use crate::coordinator::owner::Metadata;
    use crate::coordinator::registry::{LocalBroker, Registry};
    use crate::coordinator::store::LocalStore;
    use crate::group::records::StoredOffset;
    use crate::model::{NodeId, ShardId};

    const NOW_MS: i64 = 1_000;
    /// In `__consumer_offsets`-12 ("my-group".hashCode() % 50).
    const GROUP: &str = "my-group";

    /// One broker, one shard, leading every `__consumer_offsets` partition (loaded).
    fn coordinator_shard(store: &Path, data: &Path) -> Shard {
        let broker = LocalBroker { id: NodeId(1), endpoint: Endpoint::new("127.0.0.1", 9091), rack: None, shards: 1 };
        let mut r = Registry::open(Box::new(LocalStore::open(store).unwrap()), broker, 1_000).unwrap();
        let compact = TopicConfig::from_pairs([("cleanup.policy", Some("compact"))], &Default::default()).unwrap();
        r.create_replicated(OFFSETS_TOPIC, offsets_topic_partitions, 1, compact).unwrap();
        let metadata = Metadata::start(r).unwrap();
        let mut shard = Shard::new(
            ShardId(0),
            1,
            data.to_path_buf(),
            metadata,
            Default::default(),
            crate::group::GroupConfig::default(),
        );
        shard.sync_registry();
        let jobs = shard.take_open_jobs();
        shard.install_opened_later(super::super::open_logs(jobs, NOW_MS), NOW_MS);
        shard.sync_registry();
        shard.run_group_loads_inline(NOW_MS);
        let tp = group_partition(GROUP);
        assert!(shard.partitions[&tp].replica.leader_state().is_some(), "leads {tp}");
        shard
    }

    fn fetch(shard: &mut Shard, partitions: &[(&str, i32)], require_stable: bool) -> Vec<Result<i64, GroupError>> {
        let op = GroupOp::FetchOffsets {
            group_id: GROUP.into(),
            partitions: Some(partitions.iter().map(|(t, p)| (t.to_string(), *p)).collect()),
            require_stable,
            member: None,
        };
        match shard.execute_group(op) {
            GroupReply::Offsets(Ok(list)) => {
                list.into_iter().map(|(_, _, o)| o.map(|o| o.map_or(-1, |o| o.offset))).collect()
            }
            other => panic!("FetchOffsets answered {other:?}"),
        }
    }

    /// A batch of offset records of GROUP at `base_offset`, as a leader stored it.
    fn offsets_batch(base_offset: i64, producer: Option<(i64, i16, i32)>, offsets: &[(&str, i32, i64)]) -> Vec<u8> {
        let recs: Vec<PendingRecord> = offsets
            .iter()
            .map(|(t, p, o)| PendingRecord {
                group_id: GROUP.into(),
                key: group_records::offset_key(GROUP, t, *p),
                value: Some(group_records::offset_value(&StoredOffset {
                    offset: *o,
                    leader_epoch: -1,
                    metadata: String::new(),
                    commit_timestamp_ms: NOW_MS,
                })),
            })
            .collect();
        let txn = producer.map(|(producer_id, producer_epoch, base_sequence)| TxnProducer {
            producer_id,
            producer_epoch,
            base_sequence,
        });
        let mut b = encode_batch(&recs, NOW_MS, txn).unwrap();
        b[..8].copy_from_slice(&base_offset.to_be_bytes()); // outside the CRC
        b
    }

    fn marker(base_offset: i64, producer_id: i64, producer_epoch: i16, commit: bool) -> Vec<u8> {
        use crate::log::batch::{encode_marker, ControlMarker};
        let mut b = encode_marker(producer_id, producer_epoch, ControlMarker { commit, coordinator_epoch: 0 }, NOW_MS);
        b[..8].copy_from_slice(&base_offset.to_be_bytes());
        b
    }

    /// SyncGroup's answer waits for `GroupOp::Stored`: nothing to wait for before the
    /// group wrote anything; after the leader's assignment, the in-sync replicas (here
    /// the leader alone: at once) and, durable, an fsync round over the group's record.
    #[test]
    fn stored_waits_for_the_record_the_leaders_sync_wrote() {
        let (store, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut shard = coordinator_shard(store.path(), data.path());
        let stored =
            |shard: &mut Shard| match shard.execute_group(GroupOp::Stored { group_id: GROUP.into(), durable: true }) {
                GroupReply::Stored { waits, replicated } => (waits, replicated),
                other => panic!("Stored answered {other:?}"),
            };
        let (waits, replicated) = stored(&mut shard);
        assert!(waits.is_empty() && replicated.is_none(), "nothing written yet");

        let join = JoinRequest {
            group_id: GROUP.into(),
            member_id: String::new(),
            group_instance_id: Some("i1".into()),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::new())],
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 10_000,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            require_known_member_id: false,
            reason: None,
        };
        let op = GroupOp::Join { req: join, now_ms: NOW_MS, new_member_id: "m1".into() };
        let GroupReply::Join(Deferred::Later(mut joined)) = shard.execute_group(op) else { panic!("join") };
        shard.group_tick(NOW_MS + 10_000); // past the initial rebalance delay
        let joined = joined.try_recv().unwrap().expect("the join completed");
        assert!(joined.error.is_none(), "{joined:?}");
        let sync = SyncRequest {
            group_id: GROUP.into(),
            member_id: "m1".into(),
            group_instance_id: Some("i1".into()),
            generation_id: joined.generation_id,
            protocol_type: None,
            protocol_name: None,
            assignments: vec![("m1".into(), Bytes::from_static(b"mine"))],
        };
        let op = GroupOp::Sync { req: sync, now_ms: NOW_MS + 10_000 };
        let GroupReply::Sync(Deferred::Later(mut synced)) = shard.execute_group(op) else { panic!("sync") };
        assert!(synced.try_recv().unwrap().is_some_and(|r| r.error.is_none()));

        let (mut waits, replicated) = stored(&mut shard);
        let replicated = futures::executor::block_on(replicated.expect("a record to replicate"));
        assert!(matches!(replicated, Ok(Ok(()))), "the only in-sync replica has it");
        assert_eq!(waits.len(), 1, "an fsync owed");
        assert!(matches!(waits[0].try_recv(), Ok(None)), "answered before a round");
        let round = shard.take_flush_batch();
        let synced = round.items.into_iter().map(|(tp, h)| (tp, h.flushed, h.sync())).collect::<Vec<_>>();
        shard.complete_flush(synced);
        assert!(matches!(waits[0].try_recv(), Ok(Some(Ok(())))), "the round's");
        let (waits, _) = stored(&mut shard);
        assert!(waits.is_empty(), "nothing left to fsync");
    }

    /// A new leader of an offsets partition loads it from the log (read in chunks off
    /// the core in the broker, inline here): transactional batches wait for their
    /// producer's marker (UNSTABLE_OFFSET_COMMIT for read_committed consumers until
    /// then); WriteTxnMarkers' COMMIT publishes them, ABORT drops them, each in its
    /// producer's transaction only. The batches are written as a follower stores its
    /// leader's. (Markers read back by a load: `txn_offset_commit_waits_for_the_marker`,
    /// and `a_load_replays_transactions` in group::txn_offsets.)
    #[test]
    fn a_leader_loads_transactional_offsets_then_markers_land() {
        let (store, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut shard = coordinator_shard(store.path(), data.path());
        let tp = group_partition(GROUP);
        let mut log = Vec::new();
        log.extend(offsets_batch(0, None, &[("t", 0, 1), ("t", 1, 1), ("t", 2, 1)]));
        log.extend(offsets_batch(3, Some((5, 0, 0)), &[("t", 0, 50)]));
        log.extend(offsets_batch(4, Some((6, 0, 0)), &[("t", 1, 60)]));
        log.extend(offsets_batch(5, Some((7, 0, 0)), &[("t", 2, 70)]));
        let p = shard.partitions.get_mut(&tp).unwrap();
        p.log.append_replicated(&log, NOW_MS).unwrap();
        assert_eq!(p.log.log_end_offset(), Offset(6));

        shard.load_group_partition(&tp, NOW_MS);
        assert!(matches!(shard.execute_group(GroupOp::List), GroupReply::Loading));
        shard.offsets_txn_marker(&tp, 5, 0, true); // while loading: the load reads the log instead
        shard.run_group_loads_inline(NOW_MS);
        let all = [("t", 0), ("t", 1), ("t", 2)];
        let unstable = Err(GroupError::UnstableOffsetCommit);
        assert_eq!(fetch(&mut shard, &all, false), vec![Ok(1), Ok(1), Ok(1)]);
        assert_eq!(fetch(&mut shard, &all, true), vec![unstable, unstable, unstable]);

        shard.offsets_txn_marker(&tp, 5, 0, true);
        shard.offsets_txn_marker(&tp, 6, 0, false);
        assert_eq!(fetch(&mut shard, &all, true), vec![Ok(50), Ok(1), unstable]);
        shard.offsets_txn_marker(&tp, 7, 0, true);
        assert_eq!(fetch(&mut shard, &all, true), vec![Ok(50), Ok(1), Ok(70)]);
    }

    /// Producer id -1 (no producer) commits at once, as Kafka's coordinators do; the
    /// group's KIP-447 checks still apply.
    #[test]
    fn txn_offset_commit_without_a_producer_is_a_plain_commit() {
        let (store, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut shard = coordinator_shard(store.path(), data.path());
        let op = |generation: i32| GroupOp::TxnCommit {
            group_id: GROUP.into(),
            producer_id: -1,
            producer_epoch: -1,
            member_id: String::new(),
            instance: None,
            generation,
            offsets: vec![OffsetCommit {
                topic: "t".into(),
                partition: 0,
                offset: 4,
                leader_epoch: -1,
                metadata: String::new(),
            }],
            now_ms: NOW_MS,
            durable: false,
        };
        let results = |reply| match reply {
            GroupReply::TxnCommit { results, .. } => results,
            other => panic!("TxnCommit answered {other:?}"),
        };
        assert!(matches!(
            results(shard.execute_group(op(2))),
            Err(TxnCommitRefusal::Group(GroupError::IllegalGeneration))
        ));
        assert_eq!(results(shard.execute_group(op(-1))).unwrap(), vec![Ok(())]);
        assert_eq!(fetch(&mut shard, &[("t", 0)], true), vec![Ok(4)]);
    }

    /// TxnOffsetCommit end to end on the shard: KIP-447's refusal, the transactional
    /// append (the producer's sequence continues on the partition, a fenced epoch is
    /// refused by the log), pending until the marker, and a reload that finds the
    /// offsets still pending.
    #[test]
    fn txn_offset_commit_waits_for_the_marker() {
        let (store, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut shard = coordinator_shard(store.path(), data.path());
        let tp = group_partition(GROUP);
        let commit = |shard: &mut Shard, epoch: i16, generation: i32, offset: i64| {
            let op = GroupOp::TxnCommit {
                group_id: GROUP.into(),
                producer_id: 9,
                producer_epoch: epoch,
                member_id: String::new(),
                instance: None,
                generation,
                offsets: vec![OffsetCommit {
                    topic: "t".into(),
                    partition: 0,
                    offset,
                    leader_epoch: -1,
                    metadata: String::new(),
                }],
                now_ms: NOW_MS,
                durable: false,
            };
            match shard.execute_group(op) {
                GroupReply::TxnCommit { results, .. } => results,
                other => panic!("TxnCommit answered {other:?}"),
            }
        };
        assert!(matches!(commit(&mut shard, 0, 3, 10), Err(TxnCommitRefusal::Group(GroupError::IllegalGeneration))));
        assert_eq!(commit(&mut shard, 1, -1, 10).unwrap(), vec![Ok(())]);
        assert_eq!(commit(&mut shard, 1, -1, 11).unwrap(), vec![Ok(())], "the next sequence, not a duplicate");
        let e = commit(&mut shard, 0, -1, 12).unwrap_err();
        assert!(matches!(e, TxnCommitRefusal::Append(PartitionError::Log(LogError::Producer(_)))), "{e:?}");
        assert_eq!(fetch(&mut shard, &[("t", 0)], false), vec![Ok(-1)]);
        assert_eq!(fetch(&mut shard, &[("t", 0)], true), vec![Err(GroupError::UnstableOffsetCommit)]);

        shard.load_group_partition(&tp, NOW_MS);
        shard.run_group_loads_inline(NOW_MS);
        assert_eq!(fetch(&mut shard, &[("t", 0)], true), vec![Err(GroupError::UnstableOffsetCommit)], "reloaded");

        // WriteTxnMarkers: the COMMIT marker is appended, then the coordinator told.
        let end = shard.partitions[&tp].log.log_end_offset().0;
        shard.partitions.get_mut(&tp).unwrap().log.append_replicated(&marker(end, 9, 1, true), NOW_MS).unwrap();
        shard.offsets_txn_marker(&tp, 9, 1, true);
        assert_eq!(fetch(&mut shard, &[("t", 0)], true), vec![Ok(11)]);

        // The next transaction aborts; a load reads both markers (a restart, a move).
        let p = shard.partitions.get_mut(&tp).unwrap();
        p.log.append_replicated(&offsets_batch(end + 1, Some((9, 1, 2)), &[("t", 0, 13)]), NOW_MS).unwrap();
        p.log.append_replicated(&marker(end + 2, 9, 1, false), NOW_MS).unwrap();
        shard.load_group_partition(&tp, NOW_MS);
        shard.run_group_loads_inline(NOW_MS);
        assert_eq!(fetch(&mut shard, &[("t", 0)], true), vec![Ok(11)], "the aborted 13 dropped at load");
    }
}
