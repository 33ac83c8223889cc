"""Log compaction (cleanup.policy=compact) in the real broker, read back by real clients.

- 200,000 records over 1,000 keys, the last 100 keys ending in a tombstone, into a
  compacted topic with small segments (segment.ms rolls the last one): once cleaned,
  confluent-kafka and kafka-python each read exactly one record per key, the newest one,
  at the offset the producer was acknowledged for it (offsets never move); the
  partition's .log bytes shrink to a fraction; after delete.retention.ms the tombstones
  are gone too and only the 900 live keys remain. A kill -9 and restart keep it all.
- Records without a key are refused on a compacted topic (INVALID_RECORD, as Kafka), with
  KIP-467's record_errors naming them.
- `__consumer_offsets` is compacted: a group committing 100,000 times leaves a few
  segments' worth of bytes (small offsets.topic.segment.bytes so segments roll), and the
  last commit is what a restarted broker (kill -9) serves.
- Transactions: a transactional producer's aborted records are removed by the cleaner
  (a read_uncommitted consumer then sees exactly the newest committed value per key).
- kill -9 while the cleaner works, four times: every key's newest acknowledged value
  survives each restart (every step of the swap itself is stopped deterministically in
  tests/log_compaction.rs).

Waiting is polling with deadlines (the cleaner runs on its own schedule), never a sleep
that has to be long enough.
"""

import time
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from helpers.broker import free_port
from helpers.clients import cf_conf, cf_consume, create_topic, kp_consume

KEYS = 1_000
RECORDS = 200_000
TOMBSTONED = 100  # keys 0..99 end with a tombstone
SEGMENT_BYTES = 256 * 1024
DELETE_RETENTION_MS = 8_000
CLEAN_WAIT_S = 90

COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": str(SEGMENT_BYTES),
    "segment.ms": "2000",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": str(DELETE_RETENTION_MS),
}


def key(k):
    return f"key-{k:04d}".encode()


def log_bytes(broker, topic, partition=0):
    d = broker.data_dir / f"{topic}-{partition}"
    return sum(f.stat().st_size for f in d.glob("*.log"))


def produce_keyed(bootstrap, topic):
    """RECORDS keyed records (value f"{k}:{i}"), then a tombstone for keys 0..99.
    Returns {key: (offset, value)} of each key's last acknowledged record."""
    p = Producer(cf_conf(bootstrap, **{"linger.ms": 20}))
    newest = {}
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            k = msg.key()
            if k not in newest or newest[k][0] < msg.offset():
                newest[k] = (msg.offset(), msg.value())

    for i in range(RECORDS):
        k = i % KEYS
        while True:
            try:
                p.produce(topic, key=key(k), value=f"{k}:{i}".encode(), partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    # The tombstones in batches of their own, the log's last: once they go, the log's
    # last batch stays (emptied), or consumers never reached the partition's end (CI
    # timed out here when librdkafka happened to batch them apart).
    assert p.flush(60) == 0, "not all delivered"
    for k in range(TOMBSTONED):
        p.produce(topic, key=key(k), value=None, partition=0, on_delivery=on_delivery)
    assert p.flush(60) == 0, "not all delivered"
    assert not errors, errors[:3]
    assert len(newest) == KEYS
    return newest


def read_all(bootstrap, topic):
    got = cf_consume(bootstrap, topic, 1, timeout=60)[0]
    return [(r.offset, r.key, r.value) for r in got]


def expected(newest, with_tombstones):
    want = sorted((off, k, v) for k, (off, v) in newest.items() if v is not None or with_tombstones)
    return want


def wait_until(what, check, timeout=CLEAN_WAIT_S):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        ok, last = check()
        if ok:
            return last
        time.sleep(0.5)
    pytest.fail(f"{what} not reached in {timeout}s; last seen: {last}")


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line and line[0] != "#"}


def test_a_compacted_topic_keeps_each_keys_newest_record(broker_factory):
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}")
    topic = "compacted"
    create_topic(b.bootstrap, topic, 1, config=COMPACTED)
    newest = produce_keyed(b.bootstrap, topic)
    # What the records take at the least (keys and values alone, no batch or record
    # framing): the cleaner may already be at work, so the files are no measure of it.
    written = sum(len(key(i % KEYS)) + len(f"{i % KEYS}:{i}") for i in range(RECORDS))

    # First the cleaner keeps each key's newest record, the tombstones included (their
    # delete horizon starts at the pass that first sees them).
    with_tombstones = expected(newest, True)
    live_only = expected(newest, False)

    def cleaned():
        got = read_all(b.bootstrap, topic)
        return got in (with_tombstones, live_only), (len(got), got[:2])

    wait_until("one record per key", cleaned)
    for label, reader in [("confluent-kafka", read_all),
                          ("kafka-python", lambda bs, t: [(r.offset, r.key, r.value)
                                                          for r in kp_consume(bs, t, 1, timeout=60)[0]])]:
        got = reader(b.bootstrap, topic)
        assert got in (with_tombstones, live_only), f"{label}: {len(got)} records, first {got[:3]}"
    cleaned_bytes = log_bytes(b, topic)
    assert cleaned_bytes < written // 20, f"{written} bytes before, {cleaned_bytes} after cleaning"

    # After delete.retention.ms a later pass removes the tombstones.
    wait_until("tombstones gone", lambda: ((g := read_all(b.bootstrap, topic)) == live_only, len(g)))
    assert "log cleaner pass" in b.log_text()
    m = metrics(mport)
    assert m["spate_log_cleaner_passes_total"] >= 2, m
    assert m["spate_log_cleaner_errors_total"] == 0
    assert m["spate_log_cleaner_records_removed_total"] >= RECORDS + TOMBSTONED - KEYS
    assert 0 <= m[f'spate_log_cleaner_dirty_ratio{{topic="{topic}",partition="0"}}'] <= 1
    assert m[f'spate_log_cleaner_last_clean_timestamp_ms{{topic="{topic}",partition="0"}}'] > 0

    # Appends go on at the end; a kill -9 and restart keep the cleaned log as it is.
    p = Producer(cf_conf(b.bootstrap))
    p.produce(topic, key=key(5), value=b"after", partition=0)
    assert p.flush(30) == 0
    end_before = read_all(b.bootstrap, topic)
    assert end_before[-1][1:] == (key(5), b"after")
    assert end_before[-1][0] > max(off for off, _, _ in live_only)
    b.kill()
    b.restart()
    assert read_all(b.bootstrap, topic) == end_before


def test_a_compacted_topic_refuses_records_without_a_key(broker_factory):
    b = broker_factory()
    topic = "compacted-keys"
    create_topic(b.bootstrap, topic, 1, config={"cleanup.policy": "compact"})
    p = Producer(cf_conf(b.bootstrap, **{"message.timeout.ms": 10000}))
    reports = []
    # One batch each: a batch with a keyless record is refused whole (as Kafka does).
    p.produce(topic, value=b"no key", partition=0, on_delivery=lambda err, msg: reports.append(err))
    assert p.flush(30) == 0
    p.produce(topic, key=b"k", value=b"keyed", partition=0, on_delivery=lambda err, msg: reports.append(err))
    assert p.flush(30) == 0
    assert reports[0] is not None and reports[0].code() == KafkaError.INVALID_RECORD, reports
    assert reports[1] is None, reports
    # One batch of four, two keyless: refused whole, but the answer names the keyless
    # records (KIP-467 record_errors), so librdkafka fails them with INVALID_RECORD and
    # the keyed ones with _INVALID_DIFFERENT_RECORD (which a producer may resend).
    # (librdkafka 2.16 tells them apart only when there are two record errors or more.)
    batch = []
    for key in (b"k1", None, b"k2", None):
        p.produce(topic, key=key, value=b"in a batch", partition=0,
                  on_delivery=lambda err, msg: batch.append((msg.key(), err.code() if err else None)))
    assert p.flush(30) == 0
    assert batch == [(b"k1", KafkaError._INVALID_DIFFERENT_RECORD), (None, KafkaError.INVALID_RECORD),
                     (b"k2", KafkaError._INVALID_DIFFERENT_RECORD), (None, KafkaError.INVALID_RECORD)], batch
    got = read_all(b.bootstrap, topic)
    assert [(k, v) for _, k, v in got] == [(b"k", b"keyed")]


COMMITS = 100_000


def offsets_topic_bytes(broker):
    return sum(f.stat().st_size for d in broker.data_dir.glob("__consumer_offsets-*") for f in d.glob("*.log"))


def test_consumer_offsets_stays_bounded_under_many_commits(broker_factory):
    seg = 256 * 1024
    b = broker_factory("--offsets-topic-segment-bytes", str(seg))
    topic = "committed"
    create_topic(b.bootstrap, topic, 1)
    c = Consumer(cf_conf(b.bootstrap, **{"group.id": "many-commits", "enable.auto.commit": False}))
    try:
        for i in range(1, COMMITS + 1):
            while True:
                try:
                    c.commit(offsets=[TopicPartition(topic, 0, i)], asynchronous=i % 1000 != 0)
                    break
                except Exception as e:  # noqa: BLE001 - librdkafka's queue full: let it drain
                    if "QUEUE_FULL" not in str(e) and "Queue full" not in str(e):
                        raise
                    c.poll(0.05)
            c.poll(0)
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=30)
        assert tp.offset == COMMITS
    finally:
        c.close()
    # Each commit is ~100 bytes on disk: uncleaned, 100,000 of them fill ~40 segments.
    bound = 4 * seg
    wait_until("__consumer_offsets cleaned",
               lambda: ((n := offsets_topic_bytes(b)) < bound, n))
    b.kill()
    b.restart()
    c = Consumer(cf_conf(b.bootstrap, **{"group.id": "many-commits", "enable.auto.commit": False}))
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=60)
        assert tp.offset == COMMITS
    finally:
        c.close()


KILL_ROUNDS = 4


def test_kill9_while_the_cleaner_works_loses_nothing_acknowledged(broker_factory):
    """Keyed records go in, in rounds, while the cleaner works on small segments; after
    each round the broker is killed with kill -9 at once (a pass may be mid-way: a
    `.cleaned` file half written, a swap between two renames) and restarted. Every
    key's newest acknowledged value is read back after every restart, at its offset,
    and nothing is there twice below the cleaned part's end."""
    b = broker_factory()
    topic = "compacted-kill"
    create_topic(b.bootstrap, topic, 1, config={**COMPACTED, "segment.bytes": str(32 * 1024)})
    newest = {}
    for rnd in range(KILL_ROUNDS):
        p = Producer(cf_conf(b.bootstrap, **{"linger.ms": 5}))
        errors = []

        def on_delivery(err, msg):
            if err is not None:
                errors.append(err)
            elif msg.key() not in newest or newest[msg.key()][0] < msg.offset():
                newest[msg.key()] = (msg.offset(), msg.value())

        for i in range(20_000):
            k = key(i % 300)
            while True:
                try:
                    p.produce(topic, key=k, value=f"{rnd}:{i}".encode(), partition=0, on_delivery=on_delivery)
                    break
                except BufferError:
                    p.poll(0.1)
            p.poll(0)
        assert p.flush(60) == 0
        assert not errors, errors[:3]
        # Let the cleaner start on what just rolled, then kill it wherever it is.
        wait_until("a cleaner pass", lambda: (b.log_text().count("log cleaner pass") > rnd, None))
        b.kill()
        b.restart()
        got = read_all(b.bootstrap, topic)
        by_key = {}
        for off, k, v in got:
            by_key[k] = (off, v)
        for k, (off, v) in newest.items():
            assert by_key.get(k) == (off, v), (rnd, k, by_key.get(k), (off, v))
        offsets = [off for off, _, _ in got]
        assert offsets == sorted(set(offsets)), "offsets repeat or go back"


def test_aborted_transactions_are_removed_by_the_cleaner(broker_factory):
    """A compacted topic written by confluent-kafka's transactional producer (its
    defaults): transactions over overlapping keys, every third one aborted. Once the
    cleaner has passed, a read_uncommitted consumer sees what a read_committed one sees:
    exactly each key's newest committed value, at the offset it was acknowledged at. So
    the aborted records are gone from the log, not just hidden from read_committed
    readers (they would show to read_uncommitted ones)."""
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}")
    topic = "compacted-txn"
    create_topic(b.bootstrap, topic, 1, config={**COMPACTED, "segment.bytes": str(64 * 1024)})
    p = Producer(cf_conf(b.bootstrap, **{"transactional.id": "compacted-txn-app", "linger.ms": 20}))
    p.init_transactions(30)
    committed = {}
    aborted_values = set()
    keys = 50
    for txn in range(30):
        acked = {}

        def on_delivery(err, msg, acked=acked):
            assert err is None, err
            acked[msg.key()] = (msg.offset(), msg.value())

        p.begin_transaction()
        for i in range(200):
            k = key((txn * 7 + i) % keys)
            p.produce(topic, key=k, value=f"{txn}:{i}".encode(), partition=0, on_delivery=on_delivery)
        p.flush(30)
        if txn % 3 == 2:
            p.abort_transaction(30)
            aborted_values.update(v for _, v in acked.values())
        else:
            p.commit_transaction(30)
            committed.update(acked)
    want = sorted((off, k, v) for k, (off, v) in committed.items())
    assert len(want) == keys

    def read(isolation):
        got = cf_consume(b.bootstrap, topic, 1, timeout=60, **{"isolation.level": isolation})[0]
        return [(r.offset, r.key, r.value) for r in got]

    def cleaned():
        uncommitted = read("read_uncommitted")
        return uncommitted == want, (len(uncommitted), uncommitted[:2])

    wait_until("aborted records removed, one committed record per key", cleaned)
    assert read("read_committed") == want
    assert not aborted_values & {v for _, _, v in read("read_uncommitted")}
    m = metrics(mport)
    assert m["spate_log_cleaner_errors_total"] == 0
    assert m["spate_log_cleaner_records_removed_total"] >= 30 * 200 - keys
    # A restart after kill -9 serves the cleaned log as it was.
    b.kill()
    b.restart()
    assert read("read_uncommitted") == want
