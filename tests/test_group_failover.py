"""A consumer group survives the death of its coordinator's broker.

Three brokers (embedded coordinator on broker 1). `__consumer_offsets` is created with
offsets.topic.replication.factor=3 replicas once three brokers are live; commits are
written with acks=all. A confluent-kafka consumer (its defaults: auto.offset.reset
latest) consumes and commits as it goes; the broker leading the group's offsets
partition is killed with SIGKILL. The new leader loads the group's offsets from its
replica: they are there before the consumer commits again, the consumer goes on, no
record is skipped, and the final commits are the end offsets.

With group.protocol=consumer (KIP-848) the group's members, epochs and assignments come
back too (their records in `__consumer_offsets`): the member carries on at its epoch on
the new coordinator instead of rejoining.
"""

import re
import time

import pytest

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from helpers.clients import admin, cf_produce, create_topic
from test_cluster import SESSION_MS
from test_replication import partition_states, start_cluster, wait_states
from helpers.kafka_hash import java_hash_partition

OFFSETS = "__consumer_offsets"


def committed_offsets(bootstrap, group, topic, parts):
    a = admin(bootstrap)
    fs = a.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(parts)])],
        request_timeout=10)
    res = fs[group].result(15)
    return {tp.partition: tp.offset for tp in res.topic_partitions}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_group_survives_the_kill_of_its_coordinator(broker_factory, protocol):
    brokers = start_cluster(broker_factory)
    b1 = brokers[1]
    # The offsets topic: created by the active coordinator once three brokers are live.
    offsets = wait_states(b1.bootstrap, OFFSETS, lambda s: len(s) == 50 and all(
        len(r) == 3 and l >= 0 for l, r, _ in s.values()), timeout=30, what="__consumer_offsets with 3 replicas")
    offsets = wait_states(b1.bootstrap, OFFSETS, lambda s: all(len(isr) == 3 for _, _, isr in s.values()),
                          timeout=60, what="__consumer_offsets fully in sync")
    # A group whose coordinator is not broker 1 (which runs the metadata coordinator).
    group = next(g for g in (f"failover-{i}" for i in range(1000))
                 if offsets[java_hash_partition(g)][0] != 1)
    gp = java_hash_partition(group)
    victim = offsets[gp][0]

    topic, parts, n = "fo", 3, 3000
    create_topic(b1.bootstrap, topic, parts, config={"min.insync.replicas": "2"}, replication_factor=3)
    wait_states(b1.bootstrap, topic, lambda s: all(len(isr) == 3 for _, _, isr in s.values()), timeout=30,
                what="topic fully in sync")
    cf_produce(b1.bootstrap, topic, [{"value": b"v%d" % i, "partition": i % parts} for i in range(n)], acks="all")
    ends = {p: n // parts for p in range(parts)}

    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    # The group starts at offset 0: committed first (the consumer's own default,
    # auto.offset.reset=latest, would skip what is already there).
    first = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        first.commit(offsets=[TopicPartition(topic, p, 0) for p in range(parts)], asynchronous=False)
    finally:
        first.close()
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"
    c = Consumer(conf)
    seen = {p: set() for p in range(parts)}
    commits_ok, commit_errors = [], []
    last_before_kill = None
    t_kill = None
    deadline = time.monotonic() + 180
    try:
        c.subscribe([topic])
        while sum(len(s) for s in seen.values()) < n or t_kill is None:
            assert time.monotonic() < deadline, (f"consumed {sum(len(s) for s in seen.values())} of {n}; "
                                                 f"commit errors {commit_errors[-3:]}")
            msgs = c.consume(100, timeout=1)
            for m in msgs:
                if m.error() is None:
                    seen[m.partition()].add(m.offset())
            if msgs:
                try:
                    res = c.commit(asynchronous=False)
                    commits_ok.append((time.monotonic(), {tp.partition: tp.offset for tp in res}))
                except KafkaException as e:
                    commit_errors.append((time.monotonic(), str(e)))
            if t_kill is None and sum(len(s) for s in seen.values()) >= n // 3 and commits_ok:
                # What was acknowledged per partition (a partition not consumed yet
                # answers the invalid offset -1001).
                last_before_kill = {p: max((o for _, c in commits_ok for q, o in c.items() if q == p and o >= 0), default=0)
                                    for p in range(parts)}
                assert sum(last_before_kill.values()) >= n // 3, last_before_kill
                t_kill = time.monotonic()
                brokers[victim].kill()
                # The new leader of the group's offsets partition has the acknowledged
                # commits before the consumer commits again (it is not polling now).
                moved = wait_states(b1.bootstrap, OFFSETS, lambda s: s[gp][0] not in (victim, -1),
                                    timeout=SESSION_MS / 1000 + 30, what="offsets partition leader moved")
                got = None
                while time.monotonic() < t_kill + 60:
                    try:
                        got = committed_offsets(b1.bootstrap, group, topic, parts)
                        break
                    except KafkaException:
                        time.sleep(0.2)
                t_loaded = time.monotonic()
                assert got is not None, "the group's offsets could not be read after the failover"
                for p, o in last_before_kill.items():
                    assert got.get(p, -1) >= o, (
                        f"new coordinator (broker {moved[gp][0]}) lost commits: {got} < {last_before_kill}")
        first_ok_after = next(t for t, _ in commits_ok if t > t_kill)
    finally:
        c.close()

    # No record skipped: every offset of every partition was consumed.
    for p in range(parts):
        missing = set(range(ends[p])) - seen[p]
        assert not missing, f"partition {p}: {len(missing)} records skipped, e.g. {sorted(missing)[:5]}"
    final = committed_offsets(b1.bootstrap, group, topic, parts)
    assert final == ends, (final, ends)
    if protocol == "consumer":
        # The new coordinator loaded the member: it never had to rejoin (epoch 0) there.
        new_coordinator = brokers[moved[gp][0]]
        beats = [line for line in new_coordinator.log_text().splitlines()
                 if "consumer group epoch bumped" in line and f'group="{group}"' in line]
        assert beats, "the member's heartbeats never reached the new coordinator"
        rejoins = [line for line in beats if re.search(r"member_epoch=0\b", line)]
        assert not rejoins, f"the member rejoined the new coordinator: {rejoins}"
    # The killed broker comes back as a follower; the commits are still the end offsets.
    brokers[victim].restart()
    wait_states(b1.bootstrap, OFFSETS, lambda s: len(s[gp][2]) == 3, timeout=60, what="offsets partition ISR back")
    assert committed_offsets(b1.bootstrap, group, topic, parts) == ends
    print(f"group coordinator (broker {victim}) killed with SIGKILL after {sum(last_before_kill.values())} "
          f"committed: offsets readable from the new coordinator after {t_loaded - t_kill:.1f} s, first "
          f"successful commit {first_ok_after - t_kill:.1f} s after the kill "
          f"(broker.session.timeout.ms={SESSION_MS}); {len(commit_errors)} failed commits retried; "
          f"0 of {n} records skipped")
