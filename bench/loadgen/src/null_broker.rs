//! null-broker: the least a Kafka broker can do, as a benchmark baseline (issue 20).
//!
//! It answers ApiVersions, Metadata, CreateTopics, DeleteTopics, ListOffsets, Produce
//! and Fetch for one node. A produce request is acknowledged at once: offsets are
//! assigned by counting the records of each batch header, nothing is checked, copied or
//! stored. Each partition keeps only its latest batch (a slice of the request buffer),
//! and a fetch at any offset below the partition's end is answered with copies of that
//! batch, base offsets rewritten (the CRC does not cover them): the bytes a consumer gets
//! are not the ones produced at those offsets, which a throughput baseline does not need
//! (end-to-end latency against it means nothing). One thread per connection, one lock
//! over all partitions.
//!
//! A first version kept every batch in memory: until its retention filled, the page
//! faults of that memory capped it at ~220 MB/s, then it ran at ~2 GB/s.
//!
//! On a 2-core machine the client is often the limit; a run against this responder
//! shows where that limit is, so a broker's result can be read as a fraction of it.
//! It is a load-generator target, not a broker: it trusts its clients (a benchmark
//! client on loopback), bounds only frame sizes, and is never part of the product.

#![allow(non_upper_case_globals)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::{Bytes, BytesMut};
use clap::Parser;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

/// Largest request frame accepted.
const frame_bytes_max: usize = 128 * 1024 * 1024;
const node: i32 = 1;
const unknown_topic_or_partition: i16 = 3;
const offset_out_of_range: i16 = 1;
const topic_already_exists: i16 = 36;
const unsupported_version: i16 = 35;

/// Versions answered: topics by name (Produce and Fetch below 13), as spate-bench speaks.
const versions: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 5),
];

#[derive(Parser, Debug)]
#[command(about = "A Kafka protocol responder that acknowledges produce requests without storing them on disk")]
struct Args {
    /// host:port to listen on (and advertise).
    #[arg(long, default_value = "127.0.0.1:9092")]
    listen: String,
}

#[derive(Default)]
struct Partition {
    next_offset: i64,
    /// The latest batch produced and its record count: what fetches are answered with.
    template: Option<(Bytes, i64)>,
}

#[derive(Default)]
struct State {
    topics: HashMap<String, Vec<Partition>>,
}

struct Shared {
    state: Mutex<State>,
    appended: Condvar,
    host: String,
    port: i32,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(&args.listen).with_context(|| format!("binding {}", args.listen))?;
    let (host, port) = args.listen.rsplit_once(':').context("--listen host:port")?;
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        appended: Condvar::new(),
        host: host.to_string(),
        port: port.parse()?,
    });
    eprintln!("null-broker listening on {}", args.listen);
    for stream in listener.incoming() {
        let stream = stream?;
        let shared = shared.clone();
        std::thread::spawn(move || {
            if let Err(e) = serve(stream, &shared) {
                eprintln!("connection closed: {e:#}");
            }
        });
    }
    Ok(())
}

fn serve(mut stream: TcpStream, shared: &Shared) -> Result<()> {
    stream.set_nodelay(true)?;
    let mut out = BytesMut::new();
    loop {
        let mut len = [0u8; 4];
        if stream.read_exact(&mut len).is_err() {
            return Ok(());
        }
        let len = i32::from_be_bytes(len);
        if len < 8 || len as usize > frame_bytes_max {
            bail!("bad frame length {len}");
        }
        let mut frame = vec![0u8; len as usize];
        stream.read_exact(&mut frame)?;
        let mut frame = Bytes::from(frame);
        let key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let api = ApiKey::try_from(key).map_err(|_| anyhow::anyhow!("unknown api key {key}"))?;
        let header = RequestHeader::decode(&mut frame, api.request_header_version(version))?;
        let supported = versions.iter().find(|(k, _, _)| *k == api);
        let (api, version) = match supported {
            Some((_, lo, hi)) if (*lo..=*hi).contains(&version) => (api, version),
            _ if api == ApiKey::ApiVersions => (api, -1),
            _ => bail!("{api:?} v{version} not supported"),
        };
        let response = if version < 0 {
            // An ApiVersions version we do not know: answer v0 with the error (KIP-511).
            Some((ResponseKind::ApiVersions(api_versions().with_error_code(unsupported_version)), 0))
        } else {
            let request = RequestKind::decode(api, &mut frame, version)?;
            handle(request, shared).map(|r| (r, version))
        };
        let Some((response, version)) = response else { continue };
        out.clear();
        out.extend_from_slice(&[0; 4]);
        ResponseHeader::default()
            .with_correlation_id(header.correlation_id)
            .encode(&mut out, api.response_header_version(version.max(0)))?;
        response.encode(&mut out, version)?;
        let body_len = (out.len() - 4) as i32;
        out[..4].copy_from_slice(&body_len.to_be_bytes());
        stream.write_all(&out)?;
    }
}

fn api_versions() -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(
        versions
            .iter()
            .map(|(k, lo, hi)| {
                ApiVersion::default().with_api_key(*k as i16).with_min_version(*lo).with_max_version(*hi)
            })
            .collect(),
    )
}

/// None: no response (a produce with acks=0).
fn handle(request: RequestKind, shared: &Shared) -> Option<ResponseKind> {
    Some(match request {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(api_versions()),
        RequestKind::Metadata(r) => ResponseKind::Metadata(metadata(r, shared)),
        RequestKind::CreateTopics(r) => {
            let mut state = shared.state.lock().unwrap();
            let topics = r
                .topics
                .into_iter()
                .map(|t| {
                    let name = t.name.to_string();
                    let parts = t.num_partitions.max(1);
                    let error = if state.topics.contains_key(&name) {
                        topic_already_exists
                    } else {
                        if !r.validate_only {
                            state.topics.insert(name, (0..parts).map(|_| Partition::default()).collect());
                        }
                        0
                    };
                    CreatableTopicResult::default()
                        .with_name(t.name)
                        .with_error_code(error)
                        .with_num_partitions(parts)
                        .with_replication_factor(1)
                })
                .collect();
            ResponseKind::CreateTopics(CreateTopicsResponse::default().with_topics(topics))
        }
        RequestKind::DeleteTopics(r) => {
            let mut state = shared.state.lock().unwrap();
            let names: Vec<TopicName> =
                r.topic_names.into_iter().chain(r.topics.into_iter().filter_map(|t| t.name)).collect();
            let responses = names
                .into_iter()
                .map(|n| {
                    let error = if state.topics.remove(n.as_str()).is_some() { 0 } else { unknown_topic_or_partition };
                    DeletableTopicResult::default().with_name(Some(n)).with_error_code(error)
                })
                .collect();
            ResponseKind::DeleteTopics(DeleteTopicsResponse::default().with_responses(responses))
        }
        RequestKind::ListOffsets(r) => {
            let state = shared.state.lock().unwrap();
            let topics = r
                .topics
                .into_iter()
                .map(|t| {
                    let parts = state.topics.get(t.name.as_str());
                    let partitions = t
                        .partitions
                        .into_iter()
                        .map(|p| {
                            let resp = ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
                            match parts.and_then(|v| v.get(p.partition_index as usize)) {
                                None => resp.with_error_code(unknown_topic_or_partition),
                                Some(part) => {
                                    let offset = if p.timestamp == -2 { 0 } else { part.next_offset };
                                    resp.with_offset(offset).with_timestamp(-1).with_leader_epoch(0)
                                }
                            }
                        })
                        .collect();
                    ListOffsetsTopicResponse::default().with_name(t.name).with_partitions(partitions)
                })
                .collect();
            ResponseKind::ListOffsets(ListOffsetsResponse::default().with_topics(topics))
        }
        RequestKind::Produce(r) => {
            let acks = r.acks;
            let response = produce(r, shared);
            if acks == 0 {
                return None;
            }
            ResponseKind::Produce(response)
        }
        RequestKind::Fetch(r) => ResponseKind::Fetch(fetch(r, shared)),
        _ => return None,
    })
}

fn metadata(r: MetadataRequest, shared: &Shared) -> MetadataResponse {
    let state = shared.state.lock().unwrap();
    let names: Vec<String> = match r.topics {
        None => state.topics.keys().cloned().collect(),
        Some(ts) => ts.into_iter().filter_map(|t| t.name.map(|n| n.to_string())).collect(),
    };
    let topics = names
        .into_iter()
        .map(|name| {
            let t = MetadataResponseTopic::default().with_name(Some(TopicName(StrBytes::from_string(name.clone()))));
            match state.topics.get(&name) {
                None => t.with_error_code(unknown_topic_or_partition),
                Some(parts) => t.with_partitions(
                    (0..parts.len() as i32)
                        .map(|p| {
                            MetadataResponsePartition::default()
                                .with_partition_index(p)
                                .with_leader_id(BrokerId(node))
                                .with_replica_nodes(vec![BrokerId(node)])
                                .with_isr_nodes(vec![BrokerId(node)])
                        })
                        .collect(),
                ),
            }
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(node))
            .with_host(StrBytes::from_string(shared.host.clone()))
            .with_port(shared.port)])
        .with_cluster_id(Some(StrBytes::from_static_str("null-broker")))
        .with_controller_id(BrokerId(node))
        .with_topics(topics)
}

/// Records in a record set of magic-2 batches (each batch header's record count).
fn batches(records: &Bytes) -> Vec<(usize, usize, i64)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 61 <= records.len() {
        let batch_length = i32::from_be_bytes(records[pos + 8..pos + 12].try_into().unwrap());
        let count = i32::from_be_bytes(records[pos + 57..pos + 61].try_into().unwrap()) as i64;
        // A negative or overlong batchLength ends the walk (no wrap-around in the sum).
        let Some(len) = usize::try_from(batch_length).ok().map(|l| l + 12) else { break };
        if len < 61 || len > records.len() - pos {
            break;
        }
        out.push((pos, len, count.max(0)));
        pos += len;
    }
    out
}

fn produce(r: ProduceRequest, shared: &Shared) -> ProduceResponse {
    let mut state = shared.state.lock().unwrap();
    let responses = r
        .topic_data
        .into_iter()
        .map(|t| {
            let parts = state.topics.get_mut(t.name.as_str());
            let mut parts = parts;
            let partition_responses = t
                .partition_data
                .into_iter()
                .map(|p| {
                    let resp = PartitionProduceResponse::default().with_index(p.index);
                    let Some(part) = parts.as_deref_mut().and_then(|v| v.get_mut(p.index as usize)) else {
                        return resp.with_error_code(unknown_topic_or_partition);
                    };
                    let base = part.next_offset;
                    let records = p.records.unwrap_or_default();
                    for (pos, len, count) in batches(&records) {
                        if count > 0 {
                            part.template = Some((records.slice(pos..pos + len), count));
                        }
                        part.next_offset += count;
                    }
                    resp.with_base_offset(base).with_log_append_time_ms(-1).with_log_start_offset(0)
                })
                .collect();
            TopicProduceResponse::default().with_name(t.name).with_partition_responses(partition_responses)
        })
        .collect();
    shared.appended.notify_all();
    ProduceResponse::default().with_responses(responses)
}

fn fetch(r: FetchRequest, shared: &Shared) -> FetchResponse {
    let deadline = Instant::now() + Duration::from_millis(r.max_wait_ms.max(0) as u64);
    let mut state = shared.state.lock().unwrap();
    loop {
        let mut total = 0usize;
        let topics: Vec<FetchableTopicResponse> = r
            .topics
            .iter()
            .map(|t| {
                let parts = state.topics.get(t.topic.as_str());
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        let resp =
                            PartitionData::default().with_partition_index(p.partition).with_aborted_transactions(None);
                        let Some(part) = parts.and_then(|v| v.get(p.partition as usize)) else {
                            return resp.with_error_code(unknown_topic_or_partition);
                        };
                        let resp = resp
                            .with_high_watermark(part.next_offset)
                            .with_last_stable_offset(part.next_offset)
                            .with_log_start_offset(0);
                        if p.fetch_offset < 0 || p.fetch_offset > part.next_offset {
                            return resp.with_error_code(offset_out_of_range);
                        }
                        let budget = (p.partition_max_bytes.max(0) as usize)
                            .min((r.max_bytes.max(0) as usize).saturating_sub(total));
                        let mut out = BytesMut::new();
                        if let Some((batch, count)) = &part.template {
                            let mut base = p.fetch_offset;
                            while base + count <= part.next_offset
                                && (out.is_empty() || out.len() + batch.len() <= budget)
                            {
                                let at = out.len();
                                out.extend_from_slice(batch);
                                out[at..at + 8].copy_from_slice(&base.to_be_bytes());
                                base += count;
                            }
                        }
                        total += out.len();
                        resp.with_records(Some(out.freeze()))
                    })
                    .collect();
                FetchableTopicResponse::default().with_topic(t.topic.clone()).with_partitions(partitions)
            })
            .collect();
        let now = Instant::now();
        if total >= r.min_bytes.max(1) as usize || now >= deadline {
            return FetchResponse::default().with_responses(topics);
        }
        state = shared.appended.wait_timeout(state, deadline - now).unwrap().0;
    }
}
