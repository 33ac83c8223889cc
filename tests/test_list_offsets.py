"""ListOffsets: earliest / latest (watermarks) and by timestamp, from every client."""

import json
import time

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, TopicPartition
from confluent_kafka.admin import OffsetSpec

from helpers.clients import admin, cf_consume, cf_consumer, cf_produce, create_topic, kcat, \
    kp_consumer

TS0 = 1_700_000_000_000  # fixed CreateTime timestamps, 1 s apart


@pytest.fixture
def timed_topic(broker):
    """'timed' partition 0: offsets 0..9 with timestamps TS0 + 1000*i, written as two
    batches (0..4 and 5..9); partition 1: 3 records; partition 2: empty."""
    create_topic(broker.bootstrap, "timed", 3)
    for lo, hi in ((0, 5), (5, 10)):
        cf_produce(broker.bootstrap, "timed",
                   [{"value": b"t%d" % i, "partition": 0, "timestamp": TS0 + 1000 * i}
                    for i in range(lo, hi)], **{"linger.ms": 50})
    cf_produce(broker.bootstrap, "timed",
               [{"value": b"p1-%d" % i, "partition": 1, "timestamp": TS0 + i} for i in range(3)])
    return "timed"


# (target timestamp, expected offset in partition 0; -1 = no such record)
BY_TIME = [
    (TS0 - 100000, 0),
    (TS0, 0),
    (TS0 + 1, 1),
    (TS0 + 2500, 3),
    (TS0 + 4000, 4),
    (TS0 + 4001, 5),   # first record of the second batch
    (TS0 + 7000, 7),
    (TS0 + 9000, 9),
    (TS0 + 9001, -1),  # after the last record
]


def test_watermarks_confluent(broker, timed_topic):
    c = cf_consumer(broker.bootstrap)
    try:
        for p, want in ((0, (0, 10)), (1, (0, 3)), (2, (0, 0))):
            got = c.get_watermark_offsets(TopicPartition(timed_topic, p), timeout=10,
                                          cached=False)
            assert tuple(got) == want, f"partition {p}: watermarks {got}, want {want}"
    finally:
        c.close()


def test_offsets_for_times_confluent(broker, timed_topic):
    c = cf_consumer(broker.bootstrap)
    try:
        for ts, want in BY_TIME:
            (r,) = c.offsets_for_times([TopicPartition(timed_topic, 0, ts)], timeout=10)
            assert r.error is None, r.error
            assert r.offset == want, f"offsets_for_times({ts - TS0:+d} ms) = {r.offset}, want {want}"
        (r,) = c.offsets_for_times([TopicPartition(timed_topic, 2, TS0)], timeout=10)
        assert r.offset == -1, f"empty partition: {r.offset}"
        (r,) = c.offsets_for_times([TopicPartition(timed_topic, 1, TS0 + 1)], timeout=10)
        assert r.offset == 1
    finally:
        c.close()


def test_list_offsets_admin_client(broker, timed_topic):
    a = admin(broker.bootstrap)
    tp0, tp1, tp2 = (TopicPartition(timed_topic, p) for p in range(3))
    for spec, want in ((OffsetSpec.earliest(), {0: 0, 1: 0, 2: 0}),
                       (OffsetSpec.latest(), {0: 10, 1: 3, 2: 0})):
        fs = a.list_offsets({tp0: spec, tp1: spec, tp2: spec}, request_timeout=15)
        got = {tp.partition: f.result(15).offset for tp, f in fs.items()}
        assert got == want, (spec, got)
    for ts, want in BY_TIME:
        fs = a.list_offsets({tp0: OffsetSpec.for_timestamp(ts)}, request_timeout=15)
        info = list(fs.values())[0].result(15)
        assert info.offset == want, f"for_timestamp({ts - TS0:+d} ms) = {info.offset}, want {want}"
        if want >= 0:
            assert info.timestamp == TS0 + 1000 * want, info.timestamp


def test_list_offsets_kafka_python(broker, timed_topic):
    from kafka import TopicPartition as KTP
    c = kp_consumer(broker.bootstrap)
    try:
        tps = [KTP(timed_topic, p) for p in range(3)]
        assert c.beginning_offsets(tps) == {tps[0]: 0, tps[1]: 0, tps[2]: 0}
        assert c.end_offsets(tps) == {tps[0]: 10, tps[1]: 3, tps[2]: 0}
        for ts, want in BY_TIME:
            r = c.offsets_for_times({tps[0]: ts})[tps[0]]
            if want < 0:
                assert r is None, f"offsets_for_times({ts - TS0:+d}) = {r}, want None"
            else:
                assert r is not None and r.offset == want, (ts - TS0, r, want)
                assert r.timestamp == TS0 + 1000 * want, r
    finally:
        c.close()


def test_list_offsets_kcat(broker, timed_topic):
    for ts, want in BY_TIME:
        # -J: one JSON document {topic: {partition: {"offset": n, ...}}}, read exactly
        # (a substring match of "offset 1" would accept "offset 10").
        r = kcat(broker.bootstrap, "-Q", "-J", "-t", f"{timed_topic}:0:{ts}")
        out = r.stdout.decode()
        got = json.loads(out)[timed_topic]["0"]
        assert "error" not in got, f"kcat -Q {ts - TS0:+d}: {out!r}"
        assert got["offset"] == want, f"kcat -Q {ts - TS0:+d}: offset {got['offset']}, want {want} ({out!r})"


def test_log_append_time_topic(broker):
    create_topic(broker.bootstrap, "lat", 1, config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    cf_produce(broker.bootstrap, "lat",
               [{"value": b"x%d" % i, "timestamp": 1_000_000_000_000 + i} for i in range(5)])
    after = int(time.time() * 1000)
    got = cf_consume(broker.bootstrap, "lat", 1, 5)[0]
    for m in got:
        assert before - 5000 <= m.timestamp <= after + 5000, (
            f"LogAppendTime topic: record timestamp {m.timestamp} not broker time "
            f"[{before}, {after}]")
    c = cf_consumer(broker.bootstrap)
    try:
        c.assign([TopicPartition("lat", 0, 0)])
        m = None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                break
        assert m is not None and not m.error()
        assert m.timestamp()[0] == TIMESTAMP_LOG_APPEND_TIME, m.timestamp()
        # by-time lookups use the append time too
        (r,) = c.offsets_for_times([TopicPartition("lat", 0, 1_000_000_000_000)], timeout=10)
        assert r.offset == 0
        (r,) = c.offsets_for_times([TopicPartition("lat", 0, after + 60000)], timeout=10)
        assert r.offset == -1
    finally:
        c.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_offsets_for_times_inside_a_compressed_batch(broker, codec):
    """Kafka answers a lookup by time with the exact record inside a compressed batch (it
    decompresses the batch); Spate answered the batch's base offset and max timestamp
    (found by the Java client, tests/java CodecsAndOffsets). One batch of 10 records."""
    topic = f"timed-{codec}"
    create_topic(broker.bootstrap, topic, 1)
    cf_produce(broker.bootstrap, topic,
               [{"value": b"z%d" % i * 50, "partition": 0, "timestamp": TS0 + 1000 * i} for i in range(10)],
               **{"linger.ms": 200, "compression.codec": codec})
    c = cf_consumer(broker.bootstrap)
    try:
        got = []
        for i in range(10):
            (r,) = c.offsets_for_times([TopicPartition(topic, 0, TS0 + 1000 * i - 500)], timeout=10)
            got.append(r.offset)
        assert got == list(range(10)), f"{codec}: offsets_for_times(TS0 + 1000*i - 500) = {got}"
        (r,) = c.offsets_for_times([TopicPartition(topic, 0, TS0 + 9001)], timeout=10)
        assert r.offset == -1, r
    finally:
        c.close()
    records = cf_consume(broker.bootstrap, topic, 1, count=10)[0]
    assert [(r.offset, r.timestamp) for r in records] == [(i, TS0 + 1000 * i) for i in range(10)]
