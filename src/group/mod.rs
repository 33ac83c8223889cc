//! Consumer groups: the classic group protocol (Join, Sync, Heartbeat, Leave), the
//! consumer protocol of KIP-848 (`consumer`: ConsumerGroupHeartbeat, the broker-side
//! assignors), committed offsets, and their records in `__consumer_offsets` (`records`,
//! `consumer_records`).
//!
//! One `GroupCoordinator` per shard holds the groups whose `__consumer_offsets`
//! partition that shard owns. It is a state machine: time comes in as `now_ms`, new
//! member ids come in from the caller, answers that must wait (a JoinGroup until the
//! rebalance completes, a SyncGroup until the leader's assignment) are `futures`
//! oneshot receivers. It performs no I/O: records to persist are returned to the caller,
//! which appends them to the offsets partition before acknowledging.

pub mod consumer;
pub mod consumer_records;
pub mod coordinator;
pub mod records;
pub mod txn_offsets;

pub use coordinator::*;

/// Kafka's `offsets.topic.num.partitions` default.
pub const offsets_topic_partitions: i32 = 50;
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// Which `__consumer_offsets` partition holds a group: Java's `String.hashCode` of the
/// group id, made non-negative, modulo the partition count (as Kafka does, so tools
/// that compute it agree).
pub fn offsets_partition_for(group_id: &str, partitions: i32) -> i32 {
    let mut h: i32 = 0;
    for c in group_id.encode_utf16() {
        h = h.wrapping_mul(31).wrapping_add(c as i32);
    }
    // Kafka's Utils.abs: Integer.MIN_VALUE maps to 0.
    let h = if h == i32::MIN { 0 } else { h.abs() };
    h % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_matches_java_hash() {
        // "my-group".hashCode() == -1_906_497_762 in Java -> abs % 50 = 12
        assert_eq!(offsets_partition_for("my-group", 50), 12);
        assert_eq!(offsets_partition_for("", 50), 0);
    }
}
