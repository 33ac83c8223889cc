"""A three-broker cluster whose brokers reach one another over SASL_SSL (issue 17).

Every broker has two listeners, both SASL_SSL: CLIENT (its test port, for the clients)
and BROKER (the inter-broker listener). Brokers log in to one another's BROKER
listener with SASL/PLAIN as `broker`, trusting the test CA (certificates for
127.0.0.1 made with openssl by test_security's `certs` fixture). Broker 1 runs the
embedded coordinator; brokers 2 and 3 reach it through its BROKER listener.

Checked with real clients over SASL_SSL: an idempotent acks=all producer loses no
acknowledged record when the partition leader is killed with SIGKILL, the ISR comes
back to three after its restart (the follower fetches again over TLS and SASL); the
inter-broker listener answers an unauthenticated connection nothing but ApiVersions
and SASL; a broker with a wrong inter-broker password joins nothing (its log says
authentication failed) and no ISR includes it. The `spate` CLI reaches a SASL_SSL
listener with Kafka's `--command-config` client properties."""

import os
import re
import socket
import ssl
import struct
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from helpers.broker import SPATE_BIN  # noqa: E402
from helpers.broker import free_port
from helpers.wire import (api_versions_request, frame, outcome_after, parse_write_txn_markers, recv_frame,
                          request_header_v1, write_txn_markers)
from test_cluster import cluster_args
from test_security import ALICE, certs, metadata_v0, sasl_authenticate, sasl_handshake, start_secure  # noqa: F401

BROKER_USER = ("broker", "broker-secret")
LAG_MS = 3000


def broker_config(tmp_path, certs, name, password=BROKER_USER[1], mechanism="PLAIN"):
    path = tmp_path / f"{name}-security.toml"
    path.write_text(
        f'ssl_keystore_location = "{certs / "keystore.pem"}"\n'
        f'ssl_truststore_location = "{certs / "ca.pem"}"\n'
        'sasl_enabled_mechanisms = "PLAIN,SCRAM-SHA-512"\n'
        f'sasl_mechanism_inter_broker_protocol = "{mechanism}"\n'
        f'inter_broker_sasl_username = "{BROKER_USER[0]}"\n'
        f'inter_broker_sasl_password = "{password}"\n'
        "[sasl_plain_users]\n"
        f'{ALICE[0]} = "{ALICE[1]}"\n'
        f'{BROKER_USER[0]} = "{BROKER_USER[1]}"\n')
    return path


class SecureBroker:
    """A broker and the port of its inter-broker listener."""

    def __init__(self, broker, broker_port, config):
        self.b, self.broker_port, self.config = broker, broker_port, config


def start_secure_broker(broker_factory, tmp_path, certs, node_id, coordinator=None, password=BROKER_USER[1],
                        extra=(), mechanism="PLAIN"):
    client_port, broker_port = free_port(), free_port()
    config = broker_config(tmp_path, certs, f"b{node_id}", password, mechanism)
    args = [*cluster_args(node_id), "--replica-lag-time-max-ms", str(LAG_MS), "--config", str(config),
            "--listeners", f"CLIENT://127.0.0.1:{client_port},BROKER://127.0.0.1:{broker_port}",
            "--listener-security-protocol-map", "CLIENT:SASL_SSL,BROKER:SASL_SSL",
            "--inter-broker-listener-name", "BROKER"]
    if coordinator:
        args += ["--coordinator", f"127.0.0.1:{coordinator}"]
    args += list(extra)
    b = broker_factory(*args, name=f"b{node_id}", cores=1, port=client_port)
    return SecureBroker(b, broker_port, config)


def client_conf(port, certs):
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
            "sasl.username": ALICE[0], "sasl.password": ALICE[1], "ssl.ca.location": str(certs / "ca.pem")}


def wait_for(fn, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if predicate(last):
                return last
        except Exception as e:  # noqa: BLE001 (a broker may be restarting)
            last = e
        time.sleep(0.3)
    raise AssertionError(f"{what} not reached within {timeout}s: {last}")


def broker_ids(conf):
    return set(AdminClient(conf).list_topics(timeout=5).brokers)


def partition_state(conf, topic):
    """(leader, replicas, sorted isr) of partition 0."""
    p = AdminClient(conf).list_topics(topic, timeout=5).topics[topic].partitions[0]
    return p.leader, list(p.replicas), sorted(p.isrs)


def start_cluster(broker_factory, tmp_path, certs):
    b1 = start_secure_broker(broker_factory, tmp_path, certs, 1)
    brokers = {1: b1}
    for i in (2, 3):
        brokers[i] = start_secure_broker(broker_factory, tmp_path, certs, i, coordinator=b1.broker_port)
    conf = client_conf(b1.b.port, certs)
    wait_for(lambda: broker_ids(conf), lambda ids: ids == {1, 2, 3}, 30, "three registered brokers")
    return brokers, conf


def create_topic(conf, new_topic):
    admin = AdminClient(conf)
    admin.create_topics([new_topic])[new_topic.topic].result(30)


def produce(conf, topic, values):
    """Produce with confluent-kafka's acks=all default and idempotence on; returns the
    values acknowledged, in acknowledgement order."""
    p = Producer(dict(conf, **{"enable.idempotence": True}))
    acked, errors = [], []

    def cb(err, msg):
        (errors if err else acked).append(err or msg.value())

    for v in values:
        p.produce(topic, value=v, partition=0, on_delivery=cb)
        p.poll(0)
    assert p.flush(90) == 0, "records still in flight"
    assert errors == [], errors
    return acked


def consume_all(conf, topic, n, timeout=60):
    c = Consumer(dict(conf, **{"group.id": f"{topic}-reader", "auto.offset.reset": "earliest",
                               "enable.auto.commit": False}))
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    return got


def log_since_last_start(b):
    text = b.log_path.read_text(errors="replace")
    return text[text.rfind("===== start #"):]


@pytest.mark.timeout(300)
def test_replication_over_sasl_ssl_survives_a_killed_leader(broker_factory, tmp_path, certs):
    brokers, conf = start_cluster(broker_factory, tmp_path, certs)
    topic = "secure-replicated"
    # Broker 1 runs the coordinator: the leader killed below is another broker.
    create_topic(conf, NewTopic(topic, 1, replica_assignment=[[2, 3, 1]], config={"min.insync.replicas": "2"}))
    wait_for(lambda: partition_state(conf, topic), lambda s: s[0] == 2 and s[2] == [1, 2, 3], 30,
             "leader 2 with the full ISR")
    first = [f"before-{i}".encode() for i in range(300)]
    acked = produce(conf, topic, first)
    assert acked == first

    leader = brokers[2].b
    leader.kill()
    wait_for(lambda: partition_state(conf, topic), lambda s: s[0] in (1, 3) and 2 not in s[2], 30,
             "a new leader without broker 2")
    second = [f"after-{i}".encode() for i in range(300)]
    acked += produce(conf, topic, second)
    assert acked == first + second

    leader.restart()
    # Broker 2 fetches from the new leader over SASL_SSL and rejoins the ISR.
    wait_for(lambda: partition_state(conf, topic), lambda s: s[2] == [1, 2, 3], 60, "the ISR back to three")
    assert "authentication failed" not in leader.log_path.read_text(errors="replace").lower()

    got = consume_all(conf, topic, len(acked))
    assert got == acked


@pytest.mark.timeout(300)
def test_brokers_log_in_to_one_another_with_scram(broker_factory, tmp_path, certs):
    """sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512: the brokers' SCRAM credential
    is set through the first broker's admin API, then two more brokers join and
    replicate with it. `broker`'s PLAIN password is another one, so only a SCRAM login
    can succeed; a broker with a wrong SCRAM password joins nothing."""
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
    scram_password = "broker-scram-pw"
    assert scram_password != BROKER_USER[1]
    start = lambda node_id, coordinator=None, password=scram_password: start_secure_broker(  # noqa: E731
        broker_factory, tmp_path, certs, node_id, coordinator, password, mechanism="SCRAM-SHA-512")
    b1 = start(1)
    conf = client_conf(b1.b.port, certs)
    upsert = UserScramCredentialUpsertion(BROKER_USER[0], ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                          scram_password.encode())
    admin = AdminClient(conf)  # held until the futures are done
    for f in admin.alter_user_scram_credentials([upsert]).values():
        f.result(30)
    brokers = {1: b1, 2: start(2, b1.broker_port), 3: start(3, b1.broker_port)}
    wait_for(lambda: broker_ids(conf), lambda ids: ids == {1, 2, 3}, 30, "three registered brokers")
    topic = "scram-replicated"
    # Led by broker 2: brokers 1 and 3 log in to broker 2's listener to follow it.
    create_topic(conf, NewTopic(topic, 1, replica_assignment=[[2, 3, 1]], config={"min.insync.replicas": "3"}))
    wait_for(lambda: partition_state(conf, topic), lambda s: s[0] == 2 and s[2] == [1, 2, 3], 30,
             "leader 2 with the full ISR")
    values = [f"scram-{i}".encode() for i in range(200)]
    assert produce(conf, topic, values) == values  # acks=all with min.insync.replicas=3
    assert consume_all(conf, topic, len(values)) == values
    for b in brokers.values():
        assert "authentication failed" not in b.b.log_path.read_text(errors="replace").lower()
    # The PLAIN password of `broker` is no SCRAM password: a broker using it stays out.
    b4 = start(4, b1.broker_port, password=BROKER_USER[1])
    wait_for(lambda: "authentication failed" in b4.b.log_path.read_text(errors="replace").lower(),
             bool, 30, "broker 4's failed SCRAM login in its log")
    assert broker_ids(conf) == {1, 2, 3}


def tls_socket(port, certs):
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


@pytest.mark.timeout(300)
def test_the_inter_broker_listener_refuses_strangers_and_wrong_passwords(broker_factory, tmp_path, certs):
    brokers, conf = start_cluster(broker_factory, tmp_path, certs)
    port = brokers[1].broker_port
    # Plain TCP on a TLS listener: no Kafka answer, at most a TLS alert record (0x15).
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(api_versions_request(correlation_id=5))
    out = outcome_after(s)
    assert out == "closed" or (out[0] == "answered" and out[1][:1] == b"\x15"), out
    # TLS without SASL: ApiVersions is answered, Metadata closes the connection.
    s = tls_socket(port, certs)
    s.sendall(api_versions_request(correlation_id=7))
    assert struct.unpack(">i", recv_frame(s)[:4])[0] == 7
    s.sendall(metadata_v0())
    assert outcome_after(s) == "closed"
    # A wrong password is refused.
    s = tls_socket(port, certs)
    assert sasl_handshake(s, "PLAIN")[0] == 0
    err, message, _, _ = sasl_authenticate(s, f"\0{BROKER_USER[0]}\0wrong".encode())
    assert err == 58, message

    topic = "secure-isr"
    create_topic(conf, NewTopic(topic, 1, replica_assignment=[[1, 2, 3]]))
    wait_for(lambda: partition_state(conf, topic), lambda s: s[2] == [1, 2, 3], 30, "the full ISR")
    # Broker 3 comes back with a wrong inter-broker password: it cannot log in to the
    # coordinator or to the leader, so it never rejoins the ISR.
    b3 = brokers[3]
    b3.b.kill()
    b3.config.write_text(b3.config.read_text().replace(
        f'inter_broker_sasl_password = "{BROKER_USER[1]}"', 'inter_broker_sasl_password = "not-the-password"'))
    b3.b.restart()
    wait_for(lambda: log_since_last_start(b3.b).lower(), lambda t: "authentication failed" in t, 30,
             "broker 3 logging the failed login")
    wait_for(lambda: partition_state(conf, topic), lambda s: 3 not in s[2], 30, "broker 3 out of the ISR")
    # Fenced (no heartbeat reaches the coordinator) before the producer looks for brokers:
    # broker 3 still serves its CLIENT listener, but cannot forward InitProducerId.
    wait_for(lambda: broker_ids(conf), lambda ids: ids == {1, 2}, 30, "broker 3 fenced")
    produce(conf, topic, [f"v{i}".encode() for i in range(50)])
    time.sleep(LAG_MS / 1000 * 2)
    assert 3 not in partition_state(conf, topic)[2]
    assert 3 not in broker_ids(conf)
    # With the right password it rejoins: the refusal was the password's.
    b3.b.kill()
    b3.config.write_text(b3.config.read_text().replace(
        'inter_broker_sasl_password = "not-the-password"', f'inter_broker_sasl_password = "{BROKER_USER[1]}"'))
    b3.b.restart()
    wait_for(lambda: partition_state(conf, topic), lambda s: s[2] == [1, 2, 3], 60, "broker 3 back in the ISR")


SPATE = str(SPATE_BIN)


def spate(*args, stdin=None):
    return subprocess.run([SPATE, *args], input=stdin, capture_output=True, timeout=60)


def test_the_cli_speaks_sasl_ssl_with_a_command_config(broker_factory, tmp_path, certs):
    b, ports, _ = start_secure(broker_factory, tmp_path, certs, ["SASL_SSL"])
    port = ports["SASL_SSL"]
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
                     "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                     f'username="{ALICE[0]}" password="{ALICE[1]}";\n'
                     f"ssl.truststore.type=PEM\nssl.truststore.location={certs / 'ca.pem'}\n")
    conn = ["--bootstrap", f"127.0.0.1:{port}", "--command-config", str(props)]
    r = spate("topic", "create", "cli-secure", *conn)
    assert r.returncode == 0, r.stderr
    r = spate("topic", "list", *conn)
    assert r.returncode == 0 and b"cli-secure" in r.stdout, r
    lines = [f"line-{i}" for i in range(20)]
    r = spate("produce", "cli-secure", *conn, stdin="\n".join(lines).encode() + b"\n")
    assert r.returncode == 0, r.stderr
    r = spate("consume", "cli-secure", "--from-beginning", "--max-messages", "20", "--idle-timeout-ms", "10000", *conn)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split() == lines
    # Without the properties the SASL_SSL listener gives the CLI nothing; with a wrong
    # password it is refused.
    r = spate("topic", "list", "--bootstrap", f"127.0.0.1:{port}", "--request-timeout-ms", "3000")
    assert r.returncode != 0
    props.write_text(props.read_text().replace(ALICE[1], "wrong"))
    r = spate("topic", "list", *conn)
    assert r.returncode != 0 and b"authentication failed" in r.stderr.lower(), r


AUTHZ = ["--authorizer-class-name", "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
         "--super-users", f"User:{BROKER_USER[0]}"]


def sasl_tls_socket(port, certs, user):
    """A TLS connection logged in with SASL/PLAIN as `user` (name, password)."""
    s = tls_socket(port, certs)
    assert sasl_handshake(s, "PLAIN")[0] == 0
    err, message, _, _ = sasl_authenticate(s, f"\0{user[0]}\0{user[1]}".encode())
    assert err == 0, message
    return s


def cluster_metadata_fetch_v4(corr):
    """A Fetch v4 of __cluster_metadata partition 0 from version -1, as a broker's
    coordinator link asks for the cluster snapshot (no wait)."""
    topic = b"__cluster_metadata"
    body = struct.pack(">iiiib", -1, 0, 1, 1 << 20, 0) + struct.pack(">ih", 1, len(topic)) + topic
    body += struct.pack(">iiqi", 1, 0, -1, 1 << 20)
    return frame(request_header_v1(1, 4, corr) + body)


def fetch_v4_partition_error(resp):
    """The first partition's error code in a Fetch v4 answer."""
    off = 4 + 4  # correlation id, throttle
    (_n_topics, tlen) = struct.unpack(">ih", resp[off:off + 6])
    off += 6 + tlen + 4  # topic name, partition count
    (_partition, error) = struct.unpack(">ih", resp[off:off + 6])
    return error


def broker_heartbeat_v0(broker_id, broker_epoch, want_shut_down, corr):
    """BrokerHeartbeat v0 (flexible): header v2, then broker id, epoch, metadata offset,
    want fence, want shut down, tagged fields."""
    body = struct.pack(">iqq??", broker_id, broker_epoch, 0, False, want_shut_down) + b"\x00"
    return frame(request_header_v1(63, 0, corr) + b"\x00" + body)


def broker_heartbeat_error(resp):
    """(error code, is fenced, should shut down) of a BrokerHeartbeat v0 answer (header
    v1: correlation id, tagged fields; throttle, error, caught up, fenced, shut down)."""
    (_throttle, error, _caught_up, fenced, shut_down) = struct.unpack(">ih???", resp[5:5 + 9])
    return error, fenced, shut_down


def alter_partition_v2(broker_id, topic_id, new_isr, corr):
    """AlterPartition v2 (flexible; topics by id) of partition 0: leader and partition
    epoch 0, leader recovery state 0. The answer (header v1) starts with throttle time
    and the request's error code."""
    partition = struct.pack(">ii", 0, 0) + bytes([len(new_isr) + 1]) + b"".join(struct.pack(">i", r) for r in new_isr)
    partition += struct.pack(">bi", 0, 0) + b"\x00"
    body = struct.pack(">iq", broker_id, -1) + bytes([2]) + topic_id + bytes([2]) + partition + b"\x00" + b"\x00"
    return frame(request_header_v1(56, 2, corr) + b"\x00" + body)


def create_topic_v2(name, corr):
    """CreateTopics v2 of one topic (1 partition, replication factor 1), 30 s timeout."""
    t = name.encode()
    body = struct.pack(">ih", 1, len(t)) + t + struct.pack(">ihii", 1, 1, 0, 0) + struct.pack(">i?", 30000, False)
    return frame(request_header_v1(19, 2, corr) + body)


def create_topic_v2_error(resp):
    """The topic's error code in a CreateTopics v2 answer."""
    (_corr, _throttle, _n, tlen) = struct.unpack(">iiih", resp[:14])
    return struct.unpack(">h", resp[14 + tlen:16 + tlen])[0]


def broker_registration_v0(broker_id, port, corr, listeners=1):
    """BrokerRegistration v0 (flexible) of a broker with `listeners` PLAINTEXT listeners
    (PLAINTEXT, L1, L2, ... on ports port, port + 1, ...)."""
    def cstr(v):
        return bytes([len(v) + 1]) + v
    names = [b"PLAINTEXT"] + [b"L%d" % i for i in range(1, listeners)]
    entries = b"".join(cstr(n) + cstr(b"127.0.0.1") + struct.pack(">Hh", port + i, 0) + b"\x00"
                       for i, n in enumerate(names))
    assert listeners < 127
    body = struct.pack(">i", broker_id) + cstr(b"cluster") + os.urandom(16) + bytes([listeners + 1]) + entries
    body += bytes([1]) + b"\x00" + b"\x00"  # no features, null rack, tagged fields
    return frame(request_header_v1(62, 0, corr) + b"\x00" + body)


@pytest.mark.timeout(300)
def test_requests_forwarded_to_the_coordinator_are_authorized_as_the_client(broker_factory, tmp_path, certs):
    """With ACLs on, alice (no ACLs) gets nothing through broker 2, which forwards admin
    requests to the coordinator (broker 1) as Envelopes with her principal; before,
    broker 2 forwarded them over its own connection, as `broker`, a super user, so
    alice could create topics, grant herself ACLs and set anyone's SCRAM password. The
    inter-broker APIs (AlterPartition, BrokerRegistration, BrokerHeartbeat,
    WriteTxnMarkers) and the cluster snapshot (ACLs, SCRAM keys) need CLUSTER_ACTION,
    which alice lacks. Once the super user grants her CREATE on a prefix, her creation
    through broker 2 succeeds: the coordinator saw her, not the forwarding broker."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, ResourcePatternType,
                                       ResourceType, ScramCredentialInfo, ScramMechanism,
                                       UserScramCredentialUpsertion)

    brokers = {1: start_secure_broker(broker_factory, tmp_path, certs, 1, extra=AUTHZ)}
    for i in (2, 3):
        brokers[i] = start_secure_broker(broker_factory, tmp_path, certs, i, coordinator=brokers[1].broker_port,
                                         extra=AUTHZ)
    root = dict(client_conf(brokers[1].b.port, certs), **{"sasl.username": BROKER_USER[0],
                                                          "sasl.password": BROKER_USER[1]})
    wait_for(lambda: broker_ids(root), lambda ids: ids == {1, 2, 3}, 30, "three registered brokers")
    alice_via_2 = AdminClient(client_conf(brokers[2].b.port, certs))

    def error_of(future):
        with pytest.raises(KafkaException) as e:
            future.result(30)
        return e.value.args[0].code()

    # Topic creation: refused by the coordinator (where librdkafka sends it), and raw
    # through broker 2, which forwards it.
    assert error_of(alice_via_2.create_topics([NewTopic("fw-x", 1, 1)])["fw-x"]) == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    s2 = sasl_tls_socket(brokers[2].b.port, certs, ALICE)
    s2.sendall(create_topic_v2("fw-raw", corr=5))
    assert create_topic_v2_error(recv_frame(s2, timeout=40)) == 29, "created through broker 2 as `broker`"
    # Client quotas, also through broker 2: AlterClientQuotas v0 of user alice's
    # producer_byte_rate (forwarded) and DescribeClientQuotas v0 of everything.
    entity = struct.pack(">ih", 1, 4) + b"user" + struct.pack(">h", 5) + b"alice"
    op = struct.pack(">ih", 1, 18) + b"producer_byte_rate" + struct.pack(">d?", 1e9, False)
    s2.sendall(frame(request_header_v1(49, 0, 7) + struct.pack(">i", 1) + entity + op + b"\x00"))
    assert struct.unpack(">h", recv_frame(s2, timeout=40)[12:14])[0] == 31, "alice may not set her own quota"
    s2.sendall(frame(request_header_v1(48, 0, 8) + struct.pack(">i?", 0, False)))
    assert struct.unpack(">h", recv_frame(s2)[8:10])[0] == 31
    # ACLs: alice cannot grant herself anything through broker 2.
    grant = AclBinding(ResourceType.TOPIC, "fw-", ResourcePatternType.PREFIXED, f"User:{ALICE[0]}", "*",
                       AclOperation.CREATE, AclPermissionType.ALLOW)
    assert error_of(alice_via_2.create_acls([grant])[grant]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # SCRAM credentials: she can neither set the brokers' user's nor list them.
    upsert = UserScramCredentialUpsertion(BROKER_USER[0], ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                          b"taken-over")
    assert error_of(alice_via_2.alter_user_scram_credentials([upsert])[BROKER_USER[0]]) == \
        KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # (Describe is asked raw below: confluent-kafka 2.16.1's describe_user_scram_credentials
    # crashes the Python process, in librdkafka's background thread, on an answer with a
    # request-level error, as Kafka's own is.)
    # Inter-broker APIs, raw on broker 1's CLIENT listener as alice.
    s = sasl_tls_socket(brokers[1].b.port, certs, ALICE)
    s.sendall(cluster_metadata_fetch_v4(corr=10))
    assert fetch_v4_partition_error(recv_frame(s)) == 29, "the cluster snapshot is not alice's to read"
    s.sendall(broker_heartbeat_v0(3, 0, want_shut_down=True, corr=11))
    assert broker_heartbeat_error(recv_frame(s)) == (31, True, False), "alice may not shut broker 3 down"
    s.sendall(broker_registration_v0(4, free_port(), corr=14))
    assert struct.unpack(">ih", recv_frame(s)[5:11])[1] == 31, "alice may not register a broker"
    s.sendall(write_txn_markers([(1, 0, True, 0, {"fw-x": [0]})], correlation_id=12))
    assert set(parse_write_txn_markers(recv_frame(s)).values()) == {31}
    s.sendall(alter_partition_v2(1, os.urandom(16), new_isr=[1], corr=15))
    assert struct.unpack(">ih", recv_frame(s)[5:11])[1] == 31, "alice may not change an ISR"
    # DescribeUserScramCredentials v0 of every user (a null array): header v2, then
    # (header v1 answer) throttle, error code.
    s.sendall(frame(request_header_v1(50, 0, 13) + b"\x00" + b"\x00\x00"))
    assert struct.unpack(">ih", recv_frame(s)[5:11])[1] == 31
    s.close()
    assert broker_ids(root) == {1, 2, 3}, "broker 3 still registered, no broker 4"

    # The super user grants alice CREATE on fw-* (through broker 2: forwarded as `broker`).
    root_via_2 = AdminClient(dict(root, **{"bootstrap.servers": f"127.0.0.1:{brokers[2].b.port}"}))
    root_via_2.create_acls([grant])[grant].result(30)
    wait_for(lambda: alice_via_2.create_topics([NewTopic("fw-ok", 1, 1)])["fw-ok"].result(30), lambda r: True,
             30, "alice's creation through broker 2")
    s2.sendall(create_topic_v2("fw-raw", corr=6))
    assert create_topic_v2_error(recv_frame(s2, timeout=40)) == 0, "alice's own grant, through broker 2"
    s2.close()
    assert {"fw-ok", "fw-raw"} <= set(AdminClient(root).list_topics(timeout=10).topics)
    assert error_of(alice_via_2.create_topics([NewTopic("other", 1, 1)])["other"]) == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    # The coordinator's authorizer log names alice and broker 2's address for the denial.
    log = brokers[1].b.log_path.read_text(errors="replace")
    assert re.search(r"Principal = User:alice is Denied Operation = \w+ from host = 127\.0\.0\.1 "
                     r"on resource = Topic:LITERAL:other", log), "no audit line for alice on the coordinator"
    # The same registration from the brokers' principal is taken: alice's was refused
    # for her rights, not for its bytes.
    s = sasl_tls_socket(brokers[1].broker_port, certs, BROKER_USER)
    s.sendall(broker_registration_v0(4, free_port(), corr=15))
    assert struct.unpack(">ih", recv_frame(s)[5:11])[1] == 0
    s.close()
