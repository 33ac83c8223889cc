//! Spate: a Kafka-compatible message broker for bare-metal Linux, thread-per-core and
//! shared-nothing on glommio and io_uring. See ARCHITECTURE.md for the map.

// Limits are named TigerBeetle-style, lower case with the unit last (`frame_bytes_max`).
#![allow(non_upper_case_globals)]

pub mod client;
pub mod config;
pub mod coordinator;
pub mod fuzzing;
pub mod group;
pub mod log;
pub mod model;
pub mod protocol;
pub mod replication;
pub mod security;
pub mod server;
pub mod shard;
pub mod txn;
