"""The partition side of transactions against the real binary (issue 13), driven on
the wire as a transaction coordinator would: transactional batches from producers, then
WriteTxnMarkers to end them. A read_committed consumer (confluent-kafka's default,
kafka-python's isolation_level) stops at the last stable offset and never sees aborted
records; a read_uncommitted one sees every record; control batches are never records.
Everything survives kill -9 and a restart (the aborted index and the open transactions
are rebuilt from disk)."""

import time

from helpers import wire
from helpers.broker import free_port
from helpers.clients import cf_consume, create_topic, kp_consume
from helpers.metrics import metric_sum, scrape

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
CONCURRENT_TRANSACTIONS = 51

TOPIC = "txp"


def wait_for(cond, timeout=10):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def values(got):
    return [r.value for r in got[0]]


def test_markers_decide_what_read_committed_consumers_see_through_kill9(broker_factory):
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}")
    create_topic(b.bootstrap, TOPIC, 1)

    def metric(name):
        return metric_sum(scrape(mport), f'{name}{{topic="{TOPIC}",partition="0"}}')

    def produce(batch):
        return wire.parse_produce_v3(wire.call(b.port, wire.produce_v3(TOPIC, 0, batch)))

    def lso(isolation):
        return wire.parse_list_offsets_v2(wire.call(b.port, wire.list_offsets_latest_v2(TOPIC, 0, isolation)))

    def markers(*ms):
        return wire.parse_write_txn_markers(wire.call(b.port, wire.write_txn_markers(list(ms))))

    ids = []
    for _ in range(3):
        err, pid, epoch = wire.parse_init_producer_id(wire.call(b.port, wire.init_producer_id()))
        assert (err, epoch) == (NONE, 0)
        ids.append(pid)
    a, c, d = ids
    # A's transaction [a1, a2] at 0-1, a plain record at 2, D's transaction [d1] at 3.
    assert produce(wire.record_batch([b"a1", b"a2"], a, 0, 0, transactional=True)) == (NONE, 0)
    assert produce(wire.record_batch([b"plain"])) == (NONE, 2)
    assert produce(wire.record_batch([b"d1"], d, 0, 0, transactional=True)) == (NONE, 3)
    # A plain batch from a producer whose transaction is open here is refused.
    assert produce(wire.record_batch([b"x"], a, 0, 1))[0] == INVALID_TXN_STATE
    assert lso(1) == (NONE, 0), "A's open transaction holds the last stable offset"
    assert lso(0) == (NONE, 4)
    # read_uncommitted sees everything; read_committed nothing yet (all of it is above
    # the last stable offset).
    assert values(cf_consume(b.bootstrap, TOPIC, 1, count=4, **{"isolation.level": "read_uncommitted"})) == [
        b"a1", b"a2", b"plain", b"d1"]
    assert values(cf_consume(b.bootstrap, TOPIC, 1)) == []
    # Metrics are published once a second.
    wait_for(lambda: metric("spate_partition_open_transactions") == 2 and
             metric("spate_partition_last_stable_offset_lag") == 4)

    # Abort A, commit D: markers at 4 and 5.
    assert markers((a, 0, False, 0, {TOPIC: [0]}), (d, 0, True, 0, {TOPIC: [0]})) == {
        (a, TOPIC, 0): NONE, (d, TOPIC, 0): NONE}
    assert lso(1) == (NONE, 6)
    # C opens a transaction after the markers and leaves it open.
    assert produce(wire.record_batch([b"c1"], c, 0, 0, transactional=True)) == (NONE, 6)
    assert lso(1) == (NONE, 6)

    def check():
        assert values(cf_consume(b.bootstrap, TOPIC, 1, count=2)) == [b"plain", b"d1"]
        kp = kp_consume(b.bootstrap, TOPIC, 1, count=2, isolation_level="read_committed")
        assert values(kp) == [b"plain", b"d1"]
        assert values(cf_consume(b.bootstrap, TOPIC, 1, count=5, **{"isolation.level": "read_uncommitted"})) == [
            b"a1", b"a2", b"plain", b"d1", b"c1"]
        assert lso(1) == (NONE, 6)

    check()
    wait_for(lambda: metric("spate_partition_open_transactions") == 1 and
             metric("spate_partition_last_stable_offset_lag") == 1)
    # An unknown partition answers per partition.
    got = markers((d, 0, True, 0, {TOPIC: [0], "no-such-topic": [0]}))
    assert got[(d, "no-such-topic", 0)] == UNKNOWN_TOPIC_OR_PARTITION
    assert got[(d, TOPIC, 0)] == NONE, "epoch 0 is D's current epoch: an empty transaction ends"

    b.kill()
    b.restart()
    check()
    # C's transaction was still open through the crash: aborting it now hides c1.
    assert markers((c, 0, False, 0, {TOPIC: [0]})) == {(c, TOPIC, 0): NONE}
    assert values(cf_consume(b.bootstrap, TOPIC, 1, count=2)) == [b"plain", b"d1"]
    assert lso(1) == lso(0)
    # A marker from an older producer epoch than the partition has seen is refused.
    assert produce(wire.record_batch([b"a3"], a, 1, 0, transactional=True))[0] == NONE
    assert markers((a, 0, True, 0, {TOPIC: [0]})) == {(a, TOPIC, 0): INVALID_PRODUCER_EPOCH}
    assert markers((a, 1, True, 0, {TOPIC: [0]})) == {(a, TOPIC, 0): NONE}
    assert values(cf_consume(b.bootstrap, TOPIC, 1, count=3)) == [b"plain", b"d1", b"a3"]
    assert b.alive()


NOT_COORDINATOR = 16
NOT_ENOUGH_REPLICAS = 19
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15


def init_transactional_id(port, txn_id, ports=None):
    """FindCoordinator (which creates __transaction_state) and InitProducerId for
    `txn_id` to the coordinator it names (`ports`: node id -> port, for a cluster), as
    a client does, retrying while the coordinator is not ready."""
    deadline = time.monotonic() + 30
    while True:
        err, node = wire.parse_find_coordinator_v1(wire.call(port, wire.find_coordinator_v1(txn_id, 1)))
        if err == NONE:
            at = (ports or {}).get(node, port)
            err, pid, epoch = wire.parse_init_producer_id(wire.call(at, wire.init_producer_id(transactional_id=txn_id)))
        if err not in (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE):
            return err, pid, epoch
        assert time.monotonic() < deadline, err
        time.sleep(0.2)


def kip890_scenario(leader_port, coordinator_port, topic, txn_id):
    """KIP-890 part 1 against the partition leader at `leader_port`, with `txn_id`'s
    coordinator at `coordinator_port` (the same broker, or another one): a transactional
    batch for a partition the coordinator never added is refused with INVALID_TXN_STATE
    and not appended; once added, it is appended; after the transaction is aborted, a
    late batch of it (a delayed retry, with the next sequence) is refused too, so it
    cannot open a transaction nobody will end: the LSO does not get stuck."""
    err, pid, epoch = init_transactional_id(coordinator_port, txn_id)
    assert err == NONE

    def produce(partition, value, seq):
        """As a client: NOT_ENOUGH_REPLICAS (a coordinator the leader cannot reach yet,
        e.g. before its metadata names it) is retried, and so is a leader that has not
        yet taken the new partition."""
        batch = wire.record_batch([value], pid, epoch, seq, transactional=True)
        return wire.produce_v3_settled(leader_port, topic, partition, batch, transactional_id=txn_id,
                                       retry=wire.PRODUCE_SETTLING + (NOT_ENOUGH_REPLICAS,))

    def latest(partition, isolation):
        err, offset = wire.parse_list_offsets_v2(
            wire.call(leader_port, wire.list_offsets_latest_v2(topic, partition, isolation)))
        assert err == NONE
        return offset

    # Never added: refused, nothing appended, no transaction opened.
    assert produce(0, b"not-added", 0)[0] == INVALID_TXN_STATE
    assert (latest(0, 0), latest(0, 1)) == (0, 0)
    # Added: appended. Another partition of the same transaction, not added: refused.
    # A coordinator whose metadata does not name the new topic yet answers
    # UNKNOWN_TOPIC_OR_PARTITION, which clients retry.
    add = wire.add_partitions_to_txn_v1(txn_id, pid, epoch, topic, [0])
    deadline = time.monotonic() + 20
    while (added := wire.parse_add_partitions_to_txn_v1(wire.call(coordinator_port, add))) == {
            0: UNKNOWN_TOPIC_OR_PARTITION} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert added == {0: NONE}
    assert produce(0, b"in-txn", 0) == (NONE, 0)
    assert produce(1, b"other-partition", 0)[0] == INVALID_TXN_STATE
    assert latest(1, 0) == 0
    # Abort: the marker lands at 1, and the LSO reaches the HW (2).
    assert wire.parse_end_txn_v1(wire.call(coordinator_port, wire.end_txn_v1(txn_id, pid, epoch, False))) == NONE
    wait_for(lambda: latest(0, 1) == 2, timeout=30)
    # A late batch of the ended transaction: refused; the LSO stays at the HW.
    assert produce(0, b"late", 1)[0] == INVALID_TXN_STATE
    assert (latest(0, 0), latest(0, 1)) == (2, 2)
    return pid, epoch


def test_kip890_a_transactional_batch_is_verified_with_the_coordinator(broker):
    """One broker: the coordinator is local (see `kip890_scenario`)."""
    create_topic(broker.bootstrap, "kip890", 2)
    kip890_scenario(broker.port, broker.port, "kip890", "kip890-app")
    got = cf_consume(broker.bootstrap, "kip890", 2, count=1, **{"isolation.level": "read_uncommitted"})
    assert values(got) == [b"in-txn"] and got[1] == []
    assert broker.alive()


def test_kip890_verification_asks_a_coordinator_on_another_broker(broker_factory):
    """Three brokers: the partitions are led by one broker and the transactional id is
    coordinated by another, so the leader verifies with AddPartitionsToTxn v4
    (verify_only) over the network (see `kip890_scenario`)."""
    from confluent_kafka.admin import NewTopic
    from test_cluster import start_embedded_cluster
    from helpers.clients import admin, topic_metadata, wait_for_topic
    from helpers.kafka_hash import java_hash_partition
    brokers = start_embedded_cluster(broker_factory, 3)
    # __transaction_state comes with the first transactional id initialised.
    ports = {i + 1: b.port for i, b in enumerate(brokers)}
    assert init_transactional_id(brokers[0].port, "kip890-warmup", ports)[0] == NONE
    txn_id = "kip890-remote"
    md = topic_metadata(brokers[0].bootstrap)
    coordinator = md["__transaction_state"][java_hash_partition(txn_id, 50)]
    leader = next(n for n in (1, 2, 3) if n != coordinator)
    a = admin(brokers[0].bootstrap)
    futures = a.create_topics(
        [NewTopic("kip890c", 2, replica_assignment=[[leader], [leader]])], request_timeout=15, operation_timeout=15)
    futures["kip890c"].result(30)
    # The leader itself must know the topic: the controller's metadata can name it first.
    wait_for_topic(brokers[leader - 1].bootstrap, "kip890c", 2)
    kip890_scenario(brokers[leader - 1].port, brokers[coordinator - 1].port, "kip890c", txn_id)
    assert all(b.alive() for b in brokers)


def test_a_transactions_pipelined_batches_wait_for_its_verification(broker_factory):
    """A client that pipelines a transaction's batches to a partition (the Java client
    and franz-go do, up to 5 in flight): the first one waits for the coordinator's
    verification (KIP-890), slow here, and the next one must not reach the partition
    before it. It did, out of sequence: OUT_OF_ORDER_SEQUENCE_NUMBER, fatal for the
    producer. The broker now serves a transactional Produce before it reads the
    connection's next request, as Kafka serves every request."""
    b = broker_factory("--test-txn-verification-delay-ms", "300")
    create_topic(b.bootstrap, "txn-pipelined", 1)
    txn_id = "pipelined"
    err, pid, epoch = init_transactional_id(b.port, txn_id)
    assert err == NONE

    def batch(seq):
        return wire.record_batch([b"v%d" % (seq + i) for i in range(10)], pid, epoch, seq, transactional=True)

    def add_partition():
        """As a client: CONCURRENT_TRANSACTIONS (the last commit's markers still being
        written) is retried."""
        add = wire.add_partitions_to_txn_v1(txn_id, pid, epoch, "txn-pipelined", [0])
        wait_for(lambda: wire.parse_add_partitions_to_txn_v1(wire.call(b.port, add)) != {0: CONCURRENT_TRANSACTIONS})
        assert wire.parse_add_partitions_to_txn_v1(wire.call(b.port, add)) == {0: NONE}

    def commit():
        assert wire.parse_end_txn_v1(wire.call(b.port, wire.end_txn_v1(txn_id, pid, epoch, True))) == NONE

    # The first transaction makes the partition know the producer's last sequence (9),
    # so a batch that overtakes the next transaction's first one is out of sequence.
    add_partition()
    assert wire.produce_v3_settled(b.port, "txn-pipelined", 0, batch(0), transactional_id=txn_id) == (NONE, 0)
    commit()
    add_partition()
    s = wire.connect(b.port, timeout=30)
    try:
        s.sendall(wire.produce_v3("txn-pipelined", 0, batch(10), correlation_id=1, transactional_id=txn_id)
                  + wire.produce_v3("txn-pipelined", 0, batch(20), correlation_id=2, transactional_id=txn_id))
        answers = [wire.parse_produce_v3(wire.recv_frame(s, timeout=30)) for _ in range(2)]
    finally:
        s.close()
    # After the first transaction's 10 records and its marker (offset 10).
    assert answers == [(NONE, 11), (NONE, 21)], answers
    commit()
    got = cf_consume(b.bootstrap, "txn-pipelined", 1, count=30)
    assert [r.value for r in got[0]] == [b"v%d" % i for i in range(30)]
    assert b.alive()
