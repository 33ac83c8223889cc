"""confluent-kafka (librdkafka) and kafka-python against each other through the broker."""

import os
import time

import pytest

from helpers.clients import (cf_consume, cf_produce, create_topic, kp_consume, kp_produce,
                             wait_for_topic, wait_for_topic_gone)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
DIRECTIONS = [("confluent", "kafka-python"), ("kafka-python", "confluent")]


def produce(client, bootstrap, topic, records, codec="none", **conf):
    if client == "confluent":
        return cf_produce(bootstrap, topic, records, **{"compression.type": codec, **conf})
    return kp_produce(bootstrap, topic, records,
                      compression_type=None if codec == "none" else codec, **conf)


def consume(client, bootstrap, topic, partitions, count, **conf):
    if client == "confluent":
        return cf_consume(bootstrap, topic, partitions, count, **conf)
    return kp_consume(bootstrap, topic, partitions, count, **conf)


def make_records(n, tag, ts0):
    recs = []
    for i in range(n):
        headers = [("idx", str(i).encode()), ("tag", tag.encode()),
                   ("bin", bytes([i % 256, 0, 255, 10]))]
        if i % 5 == 0:
            headers += [("dup", b"first"), ("dup", b"second")]
        if i % 7 == 0:
            headers.append(("empty", b""))
        value = (f"{tag} message {i} ".encode() * (1 + i % 20)) + bytes(range(i % 64))
        if i % 11 == 0:
            value = b""
        recs.append({"key": f"key-{i % 17}".encode(), "value": value,
                     "headers": headers, "timestamp": ts0 + i})
    return recs


def check_roundtrip(records, reports, consumed, partitions):
    """records: what we sent (send order); reports: delivery reports (partition/offset);
    consumed: {partition: [Rec]} read back by the other client."""
    assert len(reports) == len(records)
    expected = {p: [] for p in range(partitions)}
    for r, rep in zip(records, reports):
        expected[rep.partition].append(
            (rep.offset, r["key"], r["value"], r["headers"], r["timestamp"]))
    assert len([p for p in expected if expected[p]]) > 1, "keys did not spread over partitions"
    for p in range(partitions):
        offsets = [e[0] for e in expected[p]]
        assert offsets == sorted(offsets), f"partition {p}: acked offsets out of send order"
        got = [(m.offset, m.key, m.value, m.headers, m.timestamp) for m in consumed[p]]
        assert len(got) == len(expected[p]), (
            f"partition {p}: consumed {len(got)} records, produced {len(expected[p])}")
        for i, (g, e) in enumerate(zip(got, expected[p])):
            assert g == e, f"partition {p} record #{i}:\n got      {g!r}\n expected {e!r}"


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("producer,consumer", DIRECTIONS, ids=["cf-to-kp", "kp-to-cf"])
def test_cross_client_codecs(broker, producer, consumer, codec):
    topic = f"x-{producer}-{codec}"
    create_topic(broker.bootstrap, topic, 3)
    ts0 = int(time.time() * 1000) - 100000
    records = make_records(300, f"{producer}/{codec}", ts0)
    reports = produce(producer, broker.bootstrap, topic, records, codec)
    consumed = consume(consumer, broker.bootstrap, topic, 3, len(records))
    check_roundtrip(records, reports, consumed, 3)


@pytest.mark.parametrize("producer,consumer", DIRECTIONS, ids=["cf-to-kp", "kp-to-cf"])
def test_one_megabyte_message(broker, producer, consumer):
    topic = f"big-{producer}"
    create_topic(broker.bootstrap, topic, 1, config={"max.message.bytes": "3000000"})
    big = os.urandom(1024 * 1024)
    records = [{"key": b"before", "value": b"small-1", "timestamp": 1_600_000_000_000},
               {"key": b"big", "value": big, "headers": [("size", b"1MiB")],
                "timestamp": 1_600_000_000_001},
               {"key": b"after", "value": b"small-2", "timestamp": 1_600_000_000_002}]
    if producer == "confluent":
        reports = produce(producer, broker.bootstrap, topic, records,
                          **{"message.max.bytes": 3000000, "linger.ms": 0})
    else:
        reports = produce(producer, broker.bootstrap, topic, records,
                          max_request_size=3000000, linger_ms=0)
    for r in records:
        r.setdefault("headers", [])
    if consumer == "confluent":
        consumed = consume(consumer, broker.bootstrap, topic, 1, 3,
                           **{"max.partition.fetch.bytes": 5000000, "fetch.max.bytes": 10000000})
    else:
        consumed = consume(consumer, broker.bootstrap, topic, 1, 3,
                           max_partition_fetch_bytes=5000000, fetch_max_bytes=10000000,
                           receive_message_max_bytes=20000000)
    check_roundtrip_single(records, reports, consumed[0])


def check_roundtrip_single(records, reports, consumed):
    assert [m.offset for m in consumed] == [r.offset for r in reports] == [0, 1, 2]
    for r, m in zip(records, consumed):
        assert m.key == r["key"]
        assert len(m.value) == len(r["value"]) and m.value == r["value"], (
            f"value of {r['key']!r} differs (len {len(m.value)} vs {len(r['value'])})")
        assert m.headers == r["headers"]
        assert m.timestamp == r["timestamp"]


def test_max_message_bytes_enforced(broker):
    topic = "small-limit"
    create_topic(broker.bootstrap, topic, 1, config={"max.message.bytes": "10000"})
    with pytest.raises(AssertionError) as ei:
        cf_produce(broker.bootstrap, topic, [{"value": os.urandom(50000)}],
                   **{"message.max.bytes": 3000000, "message.timeout.ms": 10000, "retries": 0})
    assert "Broker: Message size too large" in str(ei.value) or "MSG_SIZE_TOO_LARGE" in str(
        ei.value), str(ei.value)
    # a message under the limit still goes through, and the rejected one left no trace
    reports = cf_produce(broker.bootstrap, topic, [{"value": b"fits"}])
    assert reports[0].offset == 0
    got = cf_consume(broker.bootstrap, topic, 1, 1)
    assert [m.value for m in got[0]] == [b"fits"]


def test_kafka_python_admin(broker):
    from kafka.admin import KafkaAdminClient, NewTopic
    a = KafkaAdminClient(bootstrap_servers=[broker.bootstrap], request_timeout_ms=15000)
    try:
        a.create_topics([NewTopic("kp-admin", num_partitions=3, replication_factor=1,
                                  topic_configs={"retention.ms": "86400000"})],
                        timeout_ms=15000)
        wait_for_topic(broker.bootstrap, "kp-admin", 3)
        reports = kp_produce(broker.bootstrap, "kp-admin",
                             [{"value": b"v%d" % i, "partition": i % 3} for i in range(9)])
        assert sorted((r.partition, r.offset) for r in reports) == [
            (p, o) for p in range(3) for o in range(3)]
        a.delete_topics(["kp-admin"], timeout_ms=15000)
        wait_for_topic_gone(broker.bootstrap, "kp-admin")
    finally:
        a.close()


def test_kafka_python_admin_list_and_describe_topics(broker):
    """KafkaAdminClient's Metadata requests ask for authorized operations
    (include_*_authorized_operations=true); a broker without an authorizer answers
    with the bit set of all supported operations, as Kafka does."""
    from kafka.admin import KafkaAdminClient
    create_topic(broker.bootstrap, "kp-list", 2)
    a = KafkaAdminClient(bootstrap_servers=[broker.bootstrap], request_timeout_ms=15000)
    try:
        assert "kp-list" in a.list_topics()
        (d,) = a.describe_topics(["kp-list"])
        # kafka-python 3.x names the topic `name` and decodes the operations bit set.
        assert d["name"] == "kp-list" and len(d["partitions"]) == 2, d
        assert {"READ", "WRITE", "DESCRIBE"} <= set(d["authorized_operations"]), d
        c = a.describe_cluster()
        assert [b["port"] for b in c["brokers"]] == [broker.port], c
    finally:
        a.close()


def test_confluent_producer_explicit_partitions(broker):
    """acks=0 and acks=all (-1, treated as 1) both work; explicit partitions honoured."""
    create_topic(broker.bootstrap, "acks", 2)
    r1 = cf_produce(broker.bootstrap, "acks",
                    [{"value": b"all-%d" % i, "partition": i % 2} for i in range(10)],
                    acks="all")
    assert sorted((r.partition, r.offset) for r in r1) == [(p, o) for p in range(2)
                                                           for o in range(5)]
    cf_produce(broker.bootstrap, "acks",
               [{"value": b"zero-%d" % i, "partition": i % 2} for i in range(10)], acks=0)
    got = cf_consume(broker.bootstrap, "acks", 2, 20)
    for p in range(2):
        assert [m.value for m in got[p]] == (
            [b"all-%d" % i for i in range(p, 10, 2)] + [b"zero-%d" % i for i in range(p, 10, 2)])
        assert [m.offset for m in got[p]] == list(range(10))
