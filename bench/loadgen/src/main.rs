//! spate-bench: an OpenMessaging-Benchmark style load generator for any
//! Kafka-compatible broker. Plain std threads and blocking sockets; each
//! producer connection pipelines up to `--in-flight` Produce requests.
#![allow(non_upper_case_globals)]

mod consumer;
mod producer;
mod stats;
mod wire;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{BrokerId, CreateTopicsRequest, ListOffsetsRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;

use producer::KeyDistribution;
use stats::{Counters, SharedHist};

/// Kafka error code TOPIC_ALREADY_EXISTS.
const error_topic_already_exists: i16 = 36;
/// How long to wait for a new topic's partitions to get leaders.
const topic_ready_timeout: Duration = Duration::from_secs(15);
/// After producers stop, consumers get this long to catch up.
const consumer_drain_max: Duration = Duration::from_secs(5);
/// Consume-only runs (--producers 0) end after this long without new records.
const consume_idle_max: Duration = Duration::from_secs(2);

#[derive(Parser, Debug, Clone, Serialize)]
#[command(version, about = "OpenMessaging-Benchmark style load generator for Kafka-compatible brokers")]
struct Args {
    /// host:port of the broker (single-node: all partitions are expected on it).
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[arg(long, default_value = "spate-bench")]
    topic: String,
    /// Partitions to create (with --create-topic); otherwise taken from metadata.
    #[arg(long, default_value_t = 1)]
    partitions: i32,
    #[arg(long, default_value_t = 1024)]
    message_size: usize,
    #[arg(long, default_value_t = 1)]
    producers: usize,
    #[arg(long, default_value_t = 0)]
    consumers: usize,
    /// 0, 1 or -1 (all).
    #[arg(long, default_value_t = 1, allow_hyphen_values = true)]
    acks: i16,
    /// Total target messages/s over all producers; 0 = flat out.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Seconds of producing (after warm-up).
    #[arg(long, default_value_t = 15.0)]
    duration: f64,
    /// Seconds at the start whose samples are left out of the results.
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// A partition's batch is sent once it holds this many payload bytes.
    #[arg(long, default_value_t = 16384)]
    batch_bytes: usize,
    /// ... or once its first record is this old.
    #[arg(long, default_value_t = 1)]
    linger_ms: u64,
    #[arg(long, value_enum, default_value_t = KeyDistribution::None)]
    key_distribution: KeyDistribution,
    /// With `--key-distribution random`: keys drawn from this many (0: any 8-byte key).
    #[arg(long, default_value_t = 0)]
    key_space: u64,
    /// Produce requests in flight per producer connection (ignored for acks=0).
    #[arg(long, default_value_t = 5)]
    in_flight: usize,
    /// Idempotent producers (InitProducerId, sequence numbers; needs --acks -1, at most 5 in flight).
    #[arg(long)]
    idempotent: bool,
    /// Consumers start at the earliest or the latest offset.
    #[arg(long, value_enum, default_value_t = StartFrom::Latest)]
    consume_from: StartFrom,
    #[arg(long)]
    create_topic: bool,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<String>,
    /// Write a latency percentile distribution plot (SVG) here.
    #[arg(long)]
    plot: Option<String>,
    /// A label carried into the JSON and the plot title.
    #[arg(long, default_value = "")]
    label: String,
    /// Latency percentiles per bucket of this many seconds go into the JSON (`buckets`),
    /// so a tail that grows over a long run shows. 0: none.
    #[arg(long, default_value_t = 60)]
    bucket_secs: u64,
}

/// Latencies of one time bucket of the run (warm-up included, marked by `end_secs`).
#[derive(Serialize)]
struct Bucket {
    end_secs: f64,
    publish: stats::LatencySummary,
    end_to_end: stats::LatencySummary,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum, Serialize)]
enum StartFrom {
    Earliest,
    Latest,
}

#[derive(Serialize)]
struct Report {
    label: String,
    args: Args,
    versions: String,
    measured_secs: f64,
    produce: stats::Throughput,
    consume: stats::Throughput,
    publish_latency: stats::LatencySummary,
    end_to_end_latency: stats::LatencySummary,
    produce_errors: u64,
    fetch_errors: u64,
    produce_requests: u64,
    /// Bytes acknowledged and consumed over the whole run, warm-up included: what a
    /// broker's CPU over the run is divided by (bench/cost.py).
    total_produced_bytes: u64,
    total_consumed_bytes: u64,
    coordinated_omission_corrected: bool,
    buckets: Vec<Bucket>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("spate-bench: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    if args.message_size < 8 {
        bail!("--message-size must be at least 8 (the send timestamp)");
    }
    if ![0, 1, -1].contains(&args.acks) {
        bail!("--acks must be 0, 1 or -1");
    }
    if args.idempotent && (args.acks != -1 || args.in_flight > 5) {
        bail!("--idempotent needs --acks -1 and --in-flight 5 or less (as Kafka's clients)");
    }
    let mut conn = wire::SyncConn::connect(&args.bootstrap)?;
    let versions = conn.negotiate().context("negotiating API versions")?;
    let topic = TopicName(StrBytes::from_string(args.topic.clone()));

    if args.create_topic {
        let req = CreateTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![CreatableTopic::default()
            .with_name(topic.clone())
            .with_num_partitions(args.partitions)
            .with_replication_factor(1)]);
        let resp = conn.call(versions.create_topics, &req)?;
        for t in &resp.topics {
            if t.error_code != 0 && t.error_code != error_topic_already_exists {
                bail!("CreateTopics {}: error {} {:?}", args.topic, t.error_code, t.error_message);
            }
        }
    }

    // Wait until every partition has a leader.
    let ready_by = Instant::now() + topic_ready_timeout;
    let partitions = loop {
        let req = MetadataRequest::default()
            .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(topic.clone()))]))
            .with_allow_auto_topic_creation(false);
        let resp = conn.call(versions.metadata, &req)?;
        let t = resp.topics.iter().find(|t| t.name.as_ref() == Some(&topic));
        if let Some(t) = t {
            if t.error_code == 0
                && !t.partitions.is_empty()
                && t.partitions.iter().all(|p| p.error_code == 0 && p.leader_id.0 >= 0)
            {
                let leaders: std::collections::BTreeSet<i32> = t.partitions.iter().map(|p| p.leader_id.0).collect();
                if leaders.len() > 1 {
                    eprintln!(
                        "warning: partitions have {} leaders; spate-bench sends everything to --bootstrap",
                        leaders.len()
                    );
                }
                let mut ps: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
                ps.sort();
                break ps;
            }
        }
        if Instant::now() > ready_by {
            bail!("topic {} not ready after {:?} (create it or pass --create-topic)", args.topic, topic_ready_timeout);
        }
        thread::sleep(Duration::from_millis(200));
    };
    let partition_count = partitions.len() as i32;

    // Starting offsets for consumers.
    let start_offsets: Vec<(i32, i64)> = match args.consume_from {
        StartFrom::Earliest => partitions.iter().map(|&p| (p, 0)).collect(),
        StartFrom::Latest if args.consumers > 0 => {
            let req = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![
                ListOffsetsTopic::default().with_name(topic.clone()).with_partitions(
                    partitions
                        .iter()
                        .map(|&p| {
                            ListOffsetsPartition::default()
                                .with_partition_index(p)
                                .with_current_leader_epoch(-1)
                                .with_timestamp(-1)
                        })
                        .collect(),
                ),
            ]);
            let resp = conn.call(versions.list_offsets, &req)?;
            let mut out = Vec::new();
            for t in resp.topics {
                for p in t.partitions {
                    if p.error_code != 0 {
                        bail!("ListOffsets partition {}: error {}", p.partition_index, p.error_code);
                    }
                    out.push((p.partition_index, p.offset));
                }
            }
            out.sort();
            out
        }
        StartFrom::Latest => Vec::new(),
    };
    drop(conn);

    let versions_text = format!(
        "produce v{} fetch v{} metadata v{} list_offsets v{} create_topics v{}",
        versions.produce, versions.fetch, versions.metadata, versions.list_offsets, versions.create_topics
    );
    eprintln!(
        "spate-bench: {} partitions, {} producers, {} consumers, {} B messages, acks={}, rate={}, {versions_text}",
        partition_count,
        args.producers,
        args.consumers,
        args.message_size,
        args.acks,
        if args.rate > 0.0 { format!("{}/s", args.rate) } else { "flat out".into() }
    );

    let counters = Arc::new(Counters::default());
    let publish = Arc::new(SharedHist::new());
    let e2e = Arc::new(SharedHist::new());
    let failed = Arc::new(AtomicBool::new(false));
    let stop_consumers = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let deadline = measure_from + Duration::from_secs_f64(args.duration);
    let measure_from_us = stats::now_us() + (args.warmup * 1e6) as u64;

    // Consumers first, so they are polling before the first message.
    let mut consumer_threads = Vec::new();
    for c in 0..args.consumers {
        let assignment: Vec<(i32, i64)> =
            start_offsets.iter().enumerate().filter(|(i, _)| i % args.consumers == c).map(|(_, &po)| po).collect();
        if assignment.is_empty() {
            eprintln!("consumer {c}: no partitions assigned (more consumers than partitions)");
            continue;
        }
        let cfg = consumer::ConsumerConfig {
            addr: args.bootstrap.clone(),
            topic: args.topic.clone(),
            assignment,
            fetch_version: versions.fetch,
            measure_from_us,
            deadline: deadline + consumer_drain_max,
        };
        let shared =
            consumer::ConsumerShared { counters: counters.clone(), e2e: e2e.clone(), stop: stop_consumers.clone() };
        let failed = failed.clone();
        consumer_threads.push(thread::Builder::new().name(format!("consumer-{c}")).spawn(move || {
            if let Err(e) = consumer::run(cfg, shared) {
                eprintln!("consumer {c}: {e:#}");
                failed.store(true, Ordering::Relaxed);
            }
        })?);
    }

    let mut producer_threads = Vec::new();
    for i in 0..args.producers {
        let cfg = producer::ProducerConfig {
            addr: args.bootstrap.clone(),
            topic: args.topic.clone(),
            partitions: partition_count,
            message_size: args.message_size,
            acks: args.acks,
            rate: args.rate / args.producers as f64,
            batch_bytes: args.batch_bytes,
            linger: Duration::from_millis(args.linger_ms),
            key_distribution: args.key_distribution,
            key_space: args.key_space,
            in_flight: args.in_flight,
            idempotent: args.idempotent,
            produce_version: versions.produce,
            deadline,
            measure_from_us,
            seed: 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i as u64 + 1),
        };
        let shared =
            producer::ProducerShared { counters: counters.clone(), publish: publish.clone(), failed: failed.clone() };
        let failed = failed.clone();
        producer_threads.push(thread::Builder::new().name(format!("producer-{i}")).spawn(move || {
            if let Err(e) = producer::run(cfg, shared) {
                eprintln!("producer {i}: {e:#}");
                failed.store(true, Ordering::Relaxed);
            }
        })?);
    }

    // Progress once a second; snapshot counters at the window edges.
    let snapshot = |c: &Counters| {
        [
            Counters::get(&c.acked_msgs),
            Counters::get(&c.acked_bytes),
            Counters::get(&c.consumed_msgs),
            Counters::get(&c.consumed_bytes),
        ]
    };
    let mut window_start = if args.warmup > 0.0 { None } else { Some((Instant::now(), snapshot(&counters))) };
    let mut window_end = None;
    let mut last = (Instant::now(), snapshot(&counters));
    let mut next_tick = Instant::now() + Duration::from_secs(1);
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut next_bucket_secs = args.bucket_secs;
    let mut bucket_hists = (stats::new_histogram(), stats::new_histogram());
    let mut close_bucket = |hists: &mut (hdrhistogram::Histogram<u64>, hdrhistogram::Histogram<u64>), end: Instant| {
        if !hists.0.is_empty() || !hists.1.is_empty() {
            buckets.push(Bucket {
                end_secs: (end - start).as_secs_f64(),
                publish: stats::summarize(&hists.0),
                end_to_end: stats::summarize(&hists.1),
            });
        }
        *hists = (stats::new_histogram(), stats::new_histogram());
    };
    let mut producers_done = false;
    let mut last_progress = (Instant::now(), 0u64);
    let drain_until = deadline + consumer_drain_max;
    loop {
        let now = Instant::now();
        if window_start.is_none() && now >= measure_from {
            window_start = Some((now, snapshot(&counters)));
        }
        if args.producers == 0 {
            // Consume-only: measure until the backlog is drained (no progress
            // for `consume_idle_max`) or the duration is over.
            let consumed = Counters::get(&counters.consumed_msgs);
            if consumed != last_progress.1 {
                last_progress = (now, consumed);
                window_end = Some((now, snapshot(&counters)));
            }
            if now >= deadline || (consumed > 0 && now - last_progress.0 >= consume_idle_max) {
                break;
            }
        } else if !producers_done && producer_threads.iter().all(|t| t.is_finished()) {
            producers_done = true;
            window_end = Some((Instant::now(), snapshot(&counters)));
        }
        if producers_done {
            let caught_up = Counters::get(&counters.consumed_msgs) >= Counters::get(&counters.acked_msgs);
            if args.consumers == 0 || caught_up || now >= drain_until || failed.load(Ordering::Relaxed) {
                break;
            }
        }
        if now >= next_tick {
            next_tick += Duration::from_secs(1);
            let cur = (now, snapshot(&counters));
            let secs = (cur.0 - last.0).as_secs_f64();
            let p = publish.take_interval();
            let e = e2e.take_interval();
            bucket_hists.0.add(&p).expect("same histogram bounds");
            bucket_hists.1.add(&e).expect("same histogram bounds");
            // `>=`, not a multiple: a tick that comes late must not merge two buckets.
            if args.bucket_secs > 0 && (now - start).as_secs() >= next_bucket_secs {
                close_bucket(&mut bucket_hists, now);
                next_bucket_secs += args.bucket_secs;
            }
            eprintln!(
                "[{:5.1}s] produce {:8.0} msg/s {:7.1} MB/s | consume {:8.0} msg/s {:7.1} MB/s | publish p50 {:7.2} p99 {:7.2} ms | e2e p50 {:7.2} p99 {:7.2} ms | err {}",
                (now - start).as_secs_f64(),
                (cur.1[0] - last.1[0]) as f64 / secs,
                (cur.1[1] - last.1[1]) as f64 / secs / 1e6,
                (cur.1[2] - last.1[2]) as f64 / secs,
                (cur.1[3] - last.1[3]) as f64 / secs / 1e6,
                p.value_at_quantile(0.5) as f64 / 1000.0,
                p.value_at_quantile(0.99) as f64 / 1000.0,
                e.value_at_quantile(0.5) as f64 / 1000.0,
                e.value_at_quantile(0.99) as f64 / 1000.0,
                Counters::get(&counters.produce_errors) + Counters::get(&counters.fetch_errors),
            );
            last = cur;
        }
        thread::sleep(Duration::from_millis(20));
    }
    if args.bucket_secs > 0 {
        bucket_hists.0.add(&publish.take_interval()).expect("same histogram bounds");
        bucket_hists.1.add(&e2e.take_interval()).expect("same histogram bounds");
        close_bucket(&mut bucket_hists, Instant::now());
    }
    stop_consumers.store(true, Ordering::Relaxed);
    for t in producer_threads {
        let _ = t.join();
    }
    for t in consumer_threads {
        let _ = t.join();
    }
    let (t0, s0) = window_start.unwrap_or((start, [0; 4]));
    let (t1, s1) = window_end.unwrap_or((Instant::now(), snapshot(&counters)));
    let secs = (t1 - t0).as_secs_f64().max(1e-3);
    let publish_h = publish.total();
    let e2e_h = e2e.total();
    let report = Report {
        label: args.label.clone(),
        args: args.clone(),
        versions: versions_text,
        measured_secs: secs,
        produce: stats::throughput(s1[0] - s0[0], s1[1] - s0[1], secs),
        consume: stats::throughput(s1[2] - s0[2], s1[3] - s0[3], secs),
        publish_latency: stats::summarize(&publish_h),
        end_to_end_latency: stats::summarize(&e2e_h),
        produce_errors: Counters::get(&counters.produce_errors),
        fetch_errors: Counters::get(&counters.fetch_errors),
        produce_requests: Counters::get(&counters.requests),
        total_produced_bytes: Counters::get(&counters.acked_bytes),
        total_consumed_bytes: Counters::get(&counters.consumed_bytes),
        coordinated_omission_corrected: args.rate > 0.0,
        buckets,
    };
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {path}"))?;
    }
    if let Some(path) = &args.plot {
        let rate = if args.rate > 0.0 { format!("{} msg/s", args.rate) } else { "flat out".into() };
        let title = format!("{} ({} B, acks={}, {rate})", args.label, args.message_size, args.acks);
        let svg = stats::percentile_svg(
            &title,
            &[("publish (send to ack)", "#1f77b4", &publish_h), ("end-to-end (send to consume)", "#d62728", &e2e_h)],
        );
        std::fs::write(path, svg).with_context(|| format!("writing {path}"))?;
    }
    if failed.load(Ordering::Relaxed) {
        bail!("a producer or consumer failed (see above)");
    }
    Ok(())
}

fn print_report(r: &Report) {
    let lat = |name: &str, l: &stats::LatencySummary| {
        println!(
            "{name:<9} latency ms: p50 {:.3}  p99 {:.3}  p99.9 {:.3}  p99.99 {:.3}  max {:.3}  (n={})",
            l.p50_ms, l.p99_ms, l.p999_ms, l.p9999_ms, l.max_ms, l.count
        );
    };
    println!("measured {:.1} s ({})", r.measured_secs, r.versions);
    println!(
        "produce: {:.0} msg/s  {:.1} MB/s  ({} msgs, {} requests, {} errors)",
        r.produce.msgs_per_sec, r.produce.mb_per_sec, r.produce.msgs, r.produce_requests, r.produce_errors
    );
    println!(
        "consume: {:.0} msg/s  {:.1} MB/s  ({} msgs, {} fetch errors)",
        r.consume.msgs_per_sec, r.consume.mb_per_sec, r.consume.msgs, r.fetch_errors
    );
    lat("publish", &r.publish_latency);
    lat("e2e", &r.end_to_end_latency);
    if r.coordinated_omission_corrected {
        println!("(latencies measured from each message's intended send time: corrected for coordinated omission)");
    }
}
