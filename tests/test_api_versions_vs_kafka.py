"""ApiVersions side by side with Apache Kafka 4.4 (issue 47): the real Kafka broker
(kafka_2.13 4.4.0, pinned by bench/kafka-broker/pom.xml, resolved by
scripts/install-deps) runs as a one-node KRaft cluster beside a Spate broker, both are
asked ApiVersions v0 (which lists every API whatever the client), and every API and
version Kafka advertises must be advertised by Spate too, or be in `GAPS` with the range
Spate advertises and the reason. A gap that closes (Spate covers Kafka's range, or its
range changes) fails the test until `GAPS` says so, so the table stays the measured gap;
so does an API Spate advertises that Kafka does not, unless `SPATE_ONLY` says why.

Kafka takes some 10 s of CPU to start here, once for the module."""

import hashlib
import shutil
import subprocess
import time
import uuid
import base64
import struct

import pytest
from confluent_kafka.admin import AdminClient

from helpers.broker import REPO_ROOT, free_port
from helpers.maven import maven_classpath
from helpers.wire import api_versions_request, call, frame, parse_api_versions_v0

KAFKA_DIR = REPO_ROOT / "bench" / "kafka-broker"
START_TIMEOUT_S = 120
# ApiVersions' key of CreateTopics: a forwardable API, which a KRaft broker advertises
# only once it knows its controller's versions (before that its answer is partial).
CREATE_TOPICS = 19

# key: (name, Kafka 4.4's range, Spate's range or None, why Spate does not cover Kafka's).
GAPS = {
    0: ("Produce", (0, 13), (3, 13), "v0-2 (magic 0/1 message sets) left out by design"),
    38: ("CreateDelegationToken", (1, 3), None, "delegation tokens not implemented"),
    39: ("RenewDelegationToken", (1, 2), None, "delegation tokens not implemented"),
    40: ("ExpireDelegationToken", (1, 2), None, "delegation tokens not implemented"),
    41: ("DescribeDelegationToken", (1, 3), None, "delegation tokens not implemented"),
    55: ("DescribeQuorum", (0, 2), None, "no KRaft quorum: the coordinator is embedded or ZooKeeper"),
    64: ("UnregisterBroker", (0, 0), None, "not yet (a broker's registration lapses with its session)"),
    74: ("ListConfigResources", (0, 1), None, "client metrics resources (KIP-714) not implemented"),
    76: ("ShareGroupHeartbeat", (1, 1), None, "share groups: issue 48"),
    77: ("ShareGroupDescribe", (1, 1), None, "share groups: issue 48"),
    78: ("ShareFetch", (1, 2), None, "share groups: issue 48"),
    79: ("ShareAcknowledge", (1, 2), None, "share groups: issue 48"),
    80: ("AddRaftVoter", (0, 1), None, "no KRaft quorum"),
    81: ("RemoveRaftVoter", (0, 0), None, "no KRaft quorum"),
    83: ("InitializeShareGroupState", (0, 0), None, "share groups: issue 48"),
    84: ("ReadShareGroupState", (0, 0), None, "share groups: issue 48"),
    85: ("WriteShareGroupState", (0, 1), None, "share groups: issue 48"),
    86: ("DeleteShareGroupState", (0, 0), None, "share groups: issue 48"),
    87: ("ReadShareGroupStateSummary", (0, 1), None, "share groups: issue 48"),
    88: ("StreamsGroupHeartbeat", (0, 1), None, "streams groups (KIP-1071) not implemented"),
    89: ("StreamsGroupDescribe", (0, 1), None, "streams groups (KIP-1071) not implemented"),
    90: ("DescribeShareGroupOffsets", (0, 1), None, "share groups: issue 48"),
    91: ("AlterShareGroupOffsets", (0, 0), None, "share groups: issue 48"),
    92: ("DeleteShareGroupOffsets", (0, 0), None, "share groups: issue 48"),
    93: ("StreamsGroupTopologyDescriptionUpdate", (0, 0), None, "streams groups (KIP-1071) not implemented"),
    94: ("UnregisterController", (0, 0), None, "no KRaft controllers"),
}

# APIs Spate's listener answers that Kafka's broker listener does not: Spate's brokers
# talk to the active coordinator on the client listener (Kafka's controllers have their own).
SPATE_ONLY = {
    56: "AlterPartition: leaders' ISR changes, to the active coordinator",
    62: "BrokerRegistration: to the active coordinator",
    63: "BrokerHeartbeat: to the active coordinator",
}


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    """A one-node Apache Kafka 4.4 (KRaft, broker and controller) on a free port: its
    ApiVersions answer once it is complete."""
    if shutil.which("java") is None:
        pytest.skip("Java is needed: run scripts/install-deps")
    classpath = maven_classpath(KAFKA_DIR, hashlib.sha256((KAFKA_DIR / "pom.xml").read_bytes()).hexdigest())
    d = tmp_path_factory.mktemp("kafka44")
    port, controller_port = free_port(), free_port()
    props = d / "server.properties"
    props.write_text(
        "process.roles=broker,controller\nnode.id=1\n"
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}\n"
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}\n"
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n"
        "controller.listener.names=CONTROLLER\n"
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
        f"log.dirs={d / 'data'}\n"
        "offsets.topic.replication.factor=1\ntransaction.state.log.replication.factor=1\n"
        "transaction.state.log.min.isr=1\n")
    jvm = ["java", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-cp", classpath]
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    fmt = subprocess.run([*jvm, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(props)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    assert fmt.returncode == 0, fmt.stdout.decode(errors="replace")
    log = open(d / "broker.log", "wb")
    proc = subprocess.Popen([*jvm, "kafka.Kafka", str(props)], stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        apis = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, (d / "broker.log").read_text(errors="replace")[-4000:]
            try:
                _, err, apis = parse_api_versions_v0(call(port, api_versions_request(), timeout=5))
            except OSError:
                time.sleep(0.5)
                continue
            if err == 0 and CREATE_TOPICS in apis:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"Kafka 4.4 did not answer a complete ApiVersions within {START_TIMEOUT_S}s: {apis}")
        yield port, apis
    finally:
        proc.kill()
        proc.wait()
        log.close()


def test_spate_advertises_what_kafka_4_4_does_or_says_why_not(kafka_broker, broker):
    _, err, spate = parse_api_versions_v0(call(broker.port, api_versions_request()))
    assert err == 0
    _, kafka = kafka_broker
    problems = []
    for key, (lo, hi) in sorted(kafka.items()):
        ours = spate.get(key)
        covered = ours is not None and ours[0] <= lo and ours[1] >= hi
        gap = GAPS.get(key)
        if covered and gap:
            problems.append(f"{key} {gap[0]}: the gap closed (Kafka {lo}-{hi}, Spate {ours}): remove it from GAPS")
        elif not covered and not gap:
            problems.append(f"{key}: Kafka advertises {lo}-{hi}, Spate {ours}, and GAPS does not say why")
        elif gap and (gap[1] != (lo, hi) or gap[2] != ours):
            problems.append(f"{key} {gap[0]}: GAPS says Kafka {gap[1]} / Spate {gap[2]}, measured Kafka "
                            f"{(lo, hi)} / Spate {ours}")
    for key in sorted(set(GAPS) - set(kafka)):
        problems.append(f"{key} {GAPS[key][0]}: in GAPS but Kafka 4.4 does not advertise it")
    for key in sorted(set(spate) - set(kafka)):
        if key not in SPATE_ONLY:
            problems.append(f"{key}: Spate advertises {spate[key]}, Kafka 4.4 does not, and SPATE_ONLY does not say why")
    for key in sorted(set(SPATE_ONLY) - (set(spate) - set(kafka))):
        problems.append(f"{key}: in SPATE_ONLY, but Spate does not advertise it or Kafka does too")
    assert not problems, "\n".join(problems)
    print(f"Kafka 4.4 advertises {len(kafka)} APIs, Spate {len(spate)}; {len(GAPS)} gaps listed")


# ---------------------------------------------------------------- behaviours, side by side

COORDINATOR_ERRORS = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, _NOT_AVAILABLE, NOT_COORDINATOR


def _compact_str(s):
    b = s.encode()
    return bytes([len(b) + 1]) + b


def _read_compact_str(b, o):
    n = b[o] - 1
    o += 1
    return (None, o) if n < 0 else (b[o:o + n].decode(), o + n)


def describe_unknown_group(port, version, group):
    """DescribeGroups (flexible, v5+) for one group: (error code, error message, state)."""
    header = struct.pack(">hhih", 15, version, 7, 3) + b"raw" + b"\x00"
    body = bytes([2]) + _compact_str(group) + b"\x00" + b"\x00"  # groups, no operations, tags
    r = call(port, frame(header + body))
    o = 4 + 1 + 4  # correlation id, header tags, throttle
    assert r[o] == 2, r  # one group
    o += 1
    (error,) = struct.unpack(">h", r[o:o + 2])
    o += 2
    message = None
    if version >= 6:
        message, o = _read_compact_str(r, o)
    _group_id, o = _read_compact_str(r, o)
    state, o = _read_compact_str(r, o)
    return error, message, state


def test_describe_groups_of_an_unknown_group_as_kafka_answers(kafka_broker, broker):
    """DescribeGroups v5 and v6 (KIP-1043) of a group that does not exist: Kafka 4.4's
    answer and Spate's, byte for byte in the fields that matter (error code, message,
    state) once each has its group coordinator up (the admin's FindCoordinator starts it)."""
    kafka_port, _ = kafka_broker
    answers = {}
    for name, port in (("kafka", kafka_port), ("spate", broker.port)):
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        for f in admin.describe_consumer_groups(["spate-warm-up"]).values():
            try:
                f.result(timeout=30)
            except Exception:
                pass  # the coordinator may still be loading: polled below
        deadline = time.monotonic() + 60
        while True:
            got = [describe_unknown_group(port, v, "no-such-group") for v in (5, 6)]
            if not any(e in COORDINATOR_ERRORS for e, _, _ in got) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        answers[name] = got
    assert answers["kafka"] == [(0, None, "Dead"), (69, "Group no-such-group not found.", "Dead")], answers
    assert answers["spate"] == answers["kafka"]
