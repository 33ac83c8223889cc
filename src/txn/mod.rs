//! Idempotent (and, later, transactional) producers.
//!
//! - `producer_state`: one partition replica's producer state (Kafka's
//!   `ProducerStateManager`): per producer id its epoch and its last 5 batches, the
//!   sequence rules a leader enforces, and the `.snapshot` file format. Pure: no I/O, no
//!   clock; owned by the partition's log, so by the partition's owner shard.
//! - `producer_id`: producer-id blocks (`/latest_producer_id_block`, Kafka's JSON) and
//!   the allocator the active coordinator hands ids out of. Pure; the registry persists.
//!
//! Transactions (`__transaction_state`, markers, LSO) are not here yet.

pub mod producer_id;
pub mod producer_state;
