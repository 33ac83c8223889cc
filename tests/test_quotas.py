"""Client quotas and SCRAM credentials (issue 17): stored in Kafka's ZooKeeper layout
(`/config/clients/<id>`, `/config/users/<user>`, with `/config/changes` notifications)
on both metadata backends, managed with Kafka's kafka-configs (ConfigCommand:
AlterClientQuotas, DescribeClientQuotas, AlterUserScramCredentials,
DescribeUserScramCredentials) and confluent-kafka's AdminClient, and enforced per
broker as Kafka does: throttle_time_ms in the answer and the connection muted
(KIP-219)."""

import base64
import hashlib
import hmac
import json
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                   UserScramCredentialUpsertion)
from kazoo.client import KazooClient

from helpers.broker import free_port
from helpers.clients import admin, cf_conf, create_topic
from helpers.metrics import metric_sum, scrape
from test_kafka_tools import configs_tool, tools_classpath  # noqa: F401 (fixture)
from test_security import ALICE, certs, sasl_conf, start_secure  # noqa: F401 (fixture)

# Serial (scripts/test runs it alone, after the parallel part): quota windows are measured in wall time: a loaded machine would move the throttle figures.
pytestmark = [pytest.mark.serial]

MIB = 1024 * 1024
VALUE_BYTES = 10_000
UNLIMITED_PACE = 8 * MIB


def local_znode(broker, path):
    """A znode's data from the embedded store's file (None when absent)."""
    doc = json.loads((broker.data_dir / "spate-meta" / "znodes.json").read_text())
    node = doc["nodes"].get(path)
    return None if node is None else base64.b64decode(node["data"])


def changes(read_children, read):
    """The entity paths of the /config/changes notifications, in sequence order."""
    return [json.loads(read(f"/config/changes/{n}"))["entity_path"] for n in sorted(read_children())]


def check_scram_document(value, password, iterations, digest="sha512"):
    """A stored SCRAM credential (Kafka's `salt=..,stored_key=..,server_key=..,iterations=n`)
    is the one RFC 5802 derives from `password` with its salt."""
    fields = dict(kv.split("=", 1) for kv in value.split(","))
    assert sorted(fields) == ["iterations", "salt", "server_key", "stored_key"], value
    assert int(fields["iterations"]) == iterations
    salt = base64.b64decode(fields["salt"])
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    assert base64.b64decode(fields["stored_key"]) == hashlib.new(digest, client_key).digest()
    assert base64.b64decode(fields["server_key"]) == hmac.new(salted, b"Server Key", digest).digest()


def quota_describe(classpath, bootstrap, *entity):
    """kafka-configs --describe of a quota entity: {key: value} of its quotas."""
    rc, out = configs_tool(classpath, bootstrap, "--describe", *entity)
    assert rc == 0, out
    # "Quota configs for client-id 'app-1' are consumer_byte_rate=2048.0, producer_byte_rate=1048576.0"
    lines = [line for line in out.splitlines() if line.startswith("Quota configs for")]
    assert len(lines) == 1, out
    return {k.strip(): float(v) for k, v in (kv.split("=") for kv in lines[0].split(" are ")[1].split(","))}


def test_kafka_configs_quotas_and_scram_in_kafka_layout(broker, tools_classpath):
    bootstrap = broker.bootstrap
    rc, out = configs_tool(tools_classpath, bootstrap, "--alter", "--entity-type", "clients", "--entity-name",
                           "app-1", "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2048")
    assert rc == 0, out
    rc, out = configs_tool(tools_classpath, bootstrap, "--alter", "--entity-type", "users", "--entity-default",
                           "--add-config", "request_percentage=200")
    assert rc == 0, out
    rc, out = configs_tool(tools_classpath, bootstrap, "--alter", "--entity-type", "users", "--entity-name",
                           "alice", "--add-config", "SCRAM-SHA-512=[iterations=8192,password=alice-secret]")
    assert rc == 0, out
    rc, out = configs_tool(tools_classpath, bootstrap, "--alter", "--entity-type", "users", "--entity-name",
                           "alice", "--add-config", "producer_byte_rate=5000")
    assert rc == 0, out

    assert quota_describe(tools_classpath, bootstrap, "--entity-type", "clients", "--entity-name", "app-1") == {
        "producer_byte_rate": 1048576.0, "consumer_byte_rate": 2048.0}
    assert quota_describe(tools_classpath, bootstrap, "--entity-type", "users", "--entity-default") == {
        "request_percentage": 200.0}

    # Kafka's documents, byte for byte where Kafka's are fixed.
    assert local_znode(broker, "/config/clients/app-1") == \
        b'{"version":1,"config":{"consumer_byte_rate":"2048","producer_byte_rate":"1048576"}}'
    assert local_znode(broker, "/config/users/<default>") == \
        b'{"version":1,"config":{"request_percentage":"200.0"}}'
    alice = json.loads(local_znode(broker, "/config/users/alice"))
    assert sorted(alice["config"]) == ["SCRAM-SHA-512", "producer_byte_rate"], alice
    assert alice["config"]["producer_byte_rate"] == "5000"
    check_scram_document(alice["config"]["SCRAM-SHA-512"], "alice-secret", 8192)
    doc = json.loads((broker.data_dir / "spate-meta" / "znodes.json").read_text())
    names = [p.rsplit("/", 1)[1] for p in doc["nodes"] if p.startswith("/config/changes/")]
    assert changes(lambda: names, lambda p: local_znode(broker, p)) == [
        "clients/app-1", "users/<default>", "users/alice", "users/alice"]

    # Described through confluent-kafka (DescribeUserScramCredentials): iterations only.
    a = admin(bootstrap)
    described = a.describe_user_scram_credentials(["alice"], request_timeout=15)["alice"].result(15)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_512, 8192)]

    # Survives a restart; a bad value is refused as Kafka refuses it.
    broker.stop()
    broker.restart(new_port=True)
    bootstrap = broker.bootstrap
    assert quota_describe(tools_classpath, bootstrap, "--entity-type", "clients", "--entity-name", "app-1") == {
        "producer_byte_rate": 1048576.0, "consumer_byte_rate": 2048.0}
    rc, out = configs_tool(tools_classpath, bootstrap, "--alter", "--entity-type", "clients", "--entity-name",
                           "app-1", "--add-config", "producer_byte_rate=1.5")
    assert rc != 0 and "must be a Long value" in out, out

    # Deleting the credential keeps the user's quota.
    rc, out = configs_tool(tools_classpath, bootstrap, "--alter", "--entity-type", "users", "--entity-name",
                           "alice", "--delete-config", "SCRAM-SHA-512")
    assert rc == 0, out
    assert json.loads(local_znode(broker, "/config/users/alice")) == {
        "version": 1, "config": {"producer_byte_rate": "5000"}}
    a = admin(bootstrap)
    fut = a.describe_user_scram_credentials(["alice"], request_timeout=15)["alice"]
    try:
        fut.result(15)
        raise AssertionError("a deleted credential was described")
    except Exception as e:  # noqa: BLE001 (confluent raises KafkaException)
        assert "RESOURCE_NOT_FOUND" in str(e) or "does not exist" in str(e), e


def test_scram_credentials_refused_as_kafka_refuses_them(broker):
    a = admin(broker.bootstrap)
    ok = UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"pw",
                                      b"salt-of-bob")
    few = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"pw")
    many = UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 20000), b"pw")
    gone = UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_512)
    fs = a.alter_user_scram_credentials([ok, few, many, gone], request_timeout=15)
    fs["bob"].result(15)
    for user, code in [("carol", "UNACCEPTABLE_CREDENTIAL"), ("dave", "UNACCEPTABLE_CREDENTIAL"),
                       ("erin", "RESOURCE_NOT_FOUND")]:
        try:
            fs[user].result(15)
            raise AssertionError(f"{user}: accepted")
        except Exception as e:  # noqa: BLE001
            assert code in str(e), (user, e)
    bob = json.loads(local_znode(broker, "/config/users/bob"))["config"]["SCRAM-SHA-256"]
    check_scram_document(bob, "pw", 4096, digest="sha256")
    assert local_znode(broker, "/config/users/carol") is None


def test_quotas_and_scram_in_zookeeper(broker_factory, zookeeper, tools_classpath):
    b = broker_factory("--metadata", f"zookeeper://{zookeeper}/spate")
    rc, out = configs_tool(tools_classpath, b.bootstrap, "--alter", "--entity-type", "users", "--entity-name",
                           "alice", "--entity-type", "clients", "--entity-default", "--add-config",
                           "consumer_byte_rate=4096")
    assert rc == 0, out
    rc, out = configs_tool(tools_classpath, b.bootstrap, "--alter", "--entity-type", "users", "--entity-name",
                           "alice", "--add-config", "SCRAM-SHA-256=[iterations=4096,password=pw-of-alice]")
    assert rc == 0, out
    zk = KazooClient(hosts=zookeeper, timeout=10)
    zk.start(timeout=15)
    try:
        read = lambda p: zk.get(f"/spate{p}")[0]  # noqa: E731
        assert read("/config/users/alice/clients/<default>") == \
            b'{"version":1,"config":{"consumer_byte_rate":"4096"}}'
        alice = json.loads(read("/config/users/alice"))["config"]
        check_scram_document(alice["SCRAM-SHA-256"], "pw-of-alice", 4096, digest="sha256")
        assert changes(lambda: zk.get_children("/spate/config/changes"), read) == [
            "users/alice/clients/<default>", "users/alice"]
    finally:
        zk.stop()
    assert quota_describe(tools_classpath, b.bootstrap, "--entity-type", "users", "--entity-name", "alice",
                          "--entity-type", "clients", "--entity-default") == {"consumer_byte_rate": 4096.0}


# ---------------------------------------------------------------- enforcement

def produce_for(bootstrap, topic, client_id, seconds, delivered, stats, pace_bytes_per_s=None):
    """One confluent-kafka producer with its defaults (client.id set; statistics on to see
    the throttle it is told) producing VALUE_BYTES values for `seconds`, at most
    `pace_bytes_per_s` when given; appends (monotonic time, bytes) per delivery."""
    def on_stats(s):
        stats.append(json.loads(s))

    conf = cf_conf(bootstrap, **{"client.id": client_id, "statistics.interval.ms": 1000})
    conf["stats_cb"] = on_stats
    p = Producer(conf)
    value = b"v" * VALUE_BYTES

    def cb(err, msg):
        if err is not None and err.code() == KafkaError._PURGE_QUEUE:
            return  # queued when the time was up, never sent (see below)
        assert err is None, err
        delivered.append((time.monotonic(), len(msg.value())))

    start = time.monotonic()
    end = start + seconds
    sent = 0
    while time.monotonic() < end:
        if pace_bytes_per_s and sent > (time.monotonic() - start) * pace_bytes_per_s:
            time.sleep(0.005)  # pacing the load generator: ahead of its schedule
            p.poll(0)
            continue
        sent += VALUE_BYTES
        try:
            p.produce(topic, value, callback=cb)
        except BufferError:
            p.poll(0.05)  # the client's queue is full (throttled): let it drain
        p.poll(0)
    # A throttled producer has a long queue when the time is up; sending it at the
    # quota would take minutes, so what was never sent is dropped and what is in flight
    # is waited for.
    p.purge(in_queue=True, in_flight=False)
    p.flush(30)


def rate(delivered, start, end):
    """Bytes per second delivered between two monotonic times."""
    return sum(n for t, n in delivered if start <= t < end) / (end - start)


def test_producer_quota_throttles_one_client_and_not_the_other(broker_factory, tools_classpath):
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}")
    create_topic(b.bootstrap, "quota-p", 2)
    rc, out = configs_tool(tools_classpath, b.bootstrap, "--alter", "--entity-type", "clients", "--entity-name",
                           "limited", "--add-config", f"producer_byte_rate={MIB}")
    assert rc == 0, out
    limited, free, limited_stats, free_stats = [], [], [], []
    seconds = 70
    started = time.monotonic()
    # The unlimited producer is paced at 8 MiB/s (what it keeps on a loaded 2-core
    # machine, and not gigabytes of disk); the limited one sends as fast as it can.
    threads = [threading.Thread(target=produce_for, args=(b.bootstrap, "quota-p", "limited", seconds, limited,
                                                          limited_stats)),
               threading.Thread(target=produce_for, args=(b.bootstrap, "quota-p", "unlimited", seconds, free,
                                                          free_stats, UNLIMITED_PACE))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    assert limited and free, "a producer thread failed (see its exception above)"
    # Kafka's quota allows a burst of a whole window's quota (10 s of it) whenever the
    # samples of the last window are spent, so the rate is measured over whole throttle
    # cycles (a burst is a second with more than 3x the quota), from the third burst to
    # the last: the first cycles settle from the first burst (pipelined requests take
    # more than the window's allowance before the first throttled answer), as a model of
    # Kafka's formula with a greedy client shows (1.08x from the second burst of a 50 s
    # run, 1.00-1.02x from the third).
    per_second = [rate(limited, started + i, started + i + 1) for i in range(seconds)]
    print("limited per second (MiB):", [round(r / MIB, 2) for r in per_second])
    bursts = [i for i, r in enumerate(per_second) if r > 3 * MIB]
    assert len(bursts) >= 4, f"not enough throttle cycles to measure: bursts at {bursts}"
    limited_rate = rate(limited, started + bursts[2], started + bursts[-1])
    free_rate = rate(free, started + 15, started + seconds)
    print(f"limited {limited_rate / MIB:.3f} MiB/s, unlimited {free_rate / MIB:.3f} MiB/s")
    # Kafka's windowed rate lets a greedy client settle from above: each burst spends what
    # the expired samples left, and the bursts shrink cycle by cycle (10.4, 8.5, 7.6,
    # 6.6 MiB in one loaded CI run, 1.13x the quota from its second burst; 1.02x from the
    # third burst in a quiet run). The band holds that and still fails a broker that
    # throttles by half or not at all (8x, unlimited).
    assert 0.85 * MIB <= limited_rate <= 1.2 * MIB, f"limited producer at {limited_rate / MIB:.3f} MiB/s"
    assert free_rate >= 0.9 * UNLIMITED_PACE, f"unlimited producer slowed to {free_rate / MIB:.3f} MiB/s"
    # The client was told: librdkafka's throttle statistics, and the broker's metrics.
    told = max((br["throttle"]["max"] for s in limited_stats for br in s["brokers"].values()
                if br.get("nodeid", -1) >= 0), default=0)
    assert told > 0, "the limited producer never saw throttle_time_ms"
    assert max((br["throttle"]["max"] for s in free_stats for br in s["brokers"].values()), default=0) == 0
    text = scrape(mport)
    throttled = metric_sum(text, 'spate_quota_throttle_time_ms_total{quota="produce",user="",client_id="limited"}')
    assert throttled > 0, text
    assert 'client_id="unlimited"' not in text


def test_consumer_quota_limits_fetch_rate(broker_factory, tools_classpath):
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}")
    create_topic(b.bootstrap, "quota-c", 1)
    delivered, stats = [], []
    produce_for(b.bootstrap, "quota-c", "filler", 10, delivered, stats, pace_bytes_per_s=5 * MIB)
    total = sum(n for _, n in delivered)
    assert total >= 40 * MIB, f"only {total / MIB:.1f} MiB to read"
    rc, out = configs_tool(tools_classpath, b.bootstrap, "--alter", "--entity-type", "clients", "--entity-name",
                           "slow-reader", "--add-config", f"consumer_byte_rate={MIB}")
    assert rc == 0, out
    c = Consumer(cf_conf(b.bootstrap, **{"client.id": "slow-reader", "group.id": "quota-c",
                                         "auto.offset.reset": "earliest"}))
    c.subscribe(["quota-c"])
    got = []
    seconds = 30
    started = time.monotonic()
    try:
        while time.monotonic() < started + seconds:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append((time.monotonic(), len(m.value())))
    finally:
        c.close()
    # Over the whole run: librdkafka prefetches into a local queue, so the times the
    # application polls records say little about when they were fetched, and a rate over
    # part of the run swings with the prefetch (1.23 MiB/s over the second half in one
    # run, 0.71 in the next). As Kafka's, the quota lets a fresh client take a whole
    # window's worth (11 samples of 1 s) before throttling starts, so over the run the
    # consumer may read at most (seconds + 11) s of quota.
    total = sum(n for _, n in got)
    r = total / seconds
    print(f"consumer read {total / MIB:.1f} MiB in {seconds} s: {r / MIB:.3f} MiB/s")
    assert 0.3 * MIB <= r <= MIB * (seconds + 11) / seconds, f"limited consumer at {r / MIB:.3f} MiB/s"
    text = scrape(mport)
    assert metric_sum(text, 'spate_quota_throttle_time_ms_total{quota="fetch",user="",client_id="slow-reader"}') > 0
    # The bytes the broker counts are those it sent: at least what the consumer read,
    # at most what the quota allowed (throttled fetches answered empty count nothing).
    sent = metric_sum(text, 'spate_quota_bytes_total{quota="fetch",user="",client_id="slow-reader"}')
    print(f"broker counted {sent / MIB:.1f} MiB sent")
    assert total <= sent <= 1.1 * MIB * (seconds + 11), f"counted {sent / MIB:.1f} MiB, read {total / MIB:.1f} MiB"


def test_a_user_quota_throttles_that_sasl_user_only(broker_factory, tmp_path, certs, tools_classpath):
    """A quota on `users/alice` applies to the SASL principal alice, whatever her client
    id, and not to bob on the same listener."""
    b, ports, mport = start_secure(broker_factory, tmp_path, certs, ["SASL_SSL"])
    create_topic(b.bootstrap, "quota-u", 1)
    rc, out = configs_tool(tools_classpath, b.bootstrap, "--alter", "--entity-type", "users", "--entity-name",
                           "alice", "--add-config", "producer_byte_rate=102400")
    assert rc == 0, out
    port = ports["SASL_SSL"]
    results = {}

    def produce(user, seconds=12):
        stats, sent = [], [0]
        conf = sasl_conf(port, certs, user=user, **{"statistics.interval.ms": 1000})
        conf["stats_cb"] = lambda s: stats.append(json.loads(s))
        p = Producer(conf)

        def cb(err, msg):
            if err is None:
                sent[0] += len(msg.value())
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                p.produce("quota-u", b"u" * VALUE_BYTES, callback=cb)
            except BufferError:
                p.poll(0.05)
            p.poll(0)
        p.purge(in_queue=True, in_flight=False)
        p.flush(30)
        throttled = max((br["throttle"]["max"] for s in stats for br in s["brokers"].values()), default=0)
        results[user[0]] = (sent[0], throttled)

    threads = [threading.Thread(target=produce, args=(u,)) for u in (ALICE, ("bob", "bob-secret"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    print("bytes delivered, max throttle ms:", results)
    (alice_bytes, alice_throttle), (bob_bytes, bob_throttle) = results["alice"], results["bob"]
    assert alice_throttle > 0 and bob_throttle == 0, results
    # alice got the window's allowance and is then held back (about 3 MB in 12 s at
    # 100 KiB/s: two batches at once, one after her first throttle); bob is not.
    assert bob_bytes > 5 * alice_bytes, results
    text = scrape(mport)
    assert metric_sum(text, 'spate_quota_throttle_time_ms_total{quota="produce",user="alice",client_id=""}') > 0
    assert 'user="bob"' not in text
