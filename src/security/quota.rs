//! Client quota enforcement, as Kafka's `ClientQuotaManager` (KIP-13, KIP-124, KIP-219):
//! per quota entity (see `entity::EntityConfigs::quota_for`), the rate of produce bytes,
//! fetch response bytes and request handler time is measured over
//! `quota_window_samples` windows of `quota_window_ms`, and a request that takes the
//! rate over the quota is answered with a throttle time:
//! `(rate - quota) / quota * window_ms`, at most `quota_window_samples * quota_window_ms`
//! (Kafka's `QuotaUtils.boundedThrottleTime`), where the window is the time the kept
//! samples span, at least `quota_window_samples - 1` windows (Kafka's `Rate.windowSize`).
//!
//! Per broker, shared by every shard: one `QuotaManager` per process. Each measured
//! entity has `quota_window_samples` slots, one `AtomicU64` each holding the slot's
//! window number (high 24 bits) and its sum (low 40 bits); a shard adds with a
//! compare-and-swap loop, never a lock, so a data core never waits on another. The
//! entity table is an `ArcSwap` of a map, copied on the rare insertion of an entity
//! (read with one atomic load). Unlike Kafka, whose windows start at a sensor's first
//! record, windows here are aligned to multiples of `quota_window_ms`; the rate is the
//! same over a full set of samples.
//!
//! Pure: time comes in as `now_ms`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::entity::{EntityConfigs, EntityName, QuotaEntity, QuotaKind};

/// Kafka's `quota.window.num` and `quota.window.size.seconds` defaults.
pub const quota_window_samples: u64 = 11;
pub const quota_window_ms: u64 = 1_000;
/// Entities measured at once; past it, idle entities are dropped, and if none is idle
/// the new one is measured in a shared overflow entity of its quota kind.
pub const quota_entities_max: usize = 10_000;

const value_bits: u32 = 40;
const value_mask: u64 = (1 << value_bits) - 1;
const window_mask: u64 = (1 << (64 - value_bits)) - 1;

/// One entity's samples (see the module comment).
#[derive(Debug, Default)]
pub struct Samples {
    slots: [AtomicU64; quota_window_samples as usize],
}

impl Samples {
    fn window_of(now_ms: u64) -> u64 {
        now_ms / quota_window_ms
    }

    /// Add `value` to the current window's sample.
    pub fn record(&self, value: u64, now_ms: u64) {
        let window = Self::window_of(now_ms);
        let slot = &self.slots[(window % quota_window_samples) as usize];
        let tag = window & window_mask;
        let mut old = slot.load(Ordering::Relaxed);
        loop {
            let sum = if old >> value_bits == tag { old & value_mask } else { 0 };
            let new = (tag << value_bits) | sum.saturating_add(value).min(value_mask);
            match slot.compare_exchange_weak(old, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(current) => old = current,
            }
        }
    }

    /// Take back `value` from the current window's sample (a throttled fetch answered
    /// empty, as Kafka's `unrecordQuotaSensor`).
    pub fn unrecord(&self, value: u64, now_ms: u64) {
        let window = Self::window_of(now_ms);
        let slot = &self.slots[(window % quota_window_samples) as usize];
        let tag = window & window_mask;
        let _ = slot.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            (old >> value_bits == tag).then(|| (tag << value_bits) | (old & value_mask).saturating_sub(value))
        });
    }

    /// (sum of the kept samples, the window they span in ms, as Kafka's `Rate.windowSize`).
    fn sum_and_window_ms(&self, now_ms: u64) -> (u64, u64) {
        let window = Self::window_of(now_ms);
        let mut sum = 0u64;
        let mut oldest = window;
        for slot in &self.slots {
            let v = slot.load(Ordering::Relaxed);
            let tag = v >> value_bits;
            // The kept windows: the current one and the samples - 1 before it.
            let age = (window & window_mask).wrapping_sub(tag) & window_mask;
            if age < quota_window_samples && v & value_mask > 0 {
                sum = sum.saturating_add(v & value_mask);
                oldest = oldest.min(window - age.min(window));
            }
        }
        let mut elapsed_ms = now_ms - oldest * quota_window_ms;
        let full_windows = elapsed_ms / quota_window_ms;
        let min_full_windows = quota_window_samples - 1;
        if full_windows < min_full_windows {
            elapsed_ms += (min_full_windows - full_windows) * quota_window_ms;
        }
        (sum, elapsed_ms.max(1))
    }

    /// The measured rate, per second.
    pub fn rate_per_sec(&self, now_ms: u64) -> f64 {
        let (sum, window_ms) = self.sum_and_window_ms(now_ms);
        sum as f64 * 1000.0 / window_ms as f64
    }

    /// Kafka's throttle time for a rate over `quota` (0 when within it).
    pub fn throttle_ms(&self, quota: f64, now_ms: u64) -> u64 {
        let (sum, window_ms) = self.sum_and_window_ms(now_ms);
        let rate = sum as f64 * 1000.0 / window_ms as f64;
        if rate <= quota || quota <= 0.0 {
            return 0;
        }
        let throttle = ((rate - quota) / quota * window_ms as f64).round() as u64;
        throttle.min(quota_window_samples * quota_window_ms)
    }

    fn idle(&self, now_ms: u64) -> bool {
        self.sum_and_window_ms(now_ms).0 == 0
    }
}

type Key = (QuotaKind, QuotaEntity);

/// What one recorded request came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// The entity the value was accounted on (Kafka's metric tags `user`, `client-id`).
    pub entity: QuotaEntity,
    pub quota: f64,
    pub throttle_ms: u64,
}

/// Every entity's rate, per broker (see the module comment).
#[derive(Default)]
pub struct QuotaManager {
    entities: ArcSwap<HashMap<Key, Arc<Samples>>>,
    /// Where entities past `quota_entities_max` are measured, by kind.
    overflow: [Samples; 3],
}

impl QuotaManager {
    pub fn new() -> Self {
        Self::default()
    }

    fn samples(&self, key: &Key, now_ms: u64) -> Option<Arc<Samples>> {
        if let Some(s) = self.entities.load().get(key) {
            return Some(s.clone());
        }
        let mut added = None;
        self.entities.rcu(|map| {
            let mut map = HashMap::clone(map);
            if map.len() >= quota_entities_max {
                map.retain(|_, s| !s.idle(now_ms));
            }
            if map.len() >= quota_entities_max {
                added = None;
                return map;
            }
            let s = map.entry(key.clone()).or_insert_with(|| Arc::new(Samples::default())).clone();
            added = Some(s);
            map
        });
        added
    }

    /// Record `value` (bytes, or handler time in Kafka's percentage units: see
    /// `handler_time_value`) for a request of `user` with `client_id`, and return the
    /// throttle time its quota asks for. `None`: no quota applies (nothing is measured).
    pub fn record(
        &self,
        configs: &EntityConfigs,
        kind: QuotaKind,
        user: &str,
        client_id: &str,
        value: u64,
        now_ms: u64,
    ) -> Option<Recorded> {
        let (entity, quota) = configs.quota_for(kind, user, client_id)?;
        let bound = match kind {
            QuotaKind::Request => quota * request_quota_units_per_percent,
            QuotaKind::Produce | QuotaKind::Fetch => quota,
        };
        let key = (kind, entity);
        let throttle_ms = match self.samples(&key, now_ms) {
            Some(s) => {
                s.record(value, now_ms);
                s.throttle_ms(bound, now_ms)
            }
            None => {
                let s = &self.overflow[kind as usize];
                s.record(value, now_ms);
                s.throttle_ms(bound, now_ms)
            }
        };
        Some(Recorded { entity: key.1, quota, throttle_ms })
    }

    /// Take back a recorded value (a throttled fetch answered without its data).
    pub fn unrecord(&self, kind: QuotaKind, entity: &QuotaEntity, value: u64, now_ms: u64) {
        if let Some(s) = self.entities.load().get(&(kind, entity.clone())) {
            s.unrecord(value, now_ms);
        }
    }

    /// The measured rate of an entity, per second (for metrics and tests).
    pub fn rate_per_sec(&self, kind: QuotaKind, entity: &QuotaEntity, now_ms: u64) -> Option<f64> {
        Some(self.entities.load().get(&(kind, entity.clone()))?.rate_per_sec(now_ms))
    }
}

/// Handler time as the request quota counts it. Kafka records percent-seconds
/// (`nanos * 100 / 1e9`); here the unit is a millionth of that, to stay an integer.
pub fn handler_time_value(busy_ns: u64) -> u64 {
    busy_ns / 10
}

/// Units of `handler_time_value` per percent-second.
pub const request_quota_units_per_percent: f64 = 1_000_000.0;

/// How `entity` is labelled in metrics: (user, client-id), "" where not part of it (as
/// Kafka's quota metric tags).
pub fn metric_labels(entity: &QuotaEntity) -> (&str, &str) {
    fn name(n: &Option<EntityName>) -> &str {
        match n {
            Some(EntityName::Name(s)) => s.as_str(),
            _ => "",
        }
    }
    (name(&entity.user), name(&entity.client_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn configs(entries: &[(&str, &str, &str)]) -> EntityConfigs {
        let mut raw: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (path, k, v) in entries {
            raw.entry(path.to_string()).or_default().insert(k.to_string(), v.to_string());
        }
        EntityConfigs::parse(&raw)
    }

    #[test]
    fn a_steady_rate_at_the_quota_is_not_throttled_and_double_is() {
        let s = Samples::default();
        // 1000 bytes/s for 20 s in 100 ms steps.
        let mut now = 1_000_000;
        for _ in 0..200 {
            s.record(100, now);
            now += 100;
        }
        let rate = s.rate_per_sec(now);
        assert!((rate - 1000.0).abs() < 100.0, "rate {rate}");
        assert_eq!(s.throttle_ms(1100.0, now), 0);
        // Twice the quota over the kept window: throttled for about the whole window.
        let t = s.throttle_ms(500.0, now);
        assert!((9_000..=11_000).contains(&t), "throttle {t}");
    }

    #[test]
    fn throttle_time_is_kafkas_formula_on_a_fresh_entity() {
        let s = Samples::default();
        // First record: the window counts as samples - 1 full windows (10 s), so 20 KB at
        // once against 1 KB/s is a rate of 2000/s: (2000 - 1000) / 1000 * 10 s = 10 s.
        s.record(20_000, 5_000);
        assert_eq!(s.throttle_ms(1000.0, 5_000), 10_000);
        // Far over the quota: bounded by samples * window.
        s.record(10_000_000, 5_000);
        assert_eq!(s.throttle_ms(1000.0, 5_000), 11_000);
        // Old samples expire.
        assert_eq!(s.rate_per_sec(5_000 + 12_000), 0.0);
    }

    #[test]
    fn unrecord_takes_back_a_value_of_the_current_window() {
        let s = Samples::default();
        s.record(5_000, 2_000);
        s.unrecord(3_000, 2_500);
        assert_eq!(s.sum_and_window_ms(2_500).0, 2_000);
        s.unrecord(10_000, 2_600);
        assert_eq!(s.sum_and_window_ms(2_600).0, 0);
    }

    #[test]
    fn entities_are_measured_apart_and_only_with_a_quota() {
        let q = QuotaManager::new();
        let c = configs(&[
            ("clients/slow", "producer_byte_rate", "1000"),
            ("clients/<default>", "consumer_byte_rate", "10"),
        ]);
        assert_eq!(q.record(&c, QuotaKind::Produce, "ANONYMOUS", "fast", 1_000_000, 10_000), None);
        let r = q.record(&c, QuotaKind::Produce, "ANONYMOUS", "slow", 20_000, 10_000).unwrap();
        assert_eq!(r.throttle_ms, 10_000);
        assert_eq!(metric_labels(&r.entity), ("", "slow"));
        // The default client quota is accounted per client id.
        let a = q.record(&c, QuotaKind::Fetch, "ANONYMOUS", "a", 200, 10_000).unwrap();
        let b = q.record(&c, QuotaKind::Fetch, "ANONYMOUS", "b", 50, 10_000).unwrap();
        assert!(a.throttle_ms > 0);
        assert_eq!(b.throttle_ms, 0);
        assert_eq!(q.rate_per_sec(QuotaKind::Fetch, &b.entity, 10_000), Some(5.0));
    }

    #[test]
    fn shards_adding_at_once_lose_nothing() {
        let s = Arc::new(Samples::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        s.record(3, 7_000);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.sum_and_window_ms(7_000).0, 120_000);
    }
}
