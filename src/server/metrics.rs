//! Counters and latency histograms the broker keeps, and the Prometheus endpoint
//! (`spate serve --metrics-listen HOST:PORT`, `GET /metrics`).
//!
//! One slot per shard, so no shard writes another's cache line. Counters are relaxed
//! atomics. Histograms (hdrhistogram, microseconds) sit behind a Mutex per shard that
//! only the owning shard locks on the hot path; the scrape thread locks it briefly to
//! read, so the lock is practically uncontended. The HTTP server is one plain std
//! thread that only reads these and the published cluster view; it never touches a shard.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::coordinator::owner::Metadata;
use crate::coordinator::view::ClusterView;
use crate::model::{ShardId, TopicPartition};
use crate::security::entity::{QuotaEntity, QuotaKind};
use crate::security::quota::{metric_labels, quota_entities_max, QuotaManager};

/// Latencies are recorded in microseconds, 1 µs ..= 60 s, 2 significant digits.
const latency_micros_max: u64 = 60_000_000;
const latency_significant_digits: u8 = 2;
/// Prometheus bucket bounds (upper, inclusive) in microseconds.
const latency_buckets_micros: &[u64] = &[
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];
/// A scrape request larger than this is refused; one read waits at most this long.
const http_request_bytes_max: usize = 8 * 1024;
const http_read_timeout_ms: u64 = 2_000;
/// Log sizes are reported for at most this many partitions per scrape.
const log_size_partitions_max: usize = 10_000;
/// How often the accept loop looks at the shutdown flag.
const accept_poll_ms: u64 = 200;

/// Whether Spate serves API `key` at some version.
fn served_api(key: i16) -> bool {
    kafka_protocol::messages::ApiKey::try_from(key).is_ok_and(|k| crate::protocol::handled_range(k).is_some())
}

/// A latency histogram with its exact sum (Prometheus wants `_sum`).
pub struct Latency {
    histogram: Histogram<u64>,
    sum_micros: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Self {
            histogram: Histogram::new_with_bounds(1, latency_micros_max, latency_significant_digits)
                .expect("constant histogram bounds are valid"),
            sum_micros: 0,
        }
    }
}

impl Latency {
    fn record(&mut self, took: Duration) {
        let micros = (took.as_micros() as u64).clamp(1, latency_micros_max);
        self.histogram.saturating_record(micros);
        self.sum_micros = self.sum_micros.saturating_add(micros);
    }
}

#[derive(Default)]
pub struct ShardCounters {
    pub requests: AtomicU64,
    pub bad_frames: AtomicU64,
    pub bad_requests: AtomicU64,
    pub unsupported_requests: AtomicU64,
    /// Connections closed at accept (max.connections, max.connections.per.ip), and
    /// connections closed for silence (connections.max.idle.ms).
    pub connections_refused: AtomicU64,
    pub connections_idle_closed: AtomicU64,
    /// TLS handshakes that failed (no common version, a bad or missing client
    /// certificate, a client that speaks plain text to a TLS listener).
    pub tls_handshake_failures: AtomicU64,
    /// Client certificates refused after a good handshake: no ssl.principal.mapping.rules
    /// rule matched their subject.
    pub tls_certificates_unmapped: AtomicU64,
    /// SASL logins that succeeded, and those refused (wrong password, unknown user,
    /// malformed exchange, a request out of the SASL order).
    pub sasl_authentications: AtomicU64,
    pub sasl_authentication_failures: AtomicU64,
    /// Idempotent batches refused by the producer state (stale epoch, sequence gap,
    /// negative sequence), and retries answered with their original offsets.
    pub producer_batches_refused: AtomicU64,
    pub producer_batches_duplicate: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub fsyncs: AtomicU64,
    pub fsync_micros: AtomicU64,
    /// Appends written through the append ring, the writev calls that carried them, and
    /// how many of those calls ran on the shard rather than through io_uring.
    pub appends_written: AtomicU64,
    pub append_writes: AtomicU64,
    pub append_writes_inline: AtomicU64,
    /// sync_file_range calls of the append ring's write-behind.
    pub write_behind_calls: AtomicU64,
    /// fadvise(DONTNEED) calls of the append ring's drop-behind, and the bytes they covered.
    pub drop_behind_calls: AtomicU64,
    pub drop_behind_bytes: AtomicU64,
    /// Published by the shard once a second: its partitions and groups.
    pub status: Mutex<crate::shard::ShardStatus>,
    /// Record bytes produced to / fetched from each topic through this shard.
    pub topic_bytes: Mutex<BTreeMap<String, (u64, u64)>>,
    /// Per Kafka API key: handler latency (and count, from the histogram).
    pub api_latency: Mutex<BTreeMap<i16, Latency>>,
    pub fsync_latency: Mutex<Latency>,
    /// Client quotas by (quota, user, client id) as accounted (`server::quotas`).
    pub quota_stats: Mutex<BTreeMap<QuotaStatKey, QuotaStat>>,
}

/// (quota kind, user, client id): the labels of a quota entity's metrics.
pub type QuotaStatKey = (QuotaKind, String, String);

/// What one shard saw of one quota entity.
#[derive(Debug, Default, Clone, Copy)]
pub struct QuotaStat {
    /// Bytes (produce, fetch) or handler time in `handler_time_value` units (request).
    pub measured: u64,
    pub throttle_ms: u64,
    pub throttled_responses: u64,
}

pub struct Metrics {
    pub shards: Vec<ShardCounters>,
    /// Kafka's quota sensors: every quota entity's measured rate, per broker (shared by
    /// the shards, lock-free; `security::quota`).
    pub quotas: QuotaManager,
}

impl Metrics {
    pub fn new(nr_shards: usize) -> Self {
        Self { shards: (0..nr_shards).map(|_| ShardCounters::default()).collect(), quotas: QuotaManager::new() }
    }

    /// A request of a quota entity measured `value` and was throttled `throttle_ms`.
    pub fn record_quota(&self, id: ShardId, kind: QuotaKind, entity: &QuotaEntity, value: u64, throttle_ms: u64) {
        let (user, client_id) = metric_labels(entity);
        if let Ok(mut m) = self.shard(id).quota_stats.lock() {
            let key = (kind, user.to_string(), client_id.to_string());
            if m.len() >= quota_entities_max && !m.contains_key(&key) {
                return;
            }
            let s = m.entry(key).or_default();
            s.measured = s.measured.saturating_add(value);
            s.throttle_ms = s.throttle_ms.saturating_add(throttle_ms);
            s.throttled_responses += u64::from(throttle_ms > 0);
        }
    }

    pub fn shard(&self, id: ShardId) -> &ShardCounters {
        &self.shards[id.0]
    }

    /// Count record bytes in (produced) and out (fetched) for a topic.
    pub fn add_topic_bytes(&self, id: ShardId, topic: &str, bytes_in: u64, bytes_out: u64) {
        if let Ok(mut m) = self.shard(id).topic_bytes.lock() {
            let e = m.entry(topic.to_string()).or_default();
            e.0 += bytes_in;
            e.1 += bytes_out;
        }
    }

    pub fn record_fsync(&self, id: ShardId, took: Duration) {
        let c = self.shard(id);
        c.fsyncs.fetch_add(1, Ordering::Relaxed);
        c.fsync_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        if let Ok(mut l) = c.fsync_latency.lock() {
            l.record(took);
        }
    }

    /// One request of `api_key` handled on shard `id` in `took`. Only APIs Spate serves
    /// get a histogram (about 20 KiB each): the key is the client's, and a histogram per
    /// key any client sends (mutated requests) grew the broker by 16 MiB per 800 keys,
    /// up to 65,536 of them. The rest are counted by `spate_unsupported_requests_total`.
    pub fn record_request(&self, id: ShardId, api_key: i16, took: Duration) {
        if let Ok(mut apis) = self.shard(id).api_latency.lock() {
            if let Some(latency) = apis.get_mut(&api_key) {
                latency.record(took);
            } else if served_api(api_key) {
                apis.entry(api_key).or_default().record(took);
            }
        }
    }

    /// The whole exposition text.
    pub fn render(&self, view: &ClusterView, data_dir: &Path) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let counter = |out: &mut String, name: &str, help: &str, get: &dyn Fn(&ShardCounters) -> u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (i, s) in self.shards.iter().enumerate() {
                let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", get(s));
            }
        };
        counter(&mut out, "spate_requests_total", "Requests received.", &|s| s.requests.load(Ordering::Relaxed));
        counter(&mut out, "spate_bad_frames_total", "Frames that did not decode.", &|s| {
            s.bad_frames.load(Ordering::Relaxed)
        });
        counter(&mut out, "spate_bad_requests_total", "Requests that did not decode.", &|s| {
            s.bad_requests.load(Ordering::Relaxed)
        });
        counter(&mut out, "spate_unsupported_requests_total", "Requests of unsupported APIs or versions.", &|s| {
            s.unsupported_requests.load(Ordering::Relaxed)
        });
        counter(&mut out, "spate_connections_refused_total", "Connections closed at accept: a connection cap.", &|s| {
            s.connections_refused.load(Ordering::Relaxed)
        });
        counter(
            &mut out,
            "spate_connections_idle_closed_total",
            "Connections closed after connections.max.idle.ms.",
            &|s| s.connections_idle_closed.load(Ordering::Relaxed),
        );
        counter(&mut out, "spate_tls_handshake_failures_total", "TLS handshakes that failed.", &|s| {
            s.tls_handshake_failures.load(Ordering::Relaxed)
        });
        counter(
            &mut out,
            "spate_tls_certificates_unmapped_total",
            "Client certificates refused after the TLS handshake: no ssl.principal.mapping.rules rule matched.",
            &|s| s.tls_certificates_unmapped.load(Ordering::Relaxed),
        );
        counter(&mut out, "spate_sasl_authentications_total", "SASL logins that succeeded.", &|s| {
            s.sasl_authentications.load(Ordering::Relaxed)
        });
        counter(
            &mut out,
            "spate_sasl_authentication_failures_total",
            "SASL logins refused (wrong password, unknown user, malformed or out-of-order exchange).",
            &|s| s.sasl_authentication_failures.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "spate_producer_batches_refused_total",
            "Idempotent batches refused (stale epoch, out-of-order or negative sequence).",
            &|s| s.producer_batches_refused.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "spate_producer_batches_duplicate_total",
            "Idempotent retries answered with the original offsets, not appended again.",
            &|s| s.producer_batches_duplicate.load(Ordering::Relaxed),
        );
        counter(&mut out, "spate_bytes_in_total", "Request bytes read.", &|s| s.bytes_in.load(Ordering::Relaxed));
        counter(&mut out, "spate_bytes_out_total", "Response bytes written.", &|s| s.bytes_out.load(Ordering::Relaxed));
        counter(
            &mut out,
            "spate_fsyncs_total",
            "Group-commit rounds (each fdatasyncs every partition log with appends to sync).",
            &|s| s.fsyncs.load(Ordering::Relaxed),
        );
        counter(&mut out, "spate_appends_written_total", "Produce appends written through the append ring.", &|s| {
            s.appends_written.load(Ordering::Relaxed)
        });
        counter(&mut out, "spate_append_writes_total", "writev calls carrying them (coalescing).", &|s| {
            s.append_writes.load(Ordering::Relaxed)
        });
        counter(
            &mut out,
            "spate_append_writes_inline_total",
            "Of those, written on the shard (the kernel was not throttling writers) rather than through io_uring.",
            &|s| s.append_writes_inline.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "spate_write_behind_calls_total",
            "sync_file_range calls handing appended pages to writeback (--write-behind-bytes).",
            &|s| s.write_behind_calls.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "spate_drop_behind_calls_total",
            "fadvise(DONTNEED) calls dropping appended pages older than the newest --drop-behind-bytes from the page cache.",
            &|s| s.drop_behind_calls.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "spate_drop_behind_bytes_total",
            "Bytes of appended data those drop-behind calls covered (pages still dirty or in use stay cached).",
            &|s| s.drop_behind_bytes.load(Ordering::Relaxed),
        );

        let _ = writeln!(
            out,
            "# HELP spate_request_duration_seconds Request handling time by API, from decoded header to response.\n\
             # TYPE spate_request_duration_seconds histogram"
        );
        for (i, s) in self.shards.iter().enumerate() {
            let Ok(apis) = s.api_latency.lock() else { continue };
            for (key, lat) in apis.iter() {
                let api = kafka_protocol::messages::ApiKey::try_from(*key)
                    .map(|k| format!("{k:?}"))
                    .unwrap_or_else(|_| key.to_string());
                write_histogram(
                    &mut out,
                    "spate_request_duration_seconds",
                    &format!("shard=\"{i}\",api=\"{api}\""),
                    lat,
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP spate_fsync_duration_seconds Group-commit round length: its partition logs' fdatasyncs.\n\
             # TYPE spate_fsync_duration_seconds histogram"
        );
        for (i, s) in self.shards.iter().enumerate() {
            if let Ok(lat) = s.fsync_latency.lock() {
                write_histogram(&mut out, "spate_fsync_duration_seconds", &format!("shard=\"{i}\""), &lat);
            }
        }

        self.render_status(&mut out, view);

        // Partitions per shard and log sizes, from the registry and the data dir.
        let nr_shards = self.shards.len().max(1);
        let mut per_shard = vec![0u64; nr_shards];
        let mut topics = 0u64;
        for (name, meta) in view.topics() {
            topics += 1;
            for p in 0..meta.partitions {
                let owner = crate::shard::owner_shard(&TopicPartition::new(name, p), nr_shards);
                per_shard[owner.0] += 1;
            }
        }
        let _ = writeln!(
            out,
            "# HELP spate_topics Topics in the registry.\n# TYPE spate_topics gauge\nspate_topics {topics}"
        );
        let _ = writeln!(
            out,
            "# HELP spate_partitions Partitions owned (and led: single node) per shard.\n# TYPE spate_partitions gauge"
        );
        for (i, n) in per_shard.iter().enumerate() {
            let _ = writeln!(out, "spate_partitions{{shard=\"{i}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP spate_log_size_bytes Bytes of segment files per partition.\n# TYPE spate_log_size_bytes gauge"
        );
        for (tp, bytes) in log_sizes(data_dir) {
            let _ =
                writeln!(out, "spate_log_size_bytes{{topic=\"{}\",partition=\"{}\"}} {bytes}", tp.topic, tp.partition);
        }
        self.render_quotas(&mut out);
        out
    }

    /// Client quotas per entity (labels as Kafka's quota metrics: quota type, user,
    /// client id; "" where the entity has no such part).
    fn render_quotas(&self, out: &mut String) {
        let mut all: BTreeMap<QuotaStatKey, QuotaStat> = BTreeMap::new();
        for s in &self.shards {
            if let Ok(m) = s.quota_stats.lock() {
                for (k, v) in m.iter() {
                    let e = all.entry(k.clone()).or_default();
                    e.measured += v.measured;
                    e.throttle_ms += v.throttle_ms;
                    e.throttled_responses += v.throttled_responses;
                }
            }
        }
        let labels = |(kind, user, client): &QuotaStatKey| {
            format!("quota=\"{}\",user=\"{}\",client_id=\"{}\"", kind.name(), label_value(user), label_value(client))
        };
        type Sample<'a> = &'a dyn Fn(&QuotaStatKey, &QuotaStat) -> Option<String>;
        let families: [(&str, &str, Sample); 4] = [
            (
                "spate_quota_throttle_time_ms_total",
                "Milliseconds of throttling answered to a quota entity.",
                &|_, s| Some(s.throttle_ms.to_string()),
            ),
            ("spate_quota_throttled_responses_total", "Responses that throttled a quota entity.", &|_, s| {
                Some(s.throttled_responses.to_string())
            }),
            ("spate_quota_bytes_total", "Bytes measured against a byte-rate quota (produce, fetch).", &|k, s| {
                (k.0 != QuotaKind::Request).then(|| s.measured.to_string())
            }),
            ("spate_quota_request_time_ms_total", "Handler time measured against request_percentage.", &|k, s| {
                (k.0 == QuotaKind::Request).then(|| format!("{:.3}", s.measured as f64 * 10.0 / 1e6))
            }),
        ];
        for (name, help, value) in families {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (k, s) in &all {
                if let Some(v) = value(k, s) {
                    let _ = writeln!(out, "{name}{{{}}} {v}", labels(k));
                }
            }
        }
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label_value(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    /// Per-topic bytes, partition offsets, offline partitions, groups and consumer lag,
    /// from what the shards published. A deleted topic's byte counters are dropped here
    /// (they would otherwise stay for good, one entry per topic name ever produced to).
    fn render_status(&self, out: &mut String, view: &ClusterView) {
        let mut topic_bytes: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for s in &self.shards {
            if let Ok(mut m) = s.topic_bytes.lock() {
                m.retain(|t, _| view.get(t).is_some());
                for (t, (i, o)) in m.iter() {
                    let e = topic_bytes.entry(t.clone()).or_default();
                    e.0 += i;
                    e.1 += o;
                }
            }
        }
        let statuses: Vec<crate::shard::ShardStatus> =
            self.shards.iter().filter_map(|s| s.status.lock().ok().map(|g| g.clone())).collect();
        let _ = writeln!(out, "# HELP spate_topic_bytes_in_total Record bytes produced to a topic.\n# TYPE spate_topic_bytes_in_total counter");
        for (t, (i, _)) in &topic_bytes {
            let _ = writeln!(out, "spate_topic_bytes_in_total{{topic=\"{t}\"}} {i}");
        }
        let _ = writeln!(out, "# HELP spate_topic_bytes_out_total Record bytes fetched from a topic.\n# TYPE spate_topic_bytes_out_total counter");
        for (t, (_, o)) in &topic_bytes {
            let _ = writeln!(out, "spate_topic_bytes_out_total{{topic=\"{t}\"}} {o}");
        }
        let mut leo: BTreeMap<(String, i32), i64> = BTreeMap::new();
        let _ = writeln!(out, "# HELP spate_partition_log_end_offset Next offset to be written.\n# TYPE spate_partition_log_end_offset gauge");
        let (mut offline, mut under_replicated) = (0, 0);
        for st in &statuses {
            for p in &st.partitions {
                leo.insert((p.tp.topic.clone(), p.tp.partition), p.log_end_offset);
                offline += p.offline as u64;
                under_replicated += p.under_replicated as u64;
                let _ = writeln!(
                    out,
                    "spate_partition_log_end_offset{{topic=\"{}\",partition=\"{}\"}} {}",
                    p.tp.topic, p.tp.partition, p.log_end_offset
                );
            }
        }
        let mut totals = crate::shard::CleanerTotals::default();
        for st in &statuses {
            totals.passes += st.cleaner.passes;
            totals.errors += st.cleaner.errors;
            totals.bytes_read += st.cleaner.bytes_read;
            totals.bytes_written += st.cleaner.bytes_written;
            totals.records_removed += st.cleaner.records_removed;
        }
        for (name, help, v) in [
            ("spate_log_cleaner_passes_total", "Log cleaner passes installed.", totals.passes),
            (
                "spate_log_cleaner_errors_total",
                "Log cleaner passes that failed or could not be swapped in.",
                totals.errors,
            ),
            ("spate_log_cleaner_bytes_read_total", "Bytes the log cleaner read.", totals.bytes_read),
            ("spate_log_cleaner_bytes_written_total", "Bytes the log cleaner wrote.", totals.bytes_written),
            ("spate_log_cleaner_records_removed_total", "Records the log cleaner removed.", totals.records_removed),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        let _ = writeln!(out, "# HELP spate_log_cleaner_dirty_ratio Compacted partitions: bytes of rolled segments not yet cleaned over all rolled bytes.\n# TYPE spate_log_cleaner_dirty_ratio gauge");
        for st in &statuses {
            for p in st.partitions.iter().filter(|p| p.cleaner.is_some()) {
                let (ratio, _) = p.cleaner.unwrap();
                let _ = writeln!(
                    out,
                    "spate_log_cleaner_dirty_ratio{{topic=\"{}\",partition=\"{}\"}} {ratio}",
                    p.tp.topic, p.tp.partition
                );
            }
        }
        let _ = writeln!(out, "# HELP spate_log_cleaner_last_clean_timestamp_ms Compacted partitions: when the last cleaning pass was installed (0: none since start).\n# TYPE spate_log_cleaner_last_clean_timestamp_ms gauge");
        for st in &statuses {
            for p in st.partitions.iter().filter(|p| p.cleaner.is_some()) {
                let last = p.cleaner.unwrap().1.unwrap_or(0);
                let _ = writeln!(
                    out,
                    "spate_log_cleaner_last_clean_timestamp_ms{{topic=\"{}\",partition=\"{}\"}} {last}",
                    p.tp.topic, p.tp.partition
                );
            }
        }
        let _ = writeln!(out, "# HELP spate_partition_log_start_offset First offset still in the log.\n# TYPE spate_partition_log_start_offset gauge");
        for st in &statuses {
            for p in &st.partitions {
                let _ = writeln!(
                    out,
                    "spate_partition_log_start_offset{{topic=\"{}\",partition=\"{}\"}} {}",
                    p.tp.topic, p.tp.partition, p.log_start_offset
                );
            }
        }
        let _ = writeln!(out, "# HELP spate_offline_partitions Partitions whose log is offline (failed write or fsync).\n# TYPE spate_offline_partitions gauge\nspate_offline_partitions {offline}");
        let _ = writeln!(out, "# HELP spate_under_replicated_partitions Partitions led here with fewer in-sync replicas than replicas.\n# TYPE spate_under_replicated_partitions gauge\nspate_under_replicated_partitions {under_replicated}");
        let _ = writeln!(out, "# HELP spate_partition_high_watermark High watermark of the partitions led here.\n# TYPE spate_partition_high_watermark gauge");
        for st in &statuses {
            for p in &st.partitions {
                if let Some(hw) = p.high_watermark {
                    let _ = writeln!(
                        out,
                        "spate_partition_high_watermark{{topic=\"{}\",partition=\"{}\"}} {hw}",
                        p.tp.topic, p.tp.partition
                    );
                }
            }
        }
        let _ = writeln!(out, "# HELP spate_partition_last_stable_offset_lag High watermark minus last stable offset (what open or unreplicated transactions hold back from read_committed consumers), partitions led here.\n# TYPE spate_partition_last_stable_offset_lag gauge");
        for st in &statuses {
            for p in &st.partitions {
                if let (Some(hw), Some(lso)) = (p.high_watermark, p.last_stable_offset) {
                    let _ = writeln!(
                        out,
                        "spate_partition_last_stable_offset_lag{{topic=\"{}\",partition=\"{}\"}} {}",
                        p.tp.topic,
                        p.tp.partition,
                        (hw - lso).max(0)
                    );
                }
            }
        }
        let _ = writeln!(out, "# HELP spate_partition_open_transactions Transactions open in a partition replica here (a transactional batch written, no marker yet).\n# TYPE spate_partition_open_transactions gauge");
        for st in &statuses {
            for p in st.partitions.iter().filter(|p| p.open_transactions > 0) {
                let _ = writeln!(
                    out,
                    "spate_partition_open_transactions{{topic=\"{}\",partition=\"{}\"}} {}",
                    p.tp.topic, p.tp.partition, p.open_transactions
                );
            }
        }
        self.render_txn_coordinator(out, &statuses, super::now_ms());
        let _ = writeln!(out, "# HELP spate_group_rebalances_total Rebalances (join phases) completed.\n# TYPE spate_group_rebalances_total counter");
        for (i, st) in statuses.iter().enumerate() {
            let _ = writeln!(out, "spate_group_rebalances_total{{shard=\"{i}\"}} {}", st.rebalances);
        }
        let _ =
            writeln!(out, "# HELP spate_group_members Members of a consumer group.\n# TYPE spate_group_members gauge");
        for st in &statuses {
            for g in &st.groups {
                let _ = writeln!(
                    out,
                    "spate_group_members{{group=\"{}\",state=\"{}\"}} {}",
                    g.group_id, g.state, g.members
                );
            }
        }
        let _ = writeln!(out, "# HELP spate_consumer_lag Log end offset minus the group's committed offset.\n# TYPE spate_consumer_lag gauge");
        for st in &statuses {
            for g in &st.groups {
                for (t, p, committed) in &g.committed {
                    if let Some(end) = leo.get(&(t.clone(), *p)) {
                        let lag = (end - committed).max(0);
                        let _ = writeln!(
                            out,
                            "spate_consumer_lag{{group=\"{}\",topic=\"{t}\",partition=\"{p}\"}} {lag}",
                            g.group_id
                        );
                    }
                }
            }
        }
    }

    /// The transaction coordinators of this broker's shards: transactional ids by state,
    /// the age of the oldest open transaction, and aborts for a timeout.
    fn render_txn_coordinator(&self, out: &mut String, statuses: &[crate::shard::ShardStatus], now_ms: i64) {
        use crate::txn::coordinator::TxnState;
        let states = [
            TxnState::Empty,
            TxnState::Ongoing,
            TxnState::PrepareCommit,
            TxnState::PrepareAbort,
            TxnState::CompleteCommit,
            TxnState::CompleteAbort,
            TxnState::Dead,
            TxnState::PrepareEpochFence,
        ];
        let _ = writeln!(out, "# HELP spate_transactions Transactional ids coordinated here, by state (Ongoing, Prepare* and PrepareEpochFence are open transactions).\n# TYPE spate_transactions gauge");
        for state in states {
            let n: u64 = statuses.iter().map(|s| s.txns.by_state[state.id() as usize]).sum();
            let _ = writeln!(out, "spate_transactions{{state=\"{state:?}\"}} {n}");
        }
        let oldest = statuses.iter().filter_map(|s| s.txns.oldest_open_start_ms).min();
        let age = oldest.map_or(0.0, |start| (now_ms - start).max(0) as f64 / 1e3);
        let _ = writeln!(out, "# HELP spate_transaction_oldest_open_age_seconds How long the oldest transaction open at a coordinator here has been open (0 with none).\n# TYPE spate_transaction_oldest_open_age_seconds gauge\nspate_transaction_oldest_open_age_seconds {age}");
        let timed_out: u64 = statuses.iter().map(|s| s.txns.timed_out).sum();
        let _ = writeln!(out, "# HELP spate_transactions_timed_out_total Transactions the coordinators here aborted for their timeout (their producers fenced).\n# TYPE spate_transactions_timed_out_total counter\nspate_transactions_timed_out_total {timed_out}");
    }
}

fn write_histogram(out: &mut String, name: &str, labels: &str, lat: &Latency) {
    let h = &lat.histogram;
    for &bound in latency_buckets_micros {
        let count = h.count_between(0, bound);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{}\"}} {count}", bound as f64 / 1e6);
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.len());
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", lat.sum_micros as f64 / 1e6);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.len());
}

/// Sum of `*.log` file sizes per partition directory of `data_dir`.
fn log_sizes(data_dir: &Path) -> Vec<(TopicPartition, u64)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(data_dir) else { return out };
    for entry in dir.flatten().take(log_size_partitions_max) {
        let Some(tp) = entry.file_name().to_str().and_then(crate::shard::parse_partition_dir) else { continue };
        let Ok(files) = std::fs::read_dir(entry.path()) else { continue };
        let bytes: u64 = files
            .flatten()
            .filter(|f| f.path().extension().is_some_and(|e| e == "log"))
            .filter_map(|f| f.metadata().ok().map(|m| m.len()))
            .sum();
        out.push((tp, bytes));
    }
    out.sort_by(|a, b| (&a.0.topic, a.0.partition).cmp(&(&b.0.topic, b.0.partition)));
    out
}

/// Start the `/metrics` HTTP server on its own thread. Binding happens here, so a bad
/// address fails `spate serve` at startup.
pub fn serve(
    listen: &str,
    metrics: Arc<Metrics>,
    metadata: Arc<Metadata>,
    data_dir: PathBuf,
    shutdown: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).map_err(|e| anyhow::anyhow!("cannot serve metrics on {listen}: {e}"))?;
    listener.set_nonblocking(true)?;
    tracing::info!(listen, "serving Prometheus metrics at /metrics");
    std::thread::Builder::new().name("spate-metrics".into()).spawn(move || {
        while !shutdown.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = answer(stream, &metrics, &metadata, &data_dir) {
                        tracing::debug!(error = %e, "metrics request failed");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(accept_poll_ms));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics accept failed");
                    std::thread::sleep(Duration::from_millis(accept_poll_ms));
                }
            }
        }
    })?;
    Ok(())
}

/// Answer one HTTP/1.1 request, then close the connection.
fn answer(mut stream: TcpStream, metrics: &Metrics, metadata: &Metadata, data_dir: &Path) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_millis(http_read_timeout_ms)))?;
    stream.set_write_timeout(Some(Duration::from_millis(http_read_timeout_ms)))?;
    let mut buf = vec![0u8; http_request_bytes_max];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == buf.len() {
            return respond(&mut stream, "431 Request Header Fields Too Large", "text/plain", "request too large\n");
        }
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            break;
        }
        len += n;
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => {
            let body = metrics.render(&metadata.view(), data_dir);
            respond(&mut stream, "200 OK", "text/plain; version=0.0.4; charset=utf-8", &body)
        }
        ("GET", _) => respond(&mut stream, "404 Not Found", "text/plain", "try /metrics\n"),
        _ => respond(&mut stream, "405 Method Not Allowed", "text/plain", "GET only\n"),
    }
}

fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_latency_is_kept_only_for_apis_spate_serves() {
        let metrics = Metrics::new(1);
        let shard = ShardId(0);
        // Keys a mutated request can carry (76: ShareGroupHeartbeat, not served): none kept.
        for key in [-1, 76, 1000, i16::MAX, i16::MIN] {
            metrics.record_request(shard, key, Duration::from_micros(10));
        }
        assert!(metrics.shard(shard).api_latency.lock().unwrap().is_empty());
        metrics.record_request(shard, 0, Duration::from_micros(10)); // Produce
        metrics.record_request(shard, 0, Duration::from_micros(30));
        let apis = metrics.shard(shard).api_latency.lock().unwrap();
        assert_eq!(apis.keys().copied().collect::<Vec<_>>(), vec![0]);
        assert_eq!(apis[&0].histogram.len(), 2);
    }
}
