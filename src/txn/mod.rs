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
//!   write to `__transaction_state` and markers to send out. Not wired to the broker
//!   yet: no request handler, `__transaction_state` topic, markers or LSO exist.
//! - `log_records`: Kafka's `__transaction_state` key and value schemas (versions 0
//!   and 1), by hand, bounded against the bytes they come in.

pub mod coordinator;
pub mod log_records;
pub mod producer_id;
pub mod producer_state;
