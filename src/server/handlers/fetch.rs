//! Fetch: whole record batches from each requested partition, below the high watermark,
//! within the response and partition byte limits (the first batch is returned even if
//! larger, KIP-74). Long-polls until `min_bytes` are there or `max_wait_ms` passes, then
//! returns what there is. Incremental fetch sessions (KIP-227) in `fetch_sessions.rs`:
//! a session's answers list only partitions with something new. Followers (a replica id
//! of 0 or more) read up to the log end and report their position, with their broker
//! epoch from v15 on (KIP-903); consumers read below the high watermark, read_committed
//! ones (isolation_level 1) below the last stable offset, and get the aborted
//! transactions that overlap what they read (the client drops those records). v13+ name
//! topics by id (KIP-516); v16+ answers NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH
//! with the leader this broker knows and its endpoint (KIP-951), so the client goes there
//! without asking for metadata first. v17's directory ids and v18's follower high
//! watermark are for KRaft's replicas; a Spate leader ignores them.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::{select, select_all, Either};
use kafka_protocol::messages::fetch_response::{self, AbortedTransaction, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, FetchResponse, ProducerId, TopicName};

use crate::coordinator::registry::CLUSTER_METADATA_TOPIC;
use crate::model::{limits, BrokerEpoch, LeaderEpoch, NodeId, Offset, TopicPartition};
use crate::protocol::zero_copy::{new_marker, splice_file_ranges, FileRange, Response};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::replication::NO_BROKER_EPOCH;
use crate::shard::{FetchRecords, PartitionOp, PartitionReply};

use super::super::context::ShardContext;
use super::super::fetch_sessions::{self, first_topic_id_version};
use super::super::now_ms;
use super::super::throttle;
use super::{partition_error_code, respond};
use crate::config::THROTTLED_RATE_UNLIMITED;

/// The longest long-poll we honour (Kafka clients use 500 ms by default).
const fetch_wait_ms_max: i32 = 60_000;
/// The first Fetch version with KIP-951's leader hints.
const first_leader_hints_version: i16 = 16;

/// KIP-951: each partition answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH gets
/// the leader and leader epoch this broker knows; returns the endpoints of those leaders.
fn fetch_leader_hints(
    ctx: &ShardContext,
    frame: &RequestFrame,
    topics: &mut [FetchableTopicResponse],
) -> Vec<fetch_response::NodeEndpoint> {
    let wanted = |p: &PartitionData| super::LeaderHints::wanted(p.error_code);
    if !topics.iter().any(|t| t.partitions.iter().any(wanted)) {
        return Vec::new();
    }
    let mut hints = super::LeaderHints::new(ctx);
    for t in topics.iter_mut() {
        for p in &mut t.partitions {
            if let Some((leader, epoch)) = hints.hint(p.error_code, t.topic.as_str(), p.partition_index) {
                p.current_leader = fetch_response::LeaderIdAndEpoch::default()
                    .with_leader_id(BrokerId(leader))
                    .with_leader_epoch(epoch);
            }
        }
    }
    hints
        .endpoints(ctx, frame)
        .into_iter()
        .map(|b| {
            fetch_response::NodeEndpoint::default()
                .with_node_id(BrokerId(b.id))
                .with_host(super::str_bytes(b.host))
                .with_port(b.port)
                .with_rack(b.rack.map(super::str_bytes))
        })
        .collect()
}

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Response, ProtocolError> {
    let mut req: FetchRequest = decode_body(frame)?;
    if req.topics.iter().any(|t| t.topic.as_str() == CLUSTER_METADATA_TOPIC) {
        return super::cluster_metadata::handle(ctx, frame, req).await.map(Response::from);
    }
    // v15+ names the follower in ReplicaState (with its broker epoch).
    if frame.api_version >= 15 {
        req.replica_id = req.replica_state.replica_id;
    }
    let (mut req, mode) = match ctx.fetch_sessions.borrow_mut().prepare(&req, frame.api_version) {
        Ok(prepared) => prepared,
        Err(code) => {
            let body = FetchResponse::default().with_error_code(code).with_session_id(0);
            return respond(ApiKey::Fetch, frame, &body).map(Response::from);
        }
    };
    // v13+ names topics by id: named after the session is applied, so that a session's
    // partition of a topic deleted since is answered by its id.
    let unknown_ids =
        if frame.api_version >= first_topic_id_version { resolve_topic_ids(ctx, &mut req) } else { Vec::new() };
    let denied = unauthorized(ctx, frame, &mut req);
    let started = Instant::now();
    let deadline = started + Duration::from_millis(req.max_wait_ms.clamp(0, fetch_wait_ms_max) as u64);
    let response_bytes_max = if req.max_bytes <= 0 {
        limits::fetch_response_bytes_max
    } else {
        (req.max_bytes as usize).min(limits::fetch_response_bytes_max)
    };
    loop {
        let (topics, topic_bytes, ranges, total_bytes, any_error, readable_ends) =
            fetch_once(ctx, &req, frame.api_version, response_bytes_max).await;
        let now = Instant::now();
        let any_error = any_error || !unknown_ids.is_empty() || !denied.is_empty();
        if total_bytes >= req.min_bytes.max(1) as usize || any_error || now >= deadline || ctx.stopping.get() {
            let session_id = match mode {
                fetch_sessions::Mode::Session { id, .. } => id,
                fetch_sessions::Mode::Sessionless => 0,
            };
            // Client quotas: a consumer's response bytes against consumer_byte_rate. Over
            // it, Kafka's answer: no data (the bytes are taken back), the throttle time,
            // and the session left as it was (a new session is not kept).
            if req.replica_id.0 < 0 {
                let throttle_ms = super::super::quotas::record_fetch(ctx, frame, total_bytes as u64);
                if throttle_ms > 0 {
                    let session_id = match mode {
                        fetch_sessions::Mode::Session { incremental: true, .. } => session_id,
                        _ => 0,
                    };
                    let body =
                        FetchResponse::default().with_throttle_time_ms(throttle_ms as i32).with_session_id(session_id);
                    let mut response = Response::from(respond(ApiKey::Fetch, frame, &body)?);
                    response.throttle_ms = throttle_ms;
                    return Ok(response);
                }
            }
            for (t, bytes) in topics.iter().zip(topic_bytes) {
                if bytes > 0 {
                    ctx.metrics.add_topic_bytes(ctx.id, t.topic.as_str(), 0, bytes);
                }
            }
            let mut topics = topics;
            ctx.fetch_sessions.borrow_mut().finish(mode, &mut topics);
            topics.extend(denied.iter().cloned());
            topics.extend(unknown_ids.iter().cloned());
            let mut body = FetchResponse::default().with_responses(topics).with_session_id(session_id);
            if frame.api_version >= first_leader_hints_version {
                body.node_endpoints = fetch_leader_hints(ctx, frame, &mut body.responses);
            }
            let encoded = respond(ApiKey::Fetch, frame, &body)?;
            let flexible = frame.api_version >= 12;
            return splice_file_ranges(encoded, flexible, ranges);
        }
        // Nothing (enough) yet: wait until any partition grows past what this pass could
        // read, or the deadline. (Waiting on the fetch offset instead would wake at once
        // whenever some data is there but less than min_bytes: a busy loop on the core
        // until max_wait_ms.)
        let partitions = req.topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (t, p)));
        let waits = partitions.zip(readable_ends).map(|((t, p), readable_end)| {
            ctx.call(PartitionOp::WaitForData {
                tp: TopicPartition::new(t.topic.as_str(), p.partition),
                offset: Offset(p.fetch_offset.max(readable_end.0)),
                replica: req.replica_id.0 >= 0,
                read_committed: req.isolation_level == 1,
            })
        });
        let receivers: Vec<_> = futures::future::join_all(waits)
            .await
            .into_iter()
            .filter_map(|r| match r {
                Ok(PartitionReply::Waiting(rx)) => Some(rx),
                _ => None,
            })
            .collect();
        let timer = Box::pin(glommio::timer::sleep(deadline - now));
        if receivers.is_empty() {
            timer.await;
        } else if let Either::Left(_) = select(timer, select_all(receivers)).await {
            // Deadline reached; the loop answers with whatever is there.
        }
    }
}

/// Authorization (Kafka's handleFetchRequest): a follower needs CLUSTER_ACTION on the
/// cluster, a consumer READ on each topic. The partitions refused leave the request;
/// their answers (TOPIC_AUTHORIZATION_FAILED) are returned.
fn unauthorized(ctx: &ShardContext, frame: &RequestFrame, req: &mut FetchRequest) -> Vec<FetchableTopicResponse> {
    use crate::security::acl::{AclOperation, ResourceType};
    if !super::authz::enabled(ctx) {
        return Vec::new();
    }
    let view = ctx.view();
    let follower_allowed =
        req.replica_id.0 < 0 || super::authz::authorize_cluster(ctx, frame, &view, AclOperation::ClusterAction);
    let mut denied = Vec::new();
    req.topics.retain(|t| {
        let allowed = follower_allowed
            && (req.replica_id.0 >= 0
                || super::authz::authorize(
                    ctx,
                    frame,
                    &view,
                    AclOperation::Read,
                    ResourceType::Topic,
                    t.topic.as_str(),
                ));
        if !allowed {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    PartitionData::default()
                        .with_partition_index(p.partition)
                        .with_error_code(error_code::TOPIC_AUTHORIZATION_FAILED)
                        .with_high_watermark(-1)
                        .with_records(Some(Bytes::new()))
                })
                .collect();
            denied.push(
                FetchableTopicResponse::default()
                    .with_topic(t.topic.clone())
                    .with_topic_id(t.topic_id)
                    .with_partitions(partitions),
            );
        }
        allowed
    });
    denied
}

/// Fetch v13+ names topics by id (KIP-516): name each from the cluster view, so that the
/// rest of the handler and fetch sessions work by name. Topics whose id is unknown leave
/// the request; their answer (UNKNOWN_TOPIC_ID) is returned.
fn resolve_topic_ids(ctx: &ShardContext, req: &mut FetchRequest) -> Vec<FetchableTopicResponse> {
    let view = ctx.view();
    let mut unknown = Vec::new();
    req.topics.retain_mut(|t| match view.by_id(t.topic_id) {
        Some((name, _)) => {
            t.topic = TopicName(crate::client::sb(name));
            true
        }
        None => {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    PartitionData::default()
                        .with_partition_index(p.partition)
                        .with_error_code(error_code::UNKNOWN_TOPIC_ID)
                        .with_high_watermark(-1)
                        .with_records(Some(Bytes::new()))
                })
                .collect();
            unknown.push(FetchableTopicResponse::default().with_topic_id(t.topic_id).with_partitions(partitions));
            false
        }
    });
    req.forgotten_topics_data.retain_mut(|t| match view.by_id(t.topic_id) {
        Some((name, _)) => {
            t.topic = TopicName(crate::client::sb(name));
            true
        }
        None => false,
    });
    unknown
}

/// One pass over every requested partition. Returns the topics, the record bytes
/// gathered, whether any partition failed (an error is answered at once), and, per
/// partition in request order, where its readable data ended (-1 when it failed).
async fn fetch_once(
    ctx: &ShardContext,
    req: &FetchRequest,
    req_version: i16,
    response_bytes_max: usize,
) -> (Vec<FetchableTopicResponse>, Vec<u64>, Vec<FileRange>, usize, bool, Vec<Offset>) {
    // KIP-903: the follower's broker epoch (ReplicaState, v15+).
    let replica_epoch = if req_version >= 15 { BrokerEpoch(req.replica_state.replica_epoch) } else { NO_BROKER_EPOCH };
    let calls = req.topics.iter().flat_map(|t| {
        t.partitions.iter().map(move |p| {
            let max_bytes = (p.partition_max_bytes.max(0) as usize).min(response_bytes_max);
            ctx.call(PartitionOp::Fetch {
                read_committed: req.isolation_level == 1,
                tp: TopicPartition::new(t.topic.as_str(), p.partition),
                offset: Offset(p.fetch_offset),
                max_bytes,
                min_one_batch: true,
                replica: NodeId(req.replica_id.0),
                replica_epoch,
                replica_log_start: p.log_start_offset,
                current_leader_epoch: LeaderEpoch(p.current_leader_epoch),
                now_ms: now_ms(),
            })
        })
    });
    let mut replies = futures::future::join_all(calls).await.into_iter();
    // Replication throttle (leader side): a follower out of the ISR fetching a throttled
    // partition gets no data for it while this shard's leader rate is exceeded.
    let follower = NodeId(req.replica_id.0);
    let view = ctx.view();
    let me = NodeId(ctx.config.node_id);
    let leader_rate = if follower.0 >= 0 {
        throttle::shard_rate(&view, me, throttle::LEADER_RATE, ctx.nr_shards)
    } else {
        THROTTLED_RATE_UNLIMITED
    };
    let throttled = |topic: &str, partition: i32| {
        leader_rate != THROTTLED_RATE_UNLIMITED
            && view
                .get(topic)
                .is_some_and(|m| throttle::throttled(&m.configs, throttle::LEADER_REPLICAS, partition, me))
            && !view.partition(topic, partition).is_some_and(|(_, s)| s.isr.contains(&follower))
    };
    let mut total_bytes = 0usize;
    let mut any_error = false;
    let mut ranges = Vec::new();
    let mut readable_ends = Vec::new();
    let mut topic_bytes = Vec::with_capacity(req.topics.len());
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let topic_start_bytes = total_bytes;
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let reply = replies.next().expect("one reply per partition");
            let d = PartitionData::default().with_partition_index(p.partition).with_aborted_transactions(None);
            partitions.push(match reply {
                Ok(PartitionReply::Fetched(data)) => {
                    readable_ends.push(data.readable_end);
                    // Whole batches only: a partition that would overflow the response
                    // budget contributes nothing this time, unless it is the first.
                    let throttle = throttled(t.topic.as_str(), p.partition);
                    let throttled_out =
                        throttle && ctx.replication_throttle.borrow_mut().leader.exceeded(leader_rate, now_ms());
                    let records = if throttled_out
                        || total_bytes > 0 && total_bytes + data.records.len() > response_bytes_max
                    {
                        Bytes::new()
                    } else {
                        if throttle {
                            ctx.replication_throttle.borrow_mut().leader.record(data.records.len() as u64, now_ms());
                        }
                        total_bytes += data.records.len();
                        match data.records {
                            FetchRecords::Copied(v) => Bytes::from(v),
                            FetchRecords::File(plan) => {
                                let marker = new_marker();
                                ranges.push(FileRange {
                                    marker,
                                    file: plan.file,
                                    position: plan.position_bytes,
                                    length: plan.length_bytes,
                                });
                                Bytes::copy_from_slice(&marker)
                            }
                        }
                    };
                    let aborted = data.aborted.map(|found| {
                        found
                            .iter()
                            .map(|a| {
                                AbortedTransaction::default()
                                    .with_producer_id(ProducerId(a.producer_id))
                                    .with_first_offset(a.first_offset)
                            })
                            .collect()
                    });
                    let d = d
                        .with_high_watermark(data.high_watermark.0)
                        .with_last_stable_offset(data.last_stable_offset.0)
                        .with_aborted_transactions(aborted)
                        .with_records(Some(records));
                    if req_version >= 5 {
                        d.with_log_start_offset(data.log_start_offset.0)
                    } else {
                        d
                    }
                }
                Ok(other) => unreachable!("Fetch answered {other:?}"),
                Err(e) => {
                    readable_ends.push(Offset(-1));
                    any_error = true;
                    d.with_error_code(partition_error_code(&e)).with_high_watermark(-1).with_records(Some(Bytes::new()))
                }
            });
        }
        topic_bytes.push((total_bytes - topic_start_bytes) as u64);
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_topic_id(t.topic_id)
                .with_partitions(partitions),
        );
    }
    (topics, topic_bytes, ranges, total_bytes, any_error, readable_ends)
}
