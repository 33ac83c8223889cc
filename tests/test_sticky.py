"""The sticky assignors through Spate's group coordinator: kafka-python's
StickyPartitionAssignor (eager, "sticky") and librdkafka's cooperative-sticky.

Both are client-side: the group leader computes the assignment from what each member
put in its JoinGroup metadata (its previous assignment and generation for "sticky",
its owned partitions for cooperative-sticky), which the broker must hand to the
leader unchanged, from the member's latest join, under the protocol every member
chose. What is checked is the assignors' property, not "no error": three members come
and one goes on a six-partition topic, and at every step the group is balanced and
no partition moves that need not:
- a member joins: every old member keeps a subset of what it had (it only gives up);
- a member leaves: every remaining member keeps all it had and takes some of the rest.
(The range assignor breaks both: with members A, B, C, B holds 2-3 where it held 3-5,
and when C leaves B gives partition 2 back to A.)
"""

import threading
import time

import pytest
from confluent_kafka import Consumer
from kafka import KafkaConsumer
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

from helpers.clients import cf_conf, create_topic, kp_common

GROUP_ARGS = ("--group-initial-rebalance-delay-ms", "300", "--group-min-session-timeout-ms", "1000")
PARTS = 6
SESSION_MS = 6000
STEP_TIMEOUT_S = 60  # a rebalance on a loaded 2-core machine


class Member:
    """A group member in a thread of this process: polls, records its assignment."""

    def __init__(self, name, bootstrap, group, topic, client, assignor):
        self.name, self.client = name, client
        if client == "confluent":
            self.c = Consumer(cf_conf(bootstrap, **{
                "group.id": group, "client.id": name, "partition.assignment.strategy": assignor,
                "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500}))
            self.c.subscribe([topic])
        else:
            self.c = KafkaConsumer(**kp_common(bootstrap), group_id=group, client_id=name,
                                   partition_assignment_strategy=[assignor],
                                   session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
            self.c.subscribe([topic])
        self.assignment = frozenset()
        self.history = []  # every assignment it held, in order
        self.stop = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            while not self.stop.is_set():
                if self.client == "confluent":
                    self.c.poll(0.1)
                else:
                    self.c.poll(timeout_ms=100)
                cur = frozenset(tp.partition for tp in self.c.assignment())
                if cur != self.assignment:
                    self.assignment = cur
                    self.history.append(cur)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.c.close()  # LeaveGroup

    def leave(self):
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), f"{self.name} did not close"


def wait_balanced(members, timeout=STEP_TIMEOUT_S):
    """Wait until `members` hold all partitions, disjoint, sizes within one of each
    other, and the assignment has not changed for a moment (the rebalance is over)."""
    deadline = time.monotonic() + timeout
    stable_since, last = None, None
    while True:
        for m in members:
            assert m.error is None, f"{m.name}: {m.error!r}"
        a = tuple(m.assignment for m in members)
        sizes = [len(x) for x in a]
        ok = (sorted(p for x in a for p in x) == list(range(PARTS)) and max(sizes) - min(sizes) <= 1)
        if ok and a == last:
            if time.monotonic() - stable_since >= 1.0:
                return {m.name: m.assignment for m in members}
        else:
            stable_since, last = time.monotonic(), a
        assert time.monotonic() < deadline, f"no balanced assignment in {timeout}s: " + \
            ", ".join(f"{m.name}={sorted(m.assignment)}" for m in members)
        time.sleep(0.1)


def show(a):
    return {k: sorted(v) for k, v in a.items()}


def sticky_scenario(broker, client, assignor):
    topic = group = f"sticky-{client}"
    create_topic(broker.bootstrap, topic, PARTS)
    members = []
    try:
        members.append(Member("a", broker.bootstrap, group, topic, client, assignor))
        before = wait_balanced(members)
        assert before["a"] == frozenset(range(PARTS))
        for name in ("b", "c"):
            members.append(Member(name, broker.bootstrap, group, topic, client, assignor))
            after = wait_balanced(members)
            for old, parts in before.items():
                assert after[old] <= parts, (
                    f"{name} joined and {old} got partitions it did not have: {show(before)} -> {show(after)}")
            before = after
        # c leaves: a and b keep everything and share c's partitions.
        c = members.pop()
        c.leave()
        after = wait_balanced(members)
        for old in ("a", "b"):
            assert after[old] >= before[old], (
                f"c left and {old} lost partitions: {show(before)} -> {show(after)}")
        return after
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.thread.join(30)


def test_kafka_python_sticky_assignor_keeps_partitions(broker_factory):
    b = broker_factory(*GROUP_ARGS)
    sticky_scenario(b, "kafka-python", StickyPartitionAssignor)


def test_confluent_cooperative_sticky_keeps_partitions(broker_factory):
    b = broker_factory(*GROUP_ARGS)
    sticky_scenario(b, "confluent", "cooperative-sticky")


@pytest.mark.parametrize("client,assignor", [("kafka-python", RangePartitionAssignor), ("confluent", "range")])
def test_the_check_catches_a_non_sticky_assignor(broker_factory, client, assignor):
    """The property above is not one every assignor has: with range it fails."""
    b = broker_factory(*GROUP_ARGS)
    with pytest.raises(AssertionError, match="got partitions it did not have|lost partitions"):
        sticky_scenario(b, client, assignor)
