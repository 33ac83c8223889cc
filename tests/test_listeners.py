"""Named listeners in a cluster (issue 17): each client is told the endpoints of the
listener it connected through, as Kafka's Metadata and FindCoordinator do.

Three brokers, each with two PLAINTEXT listeners: INTERNAL (the inter-broker listener:
replication, the coordinator link) and EXTERNAL (the clients'); broker 3 also has an
EXTRA listener the others lack. Broker 1 runs the embedded coordinator. Brokers register
every listener they advertise (BrokerRegistration's listener list, `/brokers/ids/<id>`'s
endpoints), so:
- a client on EXTERNAL sees every broker at its EXTERNAL port, produces acks=all to
  partitions led by each broker, and its group's coordinator is at an EXTERNAL port;
- a client on INTERNAL sees INTERNAL ports;
- a client on broker 3's EXTRA sees broker 3 only, and a partition led by another
  broker has no leader it could reach (LISTENER_NOT_FOUND).
Before listeners were registered, other brokers were listed at their inter-broker
address whatever listener the client used."""

import time

from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import NewTopic

from helpers.broker import free_port
from helpers.clients import admin, cf_conf, cf_produce
from test_cluster import cluster_args

TOPIC = "listeners"
PARTITIONS = 6


def start_cluster(broker_factory):
    """{id: (broker, {listener: port})} for brokers 1-3."""
    out = {}
    for i in (1, 2, 3):
        ports = {"INTERNAL": free_port(), "EXTERNAL": free_port()}
        if i == 3:
            ports["EXTRA"] = free_port()
        args = [*cluster_args(i),
                "--listeners", ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items()),
                "--listener-security-protocol-map", ",".join(f"{name}:PLAINTEXT" for name in ports),
                "--inter-broker-listener-name", "INTERNAL"]
        if i > 1:
            args += ["--coordinator", f"127.0.0.1:{out[1][1]['INTERNAL']}"]
        b = broker_factory(*args, name=f"b{i}", cores=1, port=ports["EXTERNAL"])
        out[i] = (b, ports)
    return out


def listed(port, topic=None):
    """({broker id: port}, {partition: (leader, error code)}) from Metadata through `port`."""
    a = admin(f"127.0.0.1:{port}")
    md = a.list_topics(timeout=10)
    brokers = {b.id: b.port for b in md.brokers.values()}
    parts = {}
    if topic is not None and topic in md.topics:
        parts = {p.id: (p.leader, p.error.code() if p.error else 0)
                 for p in md.topics[topic].partitions.values()}
    return brokers, parts


def wait_for(fn, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if predicate(last):
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout}s; last seen: {last}")


def test_each_client_is_told_the_endpoints_of_its_own_listener(broker_factory):
    cluster = start_cluster(broker_factory)
    port = {i: ports for i, (_, ports) in cluster.items()}
    external = {i: p["EXTERNAL"] for i, p in port.items()}
    internal = {i: p["INTERNAL"] for i, p in port.items()}

    for via in (1, 2, 3):
        wait_for(lambda: listed(external[via])[0], lambda b: b == external, 30,
                 f"every broker at its EXTERNAL port through broker {via}'s EXTERNAL listener")
        assert listed(internal[via])[0] == internal, f"through broker {via}'s INTERNAL listener"

    boot = f"127.0.0.1:{external[2]}"
    a = admin(boot)  # referenced until its futures are done
    fs = a.create_topics([NewTopic(TOPIC, PARTITIONS, replication_factor=3)], request_timeout=15)
    fs[TOPIC].result(20)
    _, parts = wait_for(lambda: listed(external[2], TOPIC), lambda r: len(r[1]) == PARTITIONS
                        and all(leader > 0 and err == 0 for leader, err in r[1].values()), 30,
                        f"{TOPIC} led everywhere")
    leaders = {p: leader for p, (leader, _) in parts.items()}
    assert set(leaders.values()) == {1, 2, 3}, leaders

    # acks=all through EXTERNAL only, to every partition (each broker leads some).
    records = [{"value": f"v{p}-{i}".encode(), "partition": p} for p in range(PARTITIONS) for i in range(5)]
    cf_produce(boot, TOPIC, records, acks="all", **{"enable.idempotence": True})

    # A group through EXTERNAL: its coordinator is named at an EXTERNAL port.
    c = Consumer(cf_conf(boot, **{"group.id": "listeners-group", "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False}))
    try:
        c.subscribe([TOPIC])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < len(records) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
        assert sorted(got) == sorted(r["value"] for r in records)
        c.commit(asynchronous=False)
    finally:
        c.close()
    desc = a.describe_consumer_groups(["listeners-group"], request_timeout=15)["listeners-group"].result(20)
    assert desc.coordinator.port in external.values(), (desc.coordinator, external)

    # Broker 3's EXTRA listener: only broker 3 is listed; a partition another broker leads
    # has no leader this client could reach.
    brokers, parts = listed(port[3]["EXTRA"], TOPIC)
    assert brokers == {3: port[3]["EXTRA"]}, brokers
    for p, leader in leaders.items():
        if leader == 3:
            assert parts[p] == (3, 0), (p, parts[p])
        else:
            assert parts[p] == (-1, KafkaError.LISTENER_NOT_FOUND), (p, parts[p])
