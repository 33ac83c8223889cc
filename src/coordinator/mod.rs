//! Cluster metadata. For now: the topic registry of a single node, kept durable in the
//! data dir. The coordinator issue moves it behind a `MetaStore` (embedded or ZooKeeper).

pub mod acl_store;
pub mod controller;
pub mod layout;
pub mod owner;
pub mod registry;
pub mod store;
pub mod view;
pub mod zookeeper;
