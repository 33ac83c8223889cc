"""OffsetDelete (kafka-python's KafkaAdminClient.delete_group_offsets; confluent-kafka's
Python AdminClient has no call for it):

- in an empty group the named partitions' committed offsets are deleted, the others
  stay, as OffsetFetch (from kafka-python and from confluent-kafka) shows, and a
  consumer of the group then starts where auto.offset.reset says, not at the deleted
  offset;
- the deletion is a tombstone in __consumer_offsets: after kill -9 and a restart the
  offsets are still gone and the others still there;
- while a member of the group is subscribed to a topic, its partitions are refused with
  GROUP_SUBSCRIBED_TO_TOPIC and keep their offsets; a topic the group does not consume
  is deleted in the same request;
- an unknown group is GROUP_ID_NOT_FOUND.
"""

import time

import kafka.errors as Errors
import pytest
from confluent_kafka import Consumer, TopicPartition as CfTP
from confluent_kafka import ConsumerGroupTopicPartitions
from kafka import KafkaAdminClient, TopicPartition

from helpers.clients import admin, cf_conf, cf_produce, create_topic, kp_common


def commit(bootstrap, group, offsets):
    """Commit {(topic, partition): offset} for `group` without joining it."""
    c = Consumer(cf_conf(bootstrap, **{"group.id": group, "enable.auto.commit": False}))
    try:
        c.commit(offsets=[CfTP(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def kp_committed(bootstrap, group):
    a = KafkaAdminClient(**kp_common(bootstrap))
    try:
        got = a.list_group_offsets(group)[group]
    finally:
        a.close()
    return {(tp.topic, tp.partition): om.offset for tp, om in got.items() if om.offset >= 0}


def cf_committed(bootstrap, group, partitions):
    """Committed offsets from confluent-kafka's list_consumer_group_offsets (-1001: none)."""
    req = ConsumerGroupTopicPartitions(group, [CfTP(t, p) for t, p in partitions])
    a = admin(bootstrap)  # kept referenced until the future is done
    res = a.list_consumer_group_offsets([req], require_stable=False)[group].result(30)
    return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions}


def delete_offsets(bootstrap, group, partitions):
    a = KafkaAdminClient(**kp_common(bootstrap))
    try:
        res = a.delete_group_offsets(group, [TopicPartition(t, p) for t, p in partitions])
    finally:
        a.close()
    return {(tp.topic, tp.partition): err for tp, err in res.items()}


def first_offset_read(bootstrap, group, topic, partition, timeout=30):
    """The offset a group consumer (assign(), the group's committed offset, else
    auto.offset.reset=earliest) reads first."""
    c = Consumer(cf_conf(bootstrap, **{"group.id": group, "enable.auto.commit": False,
                                        "auto.offset.reset": "earliest"}))
    try:
        c.assign([CfTP(topic, partition)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                return m.offset()
        raise AssertionError(f"nothing read from {topic}-{partition} in {timeout}s")
    finally:
        c.close()


@pytest.fixture
def topics(broker):
    create_topic(broker.bootstrap, "t1", 2)
    create_topic(broker.bootstrap, "t2", 1)
    cf_produce(broker.bootstrap, "t1", [{"value": b"v%d" % i, "partition": i % 2} for i in range(20)])
    cf_produce(broker.bootstrap, "t2", [{"value": b"w%d" % i, "partition": 0} for i in range(10)])
    return broker


ALL = [("t1", 0), ("t1", 1), ("t2", 0)]


def test_offset_delete_in_an_empty_group_survives_a_restart(topics):
    b = topics
    commit(b.bootstrap, "quiet", {("t1", 0): 5, ("t1", 1): 7, ("t2", 0): 3})
    assert kp_committed(b.bootstrap, "quiet") == {("t1", 0): 5, ("t1", 1): 7, ("t2", 0): 3}

    res = delete_offsets(b.bootstrap, "quiet", [("t1", 0), ("t2", 0)])
    assert res == {("t1", 0): Errors.NoError, ("t2", 0): Errors.NoError}, res
    assert kp_committed(b.bootstrap, "quiet") == {("t1", 1): 7}
    assert cf_committed(b.bootstrap, "quiet", ALL) == {("t1", 0): -1001, ("t1", 1): 7, ("t2", 0): -1001}
    assert first_offset_read(b.bootstrap, "quiet", "t1", 0) == 0, "the deleted offset 5 was used"
    assert first_offset_read(b.bootstrap, "quiet", "t1", 1) == 7

    b.kill()
    b.restart()
    assert kp_committed(b.bootstrap, "quiet") == {("t1", 1): 7}, "deleted offsets came back after kill -9"
    assert cf_committed(b.bootstrap, "quiet", ALL) == {("t1", 0): -1001, ("t1", 1): 7, ("t2", 0): -1001}
    assert first_offset_read(b.bootstrap, "quiet", "t2", 0) == 0


def test_offset_delete_refuses_topics_an_active_member_consumes(topics):
    b = topics
    commit(b.bootstrap, "busy", {("t1", 0): 4, ("t1", 1): 6, ("t2", 0): 2})
    member = Consumer(cf_conf(b.bootstrap, **{"group.id": "busy", "enable.auto.commit": False}))
    try:
        member.subscribe(["t1"])
        deadline = time.monotonic() + 60
        while not member.assignment():
            assert time.monotonic() < deadline, "the member got no assignment in 60 s"
            member.poll(0.2)

        res = delete_offsets(b.bootstrap, "busy", [("t1", 0), ("t1", 1), ("t2", 0)])
        assert res == {("t1", 0): Errors.GroupSubscribedToTopicError, ("t1", 1): Errors.GroupSubscribedToTopicError,
                       ("t2", 0): Errors.NoError}, res
        assert kp_committed(b.bootstrap, "busy") == {("t1", 0): 4, ("t1", 1): 6}
    finally:
        member.close()

    # The member left: the group is empty, and the topic may go.
    res = delete_offsets(b.bootstrap, "busy", [("t1", 1)])
    assert res == {("t1", 1): Errors.NoError}, res
    assert kp_committed(b.bootstrap, "busy") == {("t1", 0): 4}


def test_offset_delete_of_an_unknown_group(broker):
    with pytest.raises(Errors.GroupIdNotFoundError):
        delete_offsets(broker.bootstrap, "nobody", [("t1", 0)])


def test_fsync_always_deletions_wait_for_the_fsync(broker_factory):
    """OffsetDelete and DeleteGroups are answered once their tombstones are written and,
    under `--fsync always`, fsynced, as Kafka answers after its local append (and its
    flush, with flush.messages=1). With each group-commit round slowed by 2 s
    (`--test-fsync-delay-ms`) each answer takes at least that. (Both were answered
    before the tombstones were even written, in any mode.) After kill -9 and a restart
    the deletions hold."""
    delay_s = 2.0
    b = broker_factory("--fsync", "always", "--test-fsync-delay-ms", str(int(delay_s * 1000)), cores=1)
    create_topic(b.bootstrap, "t1", 2)
    commit(b.bootstrap, "trimmed", {("t1", 0): 5, ("t1", 1): 7})
    commit(b.bootstrap, "doomed", {("t1", 0): 3})

    t0 = time.monotonic()
    res = delete_offsets(b.bootstrap, "trimmed", [("t1", 0)])
    took = time.monotonic() - t0
    assert res == {("t1", 0): Errors.NoError}, res
    assert took >= delay_s, f"OffsetDelete answered in {took:.3f} s, before the {delay_s} s fsync"

    a = admin(b.bootstrap)
    t0 = time.monotonic()
    a.delete_consumer_groups(["doomed"], request_timeout=30)["doomed"].result(30)
    took = time.monotonic() - t0
    assert took >= delay_s, f"DeleteGroups answered in {took:.3f} s, before the {delay_s} s fsync"

    b.kill()
    b.restart()
    assert cf_committed(b.bootstrap, "trimmed", [("t1", 0), ("t1", 1)]) == {("t1", 0): -1001, ("t1", 1): 7}
    assert cf_committed(b.bootstrap, "doomed", [("t1", 0)]) == {("t1", 0): -1001}
