//! The operator tools, driven through the real `spate` binary against a real broker:
//! topics, produce/consume, groups with lag, /metrics before and after traffic, and
//! one-line errors with meaningful exit codes.

#![allow(non_upper_case_globals)]

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const spate: &str = env!("CARGO_BIN_EXE_spate");
/// How long a broker may take to start answering.
const broker_start_ms_max: u64 = 15_000;

/// A broker on free ports with a temporary data dir, killed on drop.
struct Broker {
    child: Child,
    bootstrap: String,
    metrics: String,
    _dir: tempfile::TempDir,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start_broker() -> Broker {
    start_broker_with(&[])
}

fn start_broker_with(extra_args: &[&str]) -> Broker {
    // Ports from free_port() can be taken by another test's broker before ours binds
    // them (tests run in parallel); a broker that finds its port taken exits at once, so
    // a start is good only if the port answers and our process is still alive after.
    for _attempt in 0..broker_start_attempts_max {
        let dir = tempfile::tempdir().unwrap();
        let (port, metrics_port) = (free_port(), free_port());
        let bootstrap = format!("127.0.0.1:{port}");
        let metrics = format!("127.0.0.1:{metrics_port}");
        let child = Command::new(spate)
            .args(["serve", "--cores", "1", "--group-initial-rebalance-delay-ms", "0", "--listen", &bootstrap])
            .args(["--metrics-listen", &metrics])
            .args(extra_args)
            .arg("--data-dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut broker = Broker { child, bootstrap, metrics, _dir: dir };
        let started = Instant::now();
        while TcpStream::connect(&broker.bootstrap).is_err() && broker.child.try_wait().unwrap().is_none() {
            assert!(started.elapsed() < Duration::from_millis(broker_start_ms_max), "broker did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(200));
        if broker.child.try_wait().unwrap().is_none() && TcpStream::connect(&broker.bootstrap).is_ok() {
            return broker;
        }
    }
    panic!("broker did not start in {broker_start_attempts_max} attempts");
}

/// Starts retried when another test took our port first.
const broker_start_attempts_max: usize = 5;

fn run(b: &Broker, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(spate);
    cmd.args(args).args(["--bootstrap", &b.bootstrap]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let input = stdin.unwrap_or("").to_string();
    let mut child_stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let _ = child_stdin.write_all(input.as_bytes());
    });
    child.wait_with_output().unwrap()
}

fn ok(b: &Broker, args: &[&str], stdin: Option<&str>) -> String {
    let out = run(b, args, stdin);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "spate {args:?} failed: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

fn json(b: &Broker, args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    serde_json::from_str(&ok(b, &a, None)).unwrap()
}

fn scrape(b: &Broker) -> String {
    let mut s = TcpStream::connect(&b.metrics).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    std::io::Read::read_to_string(&mut s, &mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    body
}

/// The sum of every sample whose line starts with `prefix`.
fn sample_sum(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// A one-line error on stderr, nothing on stdout, the given exit code.
fn assert_one_line_error(out: &Output, code: i32) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "stderr: {stderr}");
    assert!(stderr.starts_with("spate: "), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
}

#[test]
fn topic_lifecycle() {
    let b = start_broker();
    ok(&b, &["topic", "create", "orders", "--partitions", "3", "--config", "retention.ms=60000"], None);
    let list = ok(&b, &["topic", "list"], None);
    assert!(list.lines().any(|l| l.starts_with("orders ") && l.contains(" 3 ")), "{list}");
    assert!(!list.contains("__consumer_offsets"), "{list}");

    let d = json(&b, &["topic", "describe", "orders"]);
    assert_eq!(d["partitions"].as_array().unwrap().len(), 3);
    assert_eq!(d["partitions"][0]["leader"], 1);
    assert_eq!(d["partitions"][0]["latest_offset"], 0);
    let retention = d["configs"].as_array().unwrap().iter().find(|c| c["name"] == "retention.ms").unwrap().clone();
    assert_eq!((retention["value"].as_str(), retention["source"].as_str()), (Some("60000"), Some("topic")));
    let human = ok(&b, &["topic", "describe", "orders"], None);
    assert!(human.contains("PARTITION") && human.contains("retention.ms"), "{human}");

    // Alter a config; describe shows the new value as a topic override.
    ok(&b, &["topic", "alter-config", "orders", "--set", "retention.ms=1000"], None);
    let d: serde_json::Value = serde_json::from_str(&ok(&b, &["topic", "describe", "orders", "--json"], None)).unwrap();
    let retention = d["configs"].as_array().unwrap().iter().find(|c| c["name"] == "retention.ms").unwrap().clone();
    assert_eq!(retention["value"].as_str(), Some("1000"));
    // An invalid config value is refused with a one-line error.
    let out = run(&b, &["topic", "alter-config", "orders", "--set", "cleanup.policy=compress"], None);
    assert_one_line_error(&out, 1);

    ok(&b, &["topic", "delete", "orders"], None);
    let list = ok(&b, &["topic", "list"], None);
    assert!(!list.contains("orders"), "{list}");
    let out = run(&b, &["topic", "describe", "orders"], None);
    assert_one_line_error(&out, 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("UNKNOWN_TOPIC_OR_PARTITION"));
}

#[test]
fn produce_then_consume() {
    let b = start_broker();
    ok(&b, &["topic", "create", "lines", "--partitions", "1"], None);
    let input: String = (0..100).map(|i| format!("k{i}:value {i}\n")).collect();
    ok(&b, &["produce", "lines", "--key-separator", ":", "--compression", "lz4"], Some(&input));
    let out =
        ok(&b, &["consume", "lines", "--from-beginning", "--max-messages", "100", "--format", "%o %k %v\\n"], None);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 100, "{out}");
    assert_eq!(lines[0], "0 k0 value 0");
    assert_eq!(lines[99], "99 k99 value 99");
    // --offset and --partition, JSON.
    let out =
        ok(&b, &["consume", "lines", "--partition", "0", "--offset", "98", "--max-messages", "2", "--json"], None);
    let recs: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(recs.len(), 2);
    assert_eq!((recs[0]["offset"].as_i64(), recs[0]["value"].as_str()), (Some(98), Some("value 98")));

    // Keyed records go where Kafka's default partitioner (murmur2) puts them:
    // murmur2("abc") = 479470107 -> partition 479470107 % 5 = 2; murmur2("foobar") =
    // -790332482 -> (that & 0x7fffffff) % 5 = 1357151166 % 5 = 1.
    ok(&b, &["topic", "create", "keyed", "--partitions", "5"], None);
    ok(&b, &["produce", "keyed", "--key-separator", ":"], Some("abc:1\nfoobar:2\n"));
    for (partition, key) in [("2", "abc"), ("1", "foobar")] {
        let out = ok(
            &b,
            &[
                "consume",
                "keyed",
                "--partition",
                partition,
                "--offset",
                "0",
                "--max-messages",
                "1",
                "--format",
                "%k\\n",
            ],
            None,
        );
        assert_eq!(out.trim(), key, "partition {partition}");
    }
}

/// Record batches in a segment file: (base offset, records) each.
fn segment_batches(path: &std::path::Path) -> Vec<(i64, i32)> {
    let bytes = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 61 <= bytes.len() {
        let base = i64::from_be_bytes(bytes[pos..pos + 8].try_into().unwrap());
        let len = i32::from_be_bytes(bytes[pos + 8..pos + 12].try_into().unwrap()) as usize;
        let count = i32::from_be_bytes(bytes[pos + 57..pos + 61].try_into().unwrap());
        out.push((base, count));
        pos += 12 + len;
    }
    assert_eq!(pos, bytes.len(), "whole batches");
    out
}

/// `spate produce` to a topic that does not exist creates it (auto-creation is on, as
/// Kafka's console producer asks for it), and sends each partition's lines as one
/// batch per request: 2,500 lines are 3 batches (1,000 lines a batch at most), where
/// they used to be 2,500 one-record batches (one writev iovec pair each).
#[test]
fn produce_creates_the_topic_and_sends_one_batch_per_request() {
    let b = start_broker();
    let input: String = (0..2_500).map(|i| format!("line {i}\n")).collect();
    ok(&b, &["produce", "fresh"], Some(&input));
    let d = json(&b, &["topic", "describe", "fresh"]);
    assert_eq!(d["partitions"].as_array().unwrap().len(), 1, "auto-created with num.partitions = 1");
    let out = ok(&b, &["consume", "fresh", "--from-beginning", "--max-messages", "2500", "--format", "%o %v\\n"], None);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2_500);
    assert_eq!((lines[0], lines[2_499]), ("0 line 0", "2499 line 2499"));
    let segment = b._dir.path().join("fresh-0").join("00000000000000000000.log");
    assert_eq!(segment_batches(&segment), vec![(0, 1_000), (1_000, 1_000), (2_000, 500)]);
}

#[test]
fn group_consume_list_describe_with_lag() {
    let b = start_broker();
    ok(&b, &["topic", "create", "events", "--partitions", "2"], None);
    ok(&b, &["produce", "events", "--partition", "0"], Some("a\nb\nc\n"));
    let out = ok(&b, &["consume", "events", "--group", "readers", "--from-beginning", "--max-messages", "3"], None);
    assert_eq!(out.lines().count(), 3, "{out}");
    ok(&b, &["produce", "events", "--partition", "0"], Some("d\ne\n"));

    let groups = json(&b, &["group", "list"]);
    assert!(groups.as_array().unwrap().iter().any(|g| g["group"] == "readers"), "{groups}");
    let d = json(&b, &["group", "describe", "readers"]);
    let p0 = d["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["topic"] == "events" && o["partition"] == 0)
        .unwrap()
        .clone();
    assert_eq!(p0["committed_offset"], 3, "{d}");
    assert_eq!(p0["log_end_offset"], 5, "{d}");
    assert_eq!(p0["lag"], 2, "{d}");
    assert_eq!(d["total_lag"], 2, "{d}");
    let human = ok(&b, &["group", "describe", "readers"], None);
    assert!(human.contains("LAG"), "{human}");

    // The group is empty again: its offsets can be reset, and the next member starts there.
    ok(&b, &["group", "reset-offsets", "readers", "--topic", "events", "--to-earliest"], None);
    let d = json(&b, &["group", "describe", "readers"]);
    assert_eq!(d["total_lag"], 5, "{d}");
    let out = ok(&b, &["consume", "events", "--group", "readers", "--max-messages", "5"], None);
    assert_eq!(out.lines().collect::<Vec<_>>(), ["a", "b", "c", "d", "e"]);
}

#[test]
fn metrics_move_with_traffic() {
    let b = start_broker();
    let before = scrape(&b);
    assert!(before.contains("# TYPE spate_request_duration_seconds histogram"), "{before}");
    let produce_count = "spate_request_duration_seconds_count{shard=\"0\",api=\"Produce\"}";
    assert_eq!(sample_sum(&before, produce_count), 0.0);

    ok(&b, &["topic", "create", "m", "--partitions", "1"], None);
    ok(&b, &["produce", "m"], Some("x\ny\n"));
    ok(&b, &["consume", "m", "--from-beginning", "--max-messages", "2"], None);

    let after = scrape(&b);
    assert!(sample_sum(&after, "spate_requests_total") > sample_sum(&before, "spate_requests_total"));
    assert!(sample_sum(&after, "spate_bytes_in_total") > sample_sum(&before, "spate_bytes_in_total"));
    assert!(sample_sum(&after, "spate_bytes_out_total") > sample_sum(&before, "spate_bytes_out_total"));
    assert_eq!(sample_sum(&after, produce_count), 1.0, "{after}");
    assert!(sample_sum(&after, "spate_request_duration_seconds_count{shard=\"0\",api=\"Fetch\"}") >= 1.0);
    assert!(after.contains("spate_request_duration_seconds_bucket{shard=\"0\",api=\"Produce\",le=\"+Inf\"} 1"));
    assert!(sample_sum(&after, "spate_log_size_bytes{topic=\"m\"") > 0.0, "{after}");
    assert!(sample_sum(&after, "spate_partitions") >= 1.0);
    assert!(sample_sum(&after, "spate_topic_bytes_in_total{topic=\"m\"}") > 0.0, "{after}");
    assert!(sample_sum(&after, "spate_topic_bytes_out_total{topic=\"m\"}") > 0.0, "{after}");

    // Shards publish partition and group status once a second: a group that consumed
    // one of three messages shows up with its lag.
    ok(&b, &["produce", "m"], Some("z\n"));
    ok(&b, &["consume", "m", "--group", "g1", "--from-beginning", "--max-messages", "1"], None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let lag = "spate_consumer_lag{group=\"g1\",topic=\"m\",partition=\"0\"}";
    loop {
        let m = scrape(&b);
        if m.contains(lag) {
            assert_eq!(sample_sum(&m, "spate_partition_log_end_offset{topic=\"m\",partition=\"0\"}"), 3.0, "{m}");
            assert_eq!(sample_sum(&m, lag), 2.0, "{m}");
            assert!(sample_sum(&m, "spate_group_rebalances_total") >= 1.0, "{m}");
            assert_eq!(sample_sum(&m, "spate_offline_partitions"), 0.0);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no lag metric for g1: {m}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

#[test]
fn bad_input_gives_one_line_errors() {
    let b = start_broker();
    // Invalid topic name: refused before anything is sent, exit 2.
    assert_one_line_error(&run(&b, &["topic", "create", "no spaces/allowed", "--partitions", "1"], None), 2);
    // Unknown flag: clap's error, one line, exit 2.
    assert_one_line_error(&run(&b, &["topic", "list", "--no-such-flag"], None), 2);
    // Bad key=value.
    assert_one_line_error(&run(&b, &["topic", "create", "t", "--config", "novalue"], None), 2);
    // Unknown topic on a broker that does not auto-create topics: the broker's error,
    // exit 1. (With auto-creation on, `spate produce` creates it: see
    // produce_creates_the_topic_and_sends_one_batch_per_request.)
    let no_auto = start_broker_with(&["--auto-create-topics", "false"]);
    let out = run(&no_auto, &["produce", "missing"], Some("x\n"));
    assert_one_line_error(&out, 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("UNKNOWN_TOPIC_OR_PARTITION"));
    // Unreachable broker: exit 3.
    let port = free_port();
    let out =
        Command::new(spate).args(["topic", "list", "--bootstrap", &format!("127.0.0.1:{port}")]).output().unwrap();
    assert_one_line_error(&out, 3);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}

/// KIP-227 incremental fetch sessions against the real broker (no third-party client
/// here speaks them: librdkafka, kafka-python and kafkajs send sessionless fetches; the
/// Java consumer and Spate's own followers use them). Spoken with Spate's client.
#[test]
fn fetch_sessions_answer_only_what_changed() {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{FetchRequest, TopicName};
    let b = start_broker();
    ok(&b, &["topic", "create", "sess", "--partitions", "2"], None);
    ok(&b, &["produce", "sess", "--partition", "0"], Some("a\nb\nc\n"));
    let mut conn = spate::client::Connection::open(&b.bootstrap, Duration::from_secs(10), "session-test").unwrap();
    let part = |p: i32, offset: i64| {
        FetchPartition::default().with_partition(p).with_fetch_offset(offset).with_partition_max_bytes(1 << 20)
    };
    let topic = |parts: Vec<FetchPartition>| {
        vec![FetchTopic::default().with_topic(TopicName(spate::client::sb("sess"))).with_partitions(parts)]
    };
    let listed = |resp: &kafka_protocol::messages::FetchResponse| -> Vec<(i32, usize)> {
        resp.responses
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (p.partition_index, p.records.as_ref().map_or(0, |r| r.len()))))
            .collect()
    };
    let fetch = |conn: &mut spate::client::Connection, id: i32, epoch: i32, parts: Vec<FetchPartition>| {
        let req = FetchRequest::default()
            .with_replica_id(kafka_protocol::messages::BrokerId(-1))
            .with_max_wait_ms(100)
            .with_max_bytes(1 << 20)
            .with_session_id(id)
            .with_session_epoch(epoch)
            .with_topics(if parts.is_empty() { Vec::new() } else { topic(parts) });
        let (version, resp) = conn.call(&req).unwrap();
        assert!(version >= 7, "sessions need Fetch v7+, got v{version}");
        resp
    };
    // A full request opens a session: both partitions listed, p0 with its records.
    let resp = fetch(&mut conn, 0, 0, vec![part(0, 0), part(1, 0)]);
    assert_eq!(resp.error_code, 0);
    let id = resp.session_id;
    assert!(id > 0, "no session id");
    let l = listed(&resp);
    assert_eq!(l.len(), 2, "{l:?}");
    assert!(l.iter().any(|&(p, n)| p == 0 && n > 0), "{l:?}");
    // Incremental, p0 moved past its records, nothing new anywhere: nothing listed.
    let resp = fetch(&mut conn, id, 1, vec![part(0, 3)]);
    assert_eq!((resp.error_code, resp.session_id), (0, id));
    assert_eq!(listed(&resp), vec![], "an incremental answer lists only what changed");
    // New records on p1 (not named in the request): listed, with its records.
    ok(&b, &["produce", "sess", "--partition", "1"], Some("d\n"));
    let resp = fetch(&mut conn, id, 2, vec![]);
    let l = listed(&resp);
    assert!(l.len() == 1 && l[0].0 == 1 && l[0].1 > 0, "{l:?}");
    // A wrong epoch, an unknown session.
    assert_eq!(fetch(&mut conn, id, 9, vec![]).error_code, 71, "INVALID_FETCH_SESSION_EPOCH");
    assert_eq!(fetch(&mut conn, id + 12345, 1, vec![]).error_code, 70, "FETCH_SESSION_ID_NOT_FOUND");
}

/// KIP-320: requests carrying a leader epoch newer than the partition's are answered
/// UNKNOWN_LEADER_EPOCH (Fetch, ListOffsets, OffsetForLeaderEpoch); OffsetForLeaderEpoch
/// answers the current epoch with the log end, an unknown older one with UNDEFINED.
#[test]
fn leader_epochs_are_checked_and_answered() {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
    use kafka_protocol::messages::{
        BrokerId, FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest, TopicName,
    };
    let b = start_broker();
    ok(&b, &["topic", "create", "epochs", "--partitions", "1"], None);
    ok(&b, &["produce", "epochs"], Some("a\nb\nc\n"));
    let mut conn = spate::client::Connection::open(&b.bootstrap, Duration::from_secs(10), "epoch-test").unwrap();
    let name = || TopicName(spate::client::sb("epochs"));
    let epoch_end = |conn: &mut spate::client::Connection, current: i32, asked: i32| {
        let req = OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![
            OffsetForLeaderTopic::default().with_topic(name()).with_partitions(vec![
                OffsetForLeaderPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(current)
                    .with_leader_epoch(asked),
            ]),
        ]);
        let p = conn.call(&req).unwrap().1.topics[0].partitions[0].clone();
        (p.error_code, p.leader_epoch, p.end_offset)
    };
    // The topic's first leader epoch is 0 and holds every record: it ends at the log end.
    assert_eq!(epoch_end(&mut conn, -1, 0), (0, 0, 3));
    assert_eq!(epoch_end(&mut conn, 0, 0), (0, 0, 3));
    assert_eq!(epoch_end(&mut conn, 7, 0).0, 76, "UNKNOWN_LEADER_EPOCH");
    let fetch = FetchRequest::default().with_replica_id(BrokerId(-1)).with_max_bytes(1 << 20).with_topics(vec![
        FetchTopic::default().with_topic(name()).with_partitions(vec![FetchPartition::default()
            .with_partition(0)
            .with_current_leader_epoch(7)
            .with_partition_max_bytes(1 << 20)]),
    ]);
    assert_eq!(conn.call(&fetch).unwrap().1.responses[0].partitions[0].error_code, 76, "Fetch: UNKNOWN_LEADER_EPOCH");
    let list =
        ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![ListOffsetsTopic::default()
            .with_name(name())
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_current_leader_epoch(7)
                .with_timestamp(-1)])]);
    let (version, resp) = conn.call(&list).unwrap();
    assert!(version >= 4, "current_leader_epoch needs ListOffsets v4+");
    assert_eq!(resp.topics[0].partitions[0].error_code, 76, "ListOffsets: UNKNOWN_LEADER_EPOCH");
}
