"""Several brokers on 127.0.0.1 as one cluster.

Embedded coordinator: broker 1 runs it (`--metadata local`, the default), brokers 2 and
3 join with `--coordinator`. With ZooKeeper: every broker runs a coordinator candidate,
the one holding `/controller` is active, a standby takes over when it dies.

Checked with real clients (confluent-kafka, kcat, kazoo) and raw requests: metadata
lists every live broker with the right leaders wherever it is asked; admin requests
sent to any broker reach the coordinator; a request to a broker that does not lead the
partition gets NOT_LEADER_OR_FOLLOWER (and group requests NOT_COORDINATOR) while
clients find the leaders by themselves; a broker killed with SIGKILL is fenced after
broker.session.timeout.ms and comes back with its data; SIGTERM is a controlled
shutdown; a broker cut off from the coordinator keeps serving what it leads.
"""

import json
import os
import struct
import subprocess
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from kazoo.exceptions import NoNodeError

from helpers.broker import SPATE_BIN  # noqa: E402
from helpers.clients import admin, cf_consume, cf_produce, create_topic, kcat
from helpers.wire import connect, frame, recv_frame, request_header_v1
from test_zookeeper import read_json as zk_json
from test_zookeeper import zk_client

# Short timeouts keep the fencing and failover tests quick.
SESSION_MS = 3000
HEARTBEAT_MS = 300
ZK_SESSION_MS = 4000

SPATE = str(SPATE_BIN)

NOT_LEADER_OR_FOLLOWER = 6
NOT_COORDINATOR = 16


def cluster_args(node_id, session_ms=SESSION_MS):
    return ["--node-id", str(node_id), "--broker-session-timeout-ms", str(session_ms),
            "--broker-heartbeat-interval-ms", str(HEARTBEAT_MS)]


def start_embedded_cluster(broker_factory, n=3, session_ms=SESSION_MS, extra=()):
    """Brokers 1..n, one core each, broker 1 running the embedded coordinator; `extra`
    arguments go to every broker. Returns them once broker 1's metadata lists all."""
    first = broker_factory(*cluster_args(1, session_ms), *extra, name="b1", cores=1)
    brokers = [first]
    for i in range(2, n + 1):
        brokers.append(broker_factory(*cluster_args(i, session_ms), *extra, "--coordinator", first.bootstrap,
                                      name=f"b{i}", cores=1))
    wait_brokers(first.bootstrap, {b.port for b in brokers})
    return brokers


def cluster_metadata(bootstrap, timeout=10):
    return admin(bootstrap).list_topics(timeout=timeout)


def wait_brokers(bootstrap, ports, timeout=20):
    """Wait until Metadata from `bootstrap` lists exactly the brokers on `ports`."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            md = cluster_metadata(bootstrap, timeout=5)
            seen = {b.port for b in md.brokers.values()}
            if seen == set(ports):
                return md
        except KafkaException as e:
            seen = e
        time.sleep(0.2)
    raise AssertionError(f"brokers {sorted(ports)} not listed by {bootstrap} within {timeout}s: {seen}")


def leaders(bootstrap, topic):
    md = cluster_metadata(bootstrap)
    t = md.topics[topic]
    assert t.error is None, t.error
    return {p.id: p.leader for p in t.partitions.values()}


def wait_for(read, predicate, timeout, what):
    """Poll `read()` until `predicate` holds of its value; metadata may be briefly
    unavailable meanwhile (errors count as not yet)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = read()
            if predicate(last):
                return last
        except Exception as e:  # noqa: BLE001 - metadata may be briefly unavailable
            last = e
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached within {timeout}s: last {last}")


def wait_leaders(bootstrap, topic, predicate, timeout=20):
    return wait_for(lambda: leaders(bootstrap, topic), predicate, timeout, f"leaders of {topic} from {bootstrap}")


def records_for(topic, n, partitions=None):
    return [{"key": f"k{i}".encode(), "value": f"{topic}-{i}".encode(),
             "partition": partitions[i % len(partitions)] if partitions else None} for i in range(n)]


def check_all_read(bootstrap, topic, partitions, sent, timeout=60):
    """Every record of `sent` (the delivery reports) is read back at its partition and
    offset, in order within each partition."""
    got = cf_consume(bootstrap, topic, partitions, count=len(sent), timeout=timeout)
    read = {(r.partition, r.offset): r.value for recs in got.values() for r in recs}
    assert read == {(r.partition, r.offset): r.value for r in sent}, \
        f"read {len(read)} records, {len(sent)} were acknowledged"


def consume_partitions(bootstrap, topic, partitions, count, timeout=30):
    """Read `count` records from the given partitions (assign, from the beginning)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "island-reader", "enable.auto.commit": False})
    out = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                out.append(m.value())
    finally:
        c.close()
    return out


def group_consume(bootstrap, topic, group, count, timeout=60):
    """Consume `count` records as a member of `group` (subscribe), committing them."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": 6000})
    n = 0
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout
        while n < count and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            n += 1
        c.commit(asynchronous=False)
    finally:
        c.close()
    return n


# ---- raw requests (to one chosen broker, no client routing) ----

def _string(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def raw_call(broker, api_key, version, correlation_id, body):
    """One request to `broker` itself (no client routing); returns the response frame."""
    s = connect(broker.port)
    try:
        s.sendall(frame(request_header_v1(api_key, version, correlation_id) + body))
        return recv_frame(s)
    finally:
        s.close()


def list_offsets_error(broker, topic, partition):
    """ListOffsets v1 (latest) sent to `broker` itself; returns the partition's error code."""
    body = struct.pack(">i", -1) + struct.pack(">i", 1) + _string(topic) + struct.pack(">i", 1) \
        + struct.pack(">iq", partition, -1)
    resp = raw_call(broker, 2, 1, 7, body)
    corr, n_topics = struct.unpack(">ii", resp[:8])
    assert (corr, n_topics) == (7, 1)
    (name_len,) = struct.unpack(">h", resp[8:10])
    pos = 10 + name_len
    n_parts, part, err = struct.unpack(">iih", resp[pos:pos + 10])
    assert (n_parts, part) == (1, partition)
    return err


def heartbeat_error(broker, group):
    """Heartbeat v0 for `group` sent to `broker` itself; returns the error code."""
    body = _string(group) + struct.pack(">i", 1) + _string("member-1")
    resp = raw_call(broker, 12, 0, 9, body)
    corr, err = struct.unpack(">ih", resp[:6])
    assert corr == 9
    return err


# ---- embedded coordinator ----

def test_three_brokers_with_the_embedded_coordinator(broker_factory):
    b1, b2, b3 = start_embedded_cluster(broker_factory)
    by_id = {1: b1, 2: b2, 3: b3}

    # Every broker answers Metadata with all three brokers and broker 1 as controller.
    for b in (b1, b2, b3):
        md = wait_brokers(b.bootstrap, {b1.port, b2.port, b3.port})
        assert md.controller_id == 1
        assert {i: (x.host, x.port) for i, x in md.brokers.items()} == \
            {i: ("127.0.0.1", x.port) for i, x in by_id.items()}
    # kcat (librdkafka 2.0) agrees.
    out = kcat(b3.bootstrap, "-L", "-J").stdout.decode()
    assert {br["id"] for br in json.loads(out)["brokers"]} == {1, 2, 3}

    # CreateTopics sent to broker 2 is forwarded to the coordinator; partitions are
    # spread over the three brokers, and every broker knows the leaders at once.
    create_topic(b2.bootstrap, "spread", 6)
    lead = leaders(b2.bootstrap, "spread")
    assert sorted(set(lead.values())) == [1, 2, 3], lead
    for b in (b1, b3):
        assert leaders(b.bootstrap, "spread") == lead

    # A request to a broker that does not lead the partition: NOT_LEADER_OR_FOLLOWER;
    # the leader answers.
    p, leader = next(iter(lead.items()))
    other = next(b for i, b in by_id.items() if i != leader)
    assert list_offsets_error(other, "spread", p) == NOT_LEADER_OR_FOLLOWER
    assert list_offsets_error(by_id[leader], "spread", p) == 0

    # Clients bootstrapped on any broker find the leaders by themselves.
    sent = cf_produce(b3.bootstrap, "spread", records_for("spread", 600))
    check_all_read(b2.bootstrap, "spread", 6, sent)

    # Groups: the coordinator is the leader of the group's __consumer_offsets partition;
    # other brokers answer NOT_COORDINATOR, and a consumer group bootstrapped elsewhere
    # commits and resumes.
    group = "g-cluster"
    coord = next(i for i, b in by_id.items() if heartbeat_error(b, group) != NOT_COORDINATOR)
    assert sum(heartbeat_error(b, group) == NOT_COORDINATOR for b in by_id.values()) == 2
    assert group_consume(b2.bootstrap, "spread", group, 600) == 600
    c = Consumer({"bootstrap.servers": b3.bootstrap, "group.id": group})
    try:
        committed = c.committed([TopicPartition("spread", i) for i in range(6)], timeout=20)
    finally:
        c.close()
    assert sum(tp.offset for tp in committed) == 600, (coord, committed)

    # DeleteTopics through broker 3: gone everywhere, partitions removed from every disk.
    a = admin(b3.bootstrap)  # keep the client alive until its future resolves
    fs = a.delete_topics(["spread"], operation_timeout=20)
    fs["spread"].result(20)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        dirs = [d for b in (b1, b2, b3) for d in b.data_dir.glob("spread-*")]
        if not dirs and all("spread" not in cluster_metadata(b.bootstrap).topics for b in (b1, b2, b3)):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"topic still present: {dirs}")


def test_killed_broker_is_fenced_and_comes_back_with_its_data(broker_factory):
    b1, b2, b3 = start_embedded_cluster(broker_factory)
    create_topic(b1.bootstrap, "fence", 6)
    sent = cf_produce(b2.bootstrap, "fence", records_for("fence", 300))
    before = leaders(b1.bootstrap, "fence")
    led_by_3 = sorted(p for p, l in before.items() if l == 3)
    assert led_by_3, before

    b3.kill()
    killed = time.monotonic()
    # Fenced after broker.session.timeout.ms: gone from Metadata, its partitions offline
    # (replication factor 1: there is no other replica), the others untouched.
    wait_brokers(b1.bootstrap, {b1.port, b2.port}, timeout=SESSION_MS / 1000 + 10)
    fenced_after = time.monotonic() - killed
    # Broker 2 learns it from its next snapshot (0-100 ms later, as in Kafka).
    wait_brokers(b2.bootstrap, {b1.port, b2.port}, timeout=10)
    md = cluster_metadata(b2.bootstrap)
    for p, t in md.topics["fence"].partitions.items():
        if p in led_by_3:
            assert t.leader == -1 and t.error is not None and \
                t.error.code() == KafkaError.LEADER_NOT_AVAILABLE, (p, t)
        else:
            assert t.leader == before[p]
    assert fenced_after >= SESSION_MS / 1000 - 0.5, fenced_after

    # It restarts, registers again, leads its partitions again with a new leader epoch,
    # and every acknowledged message is still there.
    b3.restart()
    wait_brokers(b1.bootstrap, {b1.port, b2.port, b3.port})
    wait_leaders(b1.bootstrap, "fence", lambda l: l == before)
    check_all_read(b1.bootstrap, "fence", 6, sent)


def test_sigterm_is_a_controlled_shutdown(broker_factory):
    # A session timeout far beyond the wait below: a broker that leaves only when its
    # session expires cannot pass, and a loaded machine has 20 s to see it leave.
    session_ms = 60000
    b1, b2, b3 = start_embedded_cluster(broker_factory, session_ms=session_ms)
    t0 = time.monotonic()
    assert b3.stop() == 0
    # Unregistered at once, not after the session timeout.
    wait_brokers(b1.bootstrap, {b1.port, b2.port}, timeout=session_ms / 1000 / 3)
    assert time.monotonic() - t0 < session_ms / 1000 / 3
    assert "controlled shutdown" in b3.log_text()


def test_broker_cut_off_from_the_coordinator_keeps_serving(broker_factory):
    b1, b2, b3 = start_embedded_cluster(broker_factory)
    create_topic(b1.bootstrap, "island", 6)
    lead = leaders(b1.bootstrap, "island")
    mine = sorted(p for p, l in lead.items() if l == 2)
    assert mine, lead
    # Broker 2 has the topic's metadata before the coordinator dies (it comes over the
    # coordinator link; under load it can lag the CreateTopics answer).
    wait_leaders(b2.bootstrap, "island", lambda l: l == lead)

    b1.kill()  # the coordinator
    # Broker 2 still serves the partitions it leads, with the metadata it has.
    sent = cf_produce(b2.bootstrap, "island", records_for("island", 100, partitions=mine))

    # Restarted on the same data dir after a kill -9, broker 2 starts from its cached
    # metadata while the coordinator is still down, and serves its partitions.
    b2.kill()
    b2.restart()
    got = consume_partitions(b2.bootstrap, "island", mine, 100)
    assert sorted(got) == sorted(r.value for r in sent)

    # The coordinator comes back: everyone registers again.
    b1.restart()
    wait_brokers(b1.bootstrap, {b1.port, b2.port, b3.port}, timeout=20)
    wait_leaders(b3.bootstrap, "island", lambda l: l == lead)


def describe(bootstrap, topic):
    """{partition: (leader, leader epoch)} as `spate topic describe --json` shows them."""
    r = subprocess.run([SPATE, "topic", "describe", topic, "--bootstrap", bootstrap, "--json"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return {p["partition"]: (p["leader"], p["leader_epoch"]) for p in json.loads(r.stdout)["partitions"]}


def test_coordinator_restart_moves_no_leadership_of_live_brokers(broker_factory):
    """kill -9 of the broker running the embedded coordinator, restarted at once. The
    partitions that brokers 2 and 3 lead keep their leader and leader epoch throughout:
    the coordinator keeps their registrations in its store, and they register again
    with the same incarnation. The restarted broker's own partitions get new leader
    epochs (its unsynced suffix may be gone). Spate used to start the coordinator
    knowing no other broker: every partition went offline until its leader registered
    again and then came back with a new epoch (seen in CI as a transactional processor
    stalled after its transaction coordinator's broker was killed)."""
    # A session timeout far beyond the restart: no broker can be fenced for slowness.
    b1, b2, b3 = start_embedded_cluster(broker_factory, session_ms=30000)
    create_topic(b1.bootstrap, "steady", 6, replication_factor=3)
    before = wait_for(lambda: describe(b1.bootstrap, "steady"),
                      lambda d: len(d) == 6 and all(leader >= 0 for leader, _ in d.values()), 20, "leaders")
    others = {p for p, (leader, _) in before.items() if leader in (2, 3)}
    assert others and len(others) < 6, before
    sent = cf_produce(b1.bootstrap, "steady", records_for("steady", 60), acks="all")

    b1.kill()
    b1.restart()
    # From the first answer of the restarted coordinator on, before and after brokers 2
    # and 3 register again.
    seen = [wait_for(lambda: describe(b1.bootstrap, "steady"), lambda d: len(d) == 6, 20, "metadata")]
    wait_brokers(b1.bootstrap, {b1.port, b2.port, b3.port})
    for _ in range(10):
        seen.append(describe(b1.bootstrap, "steady"))
        time.sleep(0.3)
    for d in seen:
        for p in others:
            assert d[p] == before[p], f"partition {p}: {before[p]} -> {d[p]} (all: {seen})"
    after = wait_for(lambda: describe(b1.bootstrap, "steady"),
                     lambda d: all(d[p][1] > before[p][1] for p in set(before) - others), 20,
                     "new leader epochs for the restarted broker's partitions")
    assert all(after[p] == before[p] for p in others), (before, after)

    sent += cf_produce(b1.bootstrap, "steady", records_for("steady", 60), acks="all")
    check_all_read(b1.bootstrap, "steady", 6, sent)


# ---- ZooKeeper ----

def test_zookeeper_legacy_reassign_partitions_znode(broker_factory, zookeeper, tmp_path):
    """Kafka's legacy reassignment path: an operator writes `/admin/reassign_partitions`
    with a plain ZooKeeper client (as the pre-KIP-455 tool did). The active coordinator
    moves the partition from brokers 1,2 to 2,3 (broker 3 copies the log and joins the
    ISR, broker 1 leaves and deletes its copy), drops the entry for a topic that does
    not exist, and deletes the znode once the move is done. Kafka's documents then show
    the new replicas; every acknowledged record is read back from the new leader."""
    from helpers.clients import cf_read_partition
    from confluent_kafka.admin import NewTopic
    url = f"zookeeper://{zookeeper}/legacy"
    brokers = {i: broker_factory(*cluster_args(i), "--metadata", url, "--zookeeper-session-timeout-ms",
                                 str(ZK_SESSION_MS), name=f"b{i}", cores=1) for i in (1, 2, 3)}
    wait_brokers(brokers[1].bootstrap, {b.port for b in brokers.values()})
    topic = "zk-legacy-move"
    a = admin(brokers[2].bootstrap)
    a.create_topics([NewTopic(topic, 1, replica_assignment=[[1, 2]])])[topic].result(20)
    sent = [f"legacy-{i}".encode() for i in range(300)]
    wait_for(lambda: cf_produce(brokers[1].bootstrap, topic,
                                [{"value": v, "partition": 0} for v in sent], acks="all"),
             lambda n: True, 30, "the records acknowledged")
    zk = zk_client(zookeeper)
    try:
        zk.chroot = "/legacy"
        request = {"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": [2, 3]},
                                                {"topic": "no-such-topic", "partition": 0, "replicas": [1]}]}
        zk.create("/admin/reassign_partitions", json.dumps(request).encode(), makepath=True)
        wait_for(lambda: zk.exists("/admin/reassign_partitions"), lambda st: st is None, 60,
                 "the coordinator to finish the move and delete /admin/reassign_partitions")
        doc = zk_json(zk, f"/brokers/topics/{topic}")
        assert doc["partitions"] == {"0": [2, 3]}, doc
        assert not doc.get("adding_replicas") and not doc.get("removing_replicas"), doc
        state = zk_json(zk, f"/brokers/topics/{topic}/partitions/0/state")
        assert sorted(state["isr"]) == [2, 3] and state["leader"] in (2, 3), state
    finally:
        zk.stop()
    md = wait_for(lambda: admin(brokers[1].bootstrap).list_topics(topic, timeout=10).topics[topic].partitions[0],
                  lambda p: sorted(p.replicas) == [2, 3] and sorted(p.isrs) == [2, 3], 20,
                  "broker 1's metadata to show the new replicas")
    assert cf_read_partition(brokers[md.leader].bootstrap, topic, 0) == sent
    wait_for(lambda: (brokers[1].data_dir / f"{topic}-0").exists(), lambda there: not there, 20,
             "broker 1 to delete its copy")
    assert (brokers[3].data_dir / f"{topic}-0").exists()


@pytest.mark.slow
def test_zookeeper_cluster_and_coordinator_failover(broker_factory, zookeeper):
    url = f"zookeeper://{zookeeper}/cluster"
    args = lambda i: cluster_args(i) + ["--metadata", url, "--zookeeper-session-timeout-ms", str(ZK_SESSION_MS)]
    brokers = {}
    for i in (1, 2, 3):
        brokers[i] = broker_factory(*args(i), name=f"b{i}", cores=1)
    ports = {b.port for b in brokers.values()}
    for b in brokers.values():
        wait_brokers(b.bootstrap, ports)

    zk = zk_client(zookeeper)
    try:
        zk.chroot = "/cluster"
        active = zk_json(zk, "/controller")["brokerid"]
        epoch = int(zk.get("/controller_epoch")[0])
        assert sorted(zk.get_children("/brokers/ids")) == ["1", "2", "3"]
        for i, b in brokers.items():
            doc = zk_json(zk, f"/brokers/ids/{i}")
            assert (doc["host"], doc["port"]) == ("127.0.0.1", b.port)
            assert doc["endpoints"] == [f"PLAINTEXT://127.0.0.1:{b.port}"]

        # A topic created through a standby lands in ZooKeeper with Kafka's documents.
        standby = next(i for i in brokers if i != active)
        create_topic(brokers[standby].bootstrap, "zk-spread", 6)
        assign = zk_json(zk, "/brokers/topics/zk-spread")["partitions"]
        assert sorted(set(r[0] for r in assign.values())) == [1, 2, 3]
        before = {}
        for p in range(6):
            st = zk_json(zk, f"/brokers/topics/zk-spread/partitions/{p}/state")
            assert st["isr"] == [st["leader"]] and st["controller_epoch"] == epoch
            before[p] = (st["leader"], st["leader_epoch"])
        sent = cf_produce(brokers[standby].bootstrap, "zk-spread", records_for("zk-spread", 300))

        # kill -9 the active coordinator: a standby takes over after the ZooKeeper
        # session of the dead one expires, with a higher /controller_epoch.
        brokers[active].kill()
        killed = time.monotonic()
        survivors = [i for i in brokers if i != active]
        deadline = killed + ZK_SESSION_MS / 1000 + 20
        while time.monotonic() < deadline:
            # Kafka's order: /controller first, then /controller_epoch. The dead one's
            # ephemeral /controller can go between a look and a read (CI saw NoNodeError).
            try:
                if zk_json(zk, "/controller")["brokerid"] != active and int(zk.get("/controller_epoch")[0]) > epoch:
                    break
            except NoNodeError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("no standby took over")
        took_over = time.monotonic() - killed
        new_active = zk_json(zk, "/controller")["brokerid"]
        assert new_active in survivors
        assert int(zk.get("/controller_epoch")[0]) > epoch
        print(f"coordinator failover: /controller taken over {took_over:.1f}s after kill -9 "
              f"(ZooKeeper session timeout {ZK_SESSION_MS} ms)")

        # Creating a topic still works, through either survivor.
        for i in survivors:
            create_topic(brokers[i].bootstrap, f"after-failover-{i}", 2)
        # The survivors kept their leaderships: no leader change, no new leader epoch;
        # the dead broker's partitions are offline (replication factor 1).
        for p, (leader, leader_epoch) in before.items():
            st = zk_json(zk, f"/brokers/topics/zk-spread/partitions/{p}/state")
            if leader == active:
                assert st["leader"] == -1
            else:
                assert (st["leader"], st["leader_epoch"]) == (leader, leader_epoch), (p, st)
        wait_brokers(brokers[survivors[0]].bootstrap, {brokers[i].port for i in survivors})
        assert sorted(zk.get_children("/brokers/ids")) == sorted(str(i) for i in survivors)

        # The old coordinator comes back as a standby; its partitions come back.
        brokers[active].restart()
        wait_brokers(brokers[survivors[0]].bootstrap, ports, timeout=30)
        wait_leaders(brokers[active].bootstrap, "zk-spread",
                     lambda l: all(l[p] == before[p][0] for p in l), timeout=30)
        assert zk_json(zk, "/controller")["brokerid"] == new_active
        check_all_read(brokers[active].bootstrap, "zk-spread", 6, sent)
    finally:
        zk.stop()
