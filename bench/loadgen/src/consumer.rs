//! One consumer = one connection with manual assignment of a set of
//! partitions. It long-polls Fetch for all of them and records, per record,
//! the end-to-end latency: now minus the send time embedded in the value.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::{Buf, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;

use crate::stats::{self, Counters, SharedHist};
use crate::wire;

pub const fetch_max_wait_ms: i32 = 500;
pub const fetch_partition_bytes_max: i32 = 4 * 1024 * 1024;
pub const fetch_response_bytes_max: i32 = 64 * 1024 * 1024;

#[derive(Clone)]
pub struct ConsumerConfig {
    pub addr: String,
    pub topic: String,
    /// (partition, first offset to fetch)
    pub assignment: Vec<(i32, i64)>,
    pub fetch_version: i16,
    pub measure_from_us: u64,
    /// Hard stop; consumers normally stop earlier when `stop` is raised.
    pub deadline: Instant,
}

pub struct ConsumerShared {
    pub counters: Arc<Counters>,
    pub e2e: Arc<SharedHist>,
    pub stop: Arc<AtomicBool>,
}

pub fn run(cfg: ConsumerConfig, shared: ConsumerShared) -> Result<()> {
    use std::io::Write;
    let mut stream = TcpStream::connect(&cfg.addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut offsets: Vec<(i32, i64)> = cfg.assignment.clone();
    let topic = TopicName(StrBytes::from_string(cfg.topic.clone()));
    let mut local = stats::new_histogram();
    let mut correlation_id = 0i32;
    let mut frame = BytesMut::new();
    let mut errors_shown = 0;
    while !shared.stop.load(Ordering::Relaxed) && Instant::now() < cfg.deadline {
        let partitions = offsets
            .iter()
            .map(|&(p, o)| {
                FetchPartition::default()
                    .with_partition(p)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(o)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(fetch_partition_bytes_max)
            })
            .collect();
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(fetch_max_wait_ms)
            .with_min_bytes(1)
            .with_max_bytes(fetch_response_bytes_max)
            .with_isolation_level(0)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default().with_topic(topic.clone()).with_partitions(partitions)]);
        correlation_id = correlation_id.wrapping_add(1);
        frame.clear();
        wire::encode_request(&mut frame, correlation_id, cfg.fetch_version, &req)?;
        stream.write_all(&frame)?;
        let resp_frame = wire::read_frame(&mut stream)?;
        if wire::frame_correlation_id(&resp_frame) != correlation_id {
            bail!("fetch correlation id mismatch");
        }
        let resp = wire::decode_response::<FetchRequest>(resp_frame, cfg.fetch_version)?;
        if resp.error_code != 0 {
            Counters::add(&shared.counters.fetch_errors, 1);
            if errors_shown < 5 {
                errors_shown += 1;
                eprintln!("fetch error code {}", resp.error_code);
            }
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let mut had_error = false;
        for t in resp.responses {
            for pd in t.partitions {
                let Some(slot) = offsets.iter_mut().find(|(p, _)| *p == pd.partition_index) else {
                    continue;
                };
                if pd.error_code != 0 {
                    Counters::add(&shared.counters.fetch_errors, 1);
                    had_error = true;
                    if errors_shown < 5 {
                        errors_shown += 1;
                        eprintln!("fetch error: partition {} code {}", pd.partition_index, pd.error_code);
                    }
                    continue;
                }
                let Some(records) = pd.records else { continue };
                let now = stats::now_us();
                local.reset();
                let (mut msgs, mut bytes) = (0u64, 0u64);
                let mut measuring = false;
                for (_base, mut batch) in wire::split_batches(records) {
                    let Some(last) = wire::batch_last_offset(&batch) else { break };
                    if last < slot.1 {
                        continue; // whole batch before our position
                    }
                    let set = RecordBatchDecoder::decode(&mut batch)?;
                    for r in &set.records {
                        if r.offset < slot.1 {
                            continue;
                        }
                        msgs += 1;
                        if let Some(v) = &r.value {
                            bytes += v.len() as u64;
                            if v.len() >= 8 {
                                let sent_us = (&v[..8]).get_u64();
                                if sent_us >= cfg.measure_from_us && sent_us <= now + 60_000_000 {
                                    measuring = true;
                                    stats::record(&mut local, now.saturating_sub(sent_us));
                                }
                            }
                        }
                    }
                    slot.1 = last + 1;
                }
                if msgs > 0 {
                    shared.e2e.merge(&local, measuring);
                    Counters::add(&shared.counters.consumed_msgs, msgs);
                    Counters::add(&shared.counters.consumed_bytes, bytes);
                }
            }
        }
        if had_error {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}
