"""ListOffsets: earliest / latest (watermarks) and by timestamp, from every client; max
timestamp (-3, v7, KIP-734), earliest local (-4, v8) and latest tiered (-5, v9/v10) in raw
requests of every version that has them and from confluent-kafka's AdminClient (Kafka's
kafka-get-offsets --time -3 is in test_kafka_tools.py)."""

import json
import struct
import time

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, TopicPartition
from confluent_kafka.admin import OffsetSpec

from helpers.clients import admin, cf_consume, cf_consumer, cf_produce, create_topic, kcat, \
    kp_consumer
from helpers.wire import _read_uvarint, _varint_unsigned, api_versions_request, call, frame, \
    parse_api_versions_v0, produce_v3_settled, record_batch, request_header_v1

TS0 = 1_700_000_000_000  # fixed CreateTime timestamps, 1 s apart


@pytest.fixture
def timed_topic(broker):
    """'timed' partition 0: offsets 0..9 with timestamps TS0 + 1000*i, written as two
    batches (0..4 and 5..9); partition 1: 3 records; partition 2: empty."""
    create_topic(broker.bootstrap, "timed", 3)
    for lo, hi in ((0, 5), (5, 10)):
        cf_produce(broker.bootstrap, "timed",
                   [{"value": b"t%d" % i, "partition": 0, "timestamp": TS0 + 1000 * i}
                    for i in range(lo, hi)], **{"linger.ms": 10000})
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
                    for i in range(lo, hi)], **{"linger.ms": 10000, "compression.type": codec})
    # Every batch is stored compressed with this codec (attributes, bytes 21-22 of each
    # batch; old timestamps roll a segment per batch, as in Kafka, so every .log file),
    # and the lookups land inside multi-record batches. The long linger makes each call
    # one batch as a rule (flush() sends at once, whatever the linger, and by then all
    # five records are queued), but librdkafka has still sent a call's first record
    # alone (CI, stop 33), so the check asks for a batch of several records, not for two.
    raw = b"".join(f.read_bytes() for f in sorted((broker.data_dir / f"{topic}-0").glob("*.log")))
    pos, codecs, counts = 0, [], []
    while pos + 61 <= len(raw):
        codecs.append(int.from_bytes(raw[pos + 21:pos + 23], "big") & 7)
        counts.append(int.from_bytes(raw[pos + 57:pos + 61], "big"))
        pos += 12 + int.from_bytes(raw[pos + 8:pos + 12], "big")
    assert codecs == [CODEC_IDS[codec]] * len(codecs) and sum(counts) == 10, f"stored batches {codecs} {counts}"
    assert max(counts) >= 3, f"no batch of several records: {counts}"
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


# ---------------------------------------------------------------- max timestamp (KIP-734)

MAX_TS = TS0 + 9_000
# Batches written by max_timestamp_topic: (first offset, record timestamps, codec). The
# largest timestamp is first reached inside the compressed batch, by a record that is
# not its last; a later batch has it again (Kafka answers the earliest).
MAX_TS_BATCHES = [
    (0, [TS0 + 5_000, TS0 + 1_000, TS0 + 3_000], "none"),
    (3, [TS0 + 2_000, MAX_TS, MAX_TS, TS0 + 4_000], "gzip"),
    (7, [MAX_TS], "none"),
    (8, [TS0 + 6_000], "none"),
]
MAX_TS_OFFSET = 4
CODECS = {"none": 0, **CODEC_IDS}


def stored_batches(broker, topic):
    """[(base offset, record count, codec id, max timestamp)] of every batch on disk."""
    raw = b"".join(f.read_bytes() for f in sorted((broker.data_dir / f"{topic}-0").glob("*.log")))
    pos, out = 0, []
    while pos + 61 <= len(raw):
        base, length = struct.unpack(">qi", raw[pos:pos + 12])
        attributes, last_delta, _first_ts, max_ts = struct.unpack(">hiqq", raw[pos + 21:pos + 43])
        out.append((base, last_delta + 1, attributes & 7, max_ts))
        pos += 12 + length
    return out


def max_timestamp_topic(bootstrap, broker, topic):
    """Writes MAX_TS_BATCHES to `topic` (one partition), each batch in its own Produce
    request, and checks that they are stored as those batches. The batches are built
    here: librdkafka once split the first one in two (CI, stop 33) though it was produced
    with linger.ms=10000, and which record comes first inside which batch is what these
    tests are about."""
    create_topic(bootstrap, topic, 1)
    for first, stamps, codec in MAX_TS_BATCHES:
        batch = record_batch([b"v%d " % i + b"x" * 200 for i in range(len(stamps))], timestamps=stamps,
                             gzip=codec == "gzip")
        # A new partition may not be led yet: its retriable answers are sent again.
        error, base = produce_v3_settled(broker.port, topic, 0, batch, acks=1)
        assert (error, base) == (0, first), f"batch at {first}: error {error}, base offset {base}"
    want = [(first, len(stamps), CODECS[codec], max(stamps)) for first, stamps, codec in MAX_TS_BATCHES]
    assert stored_batches(broker, topic) == want


def list_offsets_request(version, topic, specs, isolation_level=0, correlation_id=7):
    """A ListOffsets frame, v1 to v10 (flexible from v6), for partitions {partition: timestamp}."""
    flexible = version >= 6

    def array(n):
        return _varint_unsigned(n + 1) if flexible else struct.pack(">i", n)

    def string(s):
        b = s.encode()
        return (_varint_unsigned(len(b) + 1) if flexible else struct.pack(">h", len(b))) + b

    tags = b"\x00" if flexible else b""
    body = struct.pack(">i", -1) + (struct.pack(">b", isolation_level) if version >= 2 else b"")
    body += array(1) + string(topic) + array(len(specs))
    for partition, ts in specs.items():
        body += struct.pack(">i", partition)
        if version >= 4:
            body += struct.pack(">i", -1)  # current leader epoch: unknown
        body += struct.pack(">q", ts) + tags
    body += tags + (struct.pack(">i", 30_000) if version >= 10 else b"") + tags
    return frame(request_header_v1(2, version, correlation_id) + tags + body)


def parse_list_offsets(version, resp):
    """-> {partition: (error, timestamp, offset, leader_epoch or None before v4)}, checking
    that the whole response was read."""
    flexible = version >= 6
    off = 4  # correlation id
    if flexible:
        _, off = _read_uvarint(resp, off)

    def count(off):
        if flexible:
            n, off = _read_uvarint(resp, off)
            return n - 1, off
        return struct.unpack(">i", resp[off:off + 4])[0], off + 4

    off += 4 if version >= 2 else 0  # throttle time (v2+)
    n_topics, off = count(off)
    assert n_topics == 1
    if flexible:
        n, off = _read_uvarint(resp, off)
        off += n - 1
    else:
        (n,) = struct.unpack(">h", resp[off:off + 2])
        off += 2 + n
    n_parts, off = count(off)
    out = {}
    for _ in range(n_parts):
        partition, error, ts, offset = struct.unpack(">ihqq", resp[off:off + 22])
        off += 22
        epoch = None
        if version >= 4:
            (epoch,) = struct.unpack(">i", resp[off:off + 4])
            off += 4
        if flexible:
            _, off = _read_uvarint(resp, off)
        out[partition] = (error, ts, offset, epoch)
    if flexible:
        _, off = _read_uvarint(resp, off)
        _, off = _read_uvarint(resp, off)
    assert off == len(resp), f"ListOffsets v{version}: {len(resp) - off} bytes left unread"
    return out


def test_api_versions_advertises_list_offsets_1_to_11(broker):
    _corr, err, apis = parse_api_versions_v0(call(broker.port, api_versions_request()))
    assert err == 0 and apis[2] == (1, 11), apis.get(2)


def test_max_timestamp_earliest_local_and_latest_tiered_raw(broker):
    """Raw ListOffsets v7..v10: -3 answers the first record carrying the largest
    timestamp (inside a gzip batch, not its last record) with that timestamp and its
    batch's leader epoch; -4 the log start (no tiered storage), which DeleteRecords moves;
    -5 offset -1 and epoch -1 with no error, as Kafka without remote storage. Earliest and
    latest are unchanged at every version from v1."""
    topic = "max-ts-raw"
    max_timestamp_topic(broker.bootstrap, broker, topic)
    (epoch, _start), = checkpoint_epochs(broker, topic, 0)
    end = MAX_TS_BATCHES[-1][0] + len(MAX_TS_BATCHES[-1][1])

    def ask(version, ts):
        got = parse_list_offsets(version, call(broker.port, list_offsets_request(version, topic, {0: ts})))
        return got[0]

    for version in range(7, 11):
        assert ask(version, -3) == (0, MAX_TS, MAX_TS_OFFSET, epoch), f"v{version} max timestamp"
    for version in range(8, 11):
        assert ask(version, -4) == (0, -1, 0, epoch), f"v{version} earliest local"
    for version in (9, 10):
        assert ask(version, -5) == (0, -1, -1, -1), f"v{version} latest tiered"
    for version in range(1, 11):
        e = epoch if version >= 4 else None
        assert ask(version, -2) == (0, -1, 0, e), f"v{version} earliest"
        assert ask(version, -1) == (0, -1, end, e), f"v{version} latest"
        assert ask(version, TS0 + 5_500) == (0, MAX_TS, MAX_TS_OFFSET, e), f"v{version} by timestamp"

    # The log start moves (DeleteRecords): earliest local follows it; max timestamp, as in
    # Kafka, still names the record in the segment that remains.
    a = admin(broker.bootstrap)
    from confluent_kafka import TopicPartition as TP
    a.delete_records([TP(topic, 0, 2)], request_timeout=15)[TP(topic, 0, 2)].result(15)
    assert ask(8, -4) == (0, -1, 2, epoch)
    assert ask(8, -2) == (0, -1, 2, epoch)
    assert ask(7, -3) == (0, MAX_TS, MAX_TS_OFFSET, epoch)


def test_max_timestamp_admin_client(broker):
    """confluent-kafka's AdminClient OffsetSpec.max_timestamp() (ListOffsets v7): the
    offset and timestamp of the first record with the largest timestamp; an empty
    partition has none (-1)."""
    topic = "max-ts-admin"
    max_timestamp_topic(broker.bootstrap, broker, topic)
    create_topic(broker.bootstrap, "max-ts-empty", 1)
    a = admin(broker.bootstrap)
    tp, empty = TopicPartition(topic, 0), TopicPartition("max-ts-empty", 0)
    fs = a.list_offsets({tp: OffsetSpec.max_timestamp(), empty: OffsetSpec.max_timestamp()}, request_timeout=15)
    info = fs[tp].result(15)
    assert (info.offset, info.timestamp) == (MAX_TS_OFFSET, MAX_TS), info
    info = fs[empty].result(15)
    assert info.offset == -1, info


def test_max_timestamp_is_bounded_by_what_a_consumer_may_read(broker):
    """A record with the largest timestamp inside an open transaction: read_uncommitted
    (below the high watermark) is answered with it, read_committed (below the last
    stable offset) with -1, as Kafka bounds timestamp lookups; after the commit both. The
    record is stamped ten minutes ahead so that the commit marker (a control batch stamped
    with the broker's clock, which counts as in Kafka) stays below it."""
    from confluent_kafka import Producer
    from helpers.clients import cf_conf
    topic = "max-ts-txn"
    create_topic(broker.bootstrap, topic, 1)
    cf_produce(broker.bootstrap, topic, [{"value": b"a", "partition": 0, "timestamp": TS0}])
    p = Producer(cf_conf(broker.bootstrap, **{"transactional.id": "max-ts-txn"}))
    p.init_transactions(30)
    p.begin_transaction()
    ahead_ms = int(time.time() * 1000) + 600_000
    p.produce(topic, b"in-txn", partition=0, timestamp=ahead_ms)
    p.flush(30)

    def ask(isolation_level):
        resp = call(broker.port, list_offsets_request(7, topic, {0: -3}, isolation_level))
        error, ts, offset, _epoch = parse_list_offsets(7, resp)[0]
        assert error == 0
        return offset, ts

    assert ask(0) == (1, ahead_ms)
    assert ask(1) == (-1, -1)
    p.commit_transaction(30)
    # The markers are written after EndTxn answers: wait for the last stable offset.
    deadline = time.monotonic() + 30
    while (got := ask(1)) != (1, ahead_ms) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the condition, with a deadline
    assert got == (1, ahead_ms), f"read_committed after the commit: {got}"
