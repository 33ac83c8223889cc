//! The transaction coordinator's wiring, against the real `spate` binary (two shards,
//! so requests hop to the shard that owns the id's `__transaction_state` partition):
//! FindCoordinator key_type=1 creates `__transaction_state` and names this broker;
//! InitProducerId with a transactional id (and its timeout limit); AddPartitionsToTxn
//! (unknown topics refused as Kafka does); DescribeTransactions and ListTransactions;
//! EndTxn; a second InitProducerId fencing the first producer; a transaction past its
//! timeout aborted with a bumped epoch; and the state reloaded from the log after a
//! kill -9 and restart.
//!
//! `markers_complete_transactions`: the markers reach the partitions (WriteTxnMarkers to
//! this broker's own listener), so every ended transaction reaches CompleteCommit /
//! CompleteAbort, and a new producer gets on once its fencing abort completes.

#![allow(non_upper_case_globals)]

mod wire_common;

use std::time::{Duration, Instant};

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, FindCoordinatorRequest, GroupId, InitProducerIdRequest, ListTransactionsRequest, ProducerId,
    TransactionalId,
};
use spate::client::{sb, topic_name, Connection};
use wire_common::start_broker;

const retry_ms_max: u64 = 20_000;

const NONE: i16 = 0;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const NOT_COORDINATOR: i16 = 16;
const INVALID_REQUEST: i16 = 42;
const INVALID_TXN_STATE: i16 = 48;
const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
const CONCURRENT_TRANSACTIONS: i16 = 51;
const OPERATION_NOT_ATTEMPTED: i16 = 55;
const PRODUCER_FENCED: i16 = 90;
const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;

/// Retry `f` while it answers a retriable coordinator error.
fn retrying<T>(what: &str, mut f: impl FnMut() -> (i16, T)) -> (i16, T) {
    let started = Instant::now();
    loop {
        let (code, t) = f();
        let retriable = matches!(code, COORDINATOR_LOAD_IN_PROGRESS | COORDINATOR_NOT_AVAILABLE | NOT_COORDINATOR);
        if !retriable || started.elapsed() > Duration::from_millis(retry_ms_max) {
            return (code, t);
        }
        std::thread::sleep(Duration::from_millis(100));
        let _ = what;
    }
}

fn find_txn_coordinator(c: &mut Connection, id: &str) -> (i16, i32) {
    retrying("FindCoordinator", || {
        let req = FindCoordinatorRequest::default().with_key_type(1).with_key(sb(id));
        let (_, resp) = c.call(&req).unwrap();
        (resp.error_code, resp.port)
    })
}

fn init(c: &mut Connection, id: &str, timeout_ms: i32) -> (i16, i64, i16) {
    let (code, (pid, epoch)) = retrying("InitProducerId", || {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(sb(id))))
            .with_transaction_timeout_ms(timeout_ms)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let (_, resp) = c.call(&req).unwrap();
        (resp.error_code, (resp.producer_id.0, resp.producer_epoch))
    });
    (code, pid, epoch)
}

fn add(c: &mut Connection, id: &str, pid: i64, epoch: i16, topics: &[(&str, &[i32])]) -> Vec<i16> {
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(TransactionalId(sb(id)))
        .with_v3_and_below_producer_id(ProducerId(pid))
        .with_v3_and_below_producer_epoch(epoch)
        .with_v3_and_below_topics(
            topics
                .iter()
                .map(|(t, ps)| AddPartitionsToTxnTopic::default().with_name(topic_name(t)).with_partitions(ps.to_vec()))
                .collect(),
        );
    let (v, resp) = c.call(&req).unwrap();
    assert_eq!(v, 3);
    resp.results_by_topic_v3_and_below
        .iter()
        .flat_map(|t| t.results_by_partition.iter().map(|p| p.partition_error_code))
        .collect()
}

fn end(c: &mut Connection, id: &str, pid: i64, epoch: i16, commit: bool) -> i16 {
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(sb(id)))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_committed(commit);
    c.call(&req).unwrap().1.error_code
}

fn describe(c: &mut Connection, ids: &[&str]) -> DescribeTransactionsResponse {
    let req = DescribeTransactionsRequest::default()
        .with_transactional_ids(ids.iter().map(|i| TransactionalId(sb(i))).collect());
    c.call(&req).unwrap().1
}

/// (error code, state, producer id, epoch, partitions by topic) of one id.
type Described = (i16, String, i64, i16, Vec<(String, Vec<i32>)>);

fn state_of(c: &mut Connection, id: &str) -> Described {
    let (code, s) = retrying("DescribeTransactions", || {
        let d = describe(c, &[id]);
        let s = d.transaction_states.into_iter().next().unwrap();
        (s.error_code, s)
    });
    let topics = s.topics.iter().map(|t| (t.topic.to_string(), t.partitions.clone())).collect();
    (code, s.transaction_state.to_string(), s.producer_id.0, s.producer_epoch, topics)
}

fn wait_state(c: &mut Connection, id: &str, want: &str, within_ms: u64) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(within_ms) {
        if state_of(c, id).1 == want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn coordinator_requests_and_reload() {
    let mut b = start_broker(&["--cores", "2"]);
    let mut c = b.conn();
    b.create_topic("t", 2);
    let port: i32 = b.bootstrap.rsplit(':').next().unwrap().parse().unwrap();

    // Before __transaction_state exists nobody coordinates an id.
    let (code, _, _) = {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(sb("tx-a"))))
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let r = c.call(&req).unwrap().1;
        (r.error_code, r.producer_id.0, r.producer_epoch)
    };
    assert_eq!(code, NOT_COORDINATOR);
    // FindCoordinator creates it and names this broker; an empty id is invalid.
    assert_eq!(find_txn_coordinator(&mut c, "tx-a"), (NONE, port));
    let req = FindCoordinatorRequest::default().with_key_type(1).with_key(sb(""));
    assert_eq!(c.call(&req).unwrap().1.error_code, INVALID_REQUEST);
    // v6's share coordinator (KIP-932): no share groups here, so INVALID_REQUEST, as
    // Kafka 4.4 answers where no share coordinator runs.
    let req = FindCoordinatorRequest::default().with_key_type(2).with_coordinator_keys(vec![sb("share-group")]);
    let found = c.call_version(6, &req).unwrap();
    assert_eq!(found.coordinators.iter().map(|k| k.error_code).collect::<Vec<_>>(), vec![INVALID_REQUEST]);

    let (code, pid, epoch) = init(&mut c, "tx-a", 60_000);
    assert_eq!((code, epoch), (NONE, 0));
    assert!(pid >= 0);
    assert_eq!(init(&mut c, "tx-b", 15 * 60 * 1000 + 1).0, INVALID_TRANSACTION_TIMEOUT);
    let (code, _, _, _, _) = state_of(&mut c, "tx-a");
    assert_eq!(code, NONE);
    assert_eq!(state_of(&mut c, "tx-a").1, "Empty");
    assert_eq!(state_of(&mut c, "never-seen").0, TRANSACTIONAL_ID_NOT_FOUND);

    // A partition of an unknown topic: nothing is added, the others not attempted.
    assert_eq!(
        add(&mut c, "tx-a", pid, epoch, &[("t", &[0]), ("nope", &[0])]),
        vec![OPERATION_NOT_ATTEMPTED, UNKNOWN_TOPIC_OR_PARTITION]
    );
    assert_eq!(add(&mut c, "tx-a", pid, epoch, &[("t", &[0, 1])]), vec![NONE, NONE]);
    let req = AddOffsetsToTxnRequest::default()
        .with_transactional_id(TransactionalId(sb("tx-a")))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_group_id(GroupId(sb("g1")));
    assert_eq!(c.call(&req).unwrap().1.error_code, NONE);
    let g1 = spate::group::offsets_partition_for("g1", 50);
    let (_, state, spid, sepoch, topics) = state_of(&mut c, "tx-a");
    assert_eq!((state.as_str(), spid, sepoch), ("Ongoing", pid, epoch));
    assert_eq!(topics, vec![("__consumer_offsets".to_string(), vec![g1]), ("t".to_string(), vec![0, 1])]);
    // A stranger's producer id.
    assert_eq!(end(&mut c, "tx-a", pid + 1000, 0, true), 49 /* INVALID_PRODUCER_ID_MAPPING */);

    // ListTransactions, with filters.
    let list = |c: &mut Connection, states: &[&str]| {
        let req = ListTransactionsRequest::default().with_state_filters(states.iter().map(|s| sb(s)).collect());
        c.call(&req).unwrap().1
    };
    let l = list(&mut c, &[]);
    assert_eq!(l.error_code, NONE);
    let ids: Vec<(String, String)> = l
        .transaction_states
        .iter()
        .map(|s| (s.transactional_id.to_string(), s.transaction_state.to_string()))
        .collect();
    assert!(ids.contains(&("tx-a".into(), "Ongoing".into())), "{ids:?}");
    let l = list(&mut c, &["Empty", "Bogus"]);
    assert!(l.transaction_states.iter().all(|s| s.transaction_state.as_str() == "Empty"));
    assert_eq!(l.unknown_state_filters.iter().map(|s| s.to_string()).collect::<Vec<_>>(), vec!["Bogus".to_string()]);

    // EndTxn: answered once PrepareCommit is written.
    assert_eq!(end(&mut c, "tx-a", pid, epoch, true), NONE);
    let state = state_of(&mut c, "tx-a").1;
    assert!(state == "PrepareCommit" || state == "CompleteCommit", "{state}");

    // The state survives a kill -9: reloaded from __transaction_state.
    drop(c);
    b.kill9_and_restart();
    let mut c = b.conn();
    let (code, state, spid, sepoch, _) = state_of(&mut c, "tx-a");
    assert_eq!(code, NONE);
    assert!(state == "PrepareCommit" || state == "CompleteCommit", "{state}");
    assert_eq!((spid, sepoch), (pid, epoch));
    // A load resumes the markers of a transaction left in PrepareCommit.
    assert!(wait_state(&mut c, "tx-a", "CompleteCommit", 10_000), "{:?}", state_of(&mut c, "tx-a"));
}

#[test]
fn fencing_and_timeouts() {
    let b = start_broker(&["--cores", "2"]);
    let mut c = b.conn();
    b.create_topic("t", 1);
    assert_eq!(find_txn_coordinator(&mut c, "tx-f").0, NONE);
    let (_, pid, e0) = init(&mut c, "tx-f", 60_000);
    // A new producer with the same id, no transaction open: epoch + 1, the old fenced.
    let (code, pid1, e1) = init(&mut c, "tx-f", 60_000);
    assert_eq!((code, pid1, e1), (NONE, pid, e0 + 1));
    assert_eq!(add(&mut c, "tx-f", pid, e0, &[("t", &[0])]), vec![PRODUCER_FENCED]);
    assert_eq!(end(&mut c, "tx-f", pid, e0, true), PRODUCER_FENCED);
    // With a transaction open, a new producer aborts it with a fencing epoch; it is
    // told to retry (CONCURRENT_TRANSACTIONS) until the abort completes.
    assert_eq!(add(&mut c, "tx-f", pid, e1, &[("t", &[0])]), vec![NONE]);
    let (code, _, _) = init(&mut c, "tx-f", 60_000);
    assert_eq!(code, CONCURRENT_TRANSACTIONS);
    let (_, state, _, epoch, _) = state_of(&mut c, "tx-f");
    assert!(state == "PrepareAbort" || state == "CompleteAbort", "{state}");
    assert_eq!(epoch, e1 + 1);
    assert_eq!(end(&mut c, "tx-f", pid, e1, true), PRODUCER_FENCED);

    // A transaction past its timeout (1 s) is aborted and its producer fenced.
    let (code, tpid, te) = init(&mut c, "tx-t", 1_000);
    assert_eq!(code, NONE);
    assert_eq!(add(&mut c, "tx-t", tpid, te, &[("t", &[0])]), vec![NONE]);
    let started = Instant::now();
    loop {
        let (_, state, _, epoch, _) = state_of(&mut c, "tx-t");
        if state != "Ongoing" {
            assert!(state == "PrepareAbort" || state == "CompleteAbort", "{state}");
            assert_eq!(epoch, te + 1);
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the timed-out transaction is still open");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(end(&mut c, "tx-t", tpid, te, true), PRODUCER_FENCED);
}

/// Needs the WriteTxnMarkers handler on the partitions' side: every completed
/// transaction reaches its Complete* state, and the producer carries on.
#[test]
fn markers_complete_transactions() {
    let b = start_broker(&["--cores", "2"]);
    let mut c = b.conn();
    b.create_topic("t", 2);
    assert_eq!(find_txn_coordinator(&mut c, "tx-m").0, NONE);
    let (_, pid, e) = init(&mut c, "tx-m", 60_000);
    assert_eq!(add(&mut c, "tx-m", pid, e, &[("t", &[0, 1])]), vec![NONE, NONE]);
    assert_eq!(end(&mut c, "tx-m", pid, e, true), NONE);
    assert!(wait_state(&mut c, "tx-m", "CompleteCommit", 10_000), "{:?}", state_of(&mut c, "tx-m"));
    // A retried commit succeeds; the next transaction starts.
    assert_eq!(end(&mut c, "tx-m", pid, e, true), NONE);
    assert_eq!(add(&mut c, "tx-m", pid, e, &[("t", &[1])]), vec![NONE]);
    assert_eq!(end(&mut c, "tx-m", pid, e, false), NONE);
    assert!(wait_state(&mut c, "tx-m", "CompleteAbort", 10_000));
    // A new producer during a transaction: once the fencing abort completes, it gets on.
    assert_eq!(add(&mut c, "tx-m", pid, e, &[("t", &[0])]), vec![NONE]);
    let started = Instant::now();
    let (pid2, e2) = loop {
        let (code, p, ep) = init(&mut c, "tx-m", 60_000);
        if code == NONE {
            break (p, ep);
        }
        assert_eq!(code, CONCURRENT_TRANSACTIONS);
        assert!(started.elapsed() < Duration::from_secs(10), "the fencing abort did not complete");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!((pid2, e2), (pid, e + 2));
    // The transactions' topic is internal in Metadata, as Kafka's `Topic.isInternal` says.
    let mut client = spate::client::Client::connect(spate::client::ClientConfig::new(&b.bootstrap)).unwrap();
    let m = client.metadata(Some(&["__transaction_state".to_string()]), false).unwrap();
    let internal: Vec<_> = m.topics.iter().map(|t| (t.name.clone(), t.is_internal)).collect();
    assert!(internal.len() == 1 && internal[0].1, "{internal:?}");
}

/// EndTxn v5 (transaction version 2): (error code, producer id, epoch) of the answer.
fn end_v5(c: &mut Connection, id: &str, pid: i64, epoch: i16, commit: bool) -> (i16, i64, i16) {
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(sb(id)))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_committed(commit);
    let resp = c.call_version(5, &req).unwrap();
    (resp.error_code, resp.producer_id.0, resp.producer_epoch)
}

#[test]
fn transaction_version_2_bumps_the_epoch_at_every_end() {
    let b = start_broker(&["--cores", "2"]);
    let mut c = b.conn();
    b.create_topic("t2", 1);
    assert_eq!(find_txn_coordinator(&mut c, "tx-v2").0, NONE);
    let (_, pid, e) = init(&mut c, "tx-v2", 60_000);
    assert_eq!(add(&mut c, "tx-v2", pid, e, &[("t2", &[0])]), vec![NONE]);
    // Answered with the epoch to go on with; the transaction completes at it.
    assert_eq!(end_v5(&mut c, "tx-v2", pid, e, true), (NONE, pid, e + 1));
    assert!(wait_state(&mut c, "tx-v2", "CompleteCommit", 10_000), "{:?}", state_of(&mut c, "tx-v2"));
    assert_eq!(state_of(&mut c, "tx-v2").3, e + 1);
    // A retry whose answer was lost gets the same answer; the opposite outcome and the
    // old epoch's next transaction are refused.
    assert_eq!(end_v5(&mut c, "tx-v2", pid, e, true), (NONE, pid, e + 1));
    assert_eq!(end_v5(&mut c, "tx-v2", pid, e, false).0, INVALID_TXN_STATE);
    assert_eq!(add(&mut c, "tx-v2", pid, e, &[("t2", &[0])]), vec![PRODUCER_FENCED]);
    // An abort with no transaction open bumps the epoch too; a commit of nothing is refused.
    assert_eq!(end_v5(&mut c, "tx-v2", pid, e + 1, true).0, INVALID_TXN_STATE);
    assert_eq!(end_v5(&mut c, "tx-v2", pid, e + 1, false), (NONE, pid, e + 2));
    assert!(wait_state(&mut c, "tx-v2", "CompleteAbort", 10_000));
    // A stale epoch (two behind) is fenced: PRODUCER_FENCED, no producer in the answer.
    assert_eq!(end_v5(&mut c, "tx-v2", pid, e, false), (PRODUCER_FENCED, -1, -1));
    assert_eq!(add(&mut c, "tx-v2", pid, e + 2, &[("t2", &[0])]), vec![NONE]);
}
