//! Counters the broker keeps (exported to Prometheus by the operator-tools issue).
//! Plain atomics, one slot per shard, so no shard writes another's cache line often.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::model::ShardId;

#[derive(Default)]
pub struct ShardCounters {
    pub requests: AtomicU64,
    pub bad_frames: AtomicU64,
    pub bad_requests: AtomicU64,
    pub unsupported_requests: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub fsyncs: AtomicU64,
    pub fsync_micros: AtomicU64,
}

pub struct Metrics {
    pub shards: Vec<ShardCounters>,
}

impl Metrics {
    pub fn new(nr_shards: usize) -> Self {
        Self { shards: (0..nr_shards).map(|_| ShardCounters::default()).collect() }
    }

    pub fn shard(&self, id: ShardId) -> &ShardCounters {
        &self.shards[id.0]
    }

    pub fn record_fsync(&self, id: ShardId, took: Duration) {
        let c = self.shard(id);
        c.fsyncs.fetch_add(1, Ordering::Relaxed);
        c.fsync_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }
}
