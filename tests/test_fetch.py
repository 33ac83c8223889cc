"""Fetch long-poll semantics: answer when max_wait expires even if min_bytes is not
reached, and answer early when data arrives."""

import os
import threading
import time

from confluent_kafka import OFFSET_END, TopicPartition

from helpers.clients import cf_consume, cf_consumer, cf_produce, create_topic, kp_consume


def test_fetch_min_bytes_never_reached_returns_at_max_wait(broker):
    create_topic(broker.bootstrap, "minbytes", 1)
    cf_produce(broker.bootstrap, "minbytes", [{"value": b"tiny"}])
    t0 = time.monotonic()
    got = cf_consume(broker.bootstrap, "minbytes", 1, 1, timeout=20,
                     **{"fetch.min.bytes": 10_000_000, "fetch.wait.max.ms": 500})
    assert [m.value for m in got[0]] == [b"tiny"]
    assert time.monotonic() - t0 < 10
    t0 = time.monotonic()
    got = kp_consume(broker.bootstrap, "minbytes", 1, 1, timeout=20,
                     fetch_min_bytes=10_000_000, fetch_max_wait_ms=500)
    assert [m.value for m in got[0]] == [b"tiny"]
    assert time.monotonic() - t0 < 10


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
