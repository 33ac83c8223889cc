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

#![allow(non_upper_case_globals)]

mod wire_common;

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, MetadataResponse, ProduceRequest};
use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
use spate::client::{Client, ClientConfig, Connection};
use uuid::Uuid;
use wire_common::{start_broker, Broker};

const NONE: i16 = 0;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
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
