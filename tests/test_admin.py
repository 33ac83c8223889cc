"""CreateTopics / DeleteTopics / DescribeConfigs, and topics + configs across restarts."""

import signal

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from helpers.clients import (admin, cf_consume, cf_produce, create_topic, topic_metadata,
                             wait_for_topic, wait_for_topic_gone)

SUPPORTED = ["retention.ms", "retention.bytes", "segment.bytes", "max.message.bytes",
             "message.timestamp.type", "flush.messages", "flush.ms"]


def describe(bootstrap, topic, timeout=15):
    res = ConfigResource(ResourceType.TOPIC, topic)
    a = admin(bootstrap)  # keep the client alive until the future resolves
    fs = a.describe_configs([res], request_timeout=timeout)
    return fs[res].result(timeout)


def create_error(bootstrap, name, partitions=1, config=None):
    a = admin(bootstrap)
    fs = a.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        request_timeout=15, operation_timeout=15)
    with pytest.raises(KafkaException) as ei:
        fs[name].result(15)
    return ei.value.args[0]


def test_describe_configs(broker):
    create_topic(broker.bootstrap, "cfg-set", 2,
                 config={"retention.ms": "3600000", "segment.bytes": "1048576",
                         "max.message.bytes": "2000000", "message.timestamp.type": "LogAppendTime"})
    create_topic(broker.bootstrap, "cfg-default", 1)

    entries = describe(broker.bootstrap, "cfg-set")
    missing = [k for k in SUPPORTED if k not in entries]
    assert not missing, f"DescribeConfigs lacks {missing}; got {sorted(entries)}"
    assert entries["retention.ms"].value == "3600000"
    assert entries["segment.bytes"].value == "1048576"
    assert entries["max.message.bytes"].value == "2000000"
    assert entries["message.timestamp.type"].value == "LogAppendTime"
    assert not entries["retention.ms"].is_default

    d = describe(broker.bootstrap, "cfg-default")
    missing = [k for k in SUPPORTED if k not in d]
    assert not missing, f"DescribeConfigs lacks {missing}; got {sorted(d)}"
    assert d["retention.ms"].value == "604800000"  # 7 days
    assert d["retention.bytes"].value == "-1"
    assert d["message.timestamp.type"].value == "CreateTime"
    for k in SUPPORTED:
        if k != "message.timestamp.type":
            assert d[k].value is not None and d[k].value.lstrip("-").isdigit(), (k, d[k].value)


def test_describe_configs_unknown_topic(broker):
    with pytest.raises(KafkaException) as ei:
        describe(broker.bootstrap, "no-such-topic")
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, ei.value


@pytest.mark.parametrize("config", [
    {"cleanup.policy": "compress"},
    {"no.such.config": "1"},
    {"retention.ms": "not-a-number"},
], ids=["cleanup.policy=compress", "unknown-name", "bad-value"])
def test_create_topic_with_unsupported_config_fails(broker, config):
    err = create_error(broker.bootstrap, "refused", 1, config)
    assert err.code() == KafkaError.INVALID_CONFIG, err
    assert "refused" not in topic_metadata(broker.bootstrap)


def test_create_existing_topic_fails(broker):
    create_topic(broker.bootstrap, "twice", 1)
    err = create_error(broker.bootstrap, "twice", 1)
    assert err.code() == KafkaError.TOPIC_ALREADY_EXISTS, err


def test_delete_topic(broker_factory):
    from helpers.broker import free_port
    from helpers.metrics import scrape
    mport = free_port()
    broker = broker_factory("--auto-create-topics", "false", "--metrics-listen", f"127.0.0.1:{mport}")
    doomed_bytes = 'spate_topic_bytes_in_total{topic="doomed"}'
    create_topic(broker.bootstrap, "doomed", 3)
    create_topic(broker.bootstrap, "keeper", 1)
    cf_produce(broker.bootstrap, "doomed", [{"value": b"old", "partition": p} for p in range(3)])
    assert doomed_bytes in scrape(mport)

    a = admin(broker.bootstrap)
    fs = a.delete_topics(["doomed"], request_timeout=15, operation_timeout=15)
    fs["doomed"].result(15)
    wait_for_topic_gone(broker.bootstrap, "doomed")
    assert "keeper" in topic_metadata(broker.bootstrap)
    # Its byte counters go with it (/metrics kept one per topic name ever produced to).
    assert doomed_bytes not in scrape(mport)

    fs = a.delete_topics(["doomed"], request_timeout=15)
    with pytest.raises(KafkaException) as ei:
        fs["doomed"].result(15)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    # producing to it now fails (no auto-creation)
    # (librdkafka retries unknown topics until message.timeout.ms, so either error)
    with pytest.raises(AssertionError, match="UNKNOWN_TOPIC|Unknown topic|_MSG_TIMED_OUT"):
        cf_produce(broker.bootstrap, "doomed", [{"value": b"x", "partition": 0}],
                   **{"message.timeout.ms": 3000})
    assert "doomed" not in topic_metadata(broker.bootstrap), "produce re-created the topic"

    # re-created under the same name, it starts empty
    create_topic(broker.bootstrap, "doomed", 1)
    reps = cf_produce(broker.bootstrap, "doomed", [{"value": b"new", "partition": 0}])
    assert reps[0].offset == 0
    got = cf_consume(broker.bootstrap, "doomed", 1, 1)
    assert [m.value for m in got[0]] == [b"new"]


def test_topics_configs_and_data_survive_restart(broker):
    create_topic(broker.bootstrap, "persist-a", 1,
                 config={"retention.ms": "123456789", "segment.bytes": "1048576"})
    create_topic(broker.bootstrap, "persist-b", 4)
    create_topic(broker.bootstrap, "persist-gone", 2)
    a = admin(broker.bootstrap)
    a.delete_topics(["persist-gone"], request_timeout=15)["persist-gone"].result(15)
    wait_for_topic_gone(broker.bootstrap, "persist-gone")
    # enough data to roll persist-a's 1 MiB segments a few times
    cf_produce(broker.bootstrap, "persist-a",
               [{"value": b"a%06d" % i + b"." * 1000} for i in range(3000)])
    cf_produce(broker.bootstrap, "persist-b",
               [{"value": b"b%d" % i, "partition": i % 4} for i in range(40)])

    for how in (signal.SIGTERM, signal.SIGINT):
        rc = broker.stop(how, timeout=20)
        assert rc == 0, f"broker exit status {rc} after {how.name}"
        # A new port: restarting on the same one is test_restart's business.
        broker.restart(new_port=True)
        wait_for_topic(broker.bootstrap, "persist-a", 1)
        wait_for_topic(broker.bootstrap, "persist-b", 4)
        md = topic_metadata(broker.bootstrap)
        assert "persist-gone" not in md, "deleted topic came back after restart"
        d = describe(broker.bootstrap, "persist-a")
        assert d["retention.ms"].value == "123456789"
        assert d["segment.bytes"].value == "1048576"
        got = cf_consume(broker.bootstrap, "persist-a", 1, 3000, timeout=60)
        assert [m.value for m in got[0]] == [b"a%06d" % i + b"." * 1000 for i in range(3000)]
        got = cf_consume(broker.bootstrap, "persist-b", 4, 40)
        for p in range(4):
            assert [m.value for m in got[p]] == [b"b%d" % i for i in range(p, 40, 4)]


def test_sigterm_exits_promptly_and_cleanly(broker):
    """SIGTERM: exit status 0, and every partition log closed cleanly, as the broker
    records it on disk (src/log/mod.rs): the clean-shutdown marker `.spate-clean-shutdown`
    (`1\n`, absent while the log is open) and the recovery point `1 <offset> <crc>` at the
    log end offset."""
    create_topic(broker.bootstrap, "bye", 2)
    cf_produce(broker.bootstrap, "bye", [{"value": b"x", "partition": 0}] * 3 + [{"value": b"y", "partition": 1}])
    dirs = {"bye-0": 3, "bye-1": 1}
    for name in dirs:
        assert not (broker.data_dir / name / ".spate-clean-shutdown").exists(), f"{name}: marker while open"
    rc = broker.stop(signal.SIGTERM, timeout=15)
    assert rc == 0, f"exit status {rc} after SIGTERM"
    for name, log_end_offset in dirs.items():
        d = broker.data_dir / name
        marker = d / ".spate-clean-shutdown"
        assert marker.exists(), f"{name}: no clean-shutdown marker after SIGTERM: {sorted(f.name for f in d.iterdir())}"
        assert marker.read_text() == "1\n", f"{name}: clean-shutdown marker {marker.read_text()!r}"
        version, offset, _crc = (d / "spate-recovery-point").read_text().split()
        assert (version, int(offset)) == ("1", log_end_offset), f"{name}: recovery point {version} {offset}"
