//! Replication throttles, as Kafka's `ReplicationQuotaManager` applies them while a
//! reassignment copies partitions (kafka-reassign-partitions --throttle):
//! - the topic configs `leader.replication.throttled.replicas` and
//!   `follower.replication.throttled.replicas` name the throttled replicas
//!   (`partition:broker,...`, or `*` for all); a broker throttles a partition when it
//!   is named there with its own id;
//! - the dynamic broker configs `leader.replication.throttled.rate` and
//!   `follower.replication.throttled.rate` (bytes per second; per broker over the
//!   cluster-wide default) cap that traffic. Leader side: a follower fetch from a
//!   replica out of the ISR gets no data for throttled partitions while the rate is
//!   exceeded (in-sync followers are never throttled). Follower side: the fetcher leaves
//!   throttled partitions out of its fetch while the rate is exceeded.
//!
//! Shared nothing: each shard meters its own traffic against the broker's rate divided
//! by the number of shards. The rate is measured as Kafka's `Rate`: eleven one-second
//! windows, over at least ten seconds (so a new meter lets a first burst through).

use crate::config::{TopicConfig, BROKER_DEFAULT_ENTITY, THROTTLED_RATE_UNLIMITED};
use crate::coordinator::view::ClusterView;
use crate::model::NodeId;

/// Kafka's `replication.quota.window.size.seconds` (1) and `replication.quota.window.num` (11).
const window_ms: i64 = 1_000;
const windows: usize = 11;

pub const LEADER_RATE: &str = "leader.replication.throttled.rate";
pub const FOLLOWER_RATE: &str = "follower.replication.throttled.rate";
pub const LEADER_REPLICAS: &str = "leader.replication.throttled.replicas";
pub const FOLLOWER_REPLICAS: &str = "follower.replication.throttled.replicas";

/// Bytes per one-second window over the last `windows` windows.
#[derive(Debug, Default)]
pub struct RateMeter {
    /// (window start ms, bytes), oldest first.
    samples: std::collections::VecDeque<(i64, u64)>,
}

impl RateMeter {
    pub fn record(&mut self, bytes: u64, now_ms: i64) {
        self.expire(now_ms);
        match self.samples.back_mut() {
            Some((start, b)) if now_ms - *start < window_ms => *b += bytes,
            _ => self.samples.push_back((now_ms, bytes)),
        }
    }

    /// Bytes per second, as Kafka's `Rate.measure` (elapsed time at least windows - 1).
    pub fn rate(&mut self, now_ms: i64) -> f64 {
        self.expire(now_ms);
        let Some(&(oldest, _)) = self.samples.front() else { return 0.0 };
        let total: u64 = self.samples.iter().map(|(_, b)| b).sum();
        let elapsed = (now_ms - oldest).max(0).max((windows as i64 - 1) * window_ms);
        total as f64 * 1000.0 / elapsed as f64
    }

    /// Whether the rate is above `limit` bytes per second.
    pub fn exceeded(&mut self, limit: i64, now_ms: i64) -> bool {
        limit != THROTTLED_RATE_UNLIMITED && self.rate(now_ms) > limit as f64
    }

    fn expire(&mut self, now_ms: i64) {
        while self.samples.front().is_some_and(|(start, _)| now_ms - start >= windows as i64 * window_ms) {
            self.samples.pop_front();
        }
    }
}

/// This shard's meters: what leaders sent to throttled followers, what followers
/// fetched for throttled partitions.
#[derive(Debug, Default)]
pub struct ReplicationThrottle {
    pub leader: RateMeter,
    pub follower: RateMeter,
}

/// This shard's share of a broker throttle rate (`LEADER_RATE` or `FOLLOWER_RATE`) in
/// bytes per second: this broker's dynamic config, else the cluster-wide default, else
/// unlimited.
pub fn shard_rate(view: &ClusterView, me: NodeId, name: &str, shards: usize) -> i64 {
    let set = [me.0.to_string(), BROKER_DEFAULT_ENTITY.to_string()].iter().find_map(|entity| {
        view.broker_configs(entity).and_then(|c| c.get(name)).and_then(|v| v.trim().parse::<i64>().ok())
    });
    match set {
        Some(rate) if rate != THROTTLED_RATE_UNLIMITED => rate / shards.max(1) as i64,
        _ => THROTTLED_RATE_UNLIMITED,
    }
}

/// Whether `partition` is named with broker `me` in the topic config `list_name`
/// (`partition:broker,...` or `*`).
pub fn throttled(configs: &TopicConfig, list_name: &str, partition: i32, me: NodeId) -> bool {
    let Some(list) = configs.overrides.get(list_name) else { return false };
    let list = list.trim();
    list == "*"
        || list.split(',').any(|item| {
            let mut parts = item.trim().splitn(2, ':');
            let p = parts.next().and_then(|p| p.trim().parse::<i32>().ok());
            let b = parts.next().and_then(|b| b.trim().parse::<i32>().ok());
            p == Some(partition) && b == Some(me.0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_measured_over_at_least_ten_seconds_and_forgets_old_windows() {
        let mut m = RateMeter::default();
        m.record(50_000, 0);
        assert_eq!(m.rate(500), 5_000.0, "a first burst counts over ten seconds");
        assert!(m.exceeded(4_999, 500) && !m.exceeded(5_000, 500));
        assert!(!m.exceeded(THROTTLED_RATE_UNLIMITED, 500));
        for s in 1..=20 {
            m.record(1_000, s * 1_000);
        }
        // Only the last eleven windows (10..=20 s) count, over 10 s.
        assert_eq!(m.rate(20_000), 1_100.0);
        assert_eq!(m.rate(40_000), 0.0);
    }

    #[test]
    fn throttled_replicas_are_kafkas_lists() {
        let mut c = TopicConfig::default();
        assert!(!throttled(&c, LEADER_REPLICAS, 0, NodeId(1)));
        c.overrides.insert(LEADER_REPLICAS.into(), "0:1, 0:2,1:3".into());
        assert!(throttled(&c, LEADER_REPLICAS, 0, NodeId(2)));
        assert!(throttled(&c, LEADER_REPLICAS, 1, NodeId(3)));
        assert!(!throttled(&c, LEADER_REPLICAS, 1, NodeId(1)));
        assert!(!throttled(&c, FOLLOWER_REPLICAS, 0, NodeId(1)));
        c.overrides.insert(FOLLOWER_REPLICAS.into(), "*".into());
        assert!(throttled(&c, FOLLOWER_REPLICAS, 7, NodeId(9)));
    }
}
