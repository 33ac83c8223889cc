"""Restarts at scale (issue 16): 1,000 partitions of 40 records each, in four topics.
A clean stop (SIGTERM) must be quick, and so must a restart after kill -9: only what
lies above each partition's recovery point is checked, partitions recover in parallel
off the data cores, and a clean start trusts what a clean stop wrote.

Measured figures are printed (run with -s to see them; bench/README.md has the
command). Goals on the 2-core development VM: stop < 2 s, kill -9 -> serving < 5 s;
the bounds asserted are 3x that, for noisy machines. SPATE_SCALE_PARTITIONS changes
the partition count (a multiple of TOPICS)."""

import os
import signal
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from helpers.clients import admin, cf_conf, create_topic

# Serial (scripts/test runs it alone, after the parallel part): it times a restart of many partitions against goals.
pytestmark = [pytest.mark.serial, pytest.mark.slow, pytest.mark.timeout(600)]

TOPICS = 4
PARTITIONS = int(os.environ.get("SPATE_SCALE_PARTITIONS", "1000"))
RECORDS_PER_PARTITION = 40
STOP_GOAL_S = 2.0
SERVE_GOAL_S = 5.0
SLACK = 3.0


def topic_names():
    return [f"scale-{t}" for t in range(TOPICS)]


def produce_all(bootstrap):
    per_topic = PARTITIONS // TOPICS
    # Idempotent: on a loaded machine a request can time out and be retried, and the
    # records are compared exactly after the restart (a plain retry may duplicate).
    p = Producer(cf_conf(bootstrap, **{"linger.ms": 20, "enable.idempotence": True,
                                       "message.timeout.ms": 120000,
                                       "queue.buffering.max.messages": 200000}))
    failed = []

    def cb(err, _msg):
        if err is not None:
            failed.append(err)

    for i in range(RECORDS_PER_PARTITION):
        for topic in topic_names():
            for part in range(per_topic):
                value = f"{topic}/{part}/{i}".encode() + b"x" * 200
                while True:
                    try:
                        p.produce(topic, value, partition=part, on_delivery=cb)
                        break
                    except BufferError:
                        p.poll(0.05)
        p.poll(0)
    assert p.flush(120) == 0, "records not delivered in time"
    assert not failed, f"delivery failed: {failed[:3]}"


def read_all(bootstrap, timeout=120):
    """Every record of every partition, from the beginning: {(topic, partition): [values]}."""
    per_topic = PARTITIONS // TOPICS
    c = Consumer(cf_conf(bootstrap, **{"group.id": "scale-check", "enable.auto.commit": False,
                                       "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50,
                                       "enable.partition.eof": True}))
    got = {(t, p): [] for t in topic_names() for p in range(per_topic)}
    eof = set()
    try:
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for (t, p) in got])
        deadline = time.monotonic() + timeout
        while len(eof) < len(got) or any(len(v) < RECORDS_PER_PARTITION for v in got.values()):
            assert time.monotonic() < deadline, (
                f"read {sum(len(v) for v in got.values())} records in {timeout}s;"
                f" {len(eof)} of {len(got)} partitions at their end")
            for m in c.consume(1000, 0.2):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add((m.topic(), m.partition()))
                    continue
                eof.discard((m.topic(), m.partition()))
                got[(m.topic(), m.partition())].append(m.value())
    finally:
        c.close()
    return got


def check_all_there(bootstrap):
    got = read_all(bootstrap)
    for (t, p), values in got.items():
        want = [f"{t}/{p}/{i}".encode() + b"x" * 200 for i in range(RECORDS_PER_PARTITION)]
        assert values == want, f"{t}-{p}: {len(values)} records, first {values[:1]}"


def start_timed(broker):
    """Start the broker; seconds until the new process answers Metadata with every topic
    (a killed broker's socket can accept connections for a moment, so an open port alone
    proves nothing)."""
    t0 = time.monotonic()
    broker.start(timeout=120)
    a = admin(broker.bootstrap)
    while True:
        assert broker.alive(), broker.log_tail()
        assert time.monotonic() - t0 < 120, "no Metadata answer in 120 s"
        try:
            md = a.list_topics(timeout=1)
            if all(t in md.topics and len(md.topics[t].partitions) == PARTITIONS // TOPICS for t in topic_names()):
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 -- not answering yet
            pass
        time.sleep(0.02)


def test_restart_scale(broker_factory):
    broker = broker_factory("--max-broker-partitions", "5000")
    for t in topic_names():
        create_topic(broker.bootstrap, t, PARTITIONS // TOPICS, timeout=60)
    produce_all(broker.bootstrap)
    check_all_there(broker.bootstrap)
    size = sum(f.stat().st_blocks * 512 for f in broker.data_dir.rglob("*") if f.is_file())

    # Clean stop.
    t0 = time.monotonic()
    assert broker.stop(signal.SIGTERM, timeout=120) == 0
    stop_s = time.monotonic() - t0

    # Clean start.
    clean_start_s = start_timed(broker)
    check_all_there(broker.bootstrap)

    # kill -9, then the same command at once.
    broker.kill()
    t0 = time.monotonic()
    kill9_serving_s = start_timed(broker)
    check_all_there(broker.bootstrap)
    kill9_served_s = time.monotonic() - t0

    print(f"\nrestart-scale: {PARTITIONS} partitions x {RECORDS_PER_PARTITION} records,"
          f" {size / 1e6:.1f} MB on disk\n"
          f"  clean stop           {stop_s:6.2f} s (goal {STOP_GOAL_S} s)\n"
          f"  clean start -> Metadata answered    {clean_start_s:6.2f} s\n"
          f"  kill -9 -> Metadata answered        {kill9_serving_s:6.2f} s (goal {SERVE_GOAL_S} s)\n"
          f"  kill -9 -> all {PARTITIONS * RECORDS_PER_PARTITION} records read back {kill9_served_s:6.2f} s")
    assert stop_s < SLACK * STOP_GOAL_S, f"clean stop took {stop_s:.2f} s"
    assert kill9_serving_s < SLACK * SERVE_GOAL_S, f"kill -9 -> serving took {kill9_serving_s:.2f} s"
