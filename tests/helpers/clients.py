"""Thin wrappers over confluent-kafka, kafka-python and kcat used by the tests.

Records are normalised to `Rec(partition, offset, key, value, headers, timestamp)`
with headers as a list of (str, bytes) tuples ([] when there are none)."""

import collections
import logging
import subprocess
import time

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException,
                             Producer, TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic

Rec = collections.namedtuple("Rec", "partition offset key value headers timestamp")

CLIENT_TIMEOUT_MS = 15000

# librdkafka logs go through Python logging (captured per test by pytest) instead of
# straight to fd 2, where clients outliving their broker would spam later tests.
RDKAFKA_LOGGER = logging.getLogger("rdkafka")


def _norm_headers(h):
    if not h:
        return []
    return [(k, v if v is None else bytes(v)) for k, v in h]


# ---------------------------------------------------------------- confluent-kafka

def cf_conf(bootstrap, **extra):
    conf = {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "socket.timeout.ms": CLIENT_TIMEOUT_MS,
        "api.version.request.timeout.ms": 10000,
        "reconnect.backoff.max.ms": 1000,
        "logger": RDKAFKA_LOGGER,
    }
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


def admin(bootstrap):
    return AdminClient(cf_conf(bootstrap))


def topic_metadata(bootstrap, timeout=10):
    """{topic: {partition: leader}} from a fresh AdminClient (Metadata for all topics)."""
    md = admin(bootstrap).list_topics(timeout=timeout)
    out = {}
    for name, t in md.topics.items():
        if t.error is not None:
            continue
        out[name] = {p.id: p.leader for p in t.partitions.values()}
    return out


def wait_for_topic(bootstrap, topic, partitions=None, timeout=20):
    """Wait until metadata lists `topic` (with `partitions` partitions, all led)."""
    deadline = time.monotonic() + timeout
    last = None
    a = admin(bootstrap)
    while time.monotonic() < deadline:
        try:
            md = a.list_topics(timeout=5)
            t = md.topics.get(topic)
            last = t
            if t is not None and t.error is None:
                ps = t.partitions
                if (partitions is None or len(ps) == partitions) and ps and all(
                        p.leader >= 0 and p.error is None for p in ps.values()):
                    return t
        except KafkaException as e:
            last = e
        time.sleep(0.2)
    raise AssertionError(f"topic {topic!r} ({partitions} partitions) not in metadata after "
                         f"{timeout}s; last seen: {last!r}")


def wait_for_topic_gone(bootstrap, topic, timeout=20):
    deadline = time.monotonic() + timeout
    a = admin(bootstrap)
    while time.monotonic() < deadline:
        md = a.list_topics(timeout=5)
        t = md.topics.get(topic)
        if t is None or (t.error is not None and
                         t.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {topic!r} still in metadata {timeout}s after deletion")


def create_topic(bootstrap, name, partitions=1, config=None, timeout=20, wait=True, replication_factor=1):
    a = admin(bootstrap)
    fs = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                                   config=config or {})],
                         request_timeout=timeout, operation_timeout=timeout)
    fs[name].result(timeout)  # raises KafkaException on error
    if wait:
        wait_for_topic(bootstrap, name, partitions, timeout)


def cf_produce(bootstrap, topic, records, timeout=30, **conf):
    """Produce `records` (dicts: value, key, headers, partition, timestamp) in order with
    one confluent Producer; returns the delivery reports as Rec (with the assigned
    partition / offset) in send order.  Raises on any delivery error."""
    c = cf_conf(bootstrap, **{"linger.ms": 5, "acks": 1,
                              "message.timeout.ms": timeout * 1000, **conf})
    p = Producer(c)
    reports = [None] * len(records)

    def cb(i):
        def _cb(err, msg):
            reports[i] = (err, msg)
        return _cb

    for i, r in enumerate(records):
        kw = {}
        for k in ("key", "partition", "timestamp", "headers"):
            if r.get(k) is not None:
                kw[k] = r[k]
        while True:
            try:
                p.produce(topic, r.get("value"), on_delivery=cb(i), **kw)
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    left = p.flush(timeout)
    assert left == 0, f"{left} messages not delivered within {timeout}s"
    out = []
    for i, (err, msg) in enumerate(reports):
        assert err is None, f"delivery of record {i} failed: {err}"
        out.append(Rec(msg.partition(), msg.offset(), msg.key(), msg.value(),
                       _norm_headers(msg.headers()), msg.timestamp()[1]))
    return out


def cf_consumer(bootstrap, **conf):
    c = cf_conf(bootstrap, **{
        "group.id": "spate-tests",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        **conf})
    return Consumer(c)


def cf_consume(bootstrap, topic, partitions, count=None, timeout=30, **conf):
    """Read `topic` partitions 0..partitions-1 from the beginning with a confluent
    Consumer (assign(), no group) until every partition reports EOF (and, if given,
    `count` records arrived).  Returns {partition: [Rec...]}."""
    c = cf_consumer(bootstrap, **conf)
    got = {p: [] for p in range(partitions)}
    at_eof = set()
    n = 0
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    at_eof.add(m.partition())
                    if len(at_eof) == partitions and (count is None or n >= count):
                        return got
                    continue
                if m.error().retriable() or not m.error().fatal():
                    # transient (e.g. transport) errors: keep trying until the deadline
                    last_err = m.error()  # noqa: F841
                    continue
                raise KafkaException(m.error())
            at_eof.discard(m.partition())
            got[m.partition()].append(Rec(m.partition(), m.offset(), m.key(), m.value(),
                                          _norm_headers(m.headers()), m.timestamp()[1]))
            n += 1
        raise AssertionError(
            f"confluent consumer: timed out after {timeout}s with {n} records"
            f" (want {count}), partitions at EOF {sorted(at_eof)};"
            f" per partition: { {p: len(v) for p, v in got.items()} }")
    finally:
        c.close()


def cf_read_partition(bootstrap, topic, partition, timeout=60):
    """Values of `topic`-`partition` from the beginning up to the partition EOF (the
    high watermark), with a confluent consumer (assign(), no group)."""
    c = Consumer(cf_conf(bootstrap, **{"group.id": "spate-tests-reader", "enable.partition.eof": True,
                                        "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                continue
            out.append(m.value())
        raise AssertionError(f"no end of partition within {timeout}s; read {len(out)}")
    finally:
        c.close()



# ---------------------------------------------------------------- kafka-python

def kp_common(bootstrap):
    return dict(bootstrap_servers=[bootstrap], request_timeout_ms=CLIENT_TIMEOUT_MS + 5000,
                reconnect_backoff_max_ms=1000)


def kp_produce(bootstrap, topic, records, timeout=30, **conf):
    from kafka import KafkaProducer
    # kafka-python 3.x's defaults: idempotent, acks=all.
    p = KafkaProducer(**kp_common(bootstrap), **{"linger_ms": 5, **conf})
    try:
        futs = []
        for r in records:
            hdrs = r.get("headers")
            futs.append(p.send(topic, value=r.get("value"), key=r.get("key"),
                               partition=r.get("partition"), timestamp_ms=r.get("timestamp"),
                               headers=list(hdrs) if hdrs else None))
        p.flush(timeout)
        out = []
        for i, (f, r) in enumerate(zip(futs, records)):
            md = f.get(timeout)  # raises on error
            out.append(Rec(md.partition, md.offset, r.get("key"), r.get("value"),
                           _norm_headers(r.get("headers")), md.timestamp))
        return out
    finally:
        p.close(timeout=5)


def kp_consumer(bootstrap, **conf):
    from kafka import KafkaConsumer
    return KafkaConsumer(**kp_common(bootstrap), **{
        "group_id": None, "enable_auto_commit": False, "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": 100, **conf})


def kp_consume(bootstrap, topic, partitions, count=None, timeout=30, **conf):
    """Like cf_consume, with kafka-python: reads until `count` records (if given) and
    each partition's position has reached its end offset."""
    from kafka import TopicPartition as KTP
    c = kp_consumer(bootstrap, **conf)
    got = {p: [] for p in range(partitions)}
    n = 0
    try:
        tps = [KTP(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = c.poll(timeout_ms=200)
            for tp, msgs in batch.items():
                for m in msgs:
                    got[tp.partition].append(Rec(tp.partition, m.offset, m.key, m.value,
                                                 _norm_headers(m.headers), m.timestamp))
                    n += 1
            if count is not None and n < count:
                continue
            if not batch:
                ends = c.end_offsets(tps)
                if all(c.position(tp) >= ends[tp] for tp in tps):
                    return got
        raise AssertionError(
            f"kafka-python consumer: timed out after {timeout}s with {n} records"
            f" (want {count}); per partition: { {p: len(v) for p, v in got.items()} }")
    finally:
        c.close()


# ---------------------------------------------------------------- kcat

def kcat(bootstrap, *args, input=None, timeout=30, check=True):
    cmd = ["kcat", "-b", bootstrap, "-m", "15", *args]
    r = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n"
                             f"{r.stdout.decode(errors='replace')}\nstderr:\n"
                             f"{r.stderr.decode(errors='replace')}")
    return r


def by_partition(recs):
    out = collections.defaultdict(list)
    for r in recs:
        out[r.partition].append(r)
    return dict(out)
