"""Exactly once per partition under failover (issue 12): three brokers, RF=3,
min.insync.replicas=2, a confluent-kafka idempotent producer (acks=all, five requests
in flight per connection) under load while partition leaders are killed with SIGKILL
and restarted and one broker is frozen with SIGSTOP. Afterwards every acknowledged
message is read back exactly once, in send order within its partition: no duplicate
(a retry the new leader wrote again), no gap, no reordering."""

import collections
import os
import signal
import threading
import time

from confluent_kafka import Producer

from helpers.clients import cf_conf, cf_consume, create_topic
from test_cluster import SESSION_MS
from test_replication import full_isr, start_cluster, wait_identical_replicas, wait_states


class IdempotentLoad:
    """Values are "<partition>:<n>" with n counting up per partition, in send order."""

    def __init__(self, bootstrap, topic, partitions):
        self.topic, self.partitions = topic, partitions
        self.p = Producer(cf_conf(bootstrap, **{"enable.idempotence": True,
                                                "max.in.flight.requests.per.connection": 5, "linger.ms": 2,
                                                "message.timeout.ms": 180000, "retry.backoff.ms": 100,
                                                "topic.metadata.refresh.interval.ms": 1000}))
        self.acked = collections.defaultdict(list)  # partition -> [n]
        self.errors = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        sent = [0] * self.partitions
        i = 0
        while not self.stop.is_set():
            part = i % self.partitions

            def cb(err, msg):
                if err is not None:
                    self.errors.append(err.str())
                else:
                    self.acked[msg.partition()].append(int(msg.value().split(b":")[1]))

            try:
                self.p.produce(self.topic, value=f"{part}:{sent[part]}".encode(), partition=part, on_delivery=cb)
                sent[part] += 1
                i += 1
            except BufferError:
                pass
            self.p.poll(0.001 if i % 50 else 0.01)
        self.p.flush(180)

    def start(self):
        self.thread.start()

    def finish(self):
        self.stop.set()
        self.thread.join(240)


def test_idempotent_producer_exactly_once_through_kills_and_a_freeze(broker_factory):
    brokers = start_cluster(broker_factory)
    b1 = brokers[1]
    topic, parts = "exactly-once", 3
    create_topic(b1.bootstrap, topic, parts, config={"min.insync.replicas": "2"}, replication_factor=3)
    load = IdempotentLoad(",".join(b.bootstrap for b in brokers.values()), topic, parts)
    load.start()
    time.sleep(2)
    for round_ in range(2):
        states = wait_states(b1.bootstrap, topic, full_isr, timeout=60, what="full ISR")
        victim = next((l for l, _, _ in states.values() if l != 1), 2 + round_ % 2)
        led = [p for p, (l, _, _) in states.items() if l == victim]
        brokers[victim].kill()
        wait_states(b1.bootstrap, topic, lambda s: all(s[p][0] not in (victim, -1) for p in led),
                    timeout=SESSION_MS / 1000 + 15, what=f"leaders moved off broker {victim}")
        time.sleep(2)
        brokers[victim].restart()
    wait_states(b1.bootstrap, topic, full_isr, timeout=60, what="full ISR")
    frozen = 3
    os.kill(brokers[frozen].pid, signal.SIGSTOP)
    try:
        wait_states(b1.bootstrap, topic, lambda s: all(frozen not in isr for _, _, isr in s.values()),
                    timeout=SESSION_MS / 1000 + 15, what="frozen broker out of the ISR")
        time.sleep(2)
    finally:
        os.kill(brokers[frozen].pid, signal.SIGCONT)
    wait_states(b1.bootstrap, topic, full_isr, timeout=60, what="full ISR after the frozen broker returned")
    time.sleep(2)
    load.finish()
    acked = sum(len(v) for v in load.acked.values())
    assert acked > 1000, acked
    assert not load.errors, f"{len(load.errors)} sends failed, e.g. {load.errors[:3]}"

    got = cf_consume(b1.bootstrap, topic, parts, timeout=120)
    for p in range(parts):
        read = [int(r.value.split(b":")[1]) for r in got.get(p, [])]
        dupes = [n for n, c in collections.Counter(read).items() if c > 1]
        assert not dupes, f"partition {p}: {len(dupes)} messages written twice, e.g. {dupes[:5]}"
        assert read == sorted(read), f"partition {p}: read back out of send order"
        missing = set(load.acked[p]) - set(read)
        assert not missing, f"partition {p}: {len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
        # No gap: every message up to the last one read was written (nothing skipped).
        assert read == list(range(len(read))), f"partition {p}: a gap in the sequence"
    wait_identical_replicas(brokers, topic, parts)
    print(f"idempotent producer through 2 leader kills and a freeze: {acked} acknowledged, "
          f"{sum(len(v) for v in got.values())} read back, 0 duplicates, 0 lost, in order")
