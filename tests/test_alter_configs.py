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


def test_values_with_spaces_are_read_as_kafka_parses_them_and_survive_kill9(broker):
    """A number with spaces around it is a valid value for Kafka (its ConfigDef trims):
    AlterConfigs took "720000 ", stored it, then every data core panicked reading it
    (the request_handler fuzz target's finding), and the broker died again at each start
    on the stored value. Now the running log reads it trimmed and a kill -9 and restart
    on the stored value serve."""
    create_topic(broker.bootstrap, "spaced", 1)
    incremental(broker.bootstrap, "spaced", [
        ConfigEntry("retention.ms", "720000 ", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("max.message.bytes", " 2000", incremental_operation=AlterConfigOpType.SET),
    ])
    assert broker.alive(), f"broker died (exit {broker.proc.returncode})\n{broker.log_tail()}"
    # DescribeConfigs shows the value as parsed, as Kafka's does (it used to echo "720000 ").
    shown = describe(broker.bootstrap, "spaced")
    assert (shown["retention.ms"].value, shown["max.message.bytes"].value) == ("720000", "2000")

    def check():
        # The trimmed max.message.bytes is the one the running log enforces.
        with pytest.raises(AssertionError, match="MSG_SIZE_TOO_LARGE|too large|TOO_LARGE"):
            cf_produce(broker.bootstrap, "spaced", [{"value": b"x" * 5000}], timeout=10,
                       **{"compression.type": "none"})
        out = cf_produce(broker.bootstrap, "spaced", [{"value": b"small"}], timeout=10)
        return out[0].offset

    first = check()
    broker.kill()
    broker.restart()
    assert check() == first + 1


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


# ---------------------------------------------------------------- dynamic broker configs
# confluent-kafka and kafka-python refuse an empty broker name, so the cluster-wide
# default (resource name "") is set and read with Kafka's kafka-configs (ConfigCommand,
# --entity-default); per-broker configs with confluent-kafka's AdminClient.

from test_kafka_tools import configs_tool, parse_configs, tools_classpath  # noqa: F401 (fixture)

DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
DEFAULT_CONFIG = 5


def broker_incremental(bootstrap, broker_name, entries, validate_only=False, timeout=15):
    """IncrementalAlterConfigs on ConfigResource BROKER `broker_name` (a broker id)."""
    a = admin(bootstrap)
    res = ConfigResource(ResourceType.BROKER, broker_name, incremental_configs=entries)
    fs = a.incremental_alter_configs([res], request_timeout=timeout, validate_only=validate_only)
    return fs[res].result(timeout)


def describe_broker(bootstrap, broker_name, timeout=15):
    """{name: ConfigEntry} of BROKER `broker_name`, with synonyms."""
    a = admin(bootstrap)
    res = ConfigResource(ResourceType.BROKER, broker_name)
    fs = a.describe_configs([res], request_timeout=timeout)  # librdkafka asks for synonyms
    return fs[res].result(timeout)


def default_tool(classpath, bootstrap, *args):
    """kafka-configs --entity-type brokers --entity-default ...: (exit code, output)."""
    return configs_tool(classpath, bootstrap, "--entity-type", "brokers", "--entity-default", *args)


def set_op(name, value):
    return ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)


def source(entry):
    return int(getattr(entry.source, "value", entry.source))


def earliest(bootstrap, topic):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec
    tp = TopicPartition(topic, 0)
    a = admin(bootstrap)  # keep the client alive until the future resolves
    return a.list_offsets({tp: OffsetSpec.earliest()}, request_timeout=15)[tp].result(15).offset


def broker_tool_describe(classpath, bootstrap, broker_id):
    """kafka-configs --entity-name <id> --describe: that broker's own dynamic configs with
    their synonyms, parsed (confluent-kafka keeps synonyms by name, so it cannot show
    the same name in several layers)."""
    rc, out = configs_tool(classpath, bootstrap, "--entity-type", "brokers", "--entity-name", broker_id, "--describe")
    assert rc == 0, out
    return parse_configs(out)


@pytest.mark.broker_args("--log-retention-check-interval-ms", "200")
def test_dynamic_broker_retention_applies_to_topics_without_override_and_survives_restart(
        broker, tools_classpath):
    """log.retention.ms set for every broker (`/config/brokers/<default>`, with kafka-configs
    --entity-default): described with source DYNAMIC_DEFAULT_BROKER_CONFIG on broker 1 and
    on a topic without its own retention.ms (confluent-kafka), and it really deletes that
    topic's old segments, not those of a topic with its own retention.ms. A per-broker
    value (`/config/brokers/1`, confluent-kafka's incremental_alter_configs) then wins
    over it, with Kafka's synonyms, and both survive a restart."""
    import time
    from pathlib import Path
    for topic, config in (("follows", {"segment.bytes": "1024"}),
                          ("keeps", {"segment.bytes": "1024", "retention.ms": "604800000"})):
        create_topic(broker.bootstrap, topic, 1, config=config)
        for i in range(6):  # one batch each, a segment each
            cf_produce(broker.bootstrap, topic, [{"value": b"%03d" % i + b"x" * 700}])
    segments = {t: lambda t=t: sorted(Path(broker.data_dir, f"{t}-0").glob("*.log")) for t in ("follows", "keeps")}
    assert len(segments["follows"]()) > 3 and len(segments["keeps"]()) > 3
    d = describe(broker.bootstrap, "follows")["retention.ms"]
    assert (d.value, source(d)) == ("604800000", DEFAULT_CONFIG)

    rc, out = default_tool(tools_classpath, broker.bootstrap, "--alter", "--add-config", "log.retention.ms=1000")
    assert rc == 0, out
    b1 = describe_broker(broker.bootstrap, "1")
    assert (b1["log.retention.ms"].value, source(b1["log.retention.ms"]), b1["log.retention.ms"].is_read_only) \
        == ("1000", DYNAMIC_DEFAULT_BROKER_CONFIG, False)
    assert b1["broker.id"].is_read_only
    d = describe(broker.bootstrap, "follows")["retention.ms"]
    assert (d.value, source(d)) == ("1000", DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert describe(broker.bootstrap, "keeps")["retention.ms"].value == "604800000"

    # Retention runs every 200 ms: the topic without an override loses its old segments.
    deadline = time.monotonic() + 60
    while earliest(broker.bootstrap, "follows") == 0 and time.monotonic() < deadline:
        time.sleep(0.2)  # polling the condition, with a deadline
    assert earliest(broker.bootstrap, "follows") > 0, "the dynamic log.retention.ms deleted nothing"
    assert len(segments["follows"]()) == 1, segments["follows"]()
    # Retention has run since the change; the topic with its own retention.ms kept all.
    assert earliest(broker.bootstrap, "keeps") == 0
    assert len(segments["keeps"]()) > 3

    broker_incremental(broker.bootstrap, "1", [set_op("log.retention.ms", "3600000")])
    want = ("3600000", DYNAMIC_BROKER_CONFIG, {"log.retention.ms": ("3600000", [
        ("DYNAMIC_BROKER_CONFIG", "log.retention.ms", "3600000"),
        ("DYNAMIC_DEFAULT_BROKER_CONFIG", "log.retention.ms", "1000"),
        ("DEFAULT_CONFIG", "log.retention.ms", "604800000")])})

    def seen():
        e = describe_broker(broker.bootstrap, "1")["log.retention.ms"]
        return e.value, source(e), broker_tool_describe(tools_classpath, broker.bootstrap, "1")

    assert seen() == want
    broker.restart()
    assert seen() == want
    rc, out = default_tool(tools_classpath, broker.bootstrap, "--describe")
    assert rc == 0 and parse_configs(out) == {
        "log.retention.ms": ("1000", [("DYNAMIC_DEFAULT_BROKER_CONFIG", "log.retention.ms", "1000")])}, out
    d = describe(broker.bootstrap, "follows")["retention.ms"]
    assert (d.value, source(d)) == ("3600000", DYNAMIC_BROKER_CONFIG)


def test_broker_configs_refused_and_accepted_as_kafka_4_4_does(broker):
    """Every broker config Kafka 4.4 defines is checked as Kafka checks it, and refused
    with Kafka's INVALID_REQUEST and message (each measured on Kafka 4.4: read-only
    configs, security configs without their listener prefix, values of the wrong type or
    out of range, Kafka's thread-count rule); configs Kafka takes at run time that Spate
    has nothing to act on, and names Kafka does not define, are stored and described (an
    unknown name as sensitive, without its value). validate_only checks and changes
    nothing; nothing refused is stored."""
    for name, value, message in (
            ("broker.id", "7", "Cannot update these configs dynamically: [broker.id]"),
            ("num.partitions", "3", "Cannot update these configs dynamically: [num.partitions]"),
            ("log.retention.ms", "soon", "Invalid value soon for configuration log.retention.ms: Not a number of type LONG"),
            ("log.cleanup.policy", "compress",
             "Invalid value compress for configuration log.cleanup.policy: String must be one of: compact, delete"),
            ("log.cleaner.threads", "-5", "Invalid value -5 for configuration log.cleaner.threads: Value must be at least 0"),
            ("ssl.keystore.password", "secret", "These security configs can be dynamically updated only per-listener "
                                                "using the listener prefix: [ssl.keystore.password]"),
            ("num.network.threads", "20", "Dynamic thread count update validation failed for num.network.threads=20, "
                                          "value should not be greater than double the current value 3")):
        with pytest.raises(KafkaException) as ei:
            broker_incremental(broker.bootstrap, "1", [set_op(name, value)])
        assert (ei.value.args[0].name(), ei.value.args[0].str()) == ("INVALID_REQUEST", message), name
    broker_incremental(broker.bootstrap, "1", [set_op("log.retention.ms", "5000")], validate_only=True)
    e = describe_broker(broker.bootstrap, "1")["log.retention.ms"]
    assert (e.value, source(e)) == ("604800000", DEFAULT_CONFIG)
    described = describe_broker(broker.bootstrap, "1")
    assert {source(e) for e in described.values()} <= {4, 5}
    # Kafka 4.4 describes 350 broker configs (379 less 29 internal ones); Spate also its
    # three replication throttle rates, which Kafka describes once they are set.
    assert len(described) == 353 and "leader.replication.throttled.rate" in described, len(described)
    assert (described["num.io.threads"].value, described["num.io.threads"].is_read_only) == ("8", False)
    assert described["ssl.keystore.password"].is_sensitive and described["ssl.keystore.password"].value is None

    broker_incremental(broker.bootstrap, "1", [set_op("sasl.kerberos.service.name", "kafka2"),
                                               set_op("num.io.threads", "4"), set_op("no.such.config", "1")])
    described = describe_broker(broker.bootstrap, "1")
    e = described["sasl.kerberos.service.name"]
    assert (e.value, source(e), e.is_read_only) == ("kafka2", DYNAMIC_BROKER_CONFIG, False)
    assert (described["num.io.threads"].value, source(described["num.io.threads"])) == ("4", DYNAMIC_BROKER_CONFIG)
    e = described["no.such.config"]
    assert (e.value, e.is_sensitive, source(e)) == (None, True, DYNAMIC_BROKER_CONFIG)
    # Kafka's thread-count rule is on the value in effect: 4 now, so 1 is below half.
    with pytest.raises(KafkaException) as ei:
        broker_incremental(broker.bootstrap, "1", [set_op("num.io.threads", "1")])
    assert "at least half the current value 4" in ei.value.args[0].str()


def test_broker_list_configs_append_and_subtract(broker):
    """IncrementalAlterConfigs APPEND and SUBTRACT on the one list broker config,
    log.cleanup.policy: on the static default ("delete") at first, then on the dynamic
    value; the result is what a topic without its own cleanup.policy gets. APPEND on a
    config that is not a list is INVALID_CONFIG, a result Kafka would refuse
    INVALID_REQUEST (Kafka 4.4's answers to both)."""
    def op(name, value, kind):
        return ConfigEntry(name, value, incremental_operation=kind)

    create_topic(broker.bootstrap, "lists-follow", 1)
    broker_incremental(broker.bootstrap, "1", [op("log.cleanup.policy", "compact", AlterConfigOpType.APPEND)])
    assert describe_broker(broker.bootstrap, "1")["log.cleanup.policy"].value == "delete,compact"
    assert describe(broker.bootstrap, "lists-follow")["cleanup.policy"].value == "delete,compact"
    broker_incremental(broker.bootstrap, "1", [op("log.cleanup.policy", "delete", AlterConfigOpType.SUBTRACT)])
    e = describe_broker(broker.bootstrap, "1")["log.cleanup.policy"]
    assert (e.value, source(e)) == ("compact", DYNAMIC_BROKER_CONFIG)
    assert describe(broker.bootstrap, "lists-follow")["cleanup.policy"].value == "compact"
    for entry, code in ((op("log.retention.ms", "5", AlterConfigOpType.APPEND), "INVALID_CONFIG"),
                        (op("log.cleanup.policy", "compress", AlterConfigOpType.APPEND), "INVALID_REQUEST")):
        with pytest.raises(KafkaException) as ei:
            broker_incremental(broker.bootstrap, "1", [entry])
        assert ei.value.args[0].name() == code, (entry, ei.value)
    assert describe_broker(broker.bootstrap, "1")["log.cleanup.policy"].value == "compact", "nothing refused stored"


def test_dynamic_broker_configs_in_zookeeper(broker_factory, zookeeper, tools_classpath):
    """With the metadata in a real ZooKeeper: the cluster-wide default and broker 7's
    dynamic configs are Kafka's `/config/brokers/<default>` and `/config/brokers/7`
    documents (read with kazoo); a broker started on a fresh data dir reads them back;
    deleting the last config removes the znode."""
    import json
    from kazoo.client import KazooClient
    url = f"zookeeper://{zookeeper}/dyn"
    b = broker_factory("--metadata", url, "--node-id", "7")
    rc, out = default_tool(tools_classpath, b.bootstrap, "--alter", "--add-config", "log.retention.ms=1000")
    assert rc == 0, out
    broker_incremental(b.bootstrap, "7", [set_op("log.segment.bytes", "1048576"), set_op("log.retention.ms", "2000")])
    zk = KazooClient(hosts=zookeeper, timeout=10)
    zk.start(timeout=15)
    try:
        def doc(path):
            return json.loads(zk.get(path)[0].decode())

        assert sorted(zk.get_children("/dyn/config/brokers")) == ["7", "<default>"]
        assert doc("/dyn/config/brokers/<default>") == {"version": 1, "config": {"log.retention.ms": "1000"}}
        assert doc("/dyn/config/brokers/7") == {
            "version": 1, "config": {"log.retention.ms": "2000", "log.segment.bytes": "1048576"}}
        # Kafka's change notifications, one per change, in order.
        changes = sorted(zk.get_children("/dyn/config/changes"))
        assert [doc(f"/dyn/config/changes/{c}") for c in changes] == [
            {"version": 2, "entity_path": "brokers/<default>"}, {"version": 2, "entity_path": "brokers/7"}], changes

        b.kill()
        b2 = broker_factory("--metadata", url, "--node-id", "7", name="b-fresh-dir")
        e = describe_broker(b2.bootstrap, "7")
        assert (e["log.retention.ms"].value, source(e["log.retention.ms"])) == ("2000", DYNAMIC_BROKER_CONFIG)
        assert broker_tool_describe(tools_classpath, b2.bootstrap, "7") == {
            "log.retention.ms": ("2000", [("DYNAMIC_BROKER_CONFIG", "log.retention.ms", "2000"),
                                          ("DYNAMIC_DEFAULT_BROKER_CONFIG", "log.retention.ms", "1000"),
                                          ("DEFAULT_CONFIG", "log.retention.ms", "604800000")]),
            "log.segment.bytes": ("1048576", [("DYNAMIC_BROKER_CONFIG", "log.segment.bytes", "1048576"),
                                           ("DEFAULT_CONFIG", "log.segment.bytes", "1073741824")])}

        rc, out = default_tool(tools_classpath, b2.bootstrap, "--alter", "--delete-config", "log.retention.ms")
        assert rc == 0, out
        assert not zk.exists("/dyn/config/brokers/<default>")
        rc, out = default_tool(tools_classpath, b2.bootstrap, "--describe")
        assert rc == 0 and parse_configs(out) == {}, out
    finally:
        zk.stop()


def test_topic_configs_another_tool_wrote_to_zookeeper_do_not_stop_the_broker(broker_factory, zookeeper):
    """A topic config document in ZooKeeper is anybody's to write (Kafka's own tools
    write it directly): values that do not check out give way to the defaults instead of
    panicking the data cores at every start. The records written before stay readable
    and the topic takes writes, with Kafka's default max.message.bytes."""
    import json
    import time
    from kazoo.client import KazooClient

    from helpers.clients import cf_consume
    url = f"zookeeper://{zookeeper}/badcfg"
    b = broker_factory("--metadata", url, "--node-id", "7")
    create_topic(b.bootstrap, "hand-written", 1, config={"max.message.bytes": "2000"})
    cf_produce(b.bootstrap, "hand-written", [{"value": b"before-%d" % i} for i in range(3)])
    b.kill()
    zk = KazooClient(hosts=zookeeper, timeout=10)
    zk.start(timeout=15)
    try:
        deadline = time.monotonic() + 40
        while zk.exists("/badcfg/brokers/ids/7") and time.monotonic() < deadline:
            time.sleep(0.2)
        bad = {"version": 1, "config": {"max.message.bytes": "lots", "retention.ms": "soon", "segment.bytes": "-1"}}
        zk.set("/badcfg/config/topics/hand-written", json.dumps(bad).encode())
    finally:
        zk.stop()
    b.restart()
    out = cf_produce(b.bootstrap, "hand-written", [{"value": b"y" * 5000}], timeout=15,
                     **{"compression.type": "none"})
    assert out[0].offset == 3
    got = cf_consume(b.bootstrap, "hand-written", 1, 4)
    assert [m.value for m in got[0]] == [b"before-0", b"before-1", b"before-2", b"y" * 5000]
    # DescribeConfigs shows what the log runs with: Kafka's defaults, not the bad values.
    shown = describe(b.bootstrap, "hand-written")
    assert (shown["max.message.bytes"].value, shown["retention.ms"].value) == ("1048588", "604800000")
    assert shown["max.message.bytes"].is_default
    assert b.alive()
