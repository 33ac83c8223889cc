"""Kafka's topic configs in the real broker (issue 14).

- compression.type other than `producer`: the broker re-encodes every batch in the
  topic's codec, as Kafka does. Records produced uncompressed (and, for
  `uncompressed`, gzip-compressed) are read back intact by confluent-kafka and
  kafka-python, and the batches on disk carry the topic's codec.
- Every topic config Kafka 3.9 documents is accepted at CreateTopics and shown by
  DescribeConfigs with its source, including those Spate stores without effect (README).
- IncrementalAlterConfigs APPEND and SUBTRACT on the list config cleanup.policy (from
  its default), and refused on a config that is not a list.
"""

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from helpers.clients import admin, cf_conf, cf_consume, create_topic, kp_consume

CODECS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
RECORDS = 200


def batch_codecs(broker, topic):
    """The codec of every batch in the partition's segment files."""
    codecs = []
    for f in sorted((broker.data_dir / f"{topic}-0").glob("*.log")):
        data = f.read_bytes()
        pos = 0
        while pos + 61 <= len(data):
            length = int.from_bytes(data[pos + 8:pos + 12], "big")
            attributes = int.from_bytes(data[pos + 21:pos + 23], "big")
            codecs.append(attributes & 7)
            pos += 12 + length
    return codecs


@pytest.mark.parametrize("codec", list(CODECS))
def test_compression_type_recompresses_on_the_broker(broker, codec):
    topic = f"recompressed-{codec}"
    create_topic(broker.bootstrap, topic, 1, config={"compression.type": codec})
    sent_as = "gzip" if codec == "uncompressed" else "none"
    p = Producer(cf_conf(broker.bootstrap, **{"compression.type": sent_as, "linger.ms": 20}))
    values = [f"{codec}-{i}-".encode() * 20 for i in range(RECORDS)]
    for i, v in enumerate(values):
        p.produce(topic, key=str(i).encode(), value=v, partition=0, headers=[("h", str(i).encode())])
    assert p.flush(30) == 0
    got = cf_consume(broker.bootstrap, topic, 1, count=RECORDS, timeout=30)[0]
    assert [r.value for r in got] == values
    assert [r.offset for r in got] == list(range(RECORDS))
    assert [r.key for r in got] == [str(i).encode() for i in range(RECORDS)]
    got_kp = kp_consume(broker.bootstrap, topic, 1, count=RECORDS, timeout=30)[0]
    assert [r.value for r in got_kp] == values
    codecs = batch_codecs(broker, topic)
    assert codecs and set(codecs) == {CODECS[codec]}, codecs


ACCEPTED = {
    "cleanup.policy": "compact,delete",
    "compression.type": "producer",
    "compression.gzip.level": "5",
    "compression.lz4.level": "10",
    "compression.zstd.level": "7",
    "delete.retention.ms": "1000",
    "file.delete.delay.ms": "1000",
    "flush.messages": "1000",
    "flush.ms": "1000",
    "follower.replication.throttled.replicas": "*",
    "index.interval.bytes": "8192",
    "leader.replication.throttled.replicas": "0:1",
    "local.retention.bytes": "-2",
    "local.retention.ms": "-2",
    "max.compaction.lag.ms": "100000",
    "max.message.bytes": "2000000",
    "message.downconversion.enable": "false",
    "message.format.version": "3.0-IV1",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "3600000",
    "message.timestamp.difference.max.ms": "3600000",
    "message.timestamp.type": "LogAppendTime",
    "min.cleanable.dirty.ratio": "0.3",
    "min.compaction.lag.ms": "10",
    "min.insync.replicas": "1",
    "preallocate": "true",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
    "remote.storage.enable": "false",
    "retention.bytes": "100000000",
    "retention.ms": "100000000",
    "segment.bytes": "100000000",
    "segment.index.bytes": "1000000",
    "segment.jitter.ms": "10",
    "segment.ms": "100000000",
    "unclean.leader.election.enable": "false",
}


def describe(bootstrap, topic):
    a = admin(bootstrap)  # kept alive until the answer is in
    (fut,) = a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    return fut.result(15)


def test_every_kafka_topic_config_is_accepted_and_described(broker):
    create_topic(broker.bootstrap, "all-configs", 1, config=ACCEPTED)
    got = describe(broker.bootstrap, "all-configs")
    for k, v in ACCEPTED.items():
        assert got[k].value == v, (k, got[k].value)
        assert got[k].source == 1, (k, got[k].source)  # DYNAMIC_TOPIC_CONFIG
    with pytest.raises(KafkaException, match="INVALID_CONFIG|Invalid config|unsupported"):
        create_topic(broker.bootstrap, "unknown-config", 1, config={"retention.mss": "1"})


def incremental(bootstrap, topic, name, op, value):
    res = ConfigResource(ConfigResource.Type.TOPIC, topic,
                         incremental_configs=[ConfigEntry(name, value, incremental_operation=op)])
    a = admin(bootstrap)
    (fut,) = a.incremental_alter_configs([res]).values()
    return fut.result(15)


def test_incremental_append_and_subtract_on_cleanup_policy(broker):
    create_topic(broker.bootstrap, "listed", 1)
    assert describe(broker.bootstrap, "listed")["cleanup.policy"].value == "delete"
    incremental(broker.bootstrap, "listed", "cleanup.policy", AlterConfigOpType.APPEND, "compact")
    assert describe(broker.bootstrap, "listed")["cleanup.policy"].value == "delete,compact"
    incremental(broker.bootstrap, "listed", "cleanup.policy", AlterConfigOpType.APPEND, "compact")
    assert describe(broker.bootstrap, "listed")["cleanup.policy"].value == "delete,compact"
    incremental(broker.bootstrap, "listed", "cleanup.policy", AlterConfigOpType.SUBTRACT, "delete")
    assert describe(broker.bootstrap, "listed")["cleanup.policy"].value == "compact"
    # Now compacted: a record without a key is refused.
    p = Producer(cf_conf(broker.bootstrap, **{"message.timeout.ms": 10000}))
    errors = []
    p.produce("listed", value=b"no key", partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    assert errors and errors[0] is not None and "INVALID_RECORD" in errors[0].name(), errors
    with pytest.raises(KafkaException, match="INVALID_CONFIG|list"):
        incremental(broker.bootstrap, "listed", "retention.ms", AlterConfigOpType.APPEND, "5")


def test_message_timestamp_bounds_refuse_records_too_old_or_too_new(broker):
    """KIP-937: a CreateTime record older than message.timestamp.before.max.ms or newer
    than after.max.ms (each capped by the older difference.max.ms) is refused with
    INVALID_TIMESTAMP; within them it goes in; LogAppendTime topics are not checked."""
    import time

    hour = 3600 * 1000
    create_topic(broker.bootstrap, "bounded-ts", 1,
                 config={"message.timestamp.before.max.ms": str(hour), "message.timestamp.after.max.ms": str(hour)})
    create_topic(broker.bootstrap, "diff-ts", 1, config={"message.timestamp.difference.max.ms": str(hour)})
    create_topic(broker.bootstrap, "append-ts", 1,
                 config={"message.timestamp.before.max.ms": str(hour), "message.timestamp.type": "LogAppendTime"})
    now = int(time.time() * 1000)

    def produce(topic, ts):
        p = Producer(cf_conf(broker.bootstrap, **{"message.timeout.ms": 10000}))
        out = []
        p.produce(topic, key=b"k", value=b"v", partition=0, timestamp=ts, on_delivery=lambda e, m: out.append(e))
        p.flush(30)
        return out[0]

    for topic in ("bounded-ts", "diff-ts"):
        assert produce(topic, now) is None
        for ts in (now - 2 * hour, now + 2 * hour):
            err = produce(topic, ts)
            assert err is not None and err.name() == "INVALID_TIMESTAMP", (topic, ts, err)
        got = cf_consume(broker.bootstrap, topic, 1, timeout=30)[0]
        assert len(got) == 1
    assert produce("append-ts", now - 2 * hour) is None
