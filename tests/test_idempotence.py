"""Idempotent producers against the real broker: kafka-python 3.x's default
KafkaProducer(), confluent-kafka with enable.idempotence=true through a kill -9 and
restart of the broker (every acknowledged message read back exactly once, in order),
kafkajs with idempotent: true; InitProducerId ids kept in Kafka's
/latest_producer_id_block and never reused across restarts; hostile idempotent batches
(an id never issued, a stale or skipped-ahead epoch, a sequence gap, a negative
sequence) get Kafka's error codes, a log line and a metric, and append nothing."""

import json
import os
import shutil
import subprocess
import threading
import time

import pytest
from confluent_kafka import Producer
from kazoo.exceptions import NoNodeError

from helpers import wire
from helpers.metrics import metric_sum, scrape
from helpers.broker import REPO_ROOT, free_port
from helpers.clients import cf_conf, cf_consume, create_topic, kp_consume

NONE = 0
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
UNKNOWN_PRODUCER_ID = 59
INVALID_RECORD = 87
NOT_COORDINATOR = 16
INVALID_REQUEST = 42


def assert_exactly_once_in_order(sent_by_partition, got):
    """`sent_by_partition`: {partition: [value, ...]} acknowledged, in send order; `got`:
    what a consumer read. Every acknowledged value once, in order; nothing twice."""
    for p, values in sent_by_partition.items():
        read = [r.value for r in got[p]]
        assert len(read) == len(set(read)), f"partition {p}: duplicates {len(read) - len(set(read))}"
        positions = {v: i for i, v in enumerate(read)}
        missing = [v for v in values if v not in positions]
        assert not missing, f"partition {p}: {len(missing)} acknowledged values missing, e.g. {missing[:3]}"
        order = [positions[v] for v in values]
        assert order == sorted(order), f"partition {p}: acknowledged values out of order"


def test_kafka_python_default_producer(broker):
    """kafka-python 3.x enables idempotence by default: no options at all."""
    from kafka import KafkaProducer
    import kafka
    assert kafka.__version__.startswith("3."), kafka.__version__
    create_topic(broker.bootstrap, "kp-idem", 3)
    p = KafkaProducer(bootstrap_servers=[broker.bootstrap])
    try:
        assert p.config["enable_idempotence"], "kafka-python's default is idempotent"
        futs = [p.send("kp-idem", key=b"k%d" % (i % 7), value=b"v%05d" % i) for i in range(600)]
        p.flush(30)
        sent = {}
        for i, f in enumerate(futs):
            md = f.get(30)
            sent.setdefault(md.partition, []).append(b"v%05d" % i)
        pid = p._transaction_manager.producer_id_and_epoch.producer_id
    finally:
        p.close(timeout=5)
    got = kp_consume(broker.bootstrap, "kp-idem", 3, count=600)
    assert sum(len(v) for v in got.values()) == 600
    assert_exactly_once_in_order(sent, got)

    # DescribeProducers (KIP-664) shows the producer state the partitions keep.
    from kafka import TopicPartition as KTP
    from kafka.admin import KafkaAdminClient
    a = KafkaAdminClient(bootstrap_servers=[broker.bootstrap], request_timeout_ms=15000)
    try:
        states = a.describe_producers([KTP("kp-idem", part) for part in range(3)])
    finally:
        a.close()
    for part in range(3):
        (st,) = states[KTP("kp-idem", part)].active_producers
        assert (st.producer_id, st.producer_epoch) == (pid, 0), st
        assert st.last_sequence == len(sent.get(part, [])) - 1, st
        assert st.current_transaction_start_offset == -1 and st.last_timestamp > 0, st


@pytest.mark.slow
def test_confluent_idempotent_through_kill9_and_restart(broker_factory):
    """librdkafka with enable.idempotence=true keeps producing while the broker is
    killed (kill -9) and restarted on the same data dir: the batches in flight at the
    kill are retried against the state rebuilt from the log, and deduplicated."""
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}", cores=2)
    create_topic(b.bootstrap, "cf-idem", 2)
    p = Producer(cf_conf(b.bootstrap, **{
        "enable.idempotence": True, "linger.ms": 2, "message.timeout.ms": 90000,
        "batch.num.messages": 20}))
    acked = {}
    errors = []
    lock = threading.Lock()

    def on_delivery(err, msg):
        with lock:
            if err is not None:
                errors.append(err)
            else:
                acked.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))

    total = 20000
    killed = False
    for i in range(total):
        while True:
            try:
                p.produce("cf-idem", b"m-%06d" % i, key=b"k%d" % (i % 5), on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
        if i == total // 3:
            p.flush(30)
        if i == total // 3 + 4000 and not killed:
            # Batches are in flight now: kill -9 in the middle of the stream.
            b.kill()
            killed = True
            # Deliberate: the broker stays down a moment, so the producer's in-flight
            # batches fail and are retried (the case under test); nothing waits on this.
            time.sleep(0.5)
            b.restart()
    left = p.flush(90)
    assert left == 0, f"{left} messages not delivered"
    assert not errors, errors[:5]
    n_acked = sum(len(v) for v in acked.values())
    assert n_acked == total
    sent = {part: [v for _, v in sorted(vals)] for part, vals in acked.items()}
    # Offsets were acknowledged once each.
    for part, vals in acked.items():
        offsets = [o for o, _ in vals]
        assert len(offsets) == len(set(offsets)), f"partition {part}: an offset acknowledged twice"
    got = cf_consume(b.bootstrap, "cf-idem", 2, count=total, timeout=60)
    assert sum(len(v) for v in got.values()) == total, "duplicates or losses in the log"
    assert_exactly_once_in_order(sent, got)
    # How many retries the restarted broker answered from the rebuilt state (timing
    # decides; zero when nothing was in flight at the kill).
    print("duplicates answered after the restart:",
          metric_sum(scrape(mport), "spate_producer_batches_duplicate_total"))
    # The order of the acknowledgements is the order of the sends, per partition.
    for part, vals in acked.items():
        values = [v for _, v in sorted(vals)]
        assert values == sorted(values), f"partition {part}: log order differs from send order"


@pytest.mark.slow
def test_kafkajs_idempotent(broker):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    js_dir = REPO_ROOT / "tests" / "js"
    assert (js_dir / "node_modules" / "kafkajs").is_dir(), "run scripts/install-deps"
    create_topic(broker.bootstrap, "js-idem", 2)
    r = subprocess.run([node, str(js_dir / "idempotent.js"), broker.bootstrap, "js-idem"], cwd=str(REPO_ROOT),
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    out = r.stdout.decode(errors="replace")
    assert r.returncode == 0, out
    assert "PASS: kafkajs idempotent" in out, out


def test_hostile_idempotent_batches_are_refused_and_append_nothing(broker_factory):
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}")
    create_topic(b.bootstrap, "raw-idem", 1)

    def produce(batch):
        return wire.parse_produce_v3(wire.call(b.port, wire.produce_v3("raw-idem", 0, batch)))

    err, pid, epoch = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id()))
    assert (err, epoch) == (NONE, 0) and pid >= 0
    batch = wire.record_batch([b"a", b"b"], pid, 0, 0)
    assert produce(batch) == (NONE, 0)
    # A retry: the original offsets, not appended again.
    assert produce(batch) == (NONE, 0)
    assert produce(wire.record_batch([b"c"], pid, 0, 2)) == (NONE, 2)
    # A sequence gap.
    assert produce(wire.record_batch([b"x"], pid, 0, 9))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    # An epoch above the current one must start at sequence 0.
    assert produce(wire.record_batch([b"x"], pid, 4, 3))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    # InitProducerId with the producer's id and epoch (v3+, KIP-360): as in Kafka, a
    # producer without a transactional id gets a new id, epoch 0, never its claimed id
    # with a bumped epoch (nothing could verify the claim). An id without an epoch, or
    # an epoch without an id, is an invalid request.
    err, pid2, epoch2 = wire.parse_init_producer_id(
        wire.call(b.port, wire.init_producer_id(producer_id=pid, producer_epoch=0)))
    assert err == NONE and pid2 > pid and epoch2 == 0, (err, pid2, epoch2)
    for half in (dict(producer_id=pid), dict(producer_epoch=0)):
        assert wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id(**half))) == (INVALID_REQUEST, -1, -1)
    # KIP-360: the producer bumps its epoch itself (as the Java client does), then the
    # old epoch is fenced.
    assert produce(wire.record_batch([b"d"], pid, 1, 0)) == (NONE, 3)
    assert produce(wire.record_batch([b"x"], pid, 0, 3))[0] == INVALID_PRODUCER_EPOCH
    # A producer id never issued.
    assert produce(wire.record_batch([b"x"], 10**12, 0, 0))[0] == UNKNOWN_PRODUCER_ID
    # A negative sequence.
    assert produce(wire.record_batch([b"x"], pid, 1, -7))[0] == INVALID_RECORD
    # A transactional id goes to its transaction coordinator: none before a
    # FindCoordinator created __transaction_state (test_transactions.py goes on from there).
    err, _, _ = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id(transactional_id="tx-1")))
    assert err == NOT_COORDINATOR

    got = cf_consume(b.bootstrap, "raw-idem", 1, count=4)
    assert [r.value for r in got[0]] == [b"a", b"b", b"c", b"d"]
    m = scrape(mport)
    assert metric_sum(m, "spate_producer_batches_refused_total") >= 5, m
    assert metric_sum(m, "spate_producer_batches_duplicate_total") >= 1, m
    assert b.log_text().count("idempotent batch refused") >= 5
    assert b.alive()


def test_producer_ids_never_repeat_across_restarts(broker_factory):
    b = broker_factory()
    ids = []
    for _ in range(3):
        err, pid, epoch = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id()))
        assert (err, epoch) == (NONE, 0)
        ids.append(pid)
    b.kill()
    b.restart()
    err, pid, _ = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id()))
    assert err == NONE
    ids.append(pid)
    b.stop()
    b.restart()
    err, pid, _ = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id()))
    ids.append(pid)
    assert ids == sorted(ids) and len(set(ids)) == len(ids), ids
    # Kafka's ZooKeeper layout, in the embedded store.
    store = json.loads((b.data_dir / "spate-meta" / "znodes.json").read_text())
    import base64
    node = store["nodes"]["/latest_producer_id_block"]
    doc = json.loads(base64.b64decode(node["data"]))
    assert doc == {"version": 1, "broker": 1, "block_start": str(ids[-1]),
                   "block_end": str(ids[-1] + 999)}, doc


def test_producer_id_blocks_in_zookeeper(broker_factory, zookeeper):
    from kazoo.client import KazooClient
    url = f"zookeeper://{zookeeper}/spate"
    b = broker_factory("--metadata", url, "--node-id", "4")
    err, first, _ = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id()))
    assert err == NONE
    b.kill()
    zk = KazooClient(hosts=zookeeper, timeout=10)
    zk.start(timeout=15)
    try:
        doc = json.loads(zk.get("/spate/latest_producer_id_block")[0].decode())
        assert doc == {"version": 1, "broker": 4, "block_start": str(first), "block_end": str(first + 999)}
        deadline = time.monotonic() + 40
        while zk.exists("/spate/controller") and time.monotonic() < deadline:
            time.sleep(0.2)
        b2 = broker_factory("--metadata", url, "--node-id", "5", name="b-other")
        err, second, _ = wire.parse_init_producer_id(wire.call(b2.port, wire.init_producer_id()))
        assert err == NONE and second > first + 999 - 1, (first, second)
        doc = json.loads(zk.get("/spate/latest_producer_id_block")[0].decode())
        assert doc["broker"] == 5 and int(doc["block_start"]) == second
    finally:
        zk.stop()


def test_a_new_leader_deduplicates_retries_of_what_the_old_leader_wrote(broker_factory):
    """Followers build the producer state from the batches they replicate: after the
    leader is killed, the new leader answers a retry of a batch the old leader wrote
    with its original offset instead of appending it again."""
    from test_replication import partition_states, start_cluster, wait_identical_replicas, wait_states
    brokers = start_cluster(broker_factory)
    b1 = brokers[1]
    create_topic(b1.bootstrap, "idem-rep", 3, config={"min.insync.replicas": "2"}, replication_factor=3)
    states = partition_states(b1.bootstrap, "idem-rep")
    # Not the partition led by broker 1: it runs the embedded coordinator.
    part, (old_leader, _, _) = next((p, s) for p, s in sorted(states.items()) if s[0] != 1)
    # InitProducerId on a broker that is not the coordinator: forwarded to it.
    err, pid, epoch = wire.parse_init_producer_id(wire.call(brokers[3].port, wire.init_producer_id()))
    assert (err, epoch) == (NONE, 0)

    def produce(broker, batch):
        # Retried while `broker` has not yet taken the partition (new topic, new leader).
        return wire.produce_v3_settled(broker.port, "idem-rep", part, batch, acks=-1)

    first = wire.record_batch([b"a", b"b"], pid, 0, 0)
    second = wire.record_batch([b"c"], pid, 0, 2)
    assert produce(brokers[old_leader], first) == (NONE, 0)
    assert produce(brokers[old_leader], second) == (NONE, 2)
    wait_identical_replicas(brokers, "idem-rep", 3)
    brokers[old_leader].kill()
    states = wait_states(b1.bootstrap, "idem-rep", lambda s: s[part][0] not in (old_leader, -1),
                         timeout=30, what="a new leader")
    new_leader = brokers[states[part][0]]
    # The producer's retries of both batches: their original offsets, nothing appended.
    assert produce(new_leader, second) == (NONE, 2)
    assert produce(new_leader, first) == (NONE, 0)
    assert produce(new_leader, wire.record_batch([b"x"], pid, 0, 9))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce(new_leader, wire.record_batch([b"d"], pid, 0, 3)) == (NONE, 3)
    got = cf_consume(new_leader.bootstrap, "idem-rep", 3, count=4)
    assert [r.value for r in got[part]] == [b"a", b"b", b"c", b"d"]


def test_idle_producers_expire(broker_factory):
    """producer.id.expiration.ms: a producer whose last batch is older than that is
    forgotten (here at the restart's recovery; the shard's housekeeping does it on a
    running broker), and its next batch is accepted at any sequence, as in Kafka."""
    b = broker_factory("--producer-id-expiration-ms", "5000")
    create_topic(b.bootstrap, "expiring", 1)

    def produce(batch):
        return wire.parse_produce_v3(wire.call(b.port, wire.produce_v3("expiring", 0, batch)))

    err, pid, _ = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id()))
    err2, fresh, _ = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id()))
    now_ms = int(time.time() * 1000)
    assert produce(wire.record_batch([b"old"], pid, 0, 0, timestamp_ms=now_ms - 60_000)) == (NONE, 0)
    assert produce(wire.record_batch([b"new"], fresh, 0, 0, timestamp_ms=now_ms + 60_000)) == (NONE, 1)
    assert produce(wire.record_batch([b"x"], pid, 0, 7))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    b.stop()
    b.restart()
    assert produce(wire.record_batch([b"again"], pid, 0, 7)) == (NONE, 2), "expired: accepted as new"
    # The producer that was not idle is still checked.
    assert produce(wire.record_batch([b"x"], fresh, 0, 7))[0] == OUT_OF_ORDER_SEQUENCE_NUMBER


def test_five_pipelined_batches_keep_their_order(broker_factory):
    """max.in.flight = 5: five produce requests on one connection, sent before any
    answer, for a partition owned by this core and one owned by the other core."""
    b = broker_factory(cores=2)
    create_topic(b.bootstrap, "inflight", 2)
    for part in range(2):
        err, pid, _ = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id()))
        assert err == NONE
        for round_ in range(4):
            s = wire.connect(b.port)
            try:
                base = round_ * 10
                for i in range(5):
                    batch = wire.record_batch([b"%d-%d" % (base + 2 * i, part), b"%d" % (base + 2 * i + 1)],
                                              pid, 0, base + 2 * i)
                    s.sendall(wire.produce_v3("inflight", part, batch, correlation_id=i))
                answers = [wire.parse_produce_v3(wire.recv_frame(s)) for _ in range(5)]
            finally:
                s.close()
            assert answers == [(NONE, base + 2 * i) for i in range(5)], (part, round_, answers)


def test_producer_ids_never_repeat_across_a_zookeeper_coordinator_failover(broker_factory, zookeeper):
    """Two brokers on ZooKeeper: ids issued through the standby (forwarded to the
    active coordinator), then the active one is killed; the standby takes over and
    reserves the next block in /latest_producer_id_block."""
    from kazoo.client import KazooClient
    from test_cluster import ZK_SESSION_MS, cluster_args, wait_brokers
    url = f"zookeeper://{zookeeper}/fo"
    args = lambda i: cluster_args(i) + ["--metadata", url, "--zookeeper-session-timeout-ms", str(ZK_SESSION_MS)]
    brokers = {i: broker_factory(*args(i), name=f"b{i}", cores=1) for i in (1, 2)}
    for b in brokers.values():
        wait_brokers(b.bootstrap, {x.port for x in brokers.values()})
    zk = KazooClient(hosts=zookeeper, timeout=10)
    zk.start(timeout=15)
    try:
        active = json.loads(zk.get("/fo/controller")[0])["brokerid"]
        standby = 3 - active
        issued = []
        for _ in range(3):
            err, pid, epoch = wire.parse_init_producer_id(wire.call(brokers[standby].port, wire.init_producer_id()))
            assert (err, epoch) == (NONE, 0)
            issued.append(pid)
        doc = json.loads(zk.get("/fo/latest_producer_id_block")[0])
        assert doc["broker"] == active and int(doc["block_start"]) <= min(issued)
        brokers[active].kill()
        deadline = time.monotonic() + ZK_SESSION_MS / 1000 + 20
        while time.monotonic() < deadline:
            # One read: /fo/controller (ephemeral) can go between an exists() and a get().
            try:
                if json.loads(zk.get("/fo/controller")[0])["brokerid"] == standby:
                    break
            except NoNodeError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("the standby did not take over")
        deadline = time.monotonic() + 20
        while True:
            err, pid, _ = wire.parse_init_producer_id(wire.call(brokers[standby].port, wire.init_producer_id()))
            if err == NONE or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert err == NONE
        assert pid > int(doc["block_end"]), (issued, pid, doc)
        doc2 = json.loads(zk.get("/fo/latest_producer_id_block")[0])
        assert doc2 == {"version": 1, "broker": standby, "block_start": str(pid),
                        "block_end": str(pid + 999)}, doc2
    finally:
        zk.stop()


def test_retries_after_kill9_and_after_a_corrupt_snapshot_are_deduplicated(broker_factory):
    """kill -9 right after batches were appended (no snapshot covers them): the restarted
    broker rebuilds the state from the log and answers the producer's retries with the
    original offsets. Then a clean stop writes a .snapshot; a bit flipped in it is
    detected, the file discarded, and the state rebuilt from the log all the same."""
    b = broker_factory(cores=1)
    create_topic(b.bootstrap, "crash-idem", 1)

    def produce(batch):
        return wire.parse_produce_v3(wire.call(b.port, wire.produce_v3("crash-idem", 0, batch)))

    err, pid, _ = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id()))
    batches = [wire.record_batch([b"%d" % (2 * i), b"%d" % (2 * i + 1)], pid, 0, 2 * i) for i in range(4)]
    assert [produce(x) for x in batches] == [(NONE, 2 * i) for i in range(4)]
    part_dir = b.data_dir / "crash-idem-0"
    assert not list(part_dir.glob("*.snapshot")), "no roll, no clean stop: no snapshot yet"
    b.kill()
    b.restart()
    # The producer retries what it had in flight: the same offsets, nothing appended.
    assert produce(batches[3]) == (NONE, 6)
    assert produce(batches[2]) == (NONE, 4)
    assert produce(wire.record_batch([b"8"], pid, 0, 8)) == (NONE, 8)

    b.stop()
    (snap,) = part_dir.glob("*.snapshot")
    assert snap.name == "%020d.snapshot" % 9
    data = bytearray(snap.read_bytes())
    data[12] ^= 0x04  # inside the entry: the CRC no longer matches
    snap.write_bytes(bytes(data))
    b.restart()
    assert produce(wire.record_batch([b"8"], pid, 0, 8)) == (NONE, 8)
    assert produce(wire.record_batch([b"9"], pid, 0, 9)) == (NONE, 9)
    assert "corrupt producer state snapshot" in b.log_text()
    got = cf_consume(b.bootstrap, "crash-idem", 1, count=10)
    assert [r.value for r in got[0]] == [b"%d" % i for i in range(10)]
