"""AlterConfigs / IncrementalAlterConfigs: changed topic configs are stored, described,
survive a restart, and take effect on the running partition logs."""

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ResourceType)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from helpers.clients import admin, cf_produce, create_topic
from test_admin import describe


def incremental(bootstrap, topic, entries, timeout=15):
    a = admin(bootstrap)
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    fs = a.incremental_alter_configs([res], request_timeout=timeout)
    return fs[res].result(timeout)


def test_incremental_alter_takes_effect_and_survives_restart(broker):
    create_topic(broker.bootstrap, "alt", 1, config={"max.message.bytes": "2000"})
    big = [{"value": b"x" * 5000}]
    with pytest.raises(AssertionError, match="MSG_SIZE_TOO_LARGE|too large|TOO_LARGE"):
        cf_produce(broker.bootstrap, "alt", big, timeout=10, **{"compression.type": "none"})

    incremental(broker.bootstrap, "alt", [
        ConfigEntry("max.message.bytes", "100000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
    ])
    d = describe(broker.bootstrap, "alt")
    assert d["max.message.bytes"].value == "100000"
    assert d["retention.ms"].value == "3600000"
    # The running log uses the new limit at once.
    out = cf_produce(broker.bootstrap, "alt", big, timeout=10, **{"compression.type": "none"})
    assert out[0].offset == 0

    incremental(broker.bootstrap, "alt", [
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    d = describe(broker.bootstrap, "alt")
    assert d["retention.ms"].value == "604800000" and d["retention.ms"].is_default

    broker.stop()
    broker.restart(new_port=True)
    d = describe(broker.bootstrap, "alt")
    assert d["max.message.bytes"].value == "100000"


def test_unsupported_or_invalid_values_are_refused(broker):
    create_topic(broker.bootstrap, "alt2", 1)
    for key, value in [("cleanup.policy", "compress"), ("retention.ms", "soon"), ("no.such.config", "1")]:
        with pytest.raises(KafkaException) as ei:
            incremental(broker.bootstrap, "alt2", [
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        assert "INVALID_CONFIG" in str(ei.value), ei.value
    assert describe(broker.bootstrap, "alt2")["retention.ms"].value == "604800000"


def test_kafka_python_legacy_alter_configs_replaces_the_set(broker):
    create_topic(broker.bootstrap, "alt3", 1, config={"retention.ms": "1000", "segment.bytes": "1048576"})
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        # kafka-python 3.x's alter_configs() prefers IncrementalAlterConfigs and, when
        # told to use AlterConfigs, re-sends every other dynamic config itself; its
        # request path below that sends the legacy AlterConfigs exactly as given.
        resource = KpConfigResource(ConfigResourceType.TOPIC, "alt3", configs={"retention.ms": "5000"})
        resp = a._manager.run(a._send_alter_configs_requests, [resource], False, False)
        assert resp == {"topic": {"alt3": "OK"}}, resp
    finally:
        a.close()
    d = describe(broker.bootstrap, "alt3")
    assert d["retention.ms"].value == "5000"
    # AlterConfigs replaces the whole set: segment.bytes went back to its default.
    assert d["segment.bytes"].is_default
