"""Auto-commit: confluent-kafka and kafka-python group consumers with their default
auto-commit commit what they consumed, and a new member of the group resumes there."""

import time

from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaConsumer
from kafka.structs import TopicPartition as KpTopicPartition

from helpers.clients import cf_conf, cf_produce, create_topic, kp_common

GROUP_ARGS = ("--group-initial-rebalance-delay-ms", "200", "--group-min-session-timeout-ms", "1000")


def test_confluent_auto_commit_and_resume(broker_factory):
    b = broker_factory(*GROUP_ARGS)
    create_topic(b.bootstrap, "ac", 2)
    cf_produce(b.bootstrap, "ac", [{"value": b"%d" % i, "partition": i % 2} for i in range(40)])
    conf = cf_conf(b.bootstrap, **{"group.id": "auto", "enable.auto.commit": True, "auto.commit.interval.ms": 200,
                                   "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    c = Consumer(conf)
    c.subscribe(["ac"])
    got = 0
    deadline = time.monotonic() + 30
    while got < 40 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got += 1
    assert got == 40
    # The background auto-commit (every 200 ms) reaches the broker: wait for it, with a
    # deadline far beyond the interval (a loaded machine), then close.
    committed = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        committed = [tp.offset for tp in c.committed([TopicPartition("ac", 0), TopicPartition("ac", 1)], timeout=10)]
        if committed == [20, 20]:
            break
        time.sleep(0.2)
    c.close()  # commits once more on close
    assert committed == [20, 20], f"auto-commit stored {committed} within 30 s, want [20, 20]"

    # More data; a new member of the group starts where the first one stopped.
    cf_produce(b.bootstrap, "ac", [{"value": b"new%d" % i, "partition": i % 2} for i in range(4)])
    c2 = Consumer(conf)
    c2.subscribe(["ac"])
    values = []
    deadline = time.monotonic() + 30
    while len(values) < 4 and time.monotonic() < deadline:
        m = c2.poll(0.2)
        if m is not None and not m.error():
            values.append(m.value())
    c2.close()
    assert sorted(values) == [b"new0", b"new1", b"new2", b"new3"], values


def test_kafka_python_auto_commit(broker_factory):
    b = broker_factory(*GROUP_ARGS)
    create_topic(b.bootstrap, "ac-kp", 1)
    cf_produce(b.bootstrap, "ac-kp", [{"value": b"%d" % i} for i in range(25)])
    c = KafkaConsumer("ac-kp", **kp_common(b.bootstrap), group_id="auto-kp", enable_auto_commit=True,
                      auto_commit_interval_ms=200, auto_offset_reset="earliest", session_timeout_ms=6000,
                      heartbeat_interval_ms=500)
    got = 0
    deadline = time.monotonic() + 30
    while got < 25 and time.monotonic() < deadline:
        for records in c.poll(timeout_ms=200).values():
            got += len(records)
    assert got == 25
    deadline = time.monotonic() + 30
    committed = None
    while time.monotonic() < deadline:
        c.poll(timeout_ms=100)  # auto-commit runs inside poll
        committed = c.committed(KpTopicPartition("ac-kp", 0))
        if committed == 25:
            break
    c.close()
    assert committed == 25, f"auto-commit stored {committed} within 30 s, want 25"
