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
