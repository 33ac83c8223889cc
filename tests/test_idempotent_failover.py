"""Exactly once per partition under failover (issue 12): three brokers, RF=3,
min.insync.replicas=2, a confluent-kafka idempotent producer (acks=all, five requests
in flight per connection) under load while partition leaders are killed with SIGKILL
and restarted and one broker is frozen with SIGSTOP. Afterwards every acknowledged
message is read back exactly once, in send order within its partition: no duplicate
(a retry the new leader wrote again), no gap, no reordering."""

import collections
import time

from helpers.clients import RDKAFKA_LOGGER, cf_consume, create_topic
from test_replication import LoadProducer, kill_leaders_then_freeze, start_cluster, wait_identical_replicas


def test_idempotent_producer_exactly_once_through_kills_and_a_freeze(broker_factory):
    brokers = start_cluster(broker_factory)
    b1 = brokers[1]
    topic, parts = "exactly-once", 3
    create_topic(b1.bootstrap, topic, parts, config={"min.insync.replicas": "2"}, replication_factor=3)
    load = LoadProducer(",".join(b.bootstrap for b in brokers.values()), topic, parts,
                        **{"enable.idempotence": True, "max.in.flight.requests.per.connection": 5,
                           "message.timeout.ms": 180000, "logger": RDKAFKA_LOGGER})
    load.start()
    # The load is flowing (acknowledged on every partition) before the first kill.
    deadline = time.monotonic() + 60
    while {a[0] for a in load.acked} != set(range(parts)):
        assert time.monotonic() < deadline, f"no acknowledged write on some partition in 60 s: {len(load.acked)} acked"
        time.sleep(0.1)
    kill_leaders_then_freeze(brokers, topic, load, kills=2)
    load.finish()
    acked = len(load.acked)
    assert acked > 1000, acked
    assert not load.failed, f"{len(load.failed)} sends failed, e.g. {load.failed[:3]}"

    got = cf_consume(b1.bootstrap, topic, parts, timeout=120)
    for p in range(parts):
        read = [int(r.value) for r in got.get(p, [])]
        dupes = [n for n, c in collections.Counter(read).items() if c > 1]
        assert not dupes, f"partition {p}: {len(dupes)} messages written twice, e.g. {dupes[:5]}"
        assert read == sorted(read), f"partition {p}: read back out of send order"
        missing = {seq for pp, _, seq, _ in load.acked if pp == p} - set(read)
        assert not missing, f"partition {p}: {len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
        # No gap: message n goes to partition n mod parts, and every one sent up to the
        # last one read was written (nothing skipped).
        assert read == list(range(p, p + parts * len(read), parts)), f"partition {p}: a gap in the sequence"
    wait_identical_replicas(brokers, topic, parts)
    print(f"idempotent producer through 2 leader kills and a freeze: {acked} acknowledged, "
          f"{sum(len(v) for v in got.values())} read back, 0 duplicates, 0 lost, in order")
