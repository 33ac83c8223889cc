"""Apache Kafka's own command-line tools against a three-broker Spate cluster (embedded
coordinator on broker 1), and CreateTopics / CreatePartitions with manual replica
assignments.

The tools are the main classes of Apache Kafka's kafka-tools jar (4.4.0, pinned in
tests/kafka-tools/pom.xml, resolved by scripts/install-deps), run with `java -cp`:
`kafka-topics` is org.apache.kafka.tools.TopicCommand, `kafka-get-offsets` is
GetOffsetShell, `kafka-configs` is ConfigCommand, `kafka-broker-api-versions` is BrokerApiVersionsCommand. Their admin
requests go to broker 2 or 3, which forward them to the coordinator. Each output is
checked against what the cluster holds, read with another client (confluent-kafka's
metadata, a raw ApiVersions request, the records read back, the partition directories
on each broker's disk):

- kafka-topics --create --replica-assignment, then --describe (leaders, replicas, ISR,
  counts), --alter --partitions with an assignment, --list, --delete; assignments Spate
  refuses come back as Kafka's InvalidReplicaAssignmentException.
- kafka-get-offsets after producing records to each partition (latest and earliest);
  --time -3 / max-timestamp (KIP-734) and -4 on records whose timestamps the test chose.
- kafka-configs (org.apache.kafka.tools.ConfigCommand) --entity-type brokers,
  --entity-default and --entity-name 1: --alter --add-config then --describe, checked
  against confluent-kafka's describe_configs and the segments on disk.
- kafka-broker-api-versions lists every broker with the versions each one answers.
- kafka-consumer-groups --list / --describe, kafka-cluster cluster-id.
- kafka-leader-election (preferred) moves leadership back to preferred replicas.
- kafka-delete-records: the new low watermarks it prints are what ListOffsets answers,
  records read back start there, fetches below are out of range, segments below are
  gone, followers checkpoint the same log start, and all of it survives kill -9.
- kafka-log-dirs: each broker's data dir and partitions, sizes equal to the segment
  files on its disk.
- kafka-reassign-partitions moves a partition from brokers 1,2,3 to 2,3,4 (a fourth
  broker joins) under acks=all load: --execute, --verify, the old leader's copy gone,
  the new replicas byte for byte equal, every acknowledged record read back; a move
  that cannot finish (its new broker stopped) is shown by --list and --verify and
  taken back by --cancel. With "log_dirs" (AlterReplicaLogDirs; one dir per broker)
  and with --disallow-replication-factor-change (KIP-860).
- raw DeleteRecords errors (not the leader, above the high watermark, unknown
  partition); raw DescribeCluster v0/v1 and confluent-kafka's describe_cluster().
- confluent-kafka's NewTopic(replica_assignment=...) and NewPartitions(replica_assignment=
  ...): the replicas and leaders as given, the records on the assigned brokers' disks
  and read back; bad assignments are INVALID_REPLICA_ASSIGNMENT and create nothing; a
  fenced broker may be named beside a live one (outside the ISR until it is back).
- raw CreateTopics v2 requests for what the clients check before sending: an
  assignment with numPartitions or replicationFactor set (INVALID_REQUEST), partitions
  not numbered 0..n-1 or given twice, more replicas than a partition may have
  (INVALID_REPLICA_ASSIGNMENT), validate_only.

Java and Maven missing is a skip on a developer's machine and a failure under CI=true
(tests/README.md)."""

import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource, NewPartitions, NewTopic

from helpers.broker import REPO_ROOT
from helpers.jvm import finish_dump, tool_jvm_options
from helpers.maven import maven_classpath
from helpers.clients import admin, cf_conf, cf_produce, cf_read_partition, create_topic
from helpers.wire import api_versions_request, call, frame, parse_api_versions_v0, request_header_v1
from test_cluster import cluster_args, start_embedded_cluster, wait_brokers, wait_for

TOOLS_DIR = REPO_ROOT / "tests" / "kafka-tools"
RUN_TIMEOUT_S = 120

INVALID_REPLICA_ASSIGNMENT = 39
INVALID_REQUEST = 42
TOPIC_ALREADY_EXISTS = 36

RECORDS_PER_PARTITION = 25


# ---------------------------------------------------------------- running the tools

@pytest.fixture(scope="session")
def tools_classpath():
    """The classpath of tests/kafka-tools (resolved offline by Maven unless pom.xml is
    unchanged since the last time)."""
    return maven_classpath(TOOLS_DIR, hashlib.sha256((TOOLS_DIR / "pom.xml").read_bytes()).hexdigest())


def run_tool(classpath, main, *args, timeout=RUN_TIMEOUT_S):
    """Runs org.apache.kafka.tools.<main>; returns (exit code, output). The JVM starts with
    C1 only and a class-data sharing archive of the tools (helpers/jvm.py)."""
    jvm = tool_jvm_options(classpath, TOOLS_DIR / "target")
    cmd = ["java", *jvm, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", classpath,
           f"org.apache.kafka.tools.{main}", *map(str, args)]
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        finish_dump(jvm)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{main} {' '.join(map(str, args))} did not finish within {timeout}s; output:\n"
                    f"{(e.stdout or b'').decode(errors='replace')}")
    out = r.stdout.decode(errors="replace")
    print(f"$ {main} {' '.join(map(str, args))}  (exit {r.returncode})\n{out}")
    return r.returncode, out


def topics_tool(classpath, bootstrap, *args):
    return run_tool(classpath, "TopicCommand", "--bootstrap-server", bootstrap, *args)


def assignment_arg(assignment):
    """[[1, 2], [2, 3]] -> "1:2,2:3" (kafka-topics --replica-assignment)."""
    return ",".join(":".join(map(str, replicas)) for replicas in assignment)


DESCRIBE_PARTITION = re.compile(
    r"Topic: (\S+)\s+Partition: (\d+)\s+Leader: (-?\d+|none)\s+Replicas: ([\d,]*)\s+Isr: ([\d,]*)")
DESCRIBE_TOPIC = re.compile(r"^Topic: (\S+)\s+TopicId: (\S+)\s+PartitionCount: (\d+)\s+ReplicationFactor: (\d+)")


def ids(csv):
    return [int(x) for x in csv.split(",") if x]


def parse_describe(out):
    """kafka-topics --describe -> ({topic: (partition count, replication factor)},
    {(topic, partition): (leader, replicas, isr)})."""
    topics, partitions = {}, {}
    for line in out.splitlines():
        m = DESCRIBE_TOPIC.match(line)
        if m:
            topics[m[1]] = (int(m[3]), int(m[4]))
            continue
        m = DESCRIBE_PARTITION.search(line)
        if m:
            partitions[(m[1], int(m[2]))] = (int(m[3]), ids(m[4]), ids(m[5]))
    return topics, partitions


# ---------------------------------------------------------------- what the cluster holds

def cluster_view(bootstrap, topic):
    """{partition: (leader, replicas, isr)} from confluent-kafka's metadata."""
    md = admin(bootstrap).list_topics(topic, timeout=10)
    t = md.topics[topic]
    if t.error is not None:
        raise AssertionError(f"metadata for {topic}: {t.error}")
    return {p.id: (p.leader, list(p.replicas), list(p.isrs)) for p in t.partitions.values()}


def wait_view(bootstrap, topic, assignment, timeout=20):
    """Wait until `bootstrap`'s metadata shows `topic` placed as `assignment` (each
    partition led by its first replica, all replicas in sync); returns that view."""
    want = {p: (r[0], r, r) for p, r in enumerate(assignment)}
    return wait_for(lambda: cluster_view(bootstrap, topic), lambda v: v == want, timeout,
                    f"{topic} placed as {assignment} in the metadata of {bootstrap}")


def topic_names(bootstrap):
    return set(admin(bootstrap).list_topics(timeout=10).topics)


def partition_dirs(broker, topic):
    """The partitions of `topic` that have a directory in `broker`'s data dir."""
    return {int(d.name[len(topic) + 1:]) for d in broker.data_dir.iterdir()
            if d.is_dir() and re.fullmatch(re.escape(topic) + r"-\d+", d.name)}


def segment_bytes(broker, topic, partition):
    return b"".join(f.read_bytes() for f in sorted((broker.data_dir / f"{topic}-{partition}").glob("*.log")))


def produce_to_each(bootstrap, topic, partitions, tag):
    """RECORDS_PER_PARTITION records to each partition with acks=all; returns
    {partition: [values]}."""
    values = {p: [f"{tag}-p{p}-{i}".encode() for i in range(RECORDS_PER_PARTITION)] for p in partitions}
    cf_produce(bootstrap, topic, [{"value": v, "partition": p} for p, vs in values.items() for v in vs],
               acks="all")
    return values


def check_placement(brokers, topic, assignment, values):
    """Every partition's records are in the segment files of exactly its assigned
    brokers (leader first), none elsewhere; and a consumer reads them back in order."""
    by_id = {i + 1: b for i, b in enumerate(brokers)}
    for p, replicas in enumerate(assignment):
        for broker_id, b in by_id.items():
            if broker_id in replicas:
                data = wait_for(lambda: segment_bytes(b, topic, p),
                                lambda d: all(v in d for v in values.get(p, [])), 20,
                                f"the records of {topic}-{p} on replica {broker_id}")
                assert all(v in data for v in values.get(p, [])), (topic, p, broker_id)
            else:
                assert p not in partition_dirs(b, topic), (
                    f"{topic}-{p} has a directory on broker {broker_id}, not one of its replicas {replicas}")
        if p in values:
            got = cf_read_partition(brokers[replicas[0] - 1].bootstrap, topic, p)
            assert got == values[p], f"{topic}-{p} read back: {got[:3]}... want {values[p][:3]}..."


@pytest.fixture
def cluster(broker_factory):
    return start_embedded_cluster(broker_factory)


# ---------------------------------------------------------------- kafka-topics

def test_kafka_topics_create_describe_alter_list_delete(cluster, tools_classpath):
    b1, b2, b3 = cluster
    topic = "tools-assigned"
    # Broker 2 leads two partitions in a row: never the controller's own round-robin
    # placement, so an assignment ignored cannot pass for one followed.
    assignment = [[2, 3], [2, 1], [1, 2]]
    rc, out = topics_tool(tools_classpath, b2.bootstrap, "--create", "--topic", topic,
                          "--replica-assignment", assignment_arg(assignment))
    assert rc == 0 and f"Created topic {topic}." in out, out
    view = wait_view(b3.bootstrap, topic, assignment)

    rc, out = topics_tool(tools_classpath, b3.bootstrap, "--describe", "--topic", topic)
    assert rc == 0, out
    topics, partitions = parse_describe(out)
    assert topics == {topic: (3, 2)}, out
    assert partitions == {(topic, p): v for p, v in view.items()}, (
        f"kafka-topics --describe: {partitions}\nconfluent metadata: {view}")

    values = produce_to_each(b1.bootstrap, topic, range(3), "a")
    check_placement(cluster, topic, assignment, values)

    # kafka-get-offsets: the latest offset of each partition, then the earliest.
    rc, out = run_tool(tools_classpath, "GetOffsetShell", "--bootstrap-server", b2.bootstrap, "--topic", topic)
    assert rc == 0, out
    latest = {int(p): int(o) for t, p, o in re.findall(r"^(\S+):(\d+):(\d+)$", out, re.M) if t == topic}
    assert latest == {p: RECORDS_PER_PARTITION for p in range(3)}, out
    rc, out = run_tool(tools_classpath, "GetOffsetShell", "--bootstrap-server", b2.bootstrap, "--topic", topic,
                       "--time", "-2")
    assert rc == 0, out
    earliest = {int(p): int(o) for t, p, o in re.findall(r"^(\S+):(\d+):(\d+)$", out, re.M) if t == topic}
    assert earliest == {p: 0 for p in range(3)}, out

    # --alter: two partitions more, where the assignment says (Kafka's tool takes the
    # entries past the existing partitions).
    grown = assignment + [[1, 3], [1, 2]]
    rc, out = topics_tool(tools_classpath, b3.bootstrap, "--alter", "--topic", topic, "--partitions", "5",
                          "--replica-assignment", assignment_arg(grown))
    assert rc == 0 and "Error" not in out, out
    view = wait_view(b2.bootstrap, topic, grown)
    rc, out = topics_tool(tools_classpath, b2.bootstrap, "--describe", "--topic", topic)
    topics, partitions = parse_describe(out)
    assert topics == {topic: (5, 2)}, out
    assert partitions == {(topic, p): v for p, v in view.items()}, (
        f"kafka-topics --describe: {partitions}\nconfluent metadata: {view}")
    values.update(produce_to_each(b1.bootstrap, topic, [3, 4], "b"))
    check_placement(cluster, topic, grown, values)
    rc, out = run_tool(tools_classpath, "GetOffsetShell", "--bootstrap-server", b3.bootstrap,
                       "--topic-partitions", f"{topic}:3-5")  # upper bound exclusive
    assert {(p, int(o)) for p, o in re.findall(rf"^{topic}:(\d+):(\d+)$", out, re.M)} == {
        ("3", RECORDS_PER_PARTITION), ("4", RECORDS_PER_PARTITION)}, out

    # --list: exactly the topics the metadata holds.
    rc, out = topics_tool(tools_classpath, b3.bootstrap, "--list")
    assert rc == 0, out
    listed = {line.strip() for line in out.splitlines() if line.strip() and "SLF4J" not in line}
    assert listed == topic_names(b1.bootstrap) and topic in listed, out

    # --delete: gone from the metadata of every broker, from --list, and --describe
    # says so.
    rc, out = topics_tool(tools_classpath, b2.bootstrap, "--delete", "--topic", topic)
    assert rc == 0 and "Error" not in out, out
    for b in cluster:
        wait_for(lambda: topic_names(b.bootstrap), lambda names: topic not in names, 20,
                 f"{topic} gone from the metadata of {b.bootstrap}")
    rc, out = topics_tool(tools_classpath, b3.bootstrap, "--list")
    assert topic not in out.split(), out
    rc, out = topics_tool(tools_classpath, b3.bootstrap, "--describe", "--topic", topic)
    assert f"Topic '{topic}' does not exist" in out, out


def test_kafka_topics_default_placement_matches_metadata(cluster, tools_classpath):
    """--partitions/--replication-factor (the controller places the replicas): what
    --describe prints is what the metadata holds, leaders spread over the brokers."""
    b1, b2, b3 = cluster
    topic = "tools-placed"
    rc, out = topics_tool(tools_classpath, b2.bootstrap, "--create", "--topic", topic, "--partitions", "6",
                          "--replication-factor", "3")
    assert rc == 0 and f"Created topic {topic}." in out, out
    view = wait_for(lambda: cluster_view(b3.bootstrap, topic), lambda v: len(v) == 6, 20, f"{topic} metadata")
    rc, out = topics_tool(tools_classpath, b3.bootstrap, "--describe", "--topic", topic)
    topics, partitions = parse_describe(out)
    assert topics == {topic: (6, 3)}, out
    assert partitions == {(topic, p): v for p, v in view.items()}, (
        f"kafka-topics --describe: {partitions}\nconfluent metadata: {view}")
    assert {leader for leader, _, _ in view.values()} == {1, 2, 3}, view
    # The same through DescribeTopicPartitions' pages (KIP-966): 4 partitions per answer,
    # this topic and another of 3, so pages end inside a topic and at a topic's end.
    other = "tools-placed-2"
    rc, out = topics_tool(tools_classpath, b2.bootstrap, "--create", "--topic", other, "--partitions", "3",
                          "--replication-factor", "1")
    assert rc == 0, out
    other_view = wait_for(lambda: cluster_view(b1.bootstrap, other), lambda v: len(v) == 3, 20, f"{other} metadata")
    rc, out = topics_tool(tools_classpath, b1.bootstrap, "--describe", "--topic", "tools-placed.*",
                          "--partition-size-limit-per-response", "4")
    topics, partitions = parse_describe(out)
    assert topics == {topic: (6, 3), other: (3, 1)}, out
    want = {(t, p): v for t, v_ in ((topic, view), (other, other_view)) for p, v in v_.items()}
    assert partitions == want, f"paged kafka-topics --describe: {partitions}\nconfluent metadata: {want}"


def test_kafka_topics_bad_assignments_are_refused(cluster, tools_classpath):
    """Assignments the tool passes on and Spate refuses, as Kafka would: an unknown
    broker at create and at alter; nothing is created or added."""
    b1, b2, b3 = cluster
    rc, out = topics_tool(tools_classpath, b2.bootstrap, "--create", "--topic", "tools-bad",
                          "--replica-assignment", "1:9,2:3")
    assert "InvalidReplicaAssignment" in out or "invalid replica assignment" in out, out
    assert "broker 9 is not registered" in out, out

    # A refused change could still show up late: each negative check waits until b1 has
    # seen a change made after the refusal (the controller orders them), so one wrongly
    # applied would be in b1's metadata by then.
    rc, out = topics_tool(tools_classpath, b2.bootstrap, "--create", "--topic", "tools-ok",
                          "--replica-assignment", "1:2")
    assert rc == 0, out
    wait_view(b1.bootstrap, "tools-ok", [[1, 2]])
    assert "tools-bad" not in topic_names(b1.bootstrap), "a refused --create made the topic"
    rc, out = topics_tool(tools_classpath, b3.bootstrap, "--alter", "--topic", "tools-ok", "--partitions", "3",
                          "--replica-assignment", "1:2,2:3,3:7")
    assert "partition 2: broker 7 is not registered" in out, out
    rc, out = topics_tool(tools_classpath, b3.bootstrap, "--create", "--topic", "tools-after",
                          "--replica-assignment", "3:1")
    assert rc == 0, out
    wait_view(b1.bootstrap, "tools-after", [[3, 1]])
    assert len(cluster_view(b1.bootstrap, "tools-ok")) == 1, "a refused --alter added partitions"


# ---------------------------------------------------------------- kafka-get-offsets --time -3

def test_kafka_get_offsets_max_timestamp(broker, tools_classpath):
    """kafka-get-offsets --time -3 and --time max-timestamp (ListOffsets v7, KIP-734): the
    offset of the first record with the largest timestamp, which the test chose (inside a
    gzip batch, not its last record; a later batch has the same timestamp); -4 (earliest
    local, v8) is the log start; an empty partition has no answer for -3."""
    from test_list_offsets import MAX_TS_OFFSET, max_timestamp_topic
    from helpers.clients import create_topic
    topic = "tools-max-ts"
    max_timestamp_topic(broker.bootstrap, broker, topic)
    create_topic(broker.bootstrap, "tools-max-ts-empty", 1)

    def offsets(time_spec, *topics):
        rc, out = run_tool(tools_classpath, "GetOffsetShell", "--bootstrap-server", broker.bootstrap,
                           "--topic", ",".join(topics) if len(topics) == 1 else "tools-max-ts.*",
                           "--time", time_spec)
        assert rc == 0, out
        return {(t, int(p)): int(o) for t, p, o in re.findall(r"^(\S+):(\d+):(-?\d+)$", out, re.M)}, out

    for spec in ("-3", "max-timestamp"):
        got, out = offsets(spec, topic, "tools-max-ts-empty")
        # The tool prints nothing for a partition without an offset (the empty one).
        assert got == {(topic, 0): MAX_TS_OFFSET}, out
    got, out = offsets("-4", topic, "tools-max-ts-empty")
    assert got == {(topic, 0): 0, ("tools-max-ts-empty", 0): 0}, out


# ---------------------------------------------------------------- kafka-configs (brokers)

CONFIG_LINE = re.compile(r"^  (\S+?)=(\S*) sensitive=(\w+) synonyms=\{(.*)\}$")


def configs_tool(classpath, bootstrap, *args):
    """kafka-configs (org.apache.kafka.tools.ConfigCommand in Kafka 4.4's kafka-tools)."""
    return run_tool(classpath, "ConfigCommand", "--bootstrap-server", bootstrap, *args)


def parse_configs(out):
    """{name: (value, [(source, name, value)])} from a kafka-configs --describe."""
    found = {}
    for line in out.splitlines():
        m = CONFIG_LINE.match(line)
        if m:
            syn = re.findall(r"(\w+):([^=,]+)=([^,]*)", m[4])
            found[m[1]] = (m[2], [(s, n.strip(), v) for s, n, v in syn])
    return found


def test_kafka_configs_broker_default_and_per_broker(broker, tools_classpath):
    """kafka-configs --entity-type brokers: --entity-default --alter --add-config
    log.retention.ms and --entity-name 1 --alter --add-config log.segment.bytes, then
    --describe of each: the tool prints what confluent-kafka's describe_configs reads, with
    Kafka's sources and synonyms, and the per-broker log.segment.bytes really rolls the
    segments of a topic without its own segment.bytes (not those of one with it); a
    read-only config is refused."""
    from helpers.clients import create_topic
    from test_alter_configs import describe_broker
    create_topic(broker.bootstrap, "cfg-follows", 1)
    create_topic(broker.bootstrap, "cfg-own", 1, config={"segment.bytes": "1073741824"})

    rc, out = configs_tool(tools_classpath, broker.bootstrap, "--entity-type", "brokers", "--entity-default",
                           "--alter", "--add-config", "log.retention.ms=86400000")
    assert rc == 0, out
    rc, out = configs_tool(tools_classpath, broker.bootstrap, "--entity-type", "brokers", "--entity-name", "1",
                           "--alter", "--add-config", "log.segment.bytes=1048576")
    assert rc == 0, out

    rc, out = configs_tool(tools_classpath, broker.bootstrap, "--entity-type", "brokers", "--entity-default",
                           "--describe")
    assert rc == 0, out
    assert parse_configs(out) == {
        "log.retention.ms": ("86400000", [("DYNAMIC_DEFAULT_BROKER_CONFIG", "log.retention.ms", "86400000")])}, out
    rc, out = configs_tool(tools_classpath, broker.bootstrap, "--entity-type", "brokers", "--entity-name", "1",
                           "--describe")
    assert rc == 0, out
    shown = parse_configs(out)
    assert shown == {"log.segment.bytes": ("1048576", [("DYNAMIC_BROKER_CONFIG", "log.segment.bytes", "1048576"),
                                                    ("DEFAULT_CONFIG", "log.segment.bytes", "1073741824")])}, out
    described = describe_broker(broker.bootstrap, "1")
    for name in ("log.segment.bytes", "log.retention.ms"):
        assert described[name].value == {"log.segment.bytes": "1048576", "log.retention.ms": "86400000"}[name]

    # Kafka 4.4's smallest log.segment.bytes is 1 MiB: 2.4 MB in 200 KB batches rolls it.
    for topic in ("cfg-follows", "cfg-own"):
        for i in range(12):  # one batch each
            cf_produce(broker.bootstrap, topic, [{"value": b"%03d" % i + b"x" * 200_000}])
    follows = sorted((broker.data_dir / "cfg-follows-0").glob("*.log"))
    own = sorted((broker.data_dir / "cfg-own-0").glob("*.log"))
    assert len(follows) >= 3 and all(f.stat().st_size <= 1048576 for f in follows), \
        [(f.name, f.stat().st_size) for f in follows]
    assert len(own) == 1, own

    rc, out = configs_tool(tools_classpath, broker.bootstrap, "--entity-type", "brokers", "--entity-name", "1",
                           "--alter", "--add-config", "log.dirs=/tmp/elsewhere")
    assert rc != 0 and "Cannot update these configs dynamically" in out, out


# ---------------------------------------------------------------- kafka-broker-api-versions

LINE = re.compile(r"^\s*(\w+)\((\d+)\): (.*?),?$")


def test_kafka_broker_api_versions_lists_each_broker(cluster, tools_classpath):
    """Every broker listed with its id, and for each API the versions that broker
    answers in a raw ApiVersions request (UNSUPPORTED for the others)."""
    rc, out = run_tool(tools_classpath, "BrokerApiVersionsCommand", "--bootstrap-server", cluster[1].bootstrap)
    assert rc == 0, out
    sections = re.split(r"^(\S+:\d+) \(id: (\d+) rack: \S+ isFenced: (\w+)\) -> \(", out, flags=re.M)
    listed = {}
    for address, broker_id, fenced, body in zip(sections[1::4], sections[2::4], sections[3::4], sections[4::4]):
        listed[address] = (int(broker_id), fenced, body)
    assert {a: (i, f) for a, (i, f, _) in listed.items()} == {
        b.bootstrap: (n + 1, "false") for n, b in enumerate(cluster)}, out
    for b in cluster:
        _, err, apis = parse_api_versions_v0(call(b.port, api_versions_request()))
        assert err == 0
        shown = {}
        for line in listed[b.bootstrap][2].splitlines():
            m = LINE.match(line)
            if m:
                shown[int(m[2])] = m[3]
        assert shown, listed[b.bootstrap][2]
        for key, text in shown.items():
            if key not in apis:
                assert text == "UNSUPPORTED", (b.bootstrap, key, text)
                continue
            lo, hi = apis[key]
            want = f"{lo}" if lo == hi else f"{lo} to {hi}"
            assert text.startswith(want + " [usable: "), (b.bootstrap, key, text, (lo, hi))
        assert set(apis) - set(shown) <= {67, 82}, f"APIs {b.bootstrap} answers that the tool did not list"


def test_kafka_features_describe_and_refused_changes(broker, tools_classpath):
    """kafka-features.sh (FeatureCommand, through ApiVersions v4 and UpdateFeatures): the
    features Spate finalizes, with Kafka 4.4's names and levels (src/protocol/features.rs);
    an update to the level a feature has succeeds, any other is refused with Kafka's
    INVALID_UPDATE_VERSION message, and a dry run is refused alike."""
    rc, out = run_tool(tools_classpath, "FeatureCommand", "--bootstrap-server", broker.bootstrap, "describe")
    assert rc == 0, out
    shown = {m[1]: (m[2], m[3], m[4], m[5]) for m in re.finditer(
        r"^Feature: (\S+)\s+SupportedMinVersion: (\S+)\s+SupportedMaxVersion: (\S+)\s+"
        r"FinalizedVersionLevel: (\S+)\s+Epoch: (\S+)", out, flags=re.M)}
    assert shown == {
        "metadata.version": ("4.0-IV0", "4.0-IV0", "4.0-IV0", "2"),
        "group.version": ("1", "1", "1", "2"),
        "transaction.version": ("2", "2", "2", "2"),
        "eligible.leader.replicas.version": ("0", "0", "0", "2"),
        "share.version": ("0", "0", "0", "2"),
        "streams.version": ("0", "0", "0", "2"),
    }, out
    rc, out = run_tool(tools_classpath, "FeatureCommand", "--bootstrap-server", broker.bootstrap,
                       "upgrade", "--feature", "group.version=1")
    assert rc == 0 and "group.version was upgraded to 1." in out, out
    for dry in ([], ["--dry-run"]):
        rc, out = run_tool(tools_classpath, "FeatureCommand", "--bootstrap-server", broker.bootstrap,
                           "upgrade", "--feature", "share.version=1", *dry)
        assert rc != 0, out
        assert ("Invalid update version 1 for feature share.version. "
                "This Spate broker only supports version 0 of it") in out, out


def test_kafka_transactions_list_by_pattern(broker, tools_classpath):
    """kafka-transactions list --transactional-id-pattern (ListTransactions v2, KIP-1152):
    the whole id must match, as Kafka's `Pattern.matcher(id).matches()`; a pattern that
    does not compile is refused (INVALID_REGULAR_EXPRESSION)."""
    from confluent_kafka import Producer
    for txn_id in ("orders-1", "orders-2", "payments-1"):
        p = Producer(cf_conf(broker.bootstrap, **{"transactional.id": txn_id}))
        p.init_transactions(30)

    def listed(pattern):
        rc, out = run_tool(tools_classpath, "TransactionsCommand", "--bootstrap-server", broker.bootstrap,
                           "list", "--transactional-id-pattern", pattern)
        assert rc == 0, out
        return sorted(line.split()[0] for line in out.splitlines()[1:] if line.strip()), out

    assert listed("orders-.*")[0] == ["orders-1", "orders-2"]
    assert listed(".*-1")[0] == ["orders-1", "payments-1"]
    assert listed("orders")[0] == [], "a match of part of the id is not a match"
    rc, out = run_tool(tools_classpath, "TransactionsCommand", "--bootstrap-server", broker.bootstrap,
                       "list", "--transactional-id-pattern", "orders-(")
    assert rc != 0 and "INVALID_REGULAR_EXPRESSION" in out, out


def test_kafka_cluster_list_endpoints_with_fenced_brokers(cluster, tools_classpath):
    """kafka-cluster list-endpoints (DescribeCluster v2, KIP-1073): a killed broker,
    fenced once its session lapses, is left out, and listed as fenced with
    --include-fenced-brokers."""
    b1, b2, b3 = cluster
    b3.kill()
    wait_brokers(b1.bootstrap, {b1.port, b2.port})  # fenced: Metadata no longer lists it

    def listed(*flags):
        rc, out = run_tool(tools_classpath, "ClusterTool", "list-endpoints", "--bootstrap-server", b1.bootstrap,
                           *flags)
        assert rc == 0, out
        rows = {}
        for line in out.splitlines():
            cols = line.split()
            if cols and cols[0].isdigit():
                rows[int(cols[0])] = cols
        return rows, out

    rows, out = listed()
    assert set(rows) == {1, 2}, out
    rows, out = listed("--include-fenced-brokers")
    assert set(rows) == {1, 2, 3}, out
    fenced = {i for i, cols in rows.items() if "fenced" in (c.lower() for c in cols)}
    assert fenced == {3}, out


# ---------------------------------------------------------------- confluent-kafka AdminClient

def admin_error(bootstrap, topic, call):
    """(error code, message) of `call(admin)`'s future for `topic`; (0, "") on success."""
    a = admin(bootstrap)  # kept until the answer is in: a destroyed client fails its futures
    fs = call(a)
    try:
        fs[topic].result(20)
    except KafkaException as e:
        return e.args[0].code(), e.args[0].str()
    return 0, ""


def create_error(bootstrap, topic, assignment):
    return admin_error(bootstrap, topic, lambda a: a.create_topics(
        [NewTopic(topic, len(assignment), replica_assignment=assignment)], request_timeout=15, operation_timeout=15))


def partitions_error(bootstrap, topic, total, assignment):
    return admin_error(bootstrap, topic, lambda a: a.create_partitions(
        [NewPartitions(topic, total, replica_assignment=assignment)], request_timeout=15, operation_timeout=15))


def test_admin_client_replica_assignments(cluster, tools_classpath):
    """NewTopic / NewPartitions with replica_assignment, sent to a broker that forwards
    them and to the coordinator's own: the replicas, leaders and ISR as given, the
    records on the assigned brokers' disks and nowhere else; Kafka's errors for bad
    assignments, which change nothing."""
    b1, b2, b3 = cluster
    assignment = [[2, 3], [2, 1], [1, 2], [3, 1]]  # not a round-robin placement
    assert create_error(b3.bootstrap, "cf-assigned", assignment) == (0, "")
    wait_view(b1.bootstrap, "cf-assigned", assignment)
    wait_view(b2.bootstrap, "cf-assigned", assignment)
    values = produce_to_each(b2.bootstrap, "cf-assigned", range(4), "cf")
    check_placement(cluster, "cf-assigned", assignment, values)

    assert partitions_error(b2.bootstrap, "cf-assigned", 6, [[3, 2], [3, 1]]) == (0, "")
    grown = assignment + [[3, 2], [3, 1]]
    wait_view(b3.bootstrap, "cf-assigned", grown)
    values.update(produce_to_each(b3.bootstrap, "cf-assigned", [4, 5], "cf-more"))
    check_placement(cluster, "cf-assigned", grown, values)

    assert create_error(b1.bootstrap, "cf-on-coordinator", [[3], [1], [2]]) == (0, "")
    wait_view(b2.bootstrap, "cf-on-coordinator", [[3], [1], [2]])

    bad_topics = {
        "cf-dup": ([[1, 1]], "more than once"),
        "cf-inconsistent": ([[1, 2], [3]], "not consistent"),
        "cf-unknown": ([[1, 9]], "broker 9 is not registered"),
    }
    for topic, (a, words) in bad_topics.items():
        for b in (b1, b2):
            code, message = create_error(b.bootstrap, topic, a)
            assert code == INVALID_REPLICA_ASSIGNMENT and words in message, (topic, b.bootstrap, code, message)
    bad_partitions = {
        "too few lists": (8, [[1, 2]], "attempted to add 2 additional partition(s), but 1 assignment"),
        "replication factor": (7, [[1, 2, 3]], "partition 6 has 3 replica(s), not consistent"),
        "unknown broker": (7, [[1, 7]], "partition 6: broker 7 is not registered"),
        "duplicate": (7, [[2, 2]], "more than once"),
    }
    for what, (total, a, words) in bad_partitions.items():
        for b in (b1, b3):
            code, message = partitions_error(b.bootstrap, "cf-assigned", total, a)
            assert code == INVALID_REPLICA_ASSIGNMENT and words in message, (what, b.bootstrap, code, message)
    # A change made after the refusals, seen by b1: any refused one wrongly applied
    # (the controller orders them) would be in b1's metadata by then.
    assert create_error(b3.bootstrap, "cf-after", [[1, 3]]) == (0, "")
    wait_view(b1.bootstrap, "cf-after", [[1, 3]])
    names = topic_names(b1.bootstrap)
    assert not names & set(bad_topics), names
    assert cluster_view(b1.bootstrap, "cf-assigned") == {p: (r[0], r, r) for p, r in enumerate(grown)}


def test_admin_client_assignment_with_a_fenced_broker(cluster):
    """As Kafka: a broker that stopped heartbeating (fenced, still registered) may be
    named beside a live one, which leads while the fenced one is outside the ISR; it
    joins the ISR once back. A partition whose brokers are all fenced is refused."""
    b1, b2, b3 = cluster
    b3.kill()
    wait_brokers(b1.bootstrap, {b1.port, b2.port})
    assignment = [[3, 1], [3, 2]]
    assert create_error(b2.bootstrap, "cf-fenced", assignment) == (0, "")
    wait_for(lambda: cluster_view(b1.bootstrap, "cf-fenced"),
             lambda v: v == {0: (1, [3, 1], [1]), 1: (2, [3, 2], [2])}, 20,
             "cf-fenced led by its live replicas, broker 3 outside the ISR")
    code, message = create_error(b1.bootstrap, "cf-all-fenced", [[3]])
    assert code == INVALID_REPLICA_ASSIGNMENT and "are fenced" in message, (code, message)
    code, message = partitions_error(b2.bootstrap, "cf-fenced", 3, [[3]])
    assert code == INVALID_REPLICA_ASSIGNMENT, (code, message)
    values = produce_to_each(b2.bootstrap, "cf-fenced", [0, 1], "fenced")
    b3.restart()
    wait_for(lambda: cluster_view(b1.bootstrap, "cf-fenced"),
             lambda v: all(3 in v[p][2] for p in (0, 1)), 60, "broker 3 in the ISR of cf-fenced")
    for p in (0, 1):
        data = wait_for(lambda: segment_bytes(b3, "cf-fenced", p), lambda d: all(v in d for v in values[p]), 20,
                        f"cf-fenced-{p} copied to broker 3")
        assert all(v in data for v in values[p])


# ---------------------------------------------------------------- raw CreateTopics

def _str(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def create_topics_v2(topic, assignment, num_partitions=-1, replication_factor=-1, validate_only=False):
    """CreateTopics v2: one topic; `assignment` is [(partition, [brokers])]."""
    body = struct.pack(">i", 1) + _str(topic) + struct.pack(">ih", num_partitions, replication_factor)
    body += struct.pack(">i", len(assignment))
    for p, brokers in assignment:
        body += struct.pack(">ii", p, len(brokers)) + b"".join(struct.pack(">i", x) for x in brokers)
    body += struct.pack(">i", 0)  # configs
    body += struct.pack(">i?", 15000, validate_only)
    return frame(request_header_v1(19, 2, 7) + body)


def parse_create_topics_v2(resp):
    """-> [(name, error code, message)]"""
    _corr, _throttle, n = struct.unpack(">iii", resp[:12])
    off, out = 12, []
    for _ in range(n):
        (ln,) = struct.unpack(">h", resp[off:off + 2])
        name = resp[off + 2:off + 2 + ln].decode()
        off += 2 + ln
        code, mlen = struct.unpack(">hh", resp[off:off + 4])
        off += 4
        msg = None
        if mlen >= 0:
            msg = resp[off:off + mlen].decode()
            off += mlen
        out.append((name, code, msg))
    return out


def test_create_topics_assignment_request_checks(cluster):
    """What clients check before sending, checked by Spate too (on a forwarding broker
    and on the coordinator): Kafka's error code for each, nothing created."""
    b1, b2, b3 = cluster
    cases = [
        ("raw-with-count", [(0, [1, 2])], 1, -1, INVALID_REQUEST, "numPartitions"),
        ("raw-with-rf", [(0, [1, 2])], -1, 2, INVALID_REQUEST, "replication factor"),
        ("raw-gap", [(0, [1, 2]), (2, [2, 3])], -1, -1, INVALID_REPLICA_ASSIGNMENT, "consecutive"),
        ("raw-twice", [(0, [1, 2]), (0, [2, 3])], -1, -1, INVALID_REPLICA_ASSIGNMENT, "multiple"),
        ("raw-negative", [(-1, [1, 2])], -1, -1, INVALID_REPLICA_ASSIGNMENT, "consecutive"),
        ("raw-empty", [(0, [])], -1, -1, INVALID_REPLICA_ASSIGNMENT, "empty"),
        ("raw-too-many", [(0, list(range(1, 66)))], -1, -1, INVALID_REPLICA_ASSIGNMENT, "above the most"),
    ]
    for b in (b2, b1):
        for topic, a, n, rf, code, words in cases:
            [(name, got, msg)] = parse_create_topics_v2(call(b.port, create_topics_v2(topic, a, n, rf)))
            assert (name, got) == (topic, code) and words in (msg or ""), (b.bootstrap, topic, got, msg)
        [(_, got, msg)] = parse_create_topics_v2(
            call(b.port, create_topics_v2("raw-validate", [(1, [3, 1]), (0, [1, 2])], validate_only=True)))
        assert got == 0, msg
        [(_, got, msg)] = parse_create_topics_v2(
            call(b.port, create_topics_v2("raw-validate", [(0, [1, 9])], validate_only=True)))
        assert got == INVALID_REPLICA_ASSIGNMENT and "broker 9" in msg, msg
    names = topic_names(b3.bootstrap)
    assert not {n for n in names if n.startswith("raw-")}, names
    # Partitions given out of order are placed by their index.
    [(_, got, msg)] = parse_create_topics_v2(
        call(b3.port, create_topics_v2("raw-ordered", [(1, [3, 1]), (0, [1, 2])])))
    assert got == 0, msg
    wait_view(b1.bootstrap, "raw-ordered", [[1, 2], [3, 1]])
    [(_, got, msg)] = parse_create_topics_v2(
        call(b3.port, create_topics_v2("raw-ordered", [(0, [1, 2])])))
    assert got == TOPIC_ALREADY_EXISTS, msg


# ---------------------------------------------------------------- kafka-consumer-groups, kafka-cluster

def test_kafka_consumer_groups_and_cluster_id(cluster, tools_classpath):
    """kafka-consumer-groups --list / --describe show the offsets a group committed, the
    log end offsets and the lag; kafka-cluster cluster-id prints the id the metadata
    carries."""
    b1, b2, b3 = cluster
    topic, group = "tools-group", "tools-group-g"
    assignment = [[1, 2], [2, 3]]
    assert create_error(b2.bootstrap, topic, assignment) == (0, "")
    wait_view(b2.bootstrap, topic, assignment)
    produce_to_each(b1.bootstrap, topic, [0, 1], "g")
    committed = {0: 10, 1: 3}
    c = Consumer(cf_conf(b3.bootstrap, **{"group.id": group, "enable.auto.commit": False}))
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in committed.items()], asynchronous=False)
    finally:
        c.close()

    rc, out = run_tool(tools_classpath, "consumer.group.ConsumerGroupCommand", "--bootstrap-server", b2.bootstrap,
                       "--list")
    assert rc == 0 and group in out.split(), out
    rc, out = run_tool(tools_classpath, "consumer.group.ConsumerGroupCommand", "--bootstrap-server", b3.bootstrap,
                       "--describe", "--group", group)
    assert rc == 0, out
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 6 and f[0] == group and f[1] == topic:
            rows[int(f[2])] = (int(f[3]), int(f[4]), int(f[5]))
    assert rows == {p: (o, RECORDS_PER_PARTITION, RECORDS_PER_PARTITION - o) for p, o in committed.items()}, out

    rc, out = run_tool(tools_classpath, "ClusterTool", "cluster-id", "--bootstrap-server", b3.bootstrap)
    assert rc == 0, out
    cluster_id = admin(b1.bootstrap).list_topics(timeout=10).cluster_id
    assert cluster_id and f"Cluster ID: {cluster_id}" in out, (out, cluster_id)


def test_kafka_consumer_groups_on_a_consumer_protocol_group(broker, tools_classpath):
    """kafka-consumer-groups on a KIP-848 group (a confluent-kafka member with
    group.protocol=consumer): --list --type consumer lists it (ListGroups v5), --describe
    --state shows its state and assignor and --describe --members its member and
    assignment (ConsumerGroupDescribe), --describe its committed offsets."""
    topic, group = "tools-848", "tools-848-g"
    create_topic(broker.bootstrap, topic, 2)
    produce_to_each(broker.bootstrap, topic, [0, 1], "k")
    c = Consumer(cf_conf(broker.bootstrap, **{"group.id": group, "group.protocol": "consumer",
                                              "auto.offset.reset": "earliest", "enable.auto.commit": False}))
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(c.assignment()) < 2:
            assert time.monotonic() < deadline, "no assignment with group.protocol=consumer"
            c.poll(0.2)
        c.commit(offsets=[TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 2)], asynchronous=False)
        tool = ("consumer.group.ConsumerGroupCommand", "--bootstrap-server", broker.bootstrap)
        rc, out = run_tool(tools_classpath, *tool, "--list", "--type", "consumer")
        assert rc == 0 and group in out.split(), out
        rc, out = run_tool(tools_classpath, *tool, "--list", "--type", "classic")
        assert rc == 0 and group not in out.split(), out
        rc, out = run_tool(tools_classpath, *tool, "--describe", "--group", group, "--state")
        assert rc == 0, out
        row = next(line.split() for line in out.splitlines() if line.startswith(group))
        assert "uniform" in row and "Stable" in row and row[-1] == "1", out
        rc, out = run_tool(tools_classpath, *tool, "--describe", "--group", group, "--members", "--verbose")
        assert rc == 0, out
        member = next(line for line in out.splitlines() if line.startswith(group))
        assert f"{topic}:0,1" in member.replace(" ", ""), out
        rc, out = run_tool(tools_classpath, *tool, "--describe", "--group", group)
        assert rc == 0, out
        rows = {int(f[2]): int(f[3]) for f in (line.split() for line in out.splitlines())
                if len(f) >= 6 and f[0] == group and f[1] == topic}
        assert rows == {0: 4, 1: 2}, out
        # Spate's own CLI describes it too (ConsumerGroupDescribe after DescribeGroups'
        # GROUP_ID_NOT_FOUND).
        from helpers.broker import SPATE_BIN
        d = json.loads(subprocess.run([str(SPATE_BIN), "group", "describe", group, "--bootstrap", broker.bootstrap,
                                       "--json"], check=True, capture_output=True, text=True, timeout=60).stdout)
        assert d["state"] == "Stable" and d["protocol_type"] == "consumer" and d["protocol"] == "uniform", d
        assert [sorted(p for _, ps in m["assignment"] for p in ps) for m in d["members"]] == [[0, 1]], d
    finally:
        c.close()


# ---------------------------------------------------------------- kafka-leader-election

def leaders_of(bootstrap, topic):
    return {p: leader for p, (leader, _, _) in cluster_view(bootstrap, topic).items()}


def test_kafka_leader_election_preferred(cluster, tools_classpath):
    """Broker 3 stops (its leaderships move) and comes back into the ISR; leadership
    stays away (the periodic preferred election runs every 5 minutes). kafka-leader-
    election --election-type preferred, sent to a broker that forwards it, gives one
    named partition back to its preferred replica, then every partition; a partition
    already led by its preferred replica is "already elected", an unknown one an
    error; unclean elections are refused."""
    b1, b2, b3 = cluster
    topic = "tools-elect"
    assignment = [[3, 1], [3, 2], [1, 2]]
    assert create_error(b2.bootstrap, topic, assignment) == (0, "")
    wait_view(b1.bootstrap, topic, assignment)
    b3.stop()
    wait_for(lambda: leaders_of(b1.bootstrap, topic), lambda l: l == {0: 1, 1: 2, 2: 1}, 30,
             f"{topic} led by 1, 2, 1 with broker 3 stopped")
    b3.restart()
    wait_for(lambda: cluster_view(b1.bootstrap, topic),
             lambda v: all(3 in v[p][2] for p in (0, 1)), 60, f"broker 3 back in the ISR of {topic}")
    assert leaders_of(b1.bootstrap, topic) == {0: 1, 1: 2, 2: 1}

    election = ["LeaderElectionCommand", "--bootstrap-server", b2.bootstrap, "--election-type", "preferred"]
    rc, out = run_tool(tools_classpath, *election, "--topic", topic, "--partition", "0")
    assert rc == 0 and f"Successfully completed leader election (PREFERRED) for partitions {topic}-0" in out, out
    wait_for(lambda: leaders_of(b3.bootstrap, topic), lambda l: l == {0: 3, 1: 2, 2: 1}, 20,
             f"{topic}-0 led by its preferred replica")

    rc, out = run_tool(tools_classpath, *election, "--topic", topic, "--partition", "2")
    assert rc == 0 and f"Valid replica already elected for partitions {topic}-2" in out, out

    rc, out = run_tool(tools_classpath, *election, "--all-topic-partitions")
    assert rc == 0, out
    done = re.search(r"Successfully completed leader election \(PREFERRED\) for partitions (.*)", out)
    assert done and f"{topic}-1" in done[1].split(", ") and f"{topic}-0" not in done[1], out
    wait_for(lambda: leaders_of(b2.bootstrap, topic), lambda l: l == {0: 3, 1: 3, 2: 1}, 20,
             f"every partition of {topic} led by its preferred replica")

    rc, out = run_tool(tools_classpath, *election, "--topic", topic, "--partition", "9")
    assert rc != 0 and f"{topic}-9" in out and "UnknownTopicOrPartition" in out, out
    # An unclean election for a partition that has a leader changes nothing.
    rc, out = run_tool(tools_classpath, "LeaderElectionCommand", "--bootstrap-server", b2.bootstrap,
                       "--election-type", "unclean", "--topic", topic, "--partition", "1")
    assert rc == 0 and f"Valid replica already elected for partitions {topic}-1" in out, out
    assert leaders_of(b1.bootstrap, topic) == {0: 3, 1: 3, 2: 1}


def test_kafka_leader_election_unclean(cluster, tools_classpath):
    """A partition on brokers 2 and 3 loses broker 3 (out of the ISR), takes a write only
    broker 2 has, then loses broker 2: offline. kafka-leader-election --election-type
    unclean fails while no replica is live; once broker 3 is back (out of sync, so
    nothing elects it by default) it makes broker 3 the leader. The write both had is
    kept, the one only broker 2 had is lost (what unclean election means), new writes
    go to broker 3, and broker 2 returns as its follower with broker 3's bytes."""
    b1, b2, b3 = cluster
    topic = "tools-unclean"
    assert create_error(b1.bootstrap, topic, [[2, 3]]) == (0, "")
    wait_view(b1.bootstrap, topic, [[2, 3]])
    cf_produce(b1.bootstrap, topic, [{"value": b"in-sync", "partition": 0}], acks="all")
    b3.stop()
    wait_for(lambda: cluster_view(b1.bootstrap, topic), lambda v: v[0][2] == [2], 30,
             f"{topic}-0's ISR shrunk to broker 2")
    cf_produce(b1.bootstrap, topic, [{"value": b"only-on-2", "partition": 0}], acks="all")
    b2.stop()
    wait_for(lambda: cluster_view(b1.bootstrap, topic), lambda v: v[0][0] == -1, 30, f"{topic}-0 offline")

    election = ["LeaderElectionCommand", "--bootstrap-server", b1.bootstrap, "--election-type", "unclean",
                "--topic", topic, "--partition", "0"]
    rc, out = run_tool(tools_classpath, *election)
    assert rc != 0 and f"{topic}-0" in out and "EligibleLeadersNotAvailable" in out, out

    b3.restart()
    wait_brokers(b1.bootstrap, {b1.port, b3.port})
    assert cluster_view(b1.bootstrap, topic)[0][0] == -1, "an out-of-sync replica was elected on its own"
    rc, out = run_tool(tools_classpath, *election)
    assert rc == 0 and f"Successfully completed leader election (UNCLEAN) for partitions {topic}-0" in out, out
    wait_for(lambda: cluster_view(b3.bootstrap, topic), lambda v: v == {0: (3, [2, 3], [3])}, 20,
             f"{topic}-0 led by broker 3 alone")
    rc, out = run_tool(tools_classpath, *election)
    assert rc == 0 and f"Valid replica already elected for partitions {topic}-0" in out, out

    cf_produce(b1.bootstrap, topic, [{"value": b"after-unclean", "partition": 0}], acks="all")
    assert cf_read_partition(b1.bootstrap, topic, 0) == [b"in-sync", b"after-unclean"]
    # Broker 2 comes back as broker 3's follower: its divergent write is dropped.
    b2.restart()
    wait_for(lambda: cluster_view(b1.bootstrap, topic), lambda v: v == {0: (3, [2, 3], [2, 3])}, 60,
             f"broker 2 back in {topic}-0's ISR")
    assert cf_read_partition(b2.bootstrap, topic, 0) == [b"in-sync", b"after-unclean"]


# ---------------------------------------------------------------- kafka-delete-records, kafka-log-dirs

# Small segments: each produce call below (one batch of BATCH_RECORDS records of
# VALUE_BYTES) fills one, so a log start inside the log leaves whole segments below it.
SEGMENT_BYTES = 1000
BATCH_RECORDS = 10
BATCHES = 6
VALUE_BYTES = 100


def create_with_config(bootstrap, topic, assignment, config):
    a = admin(bootstrap)
    fs = a.create_topics([NewTopic(topic, len(assignment), replica_assignment=assignment, config=config)],
                         request_timeout=15,
                         operation_timeout=15)
    fs[topic].result(20)


def produce_batches(bootstrap, topic, partitions, tag):
    """BATCHES produce calls of BATCH_RECORDS records to each partition, acks=all (each
    call is flushed before the next, so each is its own batch); {partition: [values]}."""
    values = {p: [] for p in partitions}
    for b in range(BATCHES):
        recs = []
        for p in partitions:
            batch = [f"{tag}-p{p}-{b * BATCH_RECORDS + i:03}-".encode().ljust(VALUE_BYTES, b"x")
                     for i in range(BATCH_RECORDS)]
            values[p] += batch
            recs += [{"value": v, "partition": p} for v in batch]
        cf_produce(bootstrap, topic, recs, acks="all")
    return values


def segment_bases(broker, topic, partition):
    """Base offsets of the partition's segments on `broker`'s disk."""
    return sorted(int(f.stem) for f in (broker.data_dir / f"{topic}-{partition}").glob("*.log"))


def log_bytes(broker, topic, partition):
    """Bytes of the partition's segment files (.log) on `broker`'s disk."""
    return sum(f.stat().st_size for f in (broker.data_dir / f"{topic}-{partition}").glob("*.log"))


def checkpointed_log_start(broker, topic, partition):
    """The offset in the partition's `spate-log-start-offset` on `broker`'s disk (format
    "1 <offset> <crc>"), None without one."""
    f = broker.data_dir / f"{topic}-{partition}" / "spate-log-start-offset"
    if not f.exists():
        return None
    version, offset, _crc = f.read_text().split()
    assert version == "1", f.read_text()
    return int(offset)


def watermarks(bootstrap, topic, partition):
    """(earliest, latest) offsets of the partition, asked of its leader (ListOffsets)."""
    c = Consumer(cf_conf(bootstrap, **{"group.id": "spate-tests-watermarks"}))
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
    finally:
        c.close()


def fetch_error_below(bootstrap, topic, partition, offset, timeout=30):
    """What a consumer that fetches at `offset` and may not reset gets: (error code,
    message) of its first error."""
    c = Consumer(cf_conf(bootstrap, **{"group.id": "spate-tests-below", "auto.offset.reset": "error",
                                        "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                return m.error().code(), m.error().str()
            return None, f"read offset {m.offset()}: {m.value()[:20]}"
        raise AssertionError(f"no answer for offset {offset} of {topic}-{partition} within {timeout}s")
    finally:
        c.close()


def bases_below(before, log_start):
    """The segments wholly below `log_start` (their successor starts at or below it)."""
    return [b for i, b in enumerate(before) if i + 1 < len(before) and before[i + 1] <= log_start]


def test_kafka_delete_records(cluster, tools_classpath, tmp_path):
    """kafka-delete-records, bootstrapped from broker 2, which leads neither partition (the
    Java admin sends each partition to its leader): partition 0 up to an offset inside a
    segment; partition 1 up to the high watermark (-1). The tool prints each new
    low watermark; ListOffsets earliest answers it; a consumer reading from the beginning
    gets exactly the records from there on; one fetching below it gets
    OFFSET_OUT_OF_RANGE; the segments wholly below it are gone from the leader's disk;
    the followers checkpoint the same log start; and after kill -9 of every broker and a
    restart, all of it still holds."""
    b1, b2, b3 = cluster
    topic = "tools-delete"
    assignment = [[1, 2], [3, 1]]
    create_with_config(b2.bootstrap, topic, assignment, {"segment.bytes": str(SEGMENT_BYTES)})
    wait_view(b2.bootstrap, topic, assignment)
    values = produce_batches(b2.bootstrap, topic, [0, 1], "dr")
    total = BATCHES * BATCH_RECORDS
    assert watermarks(b1.bootstrap, topic, 0) == (0, total)
    leader_of = {0: b1, 1: b3}
    before = {p: segment_bases(leader_of[p], topic, p) for p in (0, 1)}
    # One segment per batch the producer sent (it may split a produce call in two).
    assert len(before[0]) >= BATCHES - 1 and len(before[1]) >= BATCHES - 1, before
    # Inside the third segment from the end: the segments before it go.
    start0 = before[0][-3] + 3
    assert before[0][-3] < start0 < before[0][-2], before

    offsets = tmp_path / "delete.json"
    offsets.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "offset": start0}, {"topic": topic, "partition": 1, "offset": -1}]}))
    rc, out = run_tool(tools_classpath, "DeleteRecordsCommand", "--bootstrap-server", b2.bootstrap,
                       "--offset-json-file", offsets)
    assert rc == 0, out
    printed = {(t, int(p)): int(lw) for t, p, lw in
               re.findall(r"^partition: (\S+)-(\d+)\s+low_watermark: (\d+)$", out, re.M)}
    assert printed == {(topic, 0): start0, (topic, 1): total}, out
    want_start = {0: start0, 1: total}

    def check(when):
        for p, start in want_start.items():
            # The high watermark of a restarted leader catches up as its followers fetch.
            wait_for(lambda: watermarks(b2.bootstrap, topic, p), lambda w: w == (start, total), 30,
                     f"{when}: earliest and latest offsets of {topic}-{p} = ({start}, {total})")
            got = cf_read_partition(b3.bootstrap, topic, p)
            assert got == values[p][start:], (
                f"{when}: {topic}-{p} read from the beginning: {len(got)} records from {got[:1]}, "
                f"want {total - start} from offset {start}")
        code, message = fetch_error_below(b2.bootstrap, topic, 0, start0 - 1)
        assert code == KafkaError._AUTO_OFFSET_RESET and "out of range" in message.lower(), (when, code, message)

    check("after kafka-delete-records")
    for p, start in want_start.items():
        # (The active segment may have rolled since `before`: a roll is due once it is
        # past segment.bytes, and it is never deleted while active.)
        now, gone = segment_bases(leader_of[p], topic, p), bases_below(before[p], start)
        assert gone and not set(gone) & set(now) and now[0] <= start, (p, start, now, before[p])
        assert checkpointed_log_start(leader_of[p], topic, p) == start
        # The tool's answer came once the follower's log start reached it (DeleteRecords
        # waits for the live replicas), so its checkpoint already holds it.
        follower = cluster[assignment[p][1] - 1]
        assert checkpointed_log_start(follower, topic, p) == start, (follower.name, p, start)

    # kill -9 every broker: what each checkpointed is all there is.
    for b in cluster:
        b.kill()
    for b in cluster:
        b.restart()
    wait_brokers(b1.bootstrap, {b.port for b in cluster})
    wait_for(lambda: cluster_view(b1.bootstrap, topic), lambda v: all(v[p][0] in (1, 2, 3) for p in (0, 1)), 30,
             f"{topic} led again after the restart")
    check("after kill -9 and a restart")


LOG_DIRS_JSON = re.compile(r"^\{.*\}$", re.M)


def test_kafka_log_dirs(cluster, tools_classpath):
    """kafka-log-dirs --describe lists, for every broker, its data directory and exactly
    the partitions whose directories it holds, each with the size of its segment files
    on that broker's disk and an offset lag of 0 (every replica caught up); again after
    records were deleted (their segments gone). A raw v4 request shows the same, with
    the data dir's file system size and usable bytes."""
    b1, b2, b3 = cluster
    topic = "tools-logdirs"
    assignment = [[1, 2], [2, 3], [3, 1]]
    create_with_config(b3.bootstrap, topic, assignment, {"segment.bytes": str(SEGMENT_BYTES)})
    wait_view(b1.bootstrap, topic, assignment)
    produce_batches(b1.bootstrap, topic, [0, 1, 2], "ld")

    def described():
        rc, out = run_tool(tools_classpath, "LogDirsCommand", "--bootstrap-server", b2.bootstrap, "--describe",
                           "--topic-list", topic)
        assert rc == 0, out
        found = LOG_DIRS_JSON.findall(out)
        assert len(found) == 1, out
        doc = json.loads(found[0])
        got = {}
        for broker in doc["brokers"]:
            [log_dir] = broker["logDirs"]
            assert log_dir["error"] is None, log_dir
            got[broker["broker"]] = (log_dir["logDir"], {
                (q["partition"], q["size"], q["offsetLag"], q["isFuture"]) for q in log_dir["partitions"]})
        return got

    def on_disk():
        return {n + 1: (os.path.abspath(b.data_dir), {
            (f"{topic}-{p}", log_bytes(b, topic, p), 0, False) for p in sorted(partition_dirs(b, topic))})
            for n, b in enumerate(cluster)}

    want = on_disk()
    for n, b in enumerate(cluster):
        # v4 adds the file system's size and usable bytes (statvfs of the data dir).
        [(log_dir, partitions, total, usable)] = describe_log_dirs_v4(b.port)
        fs = os.statvfs(b.data_dir)
        assert log_dir == want[n + 1][0] and total == fs.f_blocks * fs.f_frsize, (log_dir, total)
        # Usable space moves as everything on this machine writes: the broker's reading
        # is at most a few seconds old.
        assert 0 < usable <= total and abs(usable - fs.f_bavail * fs.f_frsize) < total // 20, (usable, total)
        assert {q for q in partitions if q[0].startswith(topic + "-")} == want[n + 1][1], partitions
    assert {n: {q[0] for q in parts} for n, (_, parts) in want.items()} == {
        1: {f"{topic}-0", f"{topic}-2"}, 2: {f"{topic}-0", f"{topic}-1"}, 3: {f"{topic}-1", f"{topic}-2"}}, want
    assert all(size > SEGMENT_BYTES for _, parts in want.values() for _, size, _, _ in parts), want
    assert described() == want

    # Deleting records removes segments: the sizes follow what is on disk.
    a = admin(b1.bootstrap)
    fs = a.delete_records([TopicPartition(topic, 0, 35)], request_timeout=15)
    assert fs[TopicPartition(topic, 0)].result(20).low_watermark == 35
    # Answered once both replicas dropped the records.
    assert [checkpointed_log_start(b, topic, 0) for b in (b1, b2)] == [35, 35]
    after = on_disk()
    assert after[1][1] != want[1][1] and after[2][1] != want[2][1], "no segment of partition 0 was deleted"
    assert described() == after


def describe_log_dirs_v4(port):
    """A raw DescribeLogDirs v4 for every partition -> [(log dir, {(partition name, size,
    offset lag, is future)}, total bytes, usable bytes)]."""
    resp = call(port, frame(request_header_v1(35, 4, 11) + b"\x00" + b"\x00" + b"\x00"))
    r = Reader(resp)
    assert r.fixed(">i") == 11
    r.no_tags()
    r.fixed(">i")  # throttle
    assert r.fixed(">h") == 0
    results = []
    for _ in range(r.uvarint() - 1):
        assert r.fixed(">h") == 0
        log_dir = r.compact_string()
        partitions = set()
        for _ in range(r.uvarint() - 1):
            name = r.compact_string()
            for _ in range(r.uvarint() - 1):
                index, size, lag, future = r.fixed(">i"), r.fixed(">q"), r.fixed(">q"), r.fixed(">?")
                r.no_tags()
                partitions.add((f"{name}-{index}", size, lag, future))
            r.no_tags()
        total, usable = r.fixed(">q"), r.fixed(">q")
        r.no_tags()
        results.append((log_dir, partitions, total, usable))
    r.no_tags()
    assert r.at == len(resp), (r.at, len(resp))
    return results


# ---------------------------------------------------------------- DeleteRecords errors, DescribeCluster

NOT_LEADER_OR_FOLLOWER = 6
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3


def delete_records_v0(topics, timeout_ms=15000, correlation_id=3):
    """DeleteRecords v0: `topics` is [(name, [(partition, offset)])]."""
    body = struct.pack(">i", len(topics))
    for name, parts in topics:
        body += _str(name) + struct.pack(">i", len(parts))
        body += b"".join(struct.pack(">iq", p, o) for p, o in parts)
    body += struct.pack(">i", timeout_ms)
    return frame(request_header_v1(21, 0, correlation_id) + body)


def parse_delete_records_v0(resp):
    """-> {(topic, partition): (low watermark, error code)}"""
    _corr, _throttle, n = struct.unpack(">iii", resp[:12])
    off, out = 12, {}
    for _ in range(n):
        (ln,) = struct.unpack(">h", resp[off:off + 2])
        name = resp[off + 2:off + 2 + ln].decode()
        off += 2 + ln
        (m,) = struct.unpack(">i", resp[off:off + 4])
        off += 4
        for _ in range(m):
            p, lw, code = struct.unpack(">iqh", resp[off:off + 14])
            off += 14
            out[(name, p)] = (lw, code)
    assert off == len(resp), (off, len(resp))
    return out


def test_delete_records_errors(cluster):
    """Raw DeleteRecords, as Kafka answers them: a replica that does not lead is
    NOT_LEADER_OR_FOLLOWER, an offset above the high watermark (or negative, other than
    -1) OFFSET_OUT_OF_RANGE, an unknown partition or topic UNKNOWN_TOPIC_OR_PARTITION,
    and none of them moves the log start; one request may mix them with a good one,
    whose low watermark is answered. Through confluent-kafka's admin (routed to the
    leader) an offset above the high watermark is the same error."""
    b1, b2, b3 = cluster
    topic = "raw-delete"
    assert create_error(b1.bootstrap, topic, [[1, 2], [2, 3]]) == (0, "")
    wait_view(b1.bootstrap, topic, [[1, 2], [2, 3]])
    produce_to_each(b1.bootstrap, topic, [0, 1], "e")
    n = RECORDS_PER_PARTITION
    answer = parse_delete_records_v0(call(b1.port, delete_records_v0([
        (topic, [(0, 3), (1, 3), (9, 1)]), ("raw-no-such-topic", [(0, 1)])])))
    assert answer == {
        (topic, 0): (3, 0),
        (topic, 1): (-1, NOT_LEADER_OR_FOLLOWER),  # broker 1 follows it
        (topic, 9): (-1, UNKNOWN_TOPIC_OR_PARTITION),
        ("raw-no-such-topic", 0): (-1, UNKNOWN_TOPIC_OR_PARTITION),
    }, answer
    answer = parse_delete_records_v0(call(b2.port, delete_records_v0([(topic, [(1, n + 1)])])))
    assert answer == {(topic, 1): (-1, OFFSET_OUT_OF_RANGE)}, answer
    answer = parse_delete_records_v0(call(b2.port, delete_records_v0([(topic, [(1, -5)])])))
    assert answer == {(topic, 1): (-1, OFFSET_OUT_OF_RANGE)}, answer
    # A lower offset than the log start moves nothing and answers the log start.
    answer = parse_delete_records_v0(call(b1.port, delete_records_v0([(topic, [(0, 1)])])))
    assert answer == {(topic, 0): (3, 0)}, answer
    assert watermarks(b3.bootstrap, topic, 0) == (3, n)
    assert watermarks(b3.bootstrap, topic, 1) == (0, n)

    a = admin(b3.bootstrap)
    fs = a.delete_records([TopicPartition(topic, 1, n + 5)], request_timeout=15)
    with pytest.raises(KafkaException) as e:
        fs[TopicPartition(topic, 1)].result(20)
    assert e.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE, e.value
    fs = a.delete_records([TopicPartition(topic, 1, -1)], request_timeout=15)
    assert fs[TopicPartition(topic, 1)].result(20).low_watermark == n
    assert watermarks(b1.bootstrap, topic, 1) == (n, n)


REQUEST_TIMED_OUT = 7


def test_delete_records_waits_for_the_live_followers(broker_factory):
    """DeleteRecords answers once every live replica dropped the records (Kafka's
    DelayedDeleteRecords, low watermark = the smallest log start over the leader and the
    followers on live brokers): with the follower frozen (SIGSTOP, still registered),
    the leader's log start moves but the answer is REQUEST_TIMED_OUT after the request's
    timeout; once it runs again, the same request answers the low watermark, and by then
    the follower has checkpointed it. A follower whose broker died (kill -9, fenced
    after the session timeout) does not hold the answer back."""
    from helpers.broker import threads_stopped
    session_ms = 6000
    b1, b2, _b3 = start_embedded_cluster(broker_factory, session_ms=session_ms)
    topic = "dr-wait"
    assert create_error(b1.bootstrap, topic, [[1, 2]]) == (0, "")
    wait_view(b1.bootstrap, topic, [[1, 2]])
    produce_to_each(b1.bootstrap, topic, [0], "w")
    n = RECORDS_PER_PARTITION

    os.kill(b2.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: threads_stopped(b2.pid), bool, 10, "broker 2 stopped")
        started = time.monotonic()
        answer = parse_delete_records_v0(call(b1.port, delete_records_v0([(topic, [(0, 3)])], timeout_ms=1500)))
        waited = time.monotonic() - started
        assert answer == {(topic, 0): (-1, REQUEST_TIMED_OUT)}, answer
        assert waited >= 1.4, f"answered after {waited:.2f}s, before the request's timeout"
        # The leader deleted all the same.
        assert checkpointed_log_start(b1, topic, 0) == 3
        assert checkpointed_log_start(b2, topic, 0) in (None, 0)
    finally:
        os.kill(b2.pid, signal.SIGCONT)
    answer = parse_delete_records_v0(call(b1.port, delete_records_v0([(topic, [(0, 3)])], timeout_ms=15000)))
    assert answer == {(topic, 0): (3, 0)}, answer
    # Answered only once the follower's log start (as its fetch said) reached it: the
    # follower says it after its checkpoint is durable.
    assert checkpointed_log_start(b2, topic, 0) == 3

    b2.kill()
    started = time.monotonic()
    answer = parse_delete_records_v0(call(b1.port, delete_records_v0([(topic, [(0, 7)])], timeout_ms=30000),
                                          timeout=40))
    waited = time.monotonic() - started
    assert answer == {(topic, 0): (7, 0)}, (answer, waited)
    assert waited < 25, f"the dead follower held the answer for {waited:.1f}s"
    assert watermarks(b1.bootstrap, topic, 0) == (7, n)


class Reader:
    """Reads a flexible-version answer: fixed ints, unsigned varints, compact strings."""

    def __init__(self, data):
        self.data, self.at = data, 0

    def fixed(self, fmt):
        (v,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return v

    def uvarint(self):
        shift = value = 0
        while True:
            b = self.data[self.at]
            self.at += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    def compact_string(self):
        n = self.uvarint()
        if n == 0:
            return None
        text = self.data[self.at:self.at + n - 1].decode()
        self.at += n - 1
        return text

    def no_tags(self):
        assert self.uvarint() == 0, "tagged fields in the answer"


def describe_cluster(port, version, include_operations=False, endpoint_type=1):
    """A raw DescribeCluster (v0: no endpoint type; v1: with one) -> its fields."""
    body = struct.pack(">?", include_operations) + (struct.pack(">b", endpoint_type) if version >= 1 else b"")
    resp = call(port, frame(request_header_v1(60, version, 9) + b"\x00" + body + b"\x00"))
    r = Reader(resp)
    assert r.fixed(">i") == 9
    r.no_tags()  # response header v1
    out = {"throttle_ms": r.fixed(">i"), "error_code": r.fixed(">h"), "error_message": r.compact_string()}
    if version >= 1:
        out["endpoint_type"] = r.fixed(">b")
    out["cluster_id"] = r.compact_string()
    out["controller_id"] = r.fixed(">i")
    brokers = {}
    for _ in range(r.uvarint() - 1):
        broker_id, host, port_, rack = r.fixed(">i"), r.compact_string(), r.fixed(">i"), r.compact_string()
        r.no_tags()
        brokers[broker_id] = (host, port_, rack)
    out["brokers"] = brokers
    out["cluster_authorized_operations"] = r.fixed(">i")
    r.no_tags()
    assert r.at == len(resp), (r.at, len(resp))
    return out


# AclOperation bits of every cluster operation (no authorizer): CREATE 5, ALTER 7,
# DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12.
CLUSTER_OPERATIONS = {"CREATE": 5, "ALTER": 7, "DESCRIBE": 8, "CLUSTER_ACTION": 9, "DESCRIBE_CONFIGS": 10,
                      "ALTER_CONFIGS": 11, "IDEMPOTENT_WRITE": 12}


def test_describe_cluster(broker_factory):
    """DescribeCluster (raw, v0 and v1, to each broker): the cluster id and the
    controller that Metadata names, every live broker with its host, port and rack;
    authorized operations only when asked for (-2147483648 otherwise, as Kafka), every
    cluster operation then (no authorizer); a v1 request for controller endpoints is
    MISMATCHED_ENDPOINT_TYPE. confluent-kafka's describe_cluster() (which librdkafka
    answers from Metadata) agrees."""
    brokers = [broker_factory(*cluster_args(1), "--rack", "rack-a", name="b1", cores=1)]
    for i, rack in ((2, "rack-b"), (3, "rack-a")):
        brokers.append(broker_factory(*cluster_args(i), "--rack", rack, "--coordinator", brokers[0].bootstrap,
                                      name=f"b{i}", cores=1))
    wait_brokers(brokers[0].bootstrap, {b.port for b in brokers})
    want_brokers = {1: ("127.0.0.1", brokers[0].port, "rack-a"), 2: ("127.0.0.1", brokers[1].port, "rack-b"),
                    3: ("127.0.0.1", brokers[2].port, "rack-a")}
    for b in brokers:
        a = admin(b.bootstrap)  # kept until the answer is in: a destroyed client fails its futures
        md = a.list_topics(timeout=10)
        assert md.cluster_id and md.controller_id == 1, (md.cluster_id, md.controller_id)  # broker 1 coordinates
        for version in (0, 1):
            got = describe_cluster(b.port, version)
            want = {"throttle_ms": 0, "error_code": 0, "error_message": None, "cluster_id": md.cluster_id,
                    "controller_id": 1, "brokers": want_brokers, "cluster_authorized_operations": -2147483648}
            if version >= 1:
                want["endpoint_type"] = 1
            assert got == want, (b.name, version)
        d = a.describe_cluster(request_timeout=15).result(20)
        assert (d.cluster_id, d.controller.id) == (md.cluster_id, 1), d
        assert {n.id: (n.host, n.port, n.rack) for n in d.nodes} == want_brokers, d.nodes
        assert d.authorized_operations is None, d.authorized_operations
    got = describe_cluster(brokers[1].port, 1, include_operations=True)
    assert got["error_code"] == 0 and got["cluster_authorized_operations"] == sum(
        1 << bit for bit in CLUSTER_OPERATIONS.values()), got
    got = describe_cluster(brokers[2].port, 1, endpoint_type=2)
    assert (got["error_code"], got["brokers"]) == (114, {}), got  # MISMATCHED_ENDPOINT_TYPE
    a = admin(brokers[1].bootstrap)
    d = a.describe_cluster(include_authorized_operations=True, request_timeout=15).result(20)
    assert {op.name for op in d.authorized_operations} == set(CLUSTER_OPERATIONS), d.authorized_operations


# ---------------------------------------------------------------- kafka-reassign-partitions

def reassign_tool(classpath, bootstrap, *args):
    return run_tool(classpath, "reassign.ReassignPartitionsCommand", "--bootstrap-server", bootstrap, *args)


def reassignment_file(tmp_path, name, topic, moves):
    """A --reassignment-json-file moving each partition of `moves` to its replicas."""
    f = tmp_path / name
    f.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": p, "replicas": r} for p, r in moves.items()]}))
    return f


class AcksAllLoad:
    """A confluent-kafka producer at its defaults (acks=all) writing numbered records
    to one partition from a thread until stopped; it keeps what was acknowledged and
    every delivery error."""

    def __init__(self, bootstrap, topic, partition):
        import threading
        from confluent_kafka import Producer
        self.producer = Producer(cf_conf(bootstrap))
        self.topic, self.partition = topic, partition
        self.acked, self.errors, self.sent = [], [], 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def delivered(self, err, msg):
        if err is not None:
            self.errors.append(err)
        else:
            self.acked.append(msg.value())

    def run(self):
        while not self.stopping.is_set():
            self.producer.produce(self.topic, f"mv-{self.sent}".encode(), partition=self.partition,
                                  on_delivery=self.delivered)
            self.sent += 1
            self.producer.poll(0.005)

    def stop(self):
        self.stopping.set()
        self.thread.join(10)
        left = self.producer.flush(60)
        assert left == 0, f"{left} records not delivered within 60 s"


def test_kafka_reassign_partitions_moves_a_partition_under_acks_all_load(broker_factory, cluster, tools_classpath,
                                                                          tmp_path):
    """kafka-reassign-partitions moves a partition from brokers 1,2,3 to 2,3,4 (a fourth
    broker joins the cluster) while a producer at its defaults (acks=all) writes to it:
    --execute starts it, --verify reports it completed, kafka-topics shows the new
    replicas all in sync with broker 2 leading (broker 1, the old leader, left), broker 1
    deleted its copy, brokers 2, 3 and 4 hold the same bytes, every acknowledged record
    is read back in order and no write failed. Then a move to a broker that cannot catch
    up (stopped with SIGSTOP) stays in progress: --list and --verify show it with what is
    added and removed, --cancel takes it back, and the partition is as before."""
    b1, b2, b3 = cluster
    b4 = broker_factory(*cluster_args(4), "--coordinator", b1.bootstrap, name="b4", cores=1)
    wait_brokers(b1.bootstrap, {b.port for b in (b1, b2, b3, b4)})
    brokers = {1: b1, 2: b2, 3: b3, 4: b4}
    topic = "tools-moved"
    assert create_error(b2.bootstrap, topic, [[1, 2, 3], [1, 2, 3]]) == (0, "")
    wait_view(b2.bootstrap, topic, [[1, 2, 3], [1, 2, 3]])
    rc, out = reassign_tool(tools_classpath, b2.bootstrap, "--list")
    assert rc == 0 and "No partition reassignments found." in out, out

    load = AcksAllLoad(b1.bootstrap, topic, 0)
    wait_for(lambda: len(load.acked), lambda n: n >= 200, 30, "acknowledged writes before the move")
    move = reassignment_file(tmp_path, "move.json", topic, {0: [2, 3, 4]})
    rc, out = reassign_tool(tools_classpath, b3.bootstrap, "--execute", "--reassignment-json-file", move)
    assert rc == 0 and f"Successfully started partition reassignment for {topic}-0" in out, out
    assert '"replicas":[1,2,3]' in out, out  # the current assignment, printed for a rollback
    rc, out = wait_for(lambda: reassign_tool(tools_classpath, b2.bootstrap, "--verify", "--reassignment-json-file", move),
                       lambda r: f"Reassignment of partition {topic}-0 is completed." in r[1], 60,
                       "kafka-reassign-partitions --verify to report the move completed")
    assert rc == 0, out
    acked_at_move = len(load.acked)
    wait_for(lambda: len(load.acked), lambda n: n >= acked_at_move + 200, 30, "acknowledged writes after the move")
    load.stop()
    assert load.errors == [], load.errors[:5]

    view = wait_for(lambda: cluster_view(b1.bootstrap, topic), lambda v: v[0] == (2, [2, 3, 4], [2, 3, 4]), 20,
                    f"{topic}-0 on [2, 3, 4], led by 2, all in sync")
    assert view[1] == (1, [1, 2, 3], [1, 2, 3]), view  # the other partition did not move
    rc, out = topics_tool(tools_classpath, b4.bootstrap, "--describe", "--topic", topic)
    assert rc == 0 and parse_describe(out)[1][(topic, 0)] == (2, [2, 3, 4], [2, 3, 4]), out
    wait_for(lambda: partition_dirs(b1, topic), lambda d: d == {1}, 20, f"broker 1 deleting its copy of {topic}-0")
    assert partition_dirs(b2, topic) == partition_dirs(b3, topic) == {0, 1}
    assert partition_dirs(b4, topic) == {0}
    got = cf_read_partition(b4.bootstrap, topic, 0)
    acked = load.acked
    assert set(acked) <= set(got), f"{len(set(acked) - set(got))} acknowledged records lost"
    assert set(got) <= {f"mv-{i}".encode() for i in range(load.sent)}
    firsts = list(dict.fromkeys(got))  # retries may write a record twice (no idempotence)
    assert [v for v in firsts if v in set(acked)] == list(dict.fromkeys(acked)), "acknowledged records out of order"
    data = {i: wait_for(lambda b=brokers[i]: segment_bytes(b, topic, 0),
                        lambda d: all(v in d for v in acked), 20, f"{topic}-0 on broker {i}") for i in (2, 3, 4)}
    wait_for(lambda: {i: segment_bytes(brokers[i], topic, 0) for i in (2, 3, 4)},
             lambda d: d[2] == d[3] == d[4], 20, f"the replicas of {topic}-0 holding the same bytes")

    # A move that cannot finish: broker 4 is stopped, so it never catches up.
    os.kill(b4.pid, signal.SIGSTOP)
    try:
        stuck = reassignment_file(tmp_path, "stuck.json", topic, {1: [1, 2, 4]})
        rc, out = reassign_tool(tools_classpath, b2.bootstrap, "--execute", "--reassignment-json-file", stuck)
        assert rc == 0 and f"Successfully started partition reassignment for {topic}-1" in out, out
        rc, out = reassign_tool(tools_classpath, b3.bootstrap, "--list")
        assert rc == 0 and f"{topic}-1: replicas: 1,2,4,3. adding: 4. removing: 3." in out, out
        rc, out = reassign_tool(tools_classpath, b3.bootstrap, "--verify", "--reassignment-json-file", stuck)
        assert f"Reassignment of partition {topic}-1 is still in progress." in out, out
        assert cluster_view(b1.bootstrap, topic)[1] == (1, [1, 2, 4, 3], [1, 2, 3]), "4 added, not in sync"
        # --preserve-throttles: clearing them would wait for the stopped broker.
        rc, out = reassign_tool(tools_classpath, b1.bootstrap, "--cancel", "--reassignment-json-file", stuck,
                                "--preserve-throttles")
        assert rc == 0 and f"Successfully cancelled partition reassignment for: {topic}-1" in out, out
        rc, out = reassign_tool(tools_classpath, b3.bootstrap, "--list")
        assert rc == 0 and "No partition reassignments found." in out, out
        wait_for(lambda: cluster_view(b2.bootstrap, topic)[1], lambda v: v == (1, [1, 2, 3], [1, 2, 3]), 20,
                 f"{topic}-1 back on [1, 2, 3]")
    finally:
        os.kill(b4.pid, signal.SIGCONT)


def describe(a, kind, name):
    """{config name: value} of one resource, with confluent-kafka's describe_configs."""
    resource = ConfigResource(kind, name)
    return {k: e.value for k, e in a.describe_configs([resource], request_timeout=15)[resource].result(20).items()}


def test_kafka_reassign_partitions_throttle_paces_the_copy(cluster, tools_classpath, tmp_path):
    """--execute --throttle sets Kafka's replication throttles (the broker rates and the
    topic's throttled-replica lists) and the copy to the new replica keeps to them: 4 MB
    at 200 kB/s cannot be copied in 3 s (the meter lets a first 2 MB through, as
    Kafka's ten-second rate does), where an unthrottled copy takes well under a second.
    The move then completes with every record on the new replica, and --verify removes
    the throttles (DescribeConfigs shows them gone)."""
    b1, b2, b3 = cluster
    topic = "tools-throttled"
    rate = 200_000
    assert create_error(b1.bootstrap, topic, [[1, 2]]) == (0, "")
    wait_view(b1.bootstrap, topic, [[1, 2]])
    values = [f"th-{i:05d}-".encode() + b"x" * 1000 for i in range(4000)]
    cf_produce(b1.bootstrap, topic, [{"value": v, "partition": 0} for v in values], acks="all")
    total = len(segment_bytes(b1, topic, 0))
    assert total >= 4_000_000, total
    move = reassignment_file(tmp_path, "throttled.json", topic, {0: [1, 3]})
    started = time.monotonic()
    rc, out = reassign_tool(tools_classpath, b2.bootstrap, "--execute", "--reassignment-json-file", move,
                            "--throttle", rate)
    assert rc == 0 and f"The inter-broker throttle limit was set to {rate} B/s" in out, out
    a = admin(b1.bootstrap)  # kept until the answers are in
    configs = describe(a, ConfigResource.Type.TOPIC, topic)
    assert "0:1" in configs["leader.replication.throttled.replicas"], configs
    assert configs["follower.replication.throttled.replicas"] == "0:3", configs
    for b in ("1", "3"):
        assert describe(a, ConfigResource.Type.BROKER, b)["leader.replication.throttled.rate"] == str(rate)
    time.sleep(max(0.0, started + 3 - time.monotonic()))
    copied = len(segment_bytes(b3, topic, 0)) if 0 in partition_dirs(b3, topic) else 0
    rc, out = reassign_tool(tools_classpath, b2.bootstrap, "--list")
    assert f"{topic}-0: replicas: 1,3,2. adding: 3. removing: 2." in out, (
        f"the move finished within 3 s: the throttle did not pace it ({copied} of {total} bytes copied)")
    assert copied < total, (copied, total)
    rc, out = wait_for(lambda: reassign_tool(tools_classpath, b2.bootstrap, "--verify", "--reassignment-json-file",
                                             move),
                       lambda r: f"Reassignment of partition {topic}-0 is completed." in r[1], 60,
                       "the throttled move to complete")
    assert rc == 0 and "Clearing broker-level throttles on brokers 1,2,3" in out, out
    assert f"Clearing topic-level throttles on topic {topic}" in out, out
    assert cf_read_partition(b3.bootstrap, topic, 0) == values
    configs = describe(a, ConfigResource.Type.TOPIC, topic)
    assert configs["leader.replication.throttled.replicas"] == "", configs
    assert configs["follower.replication.throttled.replicas"] == "", configs
    for b in ("1", "2", "3"):
        assert describe(a, ConfigResource.Type.BROKER, b)["leader.replication.throttled.rate"] == str(2**63 - 1)


def test_kafka_reassign_partitions_log_dirs_and_fixed_replication_factor(cluster, tools_classpath, tmp_path):
    """kafka-reassign-partitions with "log_dirs" in its JSON (AlterReplicaLogDirs) and
    with --disallow-replication-factor-change (AlterPartitionReassignments v1, KIP-860).
    Each broker has one log dir: a move naming each target broker's data dir starts its
    log dir moves (the new replica's once it exists) and --verify reports every replica
    in its dir, as DescribeLogDirs shows it; a dir a broker does not have fails the
    tool with LogDirNotFoundException. A move that would change the replication factor
    is refused under the flag and leaves the partition as it was; one that keeps it
    goes through."""
    b1, b2, b3 = cluster
    topic = "tools-dirs"
    assert create_error(b1.bootstrap, topic, [[1, 2]]) == (0, "")
    wait_view(b1.bootstrap, topic, [[1, 2]])
    values = [f"ld-{i}".encode() for i in range(50)]
    cf_produce(b1.bootstrap, topic, [{"value": v, "partition": 0} for v in values], acks="all")
    dirs = {n + 1: os.path.abspath(b.data_dir) for n, b in enumerate(cluster)}

    move = tmp_path / "dirs.json"
    move.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": [2, 3], "log_dirs": [dirs[2], dirs[3]]}]}))
    rc, out = reassign_tool(tools_classpath, b2.bootstrap, "--execute", "--reassignment-json-file", move)
    assert rc == 0 and f"Successfully started partition reassignment for {topic}-0" in out, out
    for b in (2, 3):
        assert f"Successfully started moving log directory to {dirs[b]} for replica {topic}-0 with broker {b}" in out, out
    # The rollback file it printed names each current replica's dir as DescribeLogDirs has it.
    assert f'"log_dirs":["{dirs[1]}","{dirs[2]}"]' in out, out
    rc, out = wait_for(lambda: reassign_tool(tools_classpath, b3.bootstrap, "--verify", "--reassignment-json-file",
                                             move),
                       lambda r: f"Reassignment of partition {topic}-0 is completed." in r[1], 60,
                       "the move with log dirs to complete")
    assert rc == 0, out
    for b in (2, 3):
        assert f"Reassignment of replica {topic}-0-{b} completed successfully." in out, out
    wait_view(b2.bootstrap, topic, [[2, 3]])
    assert cf_read_partition(b3.bootstrap, topic, 0) == values

    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": topic, "partition": 0, "replicas": [2, 3], "log_dirs": [str(tmp_path / "no-such-dir"), "any"]}]}))
    rc, out = reassign_tool(tools_classpath, b2.bootstrap, "--execute", "--reassignment-json-file", elsewhere)
    assert rc != 0 and f"Failed to alter dir for {topic}-0-2" in out, out
    assert "Caused by: org.apache.kafka.common.errors.LogDirNotFoundException" in out, out

    shrink = reassignment_file(tmp_path, "shrink.json", topic, {0: [3]})
    rc, out = reassign_tool(tools_classpath, b3.bootstrap, "--execute", "--reassignment-json-file", shrink,
                            "--disallow-replication-factor-change")
    assert rc != 0 and f"{topic}-0: The replication factor is changed from 2 to 1" in out, out
    rc, out = reassign_tool(tools_classpath, b1.bootstrap, "--list")
    assert rc == 0 and "No partition reassignments found." in out, out
    assert cluster_view(b1.bootstrap, topic)[0][1] == [2, 3]
    swap = reassignment_file(tmp_path, "swap.json", topic, {0: [3, 1]})
    rc, out = reassign_tool(tools_classpath, b3.bootstrap, "--execute", "--reassignment-json-file", swap,
                            "--disallow-replication-factor-change")
    assert rc == 0 and f"Successfully started partition reassignment for {topic}-0" in out, out
    wait_for(lambda: cluster_view(b1.bootstrap, topic)[0], lambda v: v[1] == [3, 1] and sorted(v[2]) == [1, 3], 60,
             f"{topic}-0 moved to [3, 1]")
    assert cf_read_partition(b1.bootstrap, topic, 0) == values


def test_kafka_configs_dynamic_min_insync_replicas(cluster, tools_classpath):
    """kafka-configs --entity-type brokers --entity-default sets min.insync.replicas for
    every topic without its own: an acks=all Produce (raw v3: clients retry the code) to
    a two-replica topic is then refused with NOT_ENOUGH_REPLICAS, a topic that sets its
    own min.insync.replicas=1 is not affected, and deleting the broker config lets the
    write through again. DescribeConfigs shows the dynamic default as the topic's source."""
    from helpers.wire import call, parse_produce_v3, produce_v3, record_batch
    b1, b2, b3 = cluster
    assert create_error(b1.bootstrap, "mir-default", [[1, 2]]) == (0, "")
    a = admin(b1.bootstrap)  # kept until the answers are in
    own = NewTopic("mir-own", 1, replica_assignment=[[1, 2]], config={"min.insync.replicas": "1"})
    a.create_topics([own], request_timeout=15)["mir-own"].result(20)
    for topic in ("mir-default", "mir-own"):
        wait_view(b1.bootstrap, topic, [[1, 2]])

    def produce(topic):
        return parse_produce_v3(call(b1.port, produce_v3(topic, 0, record_batch([b"v"]), acks=-1,
                                                          timeout_ms=10_000)))[0]

    assert (produce("mir-default"), produce("mir-own")) == (0, 0)
    rc, out = configs_tool(tools_classpath, b2.bootstrap, "--entity-type", "brokers", "--entity-default",
                           "--alter", "--add-config", "min.insync.replicas=3")
    assert rc == 0, out
    wait_for(lambda: describe(a, ConfigResource.Type.TOPIC, "mir-default")["min.insync.replicas"],
             lambda v: v == "3", 20, "the dynamic default in the topic's configs")
    NOT_ENOUGH_REPLICAS = 19
    wait_for(lambda: produce("mir-default"), lambda code: code == NOT_ENOUGH_REPLICAS, 20,
             "acks=all refused below the dynamic min.insync.replicas")
    assert produce("mir-own") == 0, "a topic's own min.insync.replicas wins over the broker default"
    rc, out = configs_tool(tools_classpath, b2.bootstrap, "--entity-type", "brokers", "--entity-default",
                           "--alter", "--delete-config", "min.insync.replicas")
    assert rc == 0, out
    wait_for(lambda: produce("mir-default"), lambda code: code == 0, 20, "acks=all accepted again")
