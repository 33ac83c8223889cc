//! Produce v13 and Fetch v13-18 against the real `spate` binary, two brokers (broker 1
//! runs the embedded coordinator, broker 2 joins it), one topic of two partitions so
//! that each broker leads one:
//! - topics named by id (KIP-516): produced and fetched by id, an unknown id answered
//!   UNKNOWN_TOPIC_ID;
//! - KIP-951's leader hints: a partition asked of the broker that does not lead it is
//!   answered NOT_LEADER_OR_FOLLOWER with its leader, the leader epoch and the leader's
//!   endpoint, so the client need not ask for metadata first;
//! - a fetch session held by topic id: after the topic is deleted and created again
//!   under the same name, the session's partition is answered UNKNOWN_TOPIC_ID by the
//!   old id, never with the new topic's records; names in a session by id are
//!   FETCH_SESSION_TOPIC_ID_ERROR.
//!
//! And, on one broker, the versions past the `kafka-protocol` crate's (`protocol::newer`),
//! with the answers Apache Kafka 4.4 gives (measured side by side): OffsetCommit and
//! OffsetFetch v10 and TxnOffsetCommit v6 by topic id, ListOffsets v11's -6, ApiVersions
//! v5's cluster and node check, DeleteGroups v3, DescribeLogDirs v5.

#![allow(non_upper_case_globals)]

mod wire_common;

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequestGroup, OffsetFetchRequestTopics};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, FetchRequest, FetchResponse, GroupId, ListOffsetsRequest,
    ListOffsetsResponse, MetadataResponse, OffsetCommitRequest, OffsetFetchRequest, ProduceRequest, TopicName,
    TransactionalId, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
use spate::client::{Client, ClientConfig, Connection};
use spate::protocol::newer;
use spate::protocol::shape;
use uuid::Uuid;
use wire_common::{start_broker, Broker};

const NONE: i16 = 0;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const UNSUPPORTED_VERSION: i16 = 35;
const INVALID_REQUEST: i16 = 42;
const GROUP_ID_NOT_FOUND: i16 = 69;
const REBOOTSTRAP_REQUIRED: i16 = 129;
const UNKNOWN_TOPIC_ID: i16 = 100;
const FETCH_SESSION_TOPIC_ID_ERROR: i16 = 106;
const wait_ms_max: u64 = 20_000;

fn records(values: &[&str]) -> Bytes {
    let batch: Vec<_> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut r = spate::protocol::plain_record(
                i as i64,
                -1,
                1_700_000_000_000,
                None,
                Some(Bytes::from(v.to_string())),
                Default::default(),
            );
            r.sequence = kafka_protocol::records::NO_SEQUENCE.wrapping_add(i as i32);
            r
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &batch, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .unwrap();
    buf.freeze()
}

fn produce_v13(
    c: &mut Connection,
    topic_id: Uuid,
    partition: i32,
    values: &[&str],
) -> kafka_protocol::messages::ProduceResponse {
    let req = ProduceRequest::default().with_acks(1).with_timeout_ms(10_000).with_topic_data(vec![
        TopicProduceData::default().with_topic_id(topic_id).with_partition_data(vec![PartitionProduceData::default()
            .with_index(partition)
            .with_records(Some(records(values)))]),
    ]);
    c.call_version(13, &req).unwrap()
}

/// A consumer's Fetch of `parts` (topic id, partition, fetch offset) within `session` (id, epoch).
fn fetch_by_id(session: (i32, i32), parts: &[(Uuid, i32, i64)]) -> FetchRequest {
    let topics = parts
        .iter()
        .map(|(id, p, offset)| {
            FetchTopic::default().with_topic_id(*id).with_partitions(vec![FetchPartition::default()
                .with_partition(*p)
                .with_fetch_offset(*offset)
                .with_partition_max_bytes(1 << 20)
                .with_log_start_offset(-1)
                .with_current_leader_epoch(-1)])
        })
        .collect();
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(10)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_id(session.0)
        .with_session_epoch(session.1)
        .with_topics(topics)
}

/// (error code, record bytes) of each partition answered, by (topic id, partition).
fn answered(resp: &FetchResponse) -> Vec<((Uuid, i32), i16, usize)> {
    resp.responses
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                ((t.topic_id, p.partition_index), p.error_code, p.records.as_ref().map_or(0, |r| r.len()))
            })
        })
        .collect()
}

fn metadata(b: &Broker, topic: &str) -> MetadataResponse {
    let mut client = Client::connect(ClientConfig::new(&b.bootstrap)).unwrap();
    client.metadata(Some(&[topic.to_string()]), false).unwrap()
}

/// The topic's id and each partition's (leader, leader epoch), once every partition has
/// a leader and both brokers are listed.
fn wait_led(b: &Broker, topic: &str) -> (Uuid, Vec<(i32, i32)>, MetadataResponse) {
    let started = Instant::now();
    loop {
        let m = metadata(b, topic);
        if let Some(t) = m.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == topic)) {
            let leaders: Vec<(i32, i32)> = t.partitions.iter().map(|p| (p.leader_id.0, p.leader_epoch)).collect();
            if t.error_code == NONE && m.brokers.len() == 2 && !leaders.is_empty() && leaders.iter().all(|l| l.0 >= 0) {
                return (t.topic_id, leaders, m);
            }
        }
        assert!(started.elapsed() < Duration::from_millis(wait_ms_max), "{topic} not led: {m:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn topics_by_id_leader_hints_and_sessions_by_id() {
    let b1 = start_broker(&["--node-id", "1", "--cores", "1"]);
    let b2 = start_broker(&["--node-id", "2", "--cores", "1", "--coordinator", &b1.bootstrap]);
    let mut client = Client::connect(ClientConfig::new(&b1.bootstrap)).unwrap();
    client.create_topic("ids", 2, 1, &[]).unwrap();
    let (id, leaders, meta) = wait_led(&b1, "ids");
    let local = leaders.iter().position(|l| l.0 == 1).expect("broker 1 leads a partition") as i32;
    let remote = leaders.iter().position(|l| l.0 == 2).expect("broker 2 leads a partition") as i32;
    let remote_epoch = leaders[remote as usize].1;
    let b2_port = meta.brokers.iter().find(|b| b.node_id.0 == 2).unwrap().port;
    assert_eq!(b2_port, b2.bootstrap.rsplit(':').next().unwrap().parse::<i32>().unwrap());
    let mut c = b1.conn();

    // Produce v13 by id: to the leader, to the other broker (hints), to an unknown id.
    let resp = produce_v13(&mut c, id, local, &["a", "b", "c"]);
    let t = &resp.responses[0];
    assert_eq!((t.topic_id, t.partition_responses[0].error_code, t.partition_responses[0].base_offset), (id, NONE, 0));
    let resp = produce_v13(&mut c, id, remote, &["x"]);
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!(p.error_code, NOT_LEADER_OR_FOLLOWER);
    assert_eq!((p.current_leader.leader_id.0, p.current_leader.leader_epoch), (2, remote_epoch));
    let ends: Vec<(i32, i32)> = resp.node_endpoints.iter().map(|e| (e.node_id.0, e.port)).collect();
    assert_eq!(ends, vec![(2, b2_port)], "the hinted leader's endpoint");
    let unknown = Uuid::from_u128(0x5ba7e);
    let resp = produce_v13(&mut c, unknown, local, &["y"]);
    assert_eq!(
        (resp.responses[0].topic_id, resp.responses[0].partition_responses[0].error_code),
        (unknown, UNKNOWN_TOPIC_ID)
    );

    // Fetch v18, sessionless, by id: records from the leader, hints from the other.
    let resp: FetchResponse =
        c.call_version(18, &fetch_by_id((0, -1), &[(id, local, 0), (id, remote, 0), (unknown, 0, 0)])).unwrap();
    let got = answered(&resp);
    assert!(got.iter().any(|&(k, code, bytes)| k == (id, local) && code == NONE && bytes > 0), "{got:?}");
    assert!(got.contains(&((id, remote), NOT_LEADER_OR_FOLLOWER, 0)), "{got:?}");
    assert!(got.contains(&((unknown, 0), UNKNOWN_TOPIC_ID, 0)), "{got:?}");
    let hinted =
        resp.responses.iter().flat_map(|t| &t.partitions).find(|p| p.error_code == NOT_LEADER_OR_FOLLOWER).unwrap();
    assert_eq!((hinted.current_leader.leader_id.0, hinted.current_leader.leader_epoch), (2, remote_epoch));
    assert_eq!(resp.node_endpoints.iter().map(|e| (e.node_id.0, e.port)).collect::<Vec<_>>(), vec![(2, b2_port)]);

    // A session by id (v16): opened; an incremental fetch past the records lists
    // nothing; one back at offset 0 gets the records again (the session holds it there).
    let resp: FetchResponse = c.call_version(16, &fetch_by_id((0, 0), &[(id, local, 0)])).unwrap();
    let session = resp.session_id;
    assert!(session > 0 && answered(&resp)[0].1 == NONE && answered(&resp)[0].2 > 0, "{resp:?}");
    let resp: FetchResponse = c.call_version(16, &fetch_by_id((session, 1), &[(id, local, 3)])).unwrap();
    assert_eq!(answered(&resp), vec![], "nothing new at the new position: {resp:?}");
    let resp: FetchResponse = c.call_version(16, &fetch_by_id((session, 2), &[(id, local, 0)])).unwrap();
    assert!(answered(&resp)[0].2 > 0, "{resp:?}");
    // Names in a session by id.
    let resp: FetchResponse = c.call_version(12, &fetch_by_id((session, 3), &[])).unwrap();
    assert_eq!(resp.error_code, FETCH_SESSION_TOPIC_ID_ERROR);

    // The topic deleted and created again under its name, with records in every
    // partition: the session's partition is answered by its old id, UNKNOWN_TOPIC_ID.
    client.delete_topic("ids").unwrap();
    let started = Instant::now();
    let (new_id, new_leaders) = loop {
        let mut client = Client::connect(ClientConfig::new(&b1.bootstrap)).unwrap();
        let _ = client.create_topic("ids", 2, 1, &[]);
        let (new_id, new_leaders, _) = wait_led(&b1, "ids");
        if new_id != id {
            break (new_id, new_leaders);
        }
        assert!(started.elapsed() < Duration::from_millis(wait_ms_max), "topic not created again");
        std::thread::sleep(Duration::from_millis(100));
    };
    // (UNKNOWN_TOPIC_ID is retried, as clients do, until the leader's metadata has it.)
    for (p, (leader, _)) in new_leaders.iter().enumerate() {
        let mut c = if *leader == 1 { b1.conn() } else { b2.conn() };
        let started = Instant::now();
        loop {
            let resp = produce_v13(&mut c, new_id, p as i32, &["new-1", "new-2"]);
            match resp.responses[0].partition_responses[0].error_code {
                NONE => break,
                UNKNOWN_TOPIC_ID if started.elapsed() < Duration::from_millis(wait_ms_max) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => panic!("{resp:?}"),
            }
        }
    }
    let resp: FetchResponse = c.call_version(17, &fetch_by_id((session, 3), &[])).unwrap();
    assert_eq!(answered(&resp), vec![((id, local), UNKNOWN_TOPIC_ID, 0)], "{resp:?}");
    // The new topic by its new id, on its leader, in a new session.
    let (new_leader, _) = new_leaders[local as usize];
    let b = if new_leader == 1 { &b1 } else { &b2 };
    let resp: FetchResponse = b.conn().call_version(18, &fetch_by_id((0, 0), &[(new_id, local, 0)])).unwrap();
    let got = answered(&resp);
    assert!(got.len() == 1 && got[0].0 == (new_id, local) && got[0].1 == NONE && got[0].2 > 0, "{got:?}");
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// A body answered at `version` that the shape table reads to its last byte.
fn shaped(key: ApiKey, version: i16, body: &Bytes) {
    assert_eq!(shape::check(shape::response_shape(key as i16).unwrap(), version, body, u64::MAX), Ok(body.len()));
}

fn offset_commit_v10(c: &mut Connection, group: &str, topics: &[(Uuid, &[(i32, i64)])]) -> Vec<(Uuid, i32, i16)> {
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(sb(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(
            topics
                .iter()
                .map(|(id, parts)| {
                    OffsetCommitRequestTopic::default().with_topic_id(*id).with_partitions(
                        parts
                            .iter()
                            .map(|(p, o)| {
                                OffsetCommitRequestPartition::default()
                                    .with_partition_index(*p)
                                    .with_committed_offset(*o)
                                    .with_committed_metadata(Some(sb("m")))
                            })
                            .collect(),
                    )
                })
                .collect(),
        );
    let body = c.call_raw(ApiKey::OffsetCommit, 10, |b| newer::encode_offset_commit_v10(&req, b)).unwrap();
    shaped(ApiKey::OffsetCommit, 10, &body);
    let resp = newer::decode_offset_commit_response_v10(&mut body.clone()).unwrap();
    resp.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, p.partition_index, p.error_code)))
        .collect()
}

/// (topic id, partition, offset, metadata, error) of one group's v10 answer.
fn offset_fetch_v10(
    c: &mut Connection,
    group: &str,
    topics: Option<&[(Uuid, &[i32])]>,
) -> Vec<(Uuid, i32, i64, String, i16)> {
    let topics = topics.map(|ts| {
        ts.iter()
            .map(|(id, ps)| OffsetFetchRequestTopics::default().with_topic_id(*id).with_partition_indexes(ps.to_vec()))
            .collect()
    });
    let req = OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
        .with_group_id(GroupId(sb(group)))
        .with_member_epoch(-1)
        .with_topics(topics)]);
    let body = c.call_raw(ApiKey::OffsetFetch, 10, |b| newer::encode_offset_fetch_v10(&req, b)).unwrap();
    shaped(ApiKey::OffsetFetch, 10, &body);
    let resp = newer::decode_offset_fetch_response_v10(&mut body.clone()).unwrap();
    assert_eq!(resp.groups.len(), 1);
    assert_eq!(resp.groups[0].error_code, NONE, "{resp:?}");
    resp.groups[0]
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                let meta = p.metadata.as_ref().map(|m| m.to_string()).unwrap_or_default();
                (t.topic_id, p.partition_index, p.committed_offset, meta, p.error_code)
            })
        })
        .collect()
}

/// (error, offset) of ListOffsets at `version` for partition 0 at `timestamp`.
fn list_offset(c: &mut Connection, version: i16, topic: &str, timestamp: i64) -> (i16, i64) {
    let req =
        ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(sb(topic)))
            .with_partitions(vec![ListOffsetsPartition::default().with_partition_index(0).with_timestamp(timestamp)])]);
    let resp: ListOffsetsResponse = c.call_version(version, &req).unwrap();
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.offset)
}

/// (error, number of APIs listed, ApiVersions' own max) of ApiVersions v5.
fn api_versions_v5(c: &mut Connection, cluster: Option<&str>, node: i32) -> (i16, usize, Option<i16>) {
    let req = newer::ApiVersionsV5 {
        request: kafka_protocol::messages::ApiVersionsRequest::default()
            .with_client_software_name(sb("spate-test"))
            .with_client_software_version(sb("1")),
        cluster_id: cluster.map(sb),
        node_id: node,
    };
    let mut body = c.call_raw(ApiKey::ApiVersions, 5, |b| newer::encode_api_versions_v5(&req, b)).unwrap();
    shaped(ApiKey::ApiVersions, 5, &body);
    let resp = ApiVersionsResponse::decode(&mut body, 4).unwrap();
    let own = resp.api_keys.iter().find(|k| k.api_key == ApiKey::ApiVersions as i16).map(|k| k.max_version);
    (resp.error_code, resp.api_keys.len(), own)
}

#[test]
fn versions_past_the_crate_on_one_broker() {
    let b = start_broker(&["--node-id", "1", "--cores", "1"]);
    let mut client = Client::connect(ClientConfig::new(&b.bootstrap)).unwrap();
    client.create_topic("offs", 2, 1, &[]).unwrap();
    let started = Instant::now();
    let (id, cluster) = loop {
        let m = metadata(&b, "offs");
        let t = m.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == "offs")).unwrap();
        if t.error_code == NONE && t.partitions.len() == 2 && t.partitions.iter().all(|p| p.leader_id.0 == 1) {
            break (t.topic_id, m.cluster_id.unwrap().to_string());
        }
        assert!(started.elapsed() < Duration::from_millis(wait_ms_max), "offs not led: {m:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let bogus = Uuid::from_u128(0x5ba7e);
    let mut c = b.conn();
    assert_eq!(produce_v13(&mut c, id, 0, &["a", "b", "c"]).responses[0].partition_responses[0].error_code, NONE);

    // OffsetCommit v10: by id; a partition past the topic's, and an unknown id, refused.
    let started = Instant::now();
    let committed = loop {
        // As a client: find the group's coordinator first (this creates the offsets topic).
        let find = kafka_protocol::messages::FindCoordinatorRequest::default().with_key(sb("g10")).with_key_type(0);
        let _: kafka_protocol::messages::FindCoordinatorResponse = c.call_version(3, &find).unwrap();
        let got = offset_commit_v10(&mut c, "g10", &[(id, &[(0, 2), (1, 0), (7, 1)]), (bogus, &[(0, 1)])]);
        if got[0].2 == NONE || started.elapsed() > Duration::from_millis(wait_ms_max) {
            break got; // (the group's coordinator may still be loading)
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        committed,
        vec![(id, 0, NONE), (id, 1, NONE), (id, 7, UNKNOWN_TOPIC_OR_PARTITION), (bogus, 0, UNKNOWN_TOPIC_ID)]
    );
    // OffsetFetch v10: named by id, and every partition of the group.
    let m = |s: &str| s.to_string();
    assert_eq!(
        offset_fetch_v10(&mut c, "g10", Some(&[(id, &[0, 1, 9]), (bogus, &[0])])),
        vec![
            (id, 0, 2, m("m"), NONE),
            (id, 1, 0, m("m"), NONE),
            (id, 9, -1, m(""), NONE),
            (bogus, 0, -1, m(""), UNKNOWN_TOPIC_ID)
        ]
    );
    let mut all = offset_fetch_v10(&mut c, "g10", None);
    all.sort_by_key(|p| p.1);
    assert_eq!(all, vec![(id, 0, 2, m("m"), NONE), (id, 1, 0, m("m"), NONE)]);
    // The same offsets by name (v9).
    let by_name: kafka_protocol::messages::OffsetFetchResponse = c
        .call_version(
            9,
            &OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
                .with_group_id(GroupId(sb("g10")))
                .with_member_epoch(-1)
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(TopicName(sb("offs")))
                    .with_partition_indexes(vec![0])]))]),
        )
        .unwrap();
    assert_eq!(by_name.groups[0].topics[0].partitions[0].committed_offset, 2);

    // TxnOffsetCommit v6: an unknown id is refused before the transaction is looked at.
    let txn = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(sb("tx")))
        .with_group_id(GroupId(sb("g10")))
        .with_producer_id(kafka_protocol::messages::ProducerId(12345))
        .with_generation_id(-1)
        .with_topics(vec![kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
            .with_partitions(vec![
                kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequestPartition::default(),
            ])]);
    let body =
        c.call_raw(ApiKey::TxnOffsetCommit, 6, |buf| newer::encode_txn_offset_commit_v6(&txn, &[bogus], buf)).unwrap();
    shaped(ApiKey::TxnOffsetCommit, 6, &body);
    let (resp, ids) = newer::decode_txn_offset_commit_response_v6(&mut body.clone()).unwrap();
    assert_eq!((ids, resp.topics[0].partitions[0].error_code), (vec![bogus], UNKNOWN_TOPIC_ID));

    // ListOffsets: -6 (earliest pending upload) is v11's; no tiered storage: offset -1.
    assert_eq!(list_offset(&mut c, 11, "offs", -6), (NONE, -1));
    assert_eq!(list_offset(&mut c, 10, "offs", -6).0, UNSUPPORTED_VERSION);
    assert_eq!(list_offset(&mut c, 11, "offs", -7).0, UNSUPPORTED_VERSION);
    assert_eq!(list_offset(&mut c, 7, "offs", -4).0, UNSUPPORTED_VERSION);
    assert_eq!(list_offset(&mut c, 11, "offs", -1), (NONE, 3));

    // ApiVersions v5: both or neither of cluster and node; another broker's: rebootstrap.
    let (code, apis, own) = api_versions_v5(&mut c, None, -1);
    assert!(code == NONE && apis > 40 && own == Some(5), "{code} {apis} {own:?}");
    assert_eq!(api_versions_v5(&mut c, Some(&cluster), 1).0, NONE);
    assert_eq!(api_versions_v5(&mut c, Some("another-cluster"), 1), (REBOOTSTRAP_REQUIRED, 0, None));
    assert_eq!(api_versions_v5(&mut c, Some(&cluster), 2).0, REBOOTSTRAP_REQUIRED);
    assert_eq!(api_versions_v5(&mut c, Some(&cluster), -1).0, INVALID_REQUEST);
    assert_eq!(api_versions_v5(&mut c, None, 1).0, INVALID_REQUEST);
    // The connection is still usable after a refusal.
    assert_eq!(list_offset(&mut c, 11, "offs", -2), (NONE, 0));

    // DeleteGroups v3: each result with a (null) message.
    let req = kafka_protocol::messages::DeleteGroupsRequest::default()
        .with_groups_names(vec![GroupId(sb("g10")), GroupId(sb("nope"))]);
    let body = c
        .call_raw(ApiKey::DeleteGroups, 3, |buf| {
            use kafka_protocol::protocol::Encodable;
            req.encode(buf, 2)
        })
        .unwrap();
    shaped(ApiKey::DeleteGroups, 3, &body);
    // throttle, 2 results: "g10" NONE null, "nope" GROUP_ID_NOT_FOUND null.
    let mut want = vec![0, 0, 0, 0, 3, 4];
    want.extend_from_slice(b"g10");
    want.extend_from_slice(&[0, 0, 0, 0, 5]);
    want.extend_from_slice(b"nope");
    want.extend_from_slice(&GROUP_ID_NOT_FOUND.to_be_bytes());
    want.extend_from_slice(&[0, 0, 0]);
    assert_eq!(body.as_ref(), want.as_slice());

    // DescribeLogDirs v5: one log dir, not cordoned (the byte after its usable bytes).
    // (All topics: a null array, then the tag buffer.)
    let all_topics = |buf: &mut BytesMut| {
        buf.extend_from_slice(&[0, 0]);
        Ok(())
    };
    let body = c.call_raw(ApiKey::DescribeLogDirs, 5, all_topics).unwrap();
    shaped(ApiKey::DescribeLogDirs, 5, &body);
    assert_eq!(&body[body.len() - 3..], &[0, 0, 0], "IsCordoned false, then the two tag buffers");
}
