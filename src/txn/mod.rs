//! Idempotent (and, later, transactional) producers.
//!
//! - `producer_state`: one partition replica's producer state (Kafka's
//!   `ProducerStateManager`): per producer id its epoch and its last 5 batches, the
//!   sequence rules a leader enforces, and the `.snapshot` file format. Pure: no I/O, no
//!   clock; owned by the partition's log, so by the partition's owner shard.
//! - `producer_id`: producer-id blocks (`/latest_producer_id_block`, Kafka's JSON) and
//!   the allocator the active coordinator hands ids out of. Pure; the registry persists.
//!
//! - `coordinator`: the transaction coordinator's state per transactional id (Kafka's
//!   `TransactionMetadata`), a pure machine: requests and write outcomes in, records to
//!   write to `__transaction_state` and markers to send out. One per shard, holding the
//!   ids of the `__transaction_state` partitions that shard owns and this broker leads
//!   (`shard/txns.rs`); the runtime writes the records, waits for their replication and
//!   sends the markers (`server/txn.rs`).
//! - `log_records`: Kafka's `__transaction_state` key and value schemas (versions 0
//!   and 1), by hand, bounded against the bytes they come in.

pub mod coordinator;
pub mod log_records;
pub mod producer_id;
pub mod producer_state;

/// Kafka's `transaction.state.log.num.partitions` default.
pub const txn_topic_partitions: i32 = 50;
pub const TXN_TOPIC: &str = "__transaction_state";

/// Which `__transaction_state` partition holds a transactional id: the same hash as the
/// offsets topic's (Java's `String.hashCode`, made non-negative, modulo the count).
pub fn txn_partition_for(txn_id: &str) -> i32 {
    crate::group::offsets_partition_for(txn_id, txn_topic_partitions)
}
