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
        let mut v: Vec<i64> =
            self.by_producer.iter().filter(|(_, m)| m.keys().any(|(g, _, _)| in_partition(g))).map(|(p, _)| *p).collect();
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
}
