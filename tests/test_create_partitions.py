"""CreatePartitions: a topic grows, new partitions take data at once, and the new count
survives a restart; shrinking or unknown topics are refused."""

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import NewPartitions

from helpers.clients import admin, cf_consume, cf_produce, create_topic, topic_metadata, wait_for_topic


def grow(bootstrap, topic, total, timeout=15):
    a = admin(bootstrap)  # keep the client alive until the future resolves
    fs = a.create_partitions([NewPartitions(topic, total)], operation_timeout=timeout, request_timeout=timeout)
    return fs[topic].result(timeout)


def test_grow_topic_and_use_new_partitions(broker):
    create_topic(broker.bootstrap, "grow", 2)
    grow(broker.bootstrap, "grow", 5)
    wait_for_topic(broker.bootstrap, "grow", 5)
    out = cf_produce(broker.bootstrap, "grow", [{"value": b"p%d" % p, "partition": p} for p in range(5)])
    assert sorted(r.partition for r in out) == [0, 1, 2, 3, 4]
    got = cf_consume(broker.bootstrap, "grow", 5, count=5)
    assert {p: [r.value for r in v] for p, v in got.items()} == {p: [b"p%d" % p] for p in range(5)}

    broker.stop()
    broker.restart(new_port=True)
    assert len(topic_metadata(broker.bootstrap)["grow"]) == 5


def test_shrink_and_unknown_are_refused(broker):
    create_topic(broker.bootstrap, "fixed", 3)
    with pytest.raises(KafkaException) as ei:
        grow(broker.bootstrap, "fixed", 2)
    assert "INVALID_PARTITIONS" in str(ei.value)
    with pytest.raises(KafkaException) as ei:
        grow(broker.bootstrap, "nope", 4)
    assert "UNKNOWN_TOPIC" in str(ei.value)
    assert len(topic_metadata(broker.bootstrap)["fixed"]) == 3
