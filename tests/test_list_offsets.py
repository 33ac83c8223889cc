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


CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.mark.parametrize("codec", sorted(CODEC_IDS))
def test_offsets_for_times_inside_compressed_batches(broker, codec):
    """By timestamp inside compressed batches: the record's own offset, as Kafka answers
    (it decompresses the batch). Spate answered the batch's base offset, so every target
    inside a batch gave its first record (franz-go found it, tests/go; Rust tests in
    src/log/batch.rs and tests/log_format.rs)."""
    topic = f"timed-{codec}"
    create_topic(broker.bootstrap, topic, 1)
    for lo, hi in ((0, 5), (5, 10)):
        cf_produce(broker.bootstrap, topic,
                   [{"value": b"t%d " % i + b"x" * 200, "partition": 0, "timestamp": TS0 + 1000 * i}
                    for i in range(lo, hi)], **{"linger.ms": 50, "compression.type": codec})
    # Both batches are stored compressed with this codec (attributes, bytes 21-22 of each
    # batch; old timestamps roll a segment per batch, as in Kafka, so every .log file).
    raw = b"".join(f.read_bytes() for f in sorted((broker.data_dir / f"{topic}-0").glob("*.log")))
    pos, codecs = 0, []
    while pos + 23 <= len(raw):
        codecs.append(int.from_bytes(raw[pos + 21:pos + 23], "big") & 7)
        pos += 12 + int.from_bytes(raw[pos + 8:pos + 12], "big")
    assert codecs == [CODEC_IDS[codec]] * 2, f"stored batches' codecs {codecs}"
    c = cf_consumer(broker.bootstrap)
    try:
        for ts, want in BY_TIME:
            (r,) = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)
            assert r.error is None, r.error
            assert r.offset == want, f"{codec}: offsets_for_times({ts - TS0:+d} ms) = {r.offset}, want {want}"
    finally:
        c.close()


def checkpoint_epochs(broker, topic, partition):
    """The partition's leader-epoch-checkpoint on disk: [(epoch, start offset)]."""
    path = broker.data_dir / f"{topic}-{partition}" / "leader-epoch-checkpoint"
    lines = path.read_text().split("\n")
    count = int(lines[1])
    return [tuple(int(x) for x in line.split()) for line in lines[2:2 + count]]


def test_list_offsets_answers_the_leader_epoch_of_each_offset(broker):
    """ListOffsets v4+ carries a leader epoch (KIP-320: consumers validate their position
    against it after a leader change): the leader's epoch for latest, the epoch the
    offset was written in otherwise, -1 for no offset. Records are written in two leader
    epochs (a restart makes the broker lead again in a new one); the answers are checked
    against the broker's leader-epoch-checkpoint."""
    topic = "epochs"
    create_topic(broker.bootstrap, topic, 1)
    cf_produce(broker.bootstrap, topic, [{"value": b"a%d" % i, "timestamp": TS0 + i} for i in range(3)])
    broker.restart()
    cf_produce(broker.bootstrap, topic, [{"value": b"b%d" % i, "timestamp": TS0 + 10 + i} for i in range(2)])
    epochs = checkpoint_epochs(broker, topic, 0)
    assert len(epochs) == 2 and epochs[1][1] == 3, epochs
    (first, _), (second, _) = epochs
    a = admin(broker.bootstrap)
    tp = TopicPartition(topic, 0)
    for spec, want in ((OffsetSpec.earliest(), (0, first)),
                       (OffsetSpec.latest(), (5, second)),
                       (OffsetSpec.for_timestamp(TS0 + 1), (1, first)),
                       (OffsetSpec.for_timestamp(TS0 + 11), (4, second)),
                       (OffsetSpec.for_timestamp(TS0 + 100), (-1, None))):  # no epoch: None
        info = a.list_offsets({tp: spec}, request_timeout=15)[tp].result(15)
        assert (info.offset, info.leader_epoch) == want, (spec, info)
