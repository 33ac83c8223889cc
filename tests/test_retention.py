"""Retention in a running broker: retention.ms and retention.bytes delete whole old
segments on the broker's retention check (`--log-retention-check-interval-ms`, Kafka's
log.retention.check.interval.ms), never the active one.

Each record is produced in a batch of its own (flush after each) into a topic with a
small segment.bytes, so the partition holds many segments; the test reads their base
offsets from the partition directory, so it knows which ones must go. Then, with the
check every second:
- the log start offset (ListOffsets earliest) moves to the first segment that must be
  kept, and no further;
- the deleted segments' .log/.index/.timeindex files are gone, the kept ones are there;
- a consumer from the beginning reads exactly the retained records, values intact;
- the active segment stays even when every record in it has expired, and the log goes
  on from its end offset.
"""

import time

from confluent_kafka import Consumer, Producer, TopicPartition

from helpers.clients import cf_conf, cf_consume, create_topic

CHECK_MS = 1000
SEGMENT_BYTES = 1024
VALUE_BYTES = 200
HOUR_MS = 3600 * 1000
RETENTION_WAIT_S = 60  # many retention checks, on a loaded machine


def produce_one_by_one(bootstrap, topic, values, timestamp_ms=None):
    """One batch per record (default client settings: acks=all); returns the offsets."""
    p = Producer(cf_conf(bootstrap))
    offsets = []
    for v in values:
        reports = []
        kw = {"timestamp": timestamp_ms} if timestamp_ms is not None else {}
        p.produce(topic, v, partition=0, on_delivery=lambda err, msg: reports.append((err, msg)), **kw)
        assert p.flush(30) == 0, "not delivered in 30 s"
        (err, msg), = reports
        assert err is None, err
        offsets.append(msg.offset())
    return offsets


def segment_bases(broker, topic):
    """Base offsets of the partition's segments on disk, oldest first (the last is active)."""
    d = broker.data_dir / f"{topic}-0"
    return sorted(int(f.stem) for f in d.glob("*.log"))


def segment_files(broker, topic, base):
    d = broker.data_dir / f"{topic}-0"
    return [d / f"{base:020d}{ext}" for ext in (".log", ".index", ".timeindex")]


def watermarks(bootstrap, topic):
    c = Consumer(cf_conf(bootstrap, **{"group.id": "retention-watermarks"}))
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    finally:
        c.close()


def wait_log_start(bootstrap, topic, want, timeout=RETENTION_WAIT_S):
    """Wait until the log start offset reaches `want`; fail if it passes it."""
    deadline = time.monotonic() + timeout
    while True:
        low, high = watermarks(bootstrap, topic)
        assert low <= want, f"log start offset {low} went past {want} (high {high})"
        if low == want:
            return high
        assert time.monotonic() < deadline, f"log start offset still {low} after {timeout}s, want {want}"
        time.sleep(0.2)


def value(tag, i):
    return f"{tag}-{i:05d}-".encode().ljust(VALUE_BYTES, b"x")


def check_retained(broker, topic, start, produced):
    """Files below `start` gone, others there; a consumer from the beginning reads
    offsets start.. with the values produced there."""
    bases = segment_bases(broker, topic)
    assert bases and bases[0] == start, (bases, start)
    got = cf_consume(broker.bootstrap, topic, 1)[0]
    want = [(o, v) for o, v in produced if o >= start]
    assert [(r.offset, r.value) for r in got] == want, (
        f"read offsets {[r.offset for r in got]}, want {[o for o, _ in want]}")


def test_retention_ms_deletes_expired_segments_but_not_the_active_one(broker_factory):
    b = broker_factory("--log-retention-check-interval-ms", str(CHECK_MS), cores=1)
    create_topic(b.bootstrap, "aging", config={"segment.bytes": str(SEGMENT_BYTES), "retention.ms": str(600_000)})
    old_ts = int(time.time() * 1000) - HOUR_MS
    old = [value("old", i) for i in range(30)]
    old_offsets = produce_one_by_one(b.bootstrap, "aging", old, timestamp_ms=old_ts)
    new = [value("new", i) for i in range(8)]
    new_offsets = produce_one_by_one(b.bootstrap, "aging", new)
    produced = list(zip(old_offsets + new_offsets, old + new))
    assert [o for o, _ in produced] == list(range(38)), produced

    bases = segment_bases(b, "aging")
    # The segment holding the first fresh record has a fresh max timestamp: kept, with
    # everything after it. Every segment before it holds only hour-old records. A
    # retention pass (every CHECK_MS) may already have deleted those while the fresh
    # records went in (CI run r14: the 38 one-by-one produces took over a second).
    keep_from = max(x for x in bases if x <= new_offsets[0])
    assert keep_from >= 6, f"segment.bytes={SEGMENT_BYTES} should roll several segments: {bases}"
    assert len([x for x in bases if x >= keep_from]) >= 2, bases
    doomed = [x for x in bases if x < keep_from]

    high = wait_log_start(b.bootstrap, "aging", keep_from)
    assert high == 38
    for base in doomed:
        assert not any(f.exists() for f in segment_files(b, "aging", base)), f"segment {base} left on disk"
    for base in [x for x in bases if x >= keep_from]:
        assert all(f.exists() for f in segment_files(b, "aging", base)), f"segment {base} deleted"
    check_retained(b, "aging", keep_from, produced)

    # Every record expired: all segments go but the active one, which keeps its records.
    create_topic(b.bootstrap, "expired", config={"segment.bytes": str(SEGMENT_BYTES), "retention.ms": str(600_000)})
    gone = [value("gone", i) for i in range(20)]
    offsets = produce_one_by_one(b.bootstrap, "expired", gone, timestamp_ms=old_ts)
    bases = segment_bases(b, "expired")
    # Several segments were made (the active one does not start at 0); retention may
    # already have deleted some of the others while the records went in.
    active = bases[-1]
    assert active > 0, bases
    high = wait_log_start(b.bootstrap, "expired", active)
    assert high == 20
    assert segment_bases(b, "expired") == [active]
    check_retained(b, "expired", active, list(zip(offsets, gone)))
    # Later retention passes leave the expired active segment alone: a witness topic on
    # the same (single) shard shows that a later pass ran.
    create_topic(b.bootstrap, "witness", config={"segment.bytes": str(SEGMENT_BYTES), "retention.ms": str(600_000)})
    produce_one_by_one(b.bootstrap, "witness", [value("w", i) for i in range(10)], timestamp_ms=old_ts)
    wait_log_start(b.bootstrap, "witness", segment_bases(b, "witness")[-1])
    assert segment_bases(b, "expired") == [active]
    assert watermarks(b.bootstrap, "expired") == (active, 20)
    # The log goes on from where it was.
    more = produce_one_by_one(b.bootstrap, "expired", [value("more", 0)])
    assert more == [20]
    check_retained(b, "expired", active, list(zip(offsets, gone)) + [(20, value("more", 0))])


def test_retention_bytes_keeps_the_newest_segments_within_the_limit(broker_factory):
    b = broker_factory("--log-retention-check-interval-ms", str(CHECK_MS))
    retention_bytes = 3 * SEGMENT_BYTES
    create_topic(b.bootstrap, "sized", config={"segment.bytes": str(SEGMENT_BYTES), "retention.ms": "-1",
                                               "retention.bytes": str(retention_bytes)})
    values = [value("sized", i) for i in range(40)]
    offsets = produce_one_by_one(b.bootstrap, "sized", values)
    d = b.data_dir / "sized-0"
    bases = segment_bases(b, "sized")
    sizes = {x: (d / f"{x:020d}.log").stat().st_size for x in bases}
    assert sum(sizes.values()) > retention_bytes + SEGMENT_BYTES, sizes
    # Kafka's rule: drop the oldest segment while the log stays at or above
    # retention.bytes without it (never the active one).
    excess = sum(sizes.values()) - retention_bytes
    keep = list(bases)
    while len(keep) > 1 and excess >= sizes[keep[0]]:
        excess -= sizes[keep.pop(0)]
    assert keep[0] > 0

    high = wait_log_start(b.bootstrap, "sized", keep[0])
    assert high == 40
    assert segment_bases(b, "sized") == keep
    left = sum(sizes[x] for x in keep)
    assert left >= retention_bytes and left - sizes[keep[0]] < retention_bytes, (left, sizes)
    check_retained(b, "sized", keep[0], list(zip(offsets, values)))
