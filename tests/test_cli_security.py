"""`spate acl`, `spate user scram` and `spate quota` against the real binary: what the CLI
writes is read back by Kafka's own tools (kafka-acls, kafka-configs) and confluent-kafka's
admin client, and enforced on SASL users; what Kafka's tools write, the CLI shows.

The CLI talks plaintext to a listener whose principal (User:ANONYMOUS) is a super user;
the users the ACLs and credentials are about log in on a SASL_PLAINTEXT listener."""

import json
import subprocess

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                   ResourcePatternType, ResourceType, ScramMechanism)

from helpers.broker import SPATE_BIN, free_port
from helpers.clients import admin
from test_acls import acl_tool, parse_acl_list
from test_kafka_tools import configs_tool, tools_classpath  # noqa: F401 (fixture)
from test_quotas import check_scram_document, local_znode, quota_describe
from test_txn_acls import create_topics, start_sasl_broker, user_conf

SPATE = str(SPATE_BIN)


def spate(bootstrap, *args, stdin=None, json_out=False):
    """Run `spate <args> --bootstrap <b>`; (exit code, stdout parsed as JSON or text, stderr)."""
    cmd = [SPATE, *args, "--bootstrap", bootstrap] + (["--json"] if json_out else [])
    r = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60)
    print(f"$ {' '.join(cmd)}  (exit {r.returncode})\n{r.stdout}{r.stderr}")
    out = json.loads(r.stdout) if json_out and r.returncode == 0 else r.stdout
    return r.returncode, out, r.stderr


def produce_one(conf, topic):
    """Produce one record; the delivery error's code (None when delivered)."""
    p, reports = Producer(dict(conf, **{"message.timeout.ms": 10000})), []
    p.produce(topic, value=b"v", on_delivery=lambda err, msg: reports.append(err))
    p.flush(20)
    assert reports, "no delivery report"
    return None if reports[0] is None else reports[0].code()


def test_acls_made_by_the_cli_are_seen_by_kafka_acls_and_enforced(broker_factory, tmp_path, tools_classpath):
    b, port = start_sasl_broker(broker_factory, tmp_path)
    create_topics(b.bootstrap, "cli-t", "cli-u")
    alice = user_conf(port, "alice")
    assert produce_one(alice, "cli-t") == KafkaError.TOPIC_AUTHORIZATION_FAILED  # no ACL yet

    # alice may write every cli- topic but cli-u; bob may write transactions with ids tx-*.
    rc, _, err = spate(b.bootstrap, "acl", "create", "--allow-principal", "User:alice", "--operation", "Write",
                       "--topic", "cli-", "--resource-pattern-type", "prefixed")
    assert rc == 0, err
    rc, _, err = spate(b.bootstrap, "acl", "create", "--deny-principal", "User:alice", "--operation", "Write",
                       "--topic", "cli-u", "--host", "*")
    assert rc == 0, err
    rc, created, err = spate(b.bootstrap, "acl", "create", "--allow-principal", "User:bob", "--operation", "Write",
                             "--operation", "Describe", "--transactional-id", "tx-", "--resource-pattern-type",
                             "prefixed", json_out=True)
    assert rc == 0, err
    assert sorted(a["operation"] for a in created["created"]) == ["Describe", "Write"]

    # Kafka's kafka-acls reads back exactly these.
    code, out = acl_tool(tools_classpath, b.bootstrap, "--list")
    assert code == 0, out
    assert parse_acl_list(out) == {
        ("TOPIC", "cli-", "PREFIXED"): {("User:alice", "*", "WRITE", "ALLOW")},
        ("TOPIC", "cli-u", "LITERAL"): {("User:alice", "*", "WRITE", "DENY")},
        ("TRANSACTIONAL_ID", "tx-", "PREFIXED"): {("User:bob", "*", "WRITE", "ALLOW"),
                                                 ("User:bob", "*", "DESCRIBE", "ALLOW")},
    }
    # And confluent-kafka's admin client (DescribeAcls with a filter).
    a = admin(b.bootstrap)
    found = a.describe_acls(AclBindingFilter(ResourceType.TRANSACTIONAL_ID, None, ResourcePatternType.ANY, None,
                                             None, AclOperation.ANY, AclPermissionType.ANY)).result(20)
    assert sorted((x.name, x.principal, x.operation.name) for x in found) == [
        ("tx-", "User:bob", "DESCRIBE"), ("tx-", "User:bob", "WRITE")]

    # Enforced: the prefixed ALLOW and the literal DENY.
    assert produce_one(alice, "cli-t") is None
    assert produce_one(alice, "cli-u") == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # `acl list` filters by principal and by resource (match: the ACLs that apply to it).
    rc, listed, err = spate(b.bootstrap, "acl", "list", "--principal", "User:alice", json_out=True)
    assert rc == 0, err
    assert sorted((x["name"], x["pattern_type"], x["permission"]) for x in listed["acls"]) == [
        ("cli-", "PREFIXED", "Allow"), ("cli-u", "LITERAL", "Deny")]
    rc, listed, err = spate(b.bootstrap, "acl", "list", "--topic", "cli-t", "--resource-pattern-type", "match",
                            json_out=True)
    assert rc == 0, err
    assert [(x["name"], x["principal"]) for x in listed["acls"]] == [("cli-", "User:alice")]
    rc, text, err = spate(b.bootstrap, "acl", "list", "--transactional-id", "tx-", "--resource-pattern-type",
                          "prefixed")
    assert rc == 0 and "TransactionalId" in text and "User:bob" in text, err

    # Deleting the ALLOW takes alice's write away again.
    rc, deleted, err = spate(b.bootstrap, "acl", "delete", "--allow-principal", "User:alice", "--topic", "cli-",
                             "--resource-pattern-type", "prefixed", json_out=True)
    assert rc == 0, err
    assert [(x["name"], x["operation"]) for x in deleted["deleted"]] == [("cli-", "Write")]
    assert produce_one(alice, "cli-t") == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # Usage errors exit 2 and send nothing.
    rc, _, err = spate(b.bootstrap, "acl", "create", "--allow-principal", "User:alice", "--operation", "Fly",
                       "--topic", "x")
    assert rc == 2 and "unknown --operation" in err
    rc, _, err = spate(b.bootstrap, "acl", "delete")
    assert rc == 2


def scram_conf(port, user, password):
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password}


def test_scram_user_set_by_the_cli_logs_in(broker_factory, tmp_path):
    plain_port, sasl_port = free_port(), free_port()
    b = broker_factory("--listeners", f"PLAINTEXT://127.0.0.1:{plain_port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
                       port=plain_port)
    create_topics(b.bootstrap, "scram-t")
    # The password on stdin (no --password), 8192 iterations.
    rc, out, err = spate(b.bootstrap, "user", "scram", "set", "--user", "carol", "--mechanism", "SCRAM-SHA-512",
                         "--iterations", "8192", stdin="carol-pw\n")
    assert rc == 0, err
    assert "carol" in out
    rc, _, err = spate(b.bootstrap, "user", "scram", "set", "--user", "dave", "--mechanism", "scram-sha-256",
                       "--password", "dave-pw")
    assert rc == 0, err

    # Stored as Kafka stores it: the credential RFC 5802 derives from the password.
    stored = json.loads(local_znode(b, "/config/users/carol"))["config"]["SCRAM-SHA-512"]
    check_scram_document(stored, "carol-pw", 8192)

    # carol logs in with confluent-kafka (SCRAM-SHA-512) and produces; a wrong password is refused.
    assert produce_one(scram_conf(sasl_port, "carol", "carol-pw"), "scram-t") is None
    with pytest.raises(KafkaException):
        AdminClient(scram_conf(sasl_port, "carol", "wrong")).list_topics(timeout=4)

    # describe: the CLI and confluent-kafka's admin agree.
    rc, described, err = spate(b.bootstrap, "user", "scram", "describe", json_out=True)
    assert rc == 0, err
    assert sorted((u["user"], c["mechanism"], c["iterations"]) for u in described["users"]
                  for c in u["credentials"]) == [("carol", "SCRAM-SHA-512", 8192), ("dave", "SCRAM-SHA-256", 4096)]
    a = admin(b.bootstrap)
    info = a.describe_user_scram_credentials(["carol"], request_timeout=15)["carol"].result(15)
    assert [(i.mechanism, i.iterations) for i in info.scram_credential_infos] == [(ScramMechanism.SCRAM_SHA_512, 8192)]

    # Deleted: the login is refused, and describing the user is an error (exit 1).
    rc, _, err = spate(b.bootstrap, "user", "scram", "delete", "--user", "carol", "--mechanism", "SCRAM-SHA-512")
    assert rc == 0, err
    with pytest.raises(KafkaException):
        AdminClient(scram_conf(sasl_port, "carol", "carol-pw")).list_topics(timeout=4)
    rc, _, err = spate(b.bootstrap, "user", "scram", "describe", "--user", "carol")
    assert rc == 1 and "RESOURCE_NOT_FOUND" in err
    # Kafka's bounds hold for the CLI too: too few iterations is refused by the broker.
    rc, _, err = spate(b.bootstrap, "user", "scram", "set", "--user", "erin", "--mechanism", "SCRAM-SHA-256",
                       "--iterations", "10", "--password", "x")
    assert rc == 1 and "UNACCEPTABLE_CREDENTIAL" in err


def test_quotas_set_by_the_cli_are_read_by_kafka_configs_and_back(broker, tools_classpath):
    bootstrap = broker.bootstrap
    rc, _, err = spate(bootstrap, "quota", "set", "--user", "alice", "--producer-byte-rate", "1024",
                       "--consumer-byte-rate", "2048")
    assert rc == 0, err
    rc, _, err = spate(bootstrap, "quota", "set", "--user", "alice", "--client-default", "--request-percentage", "50")
    assert rc == 0, err
    assert quota_describe(tools_classpath, bootstrap, "--entity-type", "users", "--entity-name", "alice") == {
        "producer_byte_rate": 1024.0, "consumer_byte_rate": 2048.0}
    assert quota_describe(tools_classpath, bootstrap, "--entity-type", "users", "--entity-name", "alice",
                          "--entity-type", "clients", "--entity-default") == {"request_percentage": 50.0}

    # What kafka-configs sets, `spate quota describe` shows.
    rc, out = configs_tool(tools_classpath, bootstrap, "--alter", "--entity-type", "clients", "--entity-name",
                           "app-9", "--add-config", "producer_byte_rate=777")
    assert rc == 0, out
    rc, described, err = spate(bootstrap, "quota", "describe", "--client-id", "app-9", json_out=True)
    assert rc == 0, err
    assert described["quotas"] == [{"entity": {"client-id": "app-9"}, "quotas": {"producer_byte_rate": 777.0}}]
    rc, text, err = spate(bootstrap, "quota", "describe")
    assert rc == 0, err
    assert any("client-id=app-9" in line and "producer_byte_rate" in line for line in text.splitlines()), text
    assert any("user=alice" in line and "client-id=<default>" in line and "request_percentage" in line
               for line in text.splitlines()), text

    # delete one key; the other stays.
    rc, _, err = spate(bootstrap, "quota", "delete", "--user", "alice", "--key", "producer_byte_rate")
    assert rc == 0, err
    assert quota_describe(tools_classpath, bootstrap, "--entity-type", "users", "--entity-name", "alice") == {
        "consumer_byte_rate": 2048.0}
    rc, _, err = spate(bootstrap, "quota", "set", "--user", "alice")
    assert rc == 2 and "set needs" in err
