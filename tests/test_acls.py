"""ACLs (issue 17): CreateAcls / DescribeAcls / DeleteAcls with Kafka's own kafka-acls
tool (AclCommand) and confluent-kafka's AdminClient, stored in Kafka's ZooKeeper layout
(`/kafka-acl/...`, `/kafka-acl-extended/...`, change notifications) on the embedded
store and on a real ZooKeeper, and enforced on every API with real clients.

These tests use plain-text connections, whose principal is User:ANONYMOUS: ACLs are
bootstrapped by starting the broker with `--super-users User:ANONYMOUS`, adding them, and
restarting without it (kill -9, which also shows they are durable). ACLs for SASL users
and certificate subjects: tests/test_security.py."""

import base64
import json
import re
import struct
import time

import pytest
from confluent_kafka import (Consumer, ElectionType, KafkaError, KafkaException, Producer, TopicCollection,
                             TopicPartition)
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,
                                   AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic,
                                   ResourcePatternType, ResourceType)

from helpers.clients import admin, cf_conf, create_topic
from helpers.wire import call, frame
from test_kafka_tools import run_tool, tools_classpath  # noqa: F401 (fixture)
from test_zookeeper import zk_client

AUTHORIZER = ("--authorizer-class-name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer")
BOOTSTRAP_ADMIN = ("--super-users", "User:ANONYMOUS")
ANON = "User:ANONYMOUS"


def start_bootstrapped(broker_factory, *extra):
    """A broker with the authorizer on where ANONYMOUS is a super user (to set up)."""
    return broker_factory(*AUTHORIZER, *BOOTSTRAP_ADMIN, *extra)


def drop_super_user_and_kill_restart(b):
    """kill -9, then start again without the super user: only the ACLs decide now."""
    b.extra_args = [a for a in b.extra_args if a not in BOOTSTRAP_ADMIN]
    b.kill()
    b.restart()


def acl_tool(classpath, bootstrap, *args):
    return run_tool(classpath, "AclCommand", "--bootstrap-server", bootstrap, *args)


def parse_acl_list(out):
    """kafka-acls --list output -> {(type, name, pattern): {(principal, host, op, perm)}}."""
    acls, current = {}, None
    for line in out.splitlines():
        m = re.search(r"ResourcePattern\(resourceType=(\w+), name=(.*), patternType=(\w+)\)", line)
        if m:
            current = (m.group(1), m.group(2), m.group(3))
            acls[current] = set()
            continue
        m = re.search(r"\(principal=(.*), host=(.*), operation=(\w+), permissionType=(\w+)\)", line)
        if m and current:
            acls[current].add(m.groups())
    return acls


def produce_error(bootstrap, topic, timeout=20):
    """Produce one record; the delivery error's code (None when delivered). librdkafka
    reports a refusal in the delivery report, or raises it from produce() itself when
    the topic's metadata answer (refused) came in before the call (a full local run met
    the second): either way the broker's code is what counts."""
    p = Producer(cf_conf(bootstrap, **{"message.timeout.ms": timeout * 1000}))
    result = []
    try:
        p.produce(topic, b"v", on_delivery=lambda err, msg: result.append(err))
    except KafkaException as e:
        return e.args[0].code()
    assert p.flush(timeout + 5) == 0, "no delivery report"
    err = result[0]
    return None if err is None else err.code()


def consume_in_group(bootstrap, topic, group, want, timeout=40):
    """Subscribe in `group`, read `want` records, commit them; returns (values, commit
    error codes), or raises with the first consumer error's code."""
    c = Consumer(cf_conf(bootstrap, **{"group.id": group, "auto.offset.reset": "earliest",
                                       "enable.auto.commit": False}))
    try:
        c.subscribe([topic])
        values = []
        deadline = time.monotonic() + timeout
        while len(values) < want:
            assert time.monotonic() < deadline, f"read {values} of {want} records in {timeout}s"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            values.append(m.value())
        committed = c.commit(asynchronous=False)
        return values, [tp.error for tp in committed]
    finally:
        c.close()


def group_error(bootstrap, topic, group, timeout=40):
    """The error code a consumer in `group` gets (it must get one)."""
    c = Consumer(cf_conf(bootstrap, **{"group.id": group, "auto.offset.reset": "earliest"}))
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error():
                return m.error().code()
            assert m is None, f"group {group} read a record: {m.value()}"
        pytest.fail(f"no error for group {group} within {timeout}s")
    finally:
        c.close()


def consumer_heartbeat_error(port, group, topics):
    """ConsumerGroupHeartbeat v0: a new member of `group` subscribing to `topics` by
    name; the answer's error code."""
    def compact(s):
        return bytes([len(s) + 1]) + s.encode()
    body = (compact(group) + compact("") + struct.pack(">i", 0) + b"\x00\x00" + struct.pack(">i", 30_000)
            + bytes([len(topics) + 1]) + b"".join(compact(t) for t in topics)
            + b"\x00"  # no server assignor
            + b"\x01"  # owned partitions: none (an empty array, as a joining member sends)
            + b"\x00")
    header = struct.pack(">hhih", 68, 0, 7, 4) + b"test" + b"\x00"
    resp = call(port, frame(header + body))
    # correlation id, the header's tag buffer, throttle time, error code.
    return struct.unpack_from(">h", resp, 4 + 1 + 4)[0]


def uuid_bytes(u):
    """A confluent-kafka Uuid as the protocol carries it (16 bytes)."""
    return struct.pack(">qq", u.get_most_significant_bits(), u.get_least_significant_bits())


def consumer_heartbeat_regex(port, group, regex):
    """ConsumerGroupHeartbeat v1: a new member of `group` subscribing by `regex`; the
    answer's error code and assignment ({topic id: partitions}; None if absent)."""
    def compact(s):
        return bytes([len(s) + 1]) + s.encode()
    body = (compact(group) + compact("regexmember0000000000a") + struct.pack(">i", 0)
            + b"\x00\x00"  # no instance id, no rack
            + struct.pack(">i", 30_000)
            + b"\x00"  # no topic names
            + compact(regex)
            + b"\x00"  # no server assignor
            + b"\x01"  # owned partitions: none
            + b"\x00")
    header = struct.pack(">hhih", 68, 1, 8, 4) + b"test" + b"\x00"
    resp = call(port, frame(header + body))
    at = 4 + 1 + 4  # correlation id, the header's tag buffer, throttle time
    error = struct.unpack_from(">h", resp, at)[0]
    at += 2
    for _ in range(2):  # error message, member id (compact nullable strings)
        at += max(resp[at] - 1, 0) + 1
    at += 8  # member epoch, heartbeat interval
    if resp[at] == 0xFF:
        return error, None
    at += 1
    assignment = {}
    for _ in range(resp[at] - 1):
        at += 1
        topic_id = resp[at:at + 16]
        at += 16
        count = resp[at] - 1
        assignment[topic_id] = list(struct.unpack_from(f">{count}i", resp, at + 1))
        at += 1 + 4 * count
    return error, assignment


def find_share_coordinator_error(port):
    """FindCoordinator v6 for one share coordinator key: its error code."""
    key = b"g:AAAAAAAAAAAAAAAAAAAAAA:0"
    body = b"\x02" + b"\x02" + bytes([len(key) + 1]) + key + b"\x00"
    header = struct.pack(">hhih", 10, 6, 7, 4) + b"test" + b"\x00"
    resp = call(port, frame(header + body))
    # correlation id, tags, throttle time, one coordinator: key, node id, host, port, error.
    at = 4 + 1 + 4 + 1
    at += resp[at]  # the key (compact: length + 1)
    at += 4
    at += resp[at]  # the host
    return struct.unpack_from(">h", resp, at + 4)[0]


def admin_error(future, timeout=20):
    try:
        future.result(timeout)
    except KafkaException as e:
        return e.args[0].code()
    return None


def stored_znodes(b):
    store = json.loads((b.data_dir / "spate-meta" / "znodes.json").read_text())
    return {path: base64.b64decode(n["data"]) for path, n in store["nodes"].items()}


def test_kafka_acls_tool_and_enforcement_write_one_topic_read_one_group(broker_factory, tools_classpath):
    b = start_bootstrapped(broker_factory)
    for t in ("a", "b"):
        create_topic(b.bootstrap, t, 1)
    for args in (("--allow-principal", ANON, "--operation", "Write", "--operation", "Read", "--topic", "a"),
                 ("--allow-principal", ANON, "--operation", "Read", "--group", "g")):
        code, out = acl_tool(tools_classpath, b.bootstrap, "--add", *args)
        assert code == 0, out
    code, out = acl_tool(tools_classpath, b.bootstrap, "--list")
    assert code == 0, out
    assert parse_acl_list(out) == {
        ("TOPIC", "a", "LITERAL"): {(ANON, "*", "WRITE", "ALLOW"), (ANON, "*", "READ", "ALLOW")},
        ("GROUP", "g", "LITERAL"): {(ANON, "*", "READ", "ALLOW")},
    }
    # Kafka's ZooKeeper layout, with one change notification per change.
    nodes = stored_znodes(b)
    assert json.loads(nodes["/kafka-acl/Group/g"]) == {"version": 1, "acls": [
        {"principal": ANON, "permissionType": "Allow", "operation": "Read", "host": "*"}]}
    assert [a["operation"] for a in json.loads(nodes["/kafka-acl/Topic/a"])["acls"]] == ["Read", "Write"]
    changes = sorted((p, d) for p, d in nodes.items() if p.startswith("/kafka-acl-changes/"))
    assert [p for p, _ in changes] == [f"/kafka-acl-changes/acl_changes_{i:010d}" for i in range(len(changes))]
    assert {d for _, d in changes} == {b"TOPIC:a", b"GROUP:g"}

    drop_super_user_and_kill_restart(b)

    # What is allowed works: produce to a, read it in group g and commit.
    assert produce_error(b.bootstrap, "a") is None
    values, commit_errors = consume_in_group(b.bootstrap, "a", "g", 1)
    assert values == [b"v"] and commit_errors == [None]
    # And nothing else.
    assert produce_error(b.bootstrap, "b") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert group_error(b.bootstrap, "a", "h") == KafkaError.GROUP_AUTHORIZATION_FAILED
    a = admin(b.bootstrap)
    fs = a.create_topics([NewTopic("c", 1, 1)], request_timeout=15)
    assert admin_error(fs["c"]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    fs = a.delete_topics(["a"], request_timeout=15)
    assert admin_error(fs["a"]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    res = ConfigResource(ResourceType.TOPIC, "a", incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    fs = a.incremental_alter_configs([res], request_timeout=15)
    assert admin_error(fs[res]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Nor elect leaders (ALTER on the cluster).
    fs = a.elect_leaders(ElectionType.PREFERRED, [TopicPartition("a", 0)])
    try:
        per_partition = fs.result(15)
        codes = [e.code() if e is not None else None for e in per_partition.values()]
    except KafkaException as e:
        codes = [e.args[0].code()]
    assert codes == [KafkaError.CLUSTER_AUTHORIZATION_FAILED]
    # The group's authorized operations are the principal's: READ, and DESCRIBE it implies.
    g = a.describe_consumer_groups(["g"], include_authorized_operations=True, request_timeout=15)["g"].result(15)
    assert set(g.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE}
    # Without ALTER on the cluster, ACLs cannot be changed either.
    code, out = acl_tool(tools_classpath, b.bootstrap, "--add", "--allow-principal", ANON,
                         "--operation", "All", "--topic", "b")
    assert code != 0 and "ClusterAuthorizationException" in out, out
    # Metadata for all topics lists only what ANONYMOUS may describe (Write implies it).
    md = a.list_topics(timeout=15)
    assert sorted(t for t, m in md.topics.items() if m.error is None) == ["a"]
    # The denials are in the broker log, in Kafka's authorizer log shape.
    log = b.log_path.read_text()
    # (librdkafka asks for b's metadata first, and stops at that refusal.)
    assert ("Principal = User:ANONYMOUS is Denied Operation = Describe from host = 127.0.0.1 "
            "on resource = Topic:LITERAL:b for request = Metadata with resourceRefCount = 1") in log
    # KIP-848: a regex subscription resolves to the topics the member may describe (Kafka
    # 4.4's TopicRegexResolver); b matches but is left out. (Group g, empty, becomes a
    # consumer group.)
    a_id = a.describe_topics(TopicCollection(["a"]), request_timeout=15)["a"].result(15).topic_id
    error, assignment = consumer_heartbeat_regex(b.port, "g", "a|b")
    assert error == 0 and assignment == {uuid_bytes(a_id): [0]}, (error, assignment)
    # And by name only to topics it may describe (the handler refuses the whole heartbeat).
    assert consumer_heartbeat_error(b.port, "g", ["a", "b"]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consumer_heartbeat_error(b.port, "g", ["a"]) == 0
    # A share coordinator key (FindCoordinator v6) is for brokers: CLUSTER_ACTION.
    assert find_share_coordinator_error(b.port) == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_prefixed_and_wildcard_patterns_and_deny_beats_allow(broker_factory):
    b = start_bootstrapped(broker_factory)
    for t in ("pre-x", "pre-secret", "other"):
        create_topic(b.bootstrap, t, 1)
    a = admin(b.bootstrap)
    bindings = [
        AclBinding(ResourceType.TOPIC, "pre-", ResourcePatternType.PREFIXED, ANON, "*",
                   AclOperation.WRITE, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:*", "*",
                   AclOperation.DESCRIBE, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, "pre-secret", ResourcePatternType.LITERAL, ANON, "*",
                   AclOperation.WRITE, AclPermissionType.DENY),
    ]
    for f in a.create_acls(bindings, request_timeout=15).values():
        f.result(15)
    described = a.describe_acls(AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                                 AclOperation.ANY, AclPermissionType.ANY),
                                request_timeout=15).result(15)
    assert sorted(map(str, described)) == sorted(map(str, bindings))
    # MATCH: what applies to topic pre-secret.
    matching = a.describe_acls(AclBindingFilter(ResourceType.TOPIC, "pre-secret", ResourcePatternType.MATCH,
                                                None, None, AclOperation.ANY, AclPermissionType.ANY),
                               request_timeout=15).result(15)
    assert sorted(map(str, matching)) == sorted(map(str, bindings))

    drop_super_user_and_kill_restart(b)

    assert produce_error(b.bootstrap, "pre-x") is None  # prefixed allow
    assert produce_error(b.bootstrap, "pre-secret") == KafkaError.TOPIC_AUTHORIZATION_FAILED  # deny wins
    assert produce_error(b.bootstrap, "other") == KafkaError.TOPIC_AUTHORIZATION_FAILED  # describe only
    md = admin(b.bootstrap).list_topics(timeout=15)  # the wildcard Describe shows them all
    assert sorted(t for t, m in md.topics.items() if m.error is None) == ["other", "pre-secret", "pre-x"]
    # Topics it may describe are produced to, and the Produce itself is refused.
    log = b.log_path.read_text()
    assert ("Principal = User:ANONYMOUS is Denied Operation = Write from host = 127.0.0.1 "
            "on resource = Topic:LITERAL:other for request = Produce with resourceRefCount = 1") in log


def test_acls_in_zookeeper_and_deleted(broker_factory, zookeeper):
    url = f"zookeeper://{zookeeper}/spate"
    b = start_bootstrapped(broker_factory, "--metadata", url)
    a = admin(b.bootstrap)
    literal = AclBinding(ResourceType.GROUP, "g", ResourcePatternType.LITERAL, "User:alice", "10.0.0.1",
                         AclOperation.READ, AclPermissionType.ALLOW)
    prefixed = AclBinding(ResourceType.TRANSACTIONAL_ID, "app-", ResourcePatternType.PREFIXED, "User:bob", "*",
                          AclOperation.WRITE, AclPermissionType.DENY)
    for f in a.create_acls([literal, prefixed], request_timeout=15).values():
        f.result(15)
    zk = zk_client(zookeeper)
    try:
        data, _ = zk.get("/spate/kafka-acl/Group/g")
        assert json.loads(data) == {"version": 1, "acls": [
            {"principal": "User:alice", "permissionType": "Allow", "operation": "Read", "host": "10.0.0.1"}]}
        data, _ = zk.get("/spate/kafka-acl-extended/prefixed/TransactionalId/app-")
        assert json.loads(data) == {"version": 1, "acls": [
            {"principal": "User:bob", "permissionType": "Deny", "operation": "Write", "host": "*"}]}
        assert zk.get_children("/spate/kafka-acl-changes") == ["acl_changes_0000000000"]
        assert zk.get("/spate/kafka-acl-changes/acl_changes_0000000000")[0] == b"GROUP:g"
        event = json.loads(zk.get("/spate/kafka-acl-extended-changes/acl_changes_0000000000")[0])
        assert event == {"version": 1, "resourceType": "TRANSACTIONAL_ID", "name": "app-",
                         "patternType": "PREFIXED"}

        deleted = a.delete_acls([AclBindingFilter(ResourceType.GROUP, None, ResourcePatternType.ANY, None, None,
                                                  AclOperation.ANY, AclPermissionType.ANY)],
                                request_timeout=15)
        assert [str(x) for x in list(deleted.values())[0].result(15)] == [str(literal)]
        assert not zk.exists("/spate/kafka-acl/Group/g")
        assert sorted(zk.get_children("/spate/kafka-acl-changes")) == [
            "acl_changes_0000000000", "acl_changes_0000000001"]
        # A restart on the same ZooKeeper (its data dir gone) finds what is left.
        b.kill()
        b.restart()
        a = admin(b.bootstrap)  # held: a collected client cancels its requests
        left = a.describe_acls(
            AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                             AclOperation.ANY, AclPermissionType.ANY), request_timeout=15).result(15)
        assert [str(x) for x in left] == [str(prefixed)]
    finally:
        zk.stop()


def test_without_an_authorizer_acl_requests_answer_security_disabled(broker):
    a = admin(broker.bootstrap)
    binding = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, ANON, "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    fs = a.create_acls([binding], request_timeout=15)
    assert admin_error(list(fs.values())[0]) == KafkaError.SECURITY_DISABLED
    # And everything else works as before.
    create_topic(broker.bootstrap, "t", 1)
    assert produce_error(broker.bootstrap, "t") is None
