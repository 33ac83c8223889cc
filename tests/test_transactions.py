"""Transactions against the real broker with confluent-kafka's transactional Producer at
its defaults (librdkafka): init_transactions finds the transaction coordinator
(FindCoordinator key_type=1, which creates __transaction_state) and gets a producer id
and epoch; empty transactions commit and abort; a second producer with the same
transactional.id fences the first (its next transaction fails with a fatal, fenced
error); a transaction with records commits or aborts, and a read_committed consumer
sees only the committed records.

send_offsets_to_transaction commits a consumer's offsets with the transaction.
kafka-python's transactional producer (3.x, its defaults) commits, aborts, sends offsets
and is fenced the same way. A producer killed with SIGKILL mid-transaction leaves it
open: the coordinator aborts it after its transaction.timeout.ms, read_committed
consumers go on, and the coordinator's metrics show the transaction open, its age, and
the abort. Three
brokers: coordinators on every broker, producer ids from the active coordinator, state
changes replicated to three replicas, markers sent to every partition leader, and the
coordinator's broker killed with SIGKILL."""

import subprocess
import sys
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from helpers.broker import free_port
from helpers.clients import cf_conf, cf_consume, create_topic, kp_common, kp_consumer
from helpers.kafka_hash import java_hash_partition
from helpers.metrics import metric_sum, scrape

TXN_TIMEOUT_S = 30

def txn_producer(bootstrap, txn_id, **extra):
    return Producer(cf_conf(bootstrap, **{"transactional.id": txn_id, **extra}))


def test_init_and_empty_transactions(broker):
    """init_transactions, then empty transactions committed and aborted: nothing for the
    coordinator to write but the producer's id and epoch."""
    p = txn_producer(broker.bootstrap, "tx-empty")
    p.init_transactions(TXN_TIMEOUT_S)
    p.begin_transaction()
    p.commit_transaction(TXN_TIMEOUT_S)
    p.begin_transaction()
    p.abort_transaction(TXN_TIMEOUT_S)
    # The same id again (a restarted application): a new epoch, and it works too.
    p2 = txn_producer(broker.bootstrap, "tx-empty")
    p2.init_transactions(TXN_TIMEOUT_S)
    p2.begin_transaction()
    p2.commit_transaction(TXN_TIMEOUT_S)
    assert broker.alive()
    assert "created internal topic" in broker.log_text() and "__transaction_state" in broker.log_text()


def test_second_producer_fences_the_first(broker):
    """A second producer with the same transactional.id bumps the epoch: the first one's
    next transaction is refused with a fatal error (PRODUCER_FENCED)."""
    create_topic(broker.bootstrap, "tx-fence", 1)
    first = txn_producer(broker.bootstrap, "tx-fenced")
    first.init_transactions(TXN_TIMEOUT_S)
    second = txn_producer(broker.bootstrap, "tx-fenced")
    second.init_transactions(TXN_TIMEOUT_S)

    first.begin_transaction()
    first.produce("tx-fence", b"zombie", partition=0)
    with pytest.raises(KafkaException) as raised:
        first.commit_transaction(TXN_TIMEOUT_S)
    err = raised.value.args[0]
    assert err.fatal(), err
    assert err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH), err
    assert broker.alive()


def test_commit_and_abort_with_records(broker):
    """begin, produce, commit; begin, produce, abort: a read_committed consumer sees the
    committed records only, a read_uncommitted one sees both (and no control records)."""
    create_topic(broker.bootstrap, "tx-data", 2)
    p = txn_producer(broker.bootstrap, "tx-data-app")
    p.init_transactions(TXN_TIMEOUT_S)

    p.begin_transaction()
    for i in range(10):
        p.produce("tx-data", b"committed-%d" % i, partition=i % 2)
    p.commit_transaction(TXN_TIMEOUT_S)

    p.begin_transaction()
    for i in range(10):
        p.produce("tx-data", b"aborted-%d" % i, partition=i % 2)
    p.flush(TXN_TIMEOUT_S)
    p.abort_transaction(TXN_TIMEOUT_S)

    p.begin_transaction()
    p.produce("tx-data", b"last", partition=0)
    p.commit_transaction(TXN_TIMEOUT_S)

    got = cf_consume(broker.bootstrap, "tx-data", 2, count=11, **{"isolation.level": "read_committed"})
    values = sorted(r.value for recs in got.values() for r in recs)
    assert values == sorted([b"committed-%d" % i for i in range(10)] + [b"last"]), values
    got = cf_consume(broker.bootstrap, "tx-data", 2, count=21, **{"isolation.level": "read_uncommitted"})
    values = [r.value for recs in got.values() for r in recs]
    assert len(values) == 21 and sum(v.startswith(b"aborted-") for v in values) == 10, values


def test_open_transaction_blocks_read_committed_until_it_ends(broker):
    """A read_committed consumer stops at the last stable offset: records of an open
    transaction are not returned until it commits."""
    create_topic(broker.bootstrap, "tx-lso", 1)
    p = txn_producer(broker.bootstrap, "tx-lso-app")
    p.init_transactions(TXN_TIMEOUT_S)
    p.begin_transaction()
    p.produce("tx-lso", b"pending", partition=0)
    p.flush(TXN_TIMEOUT_S)
    got = cf_consume(broker.bootstrap, "tx-lso", 1, timeout=5, **{"isolation.level": "read_committed"})
    assert got[0] == []
    p.commit_transaction(TXN_TIMEOUT_S)
    got = cf_consume(broker.bootstrap, "tx-lso", 1, count=1, **{"isolation.level": "read_committed"})
    assert [r.value for r in got[0]] == [b"pending"]


def test_send_offsets_to_transaction(broker):
    """Consume-transform-produce: the consumer's offsets commit with the transaction."""
    from confluent_kafka import Consumer, TopicPartition
    create_topic(broker.bootstrap, "tx-in", 1)
    create_topic(broker.bootstrap, "tx-out", 1)
    src = Producer(cf_conf(broker.bootstrap))
    for i in range(5):
        src.produce("tx-in", b"in-%d" % i, partition=0)
    src.flush(10)
    c = Consumer(cf_conf(broker.bootstrap, **{"group.id": "tx-group", "enable.auto.commit": False,
                                              "auto.offset.reset": "earliest", "isolation.level": "read_committed"}))
    c.subscribe(["tx-in"])
    p = txn_producer(broker.bootstrap, "tx-ctp")
    p.init_transactions(TXN_TIMEOUT_S)
    read = []
    deadline = time.monotonic() + 30
    while len(read) < 5 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            read.append(m)
    assert len(read) == 5
    p.begin_transaction()
    for m in read:
        p.produce("tx-out", m.value().replace(b"in", b"out"), partition=0)
    p.send_offsets_to_transaction([TopicPartition("tx-in", 0, read[-1].offset() + 1)],
                                  c.consumer_group_metadata(), TXN_TIMEOUT_S)
    p.commit_transaction(TXN_TIMEOUT_S)
    committed = c.committed([TopicPartition("tx-in", 0)], timeout=10)
    assert committed[0].offset == 5
    c.close()


def kp_txn_producer(bootstrap, txn_id):
    from kafka import KafkaProducer
    return KafkaProducer(**kp_common(bootstrap), transactional_id=txn_id)


def test_kafka_python_transactions_commit_abort_offsets_and_fencing(broker):
    """kafka-python's transactional KafkaProducer at its defaults: a committed transaction
    is seen by read_committed readers, an aborted one only by read_uncommitted ones;
    send_offsets_to_transaction with the consumer's group metadata commits the group's
    offset with the transaction; a second producer with the same transactional_id fences
    the first, whose next commit fails."""
    from kafka import TopicPartition as KTP
    from kafka.errors import KafkaError as KPError
    from kafka.structs import OffsetAndMetadata
    create_topic(broker.bootstrap, "kp-tx-in", 1)
    create_topic(broker.bootstrap, "kp-tx-out", 2)
    src = Producer(cf_conf(broker.bootstrap))
    for i in range(4):
        src.produce("kp-tx-in", b"in-%d" % i, partition=0)
    src.flush(10)

    p = kp_txn_producer(broker.bootstrap, "kp-tx-app")
    p.init_transactions()
    p.begin_transaction()
    for i in range(6):
        p.send("kp-tx-out", b"committed-%d" % i, partition=i % 2)
    p.commit_transaction()
    p.begin_transaction()
    for i in range(6):
        p.send("kp-tx-out", b"aborted-%d" % i, partition=i % 2)
    p.flush()
    p.abort_transaction()

    # Consume-transform-produce: read the input in a group, commit its offset with the output.
    c = kp_consumer(broker.bootstrap, group_id="kp-tx-group", isolation_level="read_committed")
    c.subscribe(["kp-tx-in"])
    read = []
    deadline = time.monotonic() + 30
    while len(read) < 4 and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=500).values():
            read.extend(recs)
    assert [r.value for r in read] == [b"in-%d" % i for i in range(4)]
    p.begin_transaction()
    for r in read:
        p.send("kp-tx-out", r.value.replace(b"in", b"out"), partition=0)
    p.send_offsets_to_transaction({KTP("kp-tx-in", 0): OffsetAndMetadata(read[-1].offset + 1, "", -1)},
                                  c.group_metadata())
    p.commit_transaction()
    assert c.committed(KTP("kp-tx-in", 0)) == 4
    c.close()

    committed = sorted([b"committed-%d" % i for i in range(6)] + [b"out-%d" % i for i in range(4)])
    got = cf_consume(broker.bootstrap, "kp-tx-out", 2, count=10, **{"isolation.level": "read_committed"})
    assert sorted(r.value for recs in got.values() for r in recs) == committed
    got = cf_consume(broker.bootstrap, "kp-tx-out", 2, count=16, **{"isolation.level": "read_uncommitted"})
    values = [r.value for recs in got.values() for r in recs]
    assert len(values) == 16 and sorted(v for v in values if v.startswith(b"aborted-")) == \
        sorted(b"aborted-%d" % i for i in range(6)), values

    # A second producer with the same id fences the first.
    zombie = p
    p2 = kp_txn_producer(broker.bootstrap, "kp-tx-app")
    p2.init_transactions()
    zombie.begin_transaction()
    zombie.send("kp-tx-out", b"zombie", partition=0)
    with pytest.raises(KPError) as raised:
        zombie.commit_transaction()
    # The fencing error reaches commit_transaction directly, or, when the sender thread met it
    # first (on AddPartitionsToTxn for the send above), the producer is already in its error
    # state and commit_transaction raises a plain KafkaError; the cause is then its last error.
    cause = raised.value
    if type(cause).__name__ == "KafkaError":
        cause = zombie._transaction_manager.last_error
    assert type(cause).__name__ in ("ProducerFencedError", "InvalidProducerEpochError"), raised.value
    p2.begin_transaction()
    p2.send("kp-tx-out", b"after-fence", partition=0)
    p2.commit_transaction()
    got = cf_consume(broker.bootstrap, "kp-tx-out", 2, count=11, **{"isolation.level": "read_committed"})
    values = sorted(r.value for recs in got.values() for r in recs)
    assert values == sorted(committed + [b"after-fence"]), values
    p2.close()
    assert broker.alive()


ORPHAN_PRODUCER = """
import sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": "tx-orphan",
              "transaction.timeout.ms": 3000})
p.init_transactions(30)
p.begin_transaction()
p.produce("tx-orphaned", b"orphan", partition=0)
p.flush(30)
print("open", flush=True)
sys.stdin.read()
"""


def metrics_when(mport, pred, timeout=30):
    """The first /metrics text satisfying `pred`, polled until `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(mport)
        if pred(m):
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.2)


def test_a_killed_producers_transaction_times_out_and_the_metrics_show_it(broker_factory):
    """A producer SIGKILLed mid-transaction leaves its transaction open: read_committed
    readers stop at it (a later committed record waits behind it), the coordinator's
    metrics show one Ongoing transaction and its age. After transaction.timeout.ms the
    coordinator aborts it: the timeout counter moves, no transaction is open, the
    partition's LSO lag is 0, and a read_committed consumer gets the committed record
    and never the orphan."""
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}")
    create_topic(b.bootstrap, "tx-orphaned", 1)
    orphan = subprocess.Popen([sys.executable, "-c", ORPHAN_PRODUCER, b.bootstrap],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert orphan.stdout.readline().strip() == "open"
        opened = time.monotonic()
        # Shards publish their status at each housekeeping tick: wait for the next one.
        m = metrics_when(mport, lambda m: metric_sum(m, 'spate_transactions{state="Ongoing"}') == 1)
        assert metric_sum(m, "spate_transactions_timed_out_total") == 0
    finally:
        orphan.kill()
        orphan.wait()
    later = txn_producer(b.bootstrap, "tx-after-orphan")
    later.init_transactions(TXN_TIMEOUT_S)
    later.begin_transaction()
    later.produce("tx-orphaned", b"committed-after", partition=0)
    later.commit_transaction(TXN_TIMEOUT_S)
    # The orphan's transaction still holds the LSO back (unless its 3 s already ran out).
    m = scrape(mport)
    if metric_sum(m, "spate_transactions_timed_out_total") == 0:
        assert metric_sum(m, 'spate_transactions{state="Ongoing"}') == 1, m
        assert metric_sum(m, "spate_transaction_oldest_open_age_seconds") > 0, m

    metrics_when(mport, lambda m: metric_sum(m, "spate_transactions_timed_out_total") >= 1, timeout=60)
    assert time.monotonic() - opened >= 3.0 - 0.5, "aborted before its timeout"
    got = cf_consume(b.bootstrap, "tx-orphaned", 1, count=1, **{"isolation.level": "read_committed"})
    assert [r.value for r in got[0]] == [b"committed-after"]
    m = metrics_when(mport, lambda m: metric_sum(m, 'spate_transactions{state="Ongoing"}') == 0
                     and metric_sum(m, 'spate_transactions{state="PrepareAbort"}') == 0
                     and metric_sum(m, 'spate_partition_last_stable_offset_lag{topic="tx-orphaned"') == 0)
    assert metric_sum(m, 'spate_transactions{state="CompleteAbort"}') == 1, m
    assert metric_sum(m, "spate_transaction_oldest_open_age_seconds") == 0, m


def test_coordinators_across_a_cluster(broker_factory):
    """Three brokers (__transaction_state with three replicas): each transactional id's
    coordinator is the leader of its partition, found from any broker; a coordinator that
    is not the active controller gets its producer ids from the active one; every state
    change waits for the three replicas. Fencing works wherever the coordinator is."""
    from test_cluster import start_embedded_cluster
    brokers = start_embedded_cluster(broker_factory, 3)
    create_topic(brokers[0].bootstrap, "tx-cluster", 3, replication_factor=3)
    ids = [f"tx-cluster-{i}" for i in range(6)]
    producers = {}
    for i, txn_id in enumerate(ids):
        p = txn_producer(brokers[i % 3].bootstrap, txn_id)
        p.init_transactions(TXN_TIMEOUT_S)
        p.begin_transaction()
        p.commit_transaction(TXN_TIMEOUT_S)
        producers[txn_id] = p
    log = "".join(b.log_text() for b in brokers)
    assert "created internal topic" in log
    # A second producer for each id fences the first, whichever broker coordinates it.
    for txn_id in ids[:3]:
        again = txn_producer(brokers[2].bootstrap, txn_id)
        again.init_transactions(TXN_TIMEOUT_S)
        first = producers[txn_id]
        first.begin_transaction()
        first.produce("tx-cluster", b"zombie", partition=0)
        with pytest.raises(KafkaException) as raised:
            first.commit_transaction(TXN_TIMEOUT_S)
        assert raised.value.args[0].fatal(), raised.value.args[0]
    assert all(b.alive() for b in brokers)


def test_markers_reach_every_leader_of_a_cluster(broker_factory):
    """A transaction over partitions led by three brokers: the coordinator sends markers
    to each leader; read_committed consumers see the committed records only."""
    from test_cluster import start_embedded_cluster
    brokers = start_embedded_cluster(broker_factory, 3)
    create_topic(brokers[0].bootstrap, "tx-spread", 6, replication_factor=2)
    p = txn_producer(brokers[1].bootstrap, "tx-spread-app")
    p.init_transactions(TXN_TIMEOUT_S)
    p.begin_transaction()
    for i in range(12):
        p.produce("tx-spread", b"c-%d" % i, partition=i % 6)
    p.commit_transaction(TXN_TIMEOUT_S)
    p.begin_transaction()
    for i in range(12):
        p.produce("tx-spread", b"a-%d" % i, partition=i % 6)
    p.abort_transaction(TXN_TIMEOUT_S)
    got = cf_consume(brokers[0].bootstrap, "tx-spread", 6, count=12, **{"isolation.level": "read_committed"})
    assert sorted(r.value for recs in got.values() for r in recs) == sorted(b"c-%d" % i for i in range(12))


def test_a_new_coordinator_takes_over_after_kill9(broker_factory):
    """The broker coordinating a transactional id is killed (-9): the new leader of its
    __transaction_state partition loads the id, and the producer's next transaction
    commits through it; read_committed sees both transactions' records."""
    from test_cluster import cluster_metadata, start_embedded_cluster
    assert java_hash_partition("my-group") == 12  # Java's "my-group".hashCode() is -1906497762
    brokers = start_embedded_cluster(broker_factory, 3)
    create_topic(brokers[0].bootstrap, "tx-fo", 3, replication_factor=3)
    probe = txn_producer(brokers[0].bootstrap, "tx-fo-probe")
    probe.init_transactions(TXN_TIMEOUT_S)
    parts = cluster_metadata(brokers[0].bootstrap).topics["__transaction_state"].partitions
    # Broker 1 runs the embedded metadata coordinator: kill another one.
    txn_id = next(f"tx-fo-{i}" for i in range(200) if parts[java_hash_partition(f"tx-fo-{i}")].leader != 1)
    victim = brokers[parts[java_hash_partition(txn_id)].leader - 1]

    p = txn_producer(brokers[0].bootstrap, txn_id)
    p.init_transactions(TXN_TIMEOUT_S)
    p.begin_transaction()
    for i in range(6):
        p.produce("tx-fo", b"before-%d" % i, partition=i % 3)
    p.commit_transaction(TXN_TIMEOUT_S)

    victim.kill()
    p.begin_transaction()
    for i in range(6):
        p.produce("tx-fo", b"after-%d" % i, partition=i % 3)
    p.commit_transaction(60)

    got = cf_consume(brokers[0].bootstrap, "tx-fo", 3, count=12, **{"isolation.level": "read_committed"})
    values = sorted(r.value for recs in got.values() for r in recs)
    assert values == sorted([b"before-%d" % i for i in range(6)] + [b"after-%d" % i for i in range(6)]), values
