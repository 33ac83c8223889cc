"""Fetch long-poll semantics: answer when max_wait expires (not before) when min_bytes is
not reached, empty partition included, and answer early when data arrives."""

import os
import threading
import time

from confluent_kafka import OFFSET_END, KafkaError, TopicPartition
from kafka import TopicPartition as KpTopicPartition

from helpers.clients import cf_consumer, cf_produce, create_topic, kp_consumer


# Long enough that an answer given at once (a broker ignoring max_wait_ms / min_bytes)
# is told apart from one given after the wait, even with a slow client start.
MAX_WAIT_MS = 3000
# A broker that waits must answer no sooner than max_wait_ms (its timer starts after
# the clock below does), so the lower bound needs only timer slack; the upper bound is
# generous for a loaded machine.
EARLY_SLACK_S = 0.05
LATE_MARGIN_S = 15


def cf_time_to_first(bootstrap, topic, **conf):
    """Seconds from assign() (offset 0, partition 0) to the first record or EOF, and it."""
    c = cf_consumer(bootstrap, **{"fetch.wait.max.ms": MAX_WAIT_MS, **conf})
    try:
        t0 = time.monotonic()
        c.assign([TopicPartition(topic, 0, 0)])
        m = None
        while m is None and time.monotonic() - t0 < MAX_WAIT_MS / 1000 + LATE_MARGIN_S:
            m = c.poll(0.05)
        return time.monotonic() - t0, m
    finally:
        c.close()


def assert_waited(waited, what):
    wait_s = MAX_WAIT_MS / 1000
    assert waited >= wait_s - EARLY_SLACK_S, f"{what}: answered after {waited:.3f} s, before max_wait_ms ({wait_s} s)"
    assert waited < wait_s + LATE_MARGIN_S, f"{what}: answered after {waited:.1f} s, long after max_wait_ms"


def test_fetch_on_an_empty_partition_waits_max_wait(broker):
    """Nothing to read, min_bytes 1: the fetch is answered (empty, the client reports
    EOF) when max_wait_ms expires, not at once and not never."""
    create_topic(broker.bootstrap, "empty-wait", 1)
    waited, m = cf_time_to_first(broker.bootstrap, "empty-wait")
    assert m is not None and m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF, m
    assert_waited(waited, "an empty partition")


def test_fetch_min_bytes_never_reached_returns_at_max_wait(broker):
    """Some data, far less than min_bytes: the fetch waits max_wait_ms, then answers
    what there is (confluent-kafka and kafka-python)."""
    create_topic(broker.bootstrap, "minbytes", 1)
    cf_produce(broker.bootstrap, "minbytes", [{"value": b"tiny"}])
    waited, m = cf_time_to_first(broker.bootstrap, "minbytes", **{"fetch.min.bytes": 10_000_000})
    assert m is not None and not m.error() and m.value() == b"tiny", m
    assert_waited(waited, "confluent-kafka, min_bytes not reached")

    c = kp_consumer(broker.bootstrap, fetch_min_bytes=10_000_000, fetch_max_wait_ms=MAX_WAIT_MS)
    try:
        t0 = time.monotonic()
        c.assign([KpTopicPartition("minbytes", 0)])
        c.seek(KpTopicPartition("minbytes", 0), 0)
        got = []
        while not got and time.monotonic() - t0 < MAX_WAIT_MS / 1000 + LATE_MARGIN_S:
            got = [r for recs in c.poll(timeout_ms=50).values() for r in recs]
        waited = time.monotonic() - t0
        assert [r.value for r in got] == [b"tiny"], got
        assert_waited(waited, "kafka-python, min_bytes not reached")
    finally:
        c.close()


def test_long_poll_wakes_up_when_data_arrives(broker):
    create_topic(broker.bootstrap, "wakeup", 1)
    cf_produce(broker.bootstrap, "wakeup", [{"value": b"old"}])
    c = cf_consumer(broker.bootstrap, **{"fetch.wait.max.ms": 10000, "enable.partition.eof": False})
    try:
        c.assign([TopicPartition("wakeup", 0, OFFSET_END)])
        # let the consumer reach the end and park a long poll
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            m = c.poll(0.1)
            assert m is None or m.error(), f"unexpected record {m.value()!r}"
        sent = {}

        def produce_later():
            sent["t"] = time.monotonic()
            cf_produce(broker.bootstrap, "wakeup", [{"value": b"new"}], **{"linger.ms": 0})
        threading.Thread(target=produce_later).start()
        deadline = time.monotonic() + 30
        m = None
        while time.monotonic() < deadline:
            m = c.poll(0.05)
            if m is not None and not m.error():
                break
        assert m is not None and not m.error() and m.value() == b"new", m
        latency = time.monotonic() - sent["t"]
        assert latency < 5, (f"record arrived {latency:.1f}s after it was produced: the"
                             f" parked fetch (max wait 10 s) did not wake up on new data")
    finally:
        c.close()


def broker_cpu_seconds(broker):
    """User + system CPU time the broker process has used (/proc/PID/stat)."""
    with open(f"/proc/{broker.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_fetch_waiting_for_min_bytes_does_not_spin(broker):
    """A fetch whose partition has some data, but less than min_bytes, waits for new
    data without using the core: it once re-read the partition in a loop that never
    yielded, taking a whole core (and stalling the shard's other connections) until
    max_wait_ms. Found by the request_handler fuzz target (a Fetch with min_bytes
    mutated high: fuzz/regressions/request_handler/)."""
    create_topic(broker.bootstrap, "minbytes-cpu", 1)
    cf_produce(broker.bootstrap, "minbytes-cpu", [{"value": b"tiny"}])
    c = cf_consumer(broker.bootstrap, **{"fetch.min.bytes": 10_000_000, "fetch.wait.max.ms": 4000,
                                         "enable.partition.eof": False})
    try:
        # The first fetch (offset 0) finds 1 record, far below min_bytes: it waits its
        # full 4 s, then answers what there is.
        cpu0, t0 = broker_cpu_seconds(broker), time.monotonic()
        c.assign([TopicPartition("minbytes-cpu", 0, 0)])
        m = None
        while m is None and time.monotonic() - t0 < 20:
            m = c.poll(0.1)
        waited, cpu = time.monotonic() - t0, broker_cpu_seconds(broker) - cpu0
        assert m is not None and not m.error() and m.value() == b"tiny", m
        assert waited >= 3, f"the fetch answered after {waited:.1f} s, before max_wait_ms"
        assert cpu < 1.0, f"the broker used {cpu:.1f} s of CPU in {waited:.1f} s while a fetch waited for min_bytes"
    finally:
        c.close()
