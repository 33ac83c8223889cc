"""ACLs on the transaction and idempotence APIs, as Kafka's KafkaApis checks them, with
confluent-kafka's transactional and idempotent producers as SASL PLAIN users.

The broker has a PLAINTEXT listener whose principal (User:ANONYMOUS) is a super user,
used to set ACLs up and to read back, and a SASL_PLAINTEXT listener for the users the
ACLs are about."""

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, NewTopic, ResourcePatternType,
                                   ResourceType)

from helpers.broker import free_port
from helpers.clients import admin
from test_kafka_tools import run_tool, tools_classpath  # noqa: F401 (fixture)

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


def start_sasl_broker(broker_factory, tmp_path):
    """(broker, SASL_PLAINTEXT port): the authorizer on, ANONYMOUS a super user."""
    config = tmp_path / "security.toml"
    config.write_text(
        'authorizer_class_name = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"\n'
        'super_users = "User:ANONYMOUS"\n'
        "[sasl_plain_users]\n" + "".join(f'{u} = "{p}"\n' for u, p in USERS.items()))
    plain_port, sasl_port = free_port(), free_port()
    b = broker_factory("--config", str(config), "--listeners",
                       f"PLAINTEXT://127.0.0.1:{plain_port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
                       port=plain_port)
    return b, sasl_port


def user_conf(port, user, **extra):
    conf = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": USERS[user]}
    conf.update(extra)
    return conf


def allow(principal, resource_type, name, op, pattern=ResourcePatternType.LITERAL):
    return AclBinding(resource_type, name, pattern, principal, "*", op, AclPermissionType.ALLOW)


def create_acls(bootstrap, bindings):
    a = admin(bootstrap)
    for f in a.create_acls(bindings).values():
        f.result(30)


def create_topics(bootstrap, *names):
    a = admin(bootstrap)
    for f in a.create_topics([NewTopic(n, 1) for n in names]).values():
        f.result(30)


def sasl_broker_with(broker_factory, tmp_path, topics, bindings):
    """A SASL broker (start_sasl_broker) with `topics` and the ACLs `bindings`."""
    b, port = start_sasl_broker(broker_factory, tmp_path)
    create_topics(b.bootstrap, *topics)
    create_acls(b.bootstrap, bindings)
    return b, port


def init_error(conf):
    """The error code init_transactions fails with, or None."""
    p = Producer(conf)
    try:
        p.init_transactions(20)
    except KafkaException as e:
        return e.args[0].code()
    return None


def test_transactional_id_acls_with_a_transactional_producer(broker_factory, tmp_path):
    b, port = sasl_broker_with(broker_factory, tmp_path, ["txt", "other"], [
        allow("User:alice", ResourceType.TOPIC, "txt", AclOperation.WRITE),
        allow("User:alice", ResourceType.TOPIC, "other", AclOperation.DESCRIBE),
        # DESCRIBE lets FindCoordinator through: the refusal below is InitProducerId's.
        allow("User:alice", ResourceType.TRANSACTIONAL_ID, "tx-alice", AclOperation.DESCRIBE),
    ])
    conf = user_conf(port, "alice", **{"transactional.id": "tx-alice"})
    assert init_error(conf) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert "Principal = User:alice is Denied Operation = Write from host = 127.0.0.1 on resource = " \
           "TransactionalId:LITERAL:tx-alice for request = InitProducerId" in b.log_path.read_text()

    # WRITE on a prefix of the id: the whole transaction goes through.
    create_acls(b.bootstrap, [allow("User:alice", ResourceType.TRANSACTIONAL_ID, "tx-", AclOperation.WRITE,
                                    ResourcePatternType.PREFIXED)])
    p = Producer(conf)
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce("txt", value=f"v{i}".encode())
    p.commit_transaction(30)

    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "check", "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed"})
    c.subscribe(["txt"])
    got, deadline = [], time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert got == [f"v{i}".encode() for i in range(5)]

    # AddPartitionsToTxn: a topic alice may describe but not write fails the transaction.
    p.begin_transaction()
    p.produce("other", value=b"no")
    with pytest.raises(KafkaException) as e:
        p.commit_transaction(30)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "Denied Operation = Write from host = 127.0.0.1 on resource = Topic:LITERAL:other for request = " \
           "AddPartitionsToTxn" in b.log_path.read_text()


def test_add_offsets_to_txn_needs_read_on_the_group(broker_factory, tmp_path):
    b, port = sasl_broker_with(broker_factory, tmp_path, ["in", "out"], [
        allow("User:alice", ResourceType.TOPIC, "out", AclOperation.WRITE),
        allow("User:alice", ResourceType.TRANSACTIONAL_ID, "tx-g", AclOperation.WRITE),
    ])
    p = Producer(user_conf(port, "alice", **{"transactional.id": "tx-g"}))
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("out", value=b"x")
    from confluent_kafka import TopicPartition
    metadata = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g-denied"}).consumer_group_metadata()
    with pytest.raises(KafkaException) as e:
        p.send_offsets_to_transaction([TopicPartition("in", 0, 1)], metadata, 30)
    assert e.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert "on resource = Group:LITERAL:g-denied for request = AddOffsetsToTxn" in b.log_path.read_text()


def test_idempotent_producer_needs_idempotent_write_or_write_on_a_topic(broker_factory, tmp_path):
    """bob may only DESCRIBE the topic: InitProducerId without a transactional id is
    refused (CLUSTER_AUTHORIZATION_FAILED), so his idempotent producer cannot start;
    alice, with WRITE on a topic, can."""
    b, port = sasl_broker_with(broker_factory, tmp_path, ["idem"], [
        allow("User:bob", ResourceType.TOPIC, "idem", AclOperation.DESCRIBE),
        allow("User:alice", ResourceType.TOPIC, "idem", AclOperation.WRITE),
    ])

    def producer(user):
        return Producer(user_conf(port, user, **{"enable.idempotence": True, "message.timeout.ms": 15000}))

    # librdkafka makes the refused InitProducerId a fatal error of the producer, raised
    # from flush (a delivery callback would be called with that exception pending).
    bobs = producer("bob")
    bobs.produce("idem", value=b"v")
    with pytest.raises(KafkaException) as e:
        bobs.flush(30)
    assert e.value.args[0].fatal() and e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert "Principal = User:bob is Denied Operation = IdempotentWrite" in b.log_path.read_text()
    alices, reports = producer("alice"), []
    alices.produce("idem", value=b"v", on_delivery=lambda err, msg: reports.append(err))
    alices.flush(30)
    assert reports == [None]


def test_describe_and_list_transactions_need_describe_on_the_id(broker_factory, tmp_path, tools_classpath):
    """Kafka's kafka-transactions tool as alice (WRITE on the id, which implies DESCRIBE)
    and as bob (no ACL): bob's list leaves the id out (ListTransactions' filter), his
    describe is refused (the admin client's FindCoordinator already needs DESCRIBE on the
    id, so DescribeTransactions' own check is not what refuses it here)."""
    b, port = sasl_broker_with(broker_factory, tmp_path, ["dt"], [
        allow("User:alice", ResourceType.TOPIC, "dt", AclOperation.WRITE),
        allow("User:alice", ResourceType.TRANSACTIONAL_ID, "tx-d", AclOperation.WRITE),
    ])
    p = Producer(user_conf(port, "alice", **{"transactional.id": "tx-d"}))
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("dt", value=b"x")
    p.commit_transaction(30)

    def transactions_tool(user, *args):
        props = tmp_path / f"{user}.properties"
        props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                         "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                         f'username="{user}" password="{USERS[user]}";\n')
        return run_tool(tools_classpath, "TransactionsCommand", "--bootstrap-server", f"127.0.0.1:{port}",
                        "--command-config", props, *args)

    rc, out = transactions_tool("alice", "list")
    assert rc == 0 and "tx-d" in out, out
    rc, out = transactions_tool("alice", "describe", "--transactional-id", "tx-d")
    assert rc == 0 and "CompleteCommit" in out, out
    rc, out = transactions_tool("bob", "list")
    assert rc == 0 and "tx-d" not in out, out
    rc, out = transactions_tool("bob", "describe", "--transactional-id", "tx-d")
    assert rc != 0 and "authorization failure" in out, out
