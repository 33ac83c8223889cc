//! Transactional offset commits that wait for their transaction's end (KIP-98, KIP-447).
//!
//! TxnOffsetCommit appends a group's offsets to its `__consumer_offsets` partition in a
//! transactional batch (the producer's id and epoch in the header). They are PENDING
//! until the transaction coordinator's marker for that producer lands in the same
//! partition: COMMIT makes them the group's committed offsets, ABORT drops them. Until
//! then OffsetFetch does not show them, and answers UNSTABLE_OFFSET_COMMIT for their
//! partitions when asked for stable offsets (KIP-447, `require_stable`).
//!
//! Kafka's rules (GroupMetadata's `pendingTransactionalOffsetCommits`, and the load in
//! GroupMetadataManager): pending offsets are kept per producer id, then per group and
//! partition; a later pending commit of the same producer replaces an earlier one; a
//! marker completes every pending offset of its producer in its partition, whatever the
//! epoch; a committed transactional offset replaces the group's committed one only if
//! its record is later in the log than the committed one's record (a non-transactional
//! commit appended after the transactional one wins). Record positions are batch base
//! offsets, as Kafka's `CommitRecordMetadataAndOffset.appendedBatchOffset`.
//!
//! Pure state: no I/O, no clock. Owned by the `GroupCoordinator` of the shard that leads
//! the groups' offsets partition.

use std::collections::{BTreeMap, HashMap};

use super::records::StoredOffset;

/// One pending transactional offset: the value and the base offset of the batch that
/// holds its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingOffset {
    pub value: StoredOffset,
    pub record_offset: i64,
}

/// (group, topic, partition) of one pending offset.
pub type GroupTopicPartition = (String, String, i32);

/// Pending transactional offsets of every open transaction, by producer id.
#[derive(Debug, Default)]
pub struct TxnOffsets {
    by_producer: HashMap<i64, BTreeMap<GroupTopicPartition, PendingOffset>>,
}

impl TxnOffsets {
    pub fn new() -> Self {
        Self::default()
    }

    /// A transactional offset record was appended (or read back at load) for
    /// `producer_id`: it is pending, replacing that producer's earlier one.
    pub fn add(&mut self, producer_id: i64, key: GroupTopicPartition, value: StoredOffset, record_offset: i64) {
        self.by_producer.entry(producer_id).or_default().insert(key, PendingOffset { value, record_offset });
    }

    /// A transactional tombstone read at load (Kafka removes the producer's pending one;
    /// Spate never writes them).
    pub fn remove(&mut self, producer_id: i64, key: &GroupTopicPartition) {
        if let Some(m) = self.by_producer.get_mut(&producer_id) {
            m.remove(key);
            if m.is_empty() {
                self.by_producer.remove(&producer_id);
            }
        }
    }

    /// The marker of `producer_id` landed: its pending offsets of the groups `in_partition`
    /// accepts (those of the marker's offsets partition) leave the pending set, and are
    /// returned in (group, topic, partition) order. The producer's pending offsets of
    /// other partitions stay.
    pub fn complete(
        &mut self,
        producer_id: i64,
        in_partition: impl Fn(&str) -> bool,
    ) -> Vec<(GroupTopicPartition, PendingOffset)> {
        let Some(m) = self.by_producer.get_mut(&producer_id) else { return Vec::new() };
        let done: Vec<GroupTopicPartition> = m.keys().filter(|(g, _, _)| in_partition(g)).cloned().collect();
        let out = done.into_iter().filter_map(|k| m.remove(&k).map(|v| (k, v))).collect();
        if m.is_empty() {
            self.by_producer.remove(&producer_id);
        }
        out
    }

    /// Whether an open transaction holds an offset for this group's partition.
    pub fn is_pending(&self, group: &str, topic: &str, partition: i32) -> bool {
        // Few producers have open transactions at once: a scan of them, each a map lookup.
        self.by_producer.values().any(|m| {
            m.range((group.to_string(), topic.to_string(), partition)..)
                .next()
                .is_some_and(|((g, t, p), _)| g == group && t == topic && *p == partition)
        })
    }

    /// Whether any open transaction holds an offset for this group.
    pub fn has_group(&self, group: &str) -> bool {
        self.by_producer.values().any(|m| {
            m.range((group.to_string(), String::new(), i32::MIN)..).next().is_some_and(|((g, _, _), _)| g == group)
        })
    }

    /// Forget the pending offsets of the groups `drop` names (a group deleted, an offsets
    /// partition no longer led here). Returns how many went.
    pub fn forget_groups(&mut self, drop: impl Fn(&str) -> bool) -> usize {
        let mut n = 0;
        self.by_producer.retain(|_, m| {
            let before = m.len();
            m.retain(|(g, _, _), _| !drop(g));
            n += before - m.len();
            !m.is_empty()
        });
        n
    }

    /// Producer ids with pending offsets in groups `in_partition` accepts, ascending.
    pub fn producers(&self, in_partition: impl Fn(&str) -> bool) -> Vec<i64> {
        let mut v: Vec<i64> = self
            .by_producer
            .iter()
            .filter(|(_, m)| m.keys().any(|(g, _, _)| in_partition(g)))
            .map(|(p, _)| *p)
            .collect();
        v.sort_unstable();
        v
    }

    /// Pending offsets in all, for the metrics and tests.
    pub fn len(&self) -> usize {
        self.by_producer.values().map(|m| m.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_producer.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn off(o: i64) -> StoredOffset {
        StoredOffset { offset: o, leader_epoch: -1, metadata: String::new(), commit_timestamp_ms: 0 }
    }

    fn k(g: &str, t: &str, p: i32) -> GroupTopicPartition {
        (g.into(), t.into(), p)
    }

    #[test]
    fn pending_per_producer_completed_per_partition() {
        let mut t = TxnOffsets::new();
        t.add(7, k("a", "t", 0), off(1), 10);
        t.add(7, k("a", "t", 0), off(2), 12); // the producer's later commit replaces it
        t.add(7, k("b", "t", 1), off(5), 13);
        t.add(8, k("a", "t", 1), off(9), 14);
        assert!(t.is_pending("a", "t", 0));
        assert!(t.is_pending("a", "t", 1));
        assert!(!t.is_pending("a", "t", 2));
        assert!(!t.is_pending("a", "u", 0));
        assert!(!t.is_pending("", "t", 0));
        assert!(t.has_group("b") && !t.has_group("c"));
        assert_eq!(t.producers(|g| g == "a"), vec![7, 8]);
        // Producer 7's marker in group a's partition: b (another partition) stays pending.
        let done = t.complete(7, |g| g == "a");
        assert_eq!(done, vec![(k("a", "t", 0), PendingOffset { value: off(2), record_offset: 12 })]);
        assert!(!t.is_pending("a", "t", 0));
        assert!(t.is_pending("b", "t", 1));
        assert!(t.complete(7, |g| g == "a").is_empty(), "a second marker finds nothing");
        assert_eq!(t.complete(7, |g| g == "b").len(), 1);
        assert_eq!(t.len(), 1);
        t.remove(8, &k("a", "t", 1));
        assert!(t.is_empty());
    }

    #[test]
    fn forgetting_groups() {
        let mut t = TxnOffsets::new();
        t.add(1, k("a", "t", 0), off(1), 1);
        t.add(2, k("a", "t", 1), off(1), 2);
        t.add(2, k("b", "t", 1), off(1), 3);
        assert_eq!(t.forget_groups(|g| g == "a"), 2);
        assert_eq!(t.producers(|_| true), vec![2]);
        assert!(t.has_group("b") && !t.has_group("a"));
    }

    // The coordinator's side: KIP-447's checks, visibility, markers, loads.

    use crate::group::records;
    use crate::group::{
        offsets_partition_for, GroupConfig, GroupCoordinator, GroupError, JoinRequest, OffsetCommit, SyncRequest,
    };
    use bytes::Bytes;

    const PARTS: i32 = 50;

    fn commit(topic: &str, partition: i32, offset: i64) -> OffsetCommit {
        OffsetCommit { topic: topic.into(), partition, offset, leader_epoch: -1, metadata: String::new() }
    }

    /// Append-and-apply as the shard does: `producer` Some: a transactional batch.
    fn write(c: &mut GroupCoordinator, group: &str, offsets: &[OffsetCommit], producer: Option<i64>, at: i64) {
        let (recs, results) = c.commit_records(group, offsets, 0);
        assert!(results.iter().all(|r| r.is_ok()));
        for r in recs {
            let rec = records::decode(&r.key, r.value.as_ref()).unwrap();
            match producer {
                Some(p) => c.apply_txn_record(rec, p, at, 0),
                None => c.apply_record(rec, at, 0),
            }
        }
    }

    fn fetched(
        c: &GroupCoordinator,
        group: &str,
        topic: &str,
        partition: i32,
        stable: bool,
    ) -> Result<i64, GroupError> {
        let got = c.fetch_offsets(group, Some(&[(topic.into(), partition)]), stable);
        got[0].2.clone().map(|o| o.map_or(-1, |o| o.offset))
    }

    fn part(group: &str) -> i32 {
        offsets_partition_for(group, PARTS)
    }

    /// A stable group of one member "m1" (instance "i1" when static): its generation.
    fn stable_group(c: &mut GroupCoordinator, group: &str, instance: Option<&str>) -> i32 {
        let req = JoinRequest {
            group_id: group.into(),
            member_id: String::new(),
            group_instance_id: instance.map(String::from),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            require_known_member_id: false,
            reason: None,
        };
        let mut rx = match c.join(req, 0, "m1".into()) {
            crate::group::Deferred::Later(rx) => rx,
            crate::group::Deferred::Now(r) => panic!("join answered at once: {:?}", r.error),
        };
        c.tick(1);
        let joined = rx.try_recv().unwrap().expect("join complete");
        let _ = c.sync(
            SyncRequest {
                group_id: group.into(),
                member_id: "m1".into(),
                group_instance_id: instance.map(String::from),
                generation_id: joined.generation_id,
                protocol_type: None,
                protocol_name: None,
                assignments: vec![("m1".into(), Bytes::new())],
            },
            2,
        );
        joined.generation_id
    }

    /// Kafka's `validateTransactionalOffsetCommit` and `validateOffsetCommit` with
    /// isTransactional: a standalone producer commits to a new or empty group; a
    /// consumer's metadata (v3+) fences zombies.
    #[test]
    fn kip_447_checks() {
        let mut c = GroupCoordinator::new(GroupConfig { initial_rebalance_delay_ms: 0, ..Default::default() });
        assert_eq!(c.validate_txn_commit("", "", None, -1), Err(GroupError::InvalidGroupId));
        assert_eq!(c.validate_txn_commit("new", "", None, -1), Ok(()), "created by the commit");
        assert_eq!(c.validate_txn_commit("new", "m", None, 3), Err(GroupError::IllegalGeneration));
        let generation = stable_group(&mut c, "g", Some("i1"));
        assert_eq!(c.validate_txn_commit("g", "m1", Some("i1"), generation), Ok(()));
        assert_eq!(c.validate_txn_commit("g", "m1", None, generation), Ok(()));
        assert_eq!(c.validate_txn_commit("g", "m1", Some("i1"), generation - 1), Err(GroupError::IllegalGeneration));
        assert_eq!(c.validate_txn_commit("g", "m1", Some("i1"), generation + 1), Err(GroupError::IllegalGeneration));
        assert_eq!(c.validate_txn_commit("g", "old", Some("i1"), generation), Err(GroupError::FencedInstanceId));
        assert_eq!(c.validate_txn_commit("g", "ghost", None, generation), Err(GroupError::UnknownMemberId));
        assert_eq!(c.validate_txn_commit("g", "", None, generation), Err(GroupError::UnknownMemberId));
        // v0-v2 carry no member: accepted whatever the group (unlike OffsetCommit).
        assert_eq!(c.validate_txn_commit("g", "", None, -1), Ok(()));
        assert_eq!(c.validate_commit("g", "", None, -1), Err(GroupError::UnknownMemberId));

        // A group completing a rebalance (joined, not synced) refuses OffsetCommit but
        // not TxnOffsetCommit (Kafka: "the group state is not enforced for those").
        let req = JoinRequest {
            group_id: "h".into(),
            member_id: String::new(),
            group_instance_id: Some("j1".into()),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            require_known_member_id: false,
            reason: None,
        };
        let crate::group::Deferred::Later(mut rx) = c.join(req, 0, "h1".into()) else {
            panic!("join answered at once")
        };
        c.tick(1);
        let generation = rx.try_recv().unwrap().expect("join complete").generation_id;
        assert_eq!(
            c.describe("h").and_then(crate::group::Described::classic).unwrap().state,
            crate::group::GroupState::CompletingRebalance
        );
        assert_eq!(c.validate_commit("h", "h1", Some("j1"), generation), Err(GroupError::RebalanceInProgress));
        assert_eq!(c.validate_txn_commit("h", "h1", Some("j1"), generation), Ok(()));
    }

    /// Pending until the marker; invisible meanwhile, UNSTABLE with require_stable;
    /// COMMIT publishes, ABORT drops; only the marker's partition is touched.
    #[test]
    fn pending_until_the_marker() {
        let mut c = GroupCoordinator::new(GroupConfig::default());
        write(&mut c, "g", &[commit("t", 0, 5)], None, 10);
        write(&mut c, "g", &[commit("t", 0, 8), commit("t", 1, 3)], Some(42), 11);
        assert_eq!(fetched(&c, "g", "t", 0, false), Ok(5), "the committed offset, not the pending one");
        assert_eq!(fetched(&c, "g", "t", 0, true), Err(GroupError::UnstableOffsetCommit));
        assert_eq!(fetched(&c, "g", "t", 1, false), Ok(-1));
        assert_eq!(fetched(&c, "g", "t", 1, true), Err(GroupError::UnstableOffsetCommit));
        assert_eq!(fetched(&c, "g", "t", 2, true), Ok(-1));
        // All partitions: the committed ones, each checked.
        let all = c.fetch_offsets("g", None, true);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].2, Err(GroupError::UnstableOffsetCommit));
        assert_eq!(c.txn_producers(part("g"), PARTS), vec![42]);

        // Another producer's marker, or this one's in another partition, changes nothing.
        assert_eq!(c.complete_txn(part("g"), PARTS, 43, true), 0);
        assert_eq!(c.complete_txn((part("g") + 1) % PARTS, PARTS, 42, true), 0);
        assert_eq!(c.complete_txn(part("g"), PARTS, 42, true), 2);
        assert_eq!(fetched(&c, "g", "t", 0, true), Ok(8));
        assert_eq!(fetched(&c, "g", "t", 1, true), Ok(3));

        write(&mut c, "g", &[commit("t", 0, 20)], Some(42), 12);
        assert_eq!(c.complete_txn(part("g"), PARTS, 42, false), 1);
        assert_eq!(fetched(&c, "g", "t", 0, true), Ok(8), "aborted");
        assert!(c.txn_producers(part("g"), PARTS).is_empty());
    }

    /// Kafka compares record positions: a non-transactional commit appended after the
    /// transactional one stays when the transaction commits; one appended before is
    /// replaced.
    #[test]
    fn the_later_record_wins() {
        let mut c = GroupCoordinator::new(GroupConfig::default());
        write(&mut c, "g", &[commit("t", 0, 100)], Some(7), 10);
        write(&mut c, "g", &[commit("t", 0, 200)], None, 11);
        write(&mut c, "g", &[commit("t", 1, 100)], None, 12);
        write(&mut c, "g", &[commit("t", 1, 300)], Some(7), 13);
        c.complete_txn(part("g"), PARTS, 7, true);
        assert_eq!(fetched(&c, "g", "t", 0, true), Ok(200));
        assert_eq!(fetched(&c, "g", "t", 1, true), Ok(300));
    }

    /// A group that only a producer's open transaction holds offsets for stays until the
    /// marker (it does not expire); deleting or unloading a group drops its pending ones.
    #[test]
    fn pending_groups_live_until_their_marker() {
        let day_ms = 24 * 3600 * 1000;
        let mut c = GroupCoordinator::new(GroupConfig { offsets_retention_ms: day_ms, ..Default::default() });
        assert_eq!(c.validate_txn_commit("solo", "", None, -1), Ok(()));
        write(&mut c, "solo", &[commit("t", 0, 9)], Some(3), 1);
        c.tick(10 * day_ms);
        assert!(c.describe("solo").is_some(), "kept for its transaction");
        c.complete_txn(part("solo"), PARTS, 3, true);
        assert_eq!(fetched(&c, "solo", "t", 0, true), Ok(9));

        write(&mut c, "solo", &[commit("t", 0, 10)], Some(4), 2);
        assert_eq!(c.delete_group("solo"), Ok(()));
        assert!(c.txn_producers(part("solo"), PARTS).is_empty());
        write(&mut c, "solo", &[commit("t", 0, 11)], Some(5), 3);
        assert_eq!(c.unload_partition(part("solo"), PARTS), 1);
        assert!(c.txn_producers(part("solo"), PARTS).is_empty());
        assert_eq!(c.complete_txn(part("solo"), PARTS, 5, true), 0);
        assert!(c.describe("solo").is_none());
    }

    /// One batch of `__consumer_offsets` records at `base_offset`, transactional when
    /// `producer` names (id, epoch).
    fn batch(base_offset: i64, producer: Option<(i64, i16)>, recs: &[(Bytes, Option<Bytes>)]) -> Vec<u8> {
        use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
        let records: Vec<_> = recs
            .iter()
            .enumerate()
            .map(|(i, (k, v))| {
                let mut r = crate::protocol::plain_record(
                    base_offset + i as i64,
                    0,
                    0,
                    Some(k.clone()),
                    v.clone(),
                    Default::default(),
                );
                if let Some((id, epoch)) = producer {
                    r.transactional = true;
                    r.producer_id = id;
                    r.producer_epoch = epoch;
                    r.sequence = i as i32;
                }
                r
            })
            .collect();
        let mut buf = bytes::BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions { version: 2, compression: Compression::None },
        )
        .unwrap();
        buf.to_vec()
    }

    fn marker(base_offset: i64, producer_id: i64, commit: bool) -> Vec<u8> {
        use crate::log::batch::{encode_marker, ControlMarker};
        let mut b = encode_marker(producer_id, 0, ControlMarker { commit, coordinator_epoch: 0 }, 0);
        b[..8].copy_from_slice(&base_offset.to_be_bytes()); // outside the CRC
        b
    }

    fn offset_rec(group: &str, partition: i32, offset: i64) -> (Bytes, Option<Bytes>) {
        let v = records::StoredOffset { offset, leader_epoch: -1, metadata: String::new(), commit_timestamp_ms: 0 };
        (records::offset_key(group, "t", partition), Some(records::offset_value(&v)))
    }

    /// A load replays transactional batches and markers as Kafka's loader: committed
    /// transactions publish (unless a later plain commit is there), aborted ones vanish,
    /// an open one stays pending; a group only an open transaction names is created.
    #[test]
    fn a_load_replays_transactions() {
        // Groups of one offsets partition (12), and one of another (25), whose
        // producer's offsets a marker in partition 12 must leave pending.
        let (g, solo, other) = ("my-group", "solo-20", "other-0");
        assert_eq!((part(g), part(solo), part(other)), (12, 12, 25));
        let p = part(g);
        let mut log = Vec::new();
        log.extend(batch(0, None, &[offset_rec(g, 0, 1), offset_rec(g, 1, 1)]));
        log.extend(batch(2, Some((5, 0)), &[offset_rec(g, 0, 50)])); // committed below
        log.extend(batch(3, Some((6, 0)), &[offset_rec(g, 1, 60)])); // aborted below
        log.extend(batch(4, None, &[offset_rec(g, 2, 7)]));
        log.extend(batch(5, Some((5, 0)), &[offset_rec(g, 2, 51)])); // same producer, later record
        log.extend(batch(6, None, &[offset_rec(g, 2, 8)])); // a plain commit after it: wins
        log.extend(marker(7, 5, true));
        log.extend(marker(8, 6, false));
        log.extend(batch(9, Some((9, 1)), &[offset_rec(g, 3, 90), offset_rec(solo, 0, 91)])); // open
        log.extend(batch(11, Some((9, 1)), &[(records::offset_key(g, "t", 3), None)])); // tombstone in txn
        log.extend(marker(12, 77, true)); // a producer with nothing pending
                                          // Producer 5 again, after its marker, in a group of partition 25 (as a live
                                          // coordinator leading both would hold it): a marker here must not touch it.
        let mut c = GroupCoordinator::new(GroupConfig::default());
        write(&mut c, other, &[commit("t", 0, 33)], Some(5), 0);

        let (next, loaded, skipped) = c.replay_batches(log.clone(), crate::model::Offset(0), p, PARTS, 0).unwrap();
        assert_eq!((next, skipped), (crate::model::Offset(13), 0));
        assert_eq!(loaded, 13);
        assert_eq!(fetched(&c, g, "t", 0, true), Ok(50));
        assert_eq!(fetched(&c, g, "t", 1, true), Ok(1));
        assert_eq!(fetched(&c, g, "t", 2, true), Ok(8));
        assert_eq!(fetched(&c, g, "t", 3, true), Ok(-1), "the open transaction's tombstone dropped it");
        assert_eq!(fetched(&c, solo, "t", 0, false), Ok(-1));
        assert_eq!(fetched(&c, solo, "t", 0, true), Err(GroupError::UnstableOffsetCommit));
        assert!(c.describe(solo).is_some(), "created by the open transaction's offsets");
        assert_eq!(c.txn_producers(p, PARTS), vec![9]);
        assert_eq!(c.txn_producers(part(other), PARTS), vec![5], "untouched by partition 12's marker");
        assert_eq!(fetched(&c, other, "t", 0, true), Err(GroupError::UnstableOffsetCommit));
        // The open transaction commits later (WriteTxnMarkers on the live coordinator).
        assert_eq!(c.complete_txn(p, PARTS, 9, true), 1);
        assert_eq!(fetched(&c, solo, "t", 0, true), Ok(91));

        // The same log read in chunks of one batch gives the same state.
        let mut chunked = GroupCoordinator::new(GroupConfig::default());
        let mut pos = 0;
        let mut from = crate::model::Offset(0);
        while pos < log.len() {
            let h = crate::log::batch::BatchHeader::parse(&log[pos..]);
            let size = h.size_bytes() as usize;
            from = chunked.replay_batches(log[pos..pos + size].to_vec(), from, p, PARTS, 0).unwrap().0;
            pos += size;
        }
        for partition in 0..4 {
            assert_eq!(fetched(&chunked, g, "t", partition, false), fetched(&c, g, "t", partition, false));
        }
    }

    /// Load bytes are read from disk: cut anywhere, they give an error, never a panic.
    #[test]
    fn a_cut_transactional_log_is_an_error_not_a_panic() {
        let mut log = batch(0, Some((5, 0)), &[offset_rec("g", 0, 50)]);
        let first = log.len();
        log.extend(marker(1, 5, true));
        for cut in (1..log.len()).filter(|cut| *cut != first) {
            let mut c = GroupCoordinator::new(GroupConfig::default());
            let replayed = c.replay_batches(log[..cut].to_vec(), crate::model::Offset(0), part("g"), PARTS, 0);
            assert!(replayed.is_err(), "cut at {cut}: {replayed:?}");
        }
    }
}
