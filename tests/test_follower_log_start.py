"""A follower whose log ends below its leader's log start starts over there.

Three brokers; a replication-factor-3 topic with small segments and retention.bytes. A
follower is killed; the leader takes many more records and retention deletes the
segments the follower would fetch next. Restarted, the follower's fetch offset is out
of the leader's range and below its log start: it drops its log, starts at the leader's
log start (Kafka's truncateFullyAndStartAt, after a ListOffsets to the leader), catches
up and rejoins the ISR, holding the same segments as the leader. Before, it truncated
by epoch again and again and never came back.
"""

import time

from confluent_kafka import Consumer, TopicPartition

from helpers.clients import cf_conf, cf_produce, create_topic
from test_cluster import SESSION_MS
from test_replication import full_isr, start_cluster, wait_states


def leader_log_start(bootstrap, topic):
    c = Consumer(cf_conf(bootstrap, **{"group.id": "log-start-reader"}))
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0]
    finally:
        c.close()


def segments(broker, topic):
    """{base offset: bytes} of the replica's segment files."""
    d = broker.data_dir / f"{topic}-0"
    return {int(f.stem): f.read_bytes() for f in d.glob("*.log")}


def test_a_follower_below_the_leaders_log_start_starts_over_there(broker_factory):
    brokers = start_cluster(broker_factory, "--log-retention-check-interval-ms", "300")
    b1 = brokers[1]
    topic = "log-start"
    create_topic(b1.bootstrap, topic, 1, config={"segment.bytes": "4096", "retention.bytes": "16384"},
                 replication_factor=3)
    leader, replicas, _ = wait_states(b1.bootstrap, topic, full_isr, timeout=30, what="full ISR")[0]
    follower = next(r for r in replicas if r not in (1, leader))  # broker 1 runs the coordinator
    value = b"x" * 300
    cf_produce(b1.bootstrap, topic, [{"value": b"%05d" % i + value, "partition": 0} for i in range(20)], acks="all")
    wait_states(b1.bootstrap, topic, full_isr, timeout=30, what="full ISR after the first records")
    brokers[follower].kill()
    wait_states(b1.bootstrap, topic, lambda s: follower not in s[0][2], timeout=SESSION_MS / 1000 + 15,
                what=f"broker {follower} out of the ISR")
    # Many small produce calls (separate batches): segments roll, retention deletes them.
    for n in range(40):
        cf_produce(b1.bootstrap, topic,
                   [{"value": b"%05d" % (20 + 10 * n + i) + value, "partition": 0} for i in range(10)], acks=1)
    deadline = time.monotonic() + 60
    while (start := leader_log_start(b1.bootstrap, topic)) <= 20:
        assert time.monotonic() < deadline, f"retention did not move the leader's log start past 20: {start}"
        time.sleep(0.3)

    brokers[follower].restart()
    wait_states(b1.bootstrap, topic, full_isr, timeout=60, what=f"broker {follower} back in the ISR")
    assert "starting over at the leader's log start" in brokers[follower].log_text()
    # Its segments are the leader's (those both still have: retention runs on each).
    deadline = time.monotonic() + 30
    while True:
        mine, theirs = segments(brokers[follower], topic), segments(brokers[leader], topic)
        common = sorted(set(mine) & set(theirs))
        if common and min(mine) >= start and all(mine[b] == theirs[b] for b in common) \
                and max(mine) == max(theirs):
            break
        assert time.monotonic() < deadline, (
            f"follower segments {sorted(mine)} (from {min(mine) if mine else None}) vs leader's {sorted(theirs)}; "
            f"leader log start was {start}; differing: {[b for b in common if mine[b] != theirs[b]]}")
        time.sleep(0.3)
