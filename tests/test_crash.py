"""kill -9 the broker while a producer streams at acks=1; every acked record survives."""

import threading
import time

from confluent_kafka import Producer

from helpers.clients import cf_conf, cf_consume, cf_produce, create_topic, wait_for_topic

PARTITIONS = 2


class StreamingProducer(threading.Thread):
    """Sends numbered records round-robin over the partitions until stopped; records the
    numbers the broker acknowledged (delivery report without error)."""

    def __init__(self, bootstrap, topic, start_at=0):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.next = start_at
        self.acked = set()
        self.errors = 0
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()

    def run(self):
        p = Producer(cf_conf(self.bootstrap, **{
            "acks": 1, "linger.ms": 2,
            "message.timeout.ms": 5000, "retries": 0, "queue.buffering.max.messages": 20000}))

        def on_delivery(err, msg):
            with self.lock:
                if err is None:
                    self.acked.add(int(msg.value().split(b":")[0]))
                else:
                    self.errors += 1

        while not self.stop_flag.is_set():
            n = self.next
            try:
                p.produce(self.topic, b"%d:payload-%d" % (n, n) + b"." * (n % 100),
                          partition=n % PARTITIONS, on_delivery=on_delivery)
                self.next += 1
            except BufferError:
                pass
            p.poll(0 if n % 50 else 0.001)
        # Serve the remaining delivery reports (failures once the broker is gone).
        p.flush(10)

    def n_acked(self):
        with self.lock:
            return len(self.acked)


def run_until_killed(broker, topic, start_at, min_acked):
    sp = StreamingProducer(broker.bootstrap, topic, start_at)
    sp.start()
    deadline = time.monotonic() + 60
    while sp.n_acked() < min_acked and time.monotonic() < deadline:
        assert sp.is_alive()
        time.sleep(0.01)
    assert sp.n_acked() >= min_acked, f"only {sp.n_acked()} acked in 60s"
    broker.kill()  # SIGKILL mid-stream
    acked_at_kill = sp.n_acked()
    # Deliberate: the producer keeps sending into the dead broker for a moment (its
    # in-flight batches fail), as a real client would; nothing waits on this.
    time.sleep(0.5)
    sp.stop_flag.set()
    sp.join(30)
    assert not sp.is_alive(), "producer thread did not stop"
    return sp, acked_at_kill


def read_all(broker, topic):
    got = cf_consume(broker.bootstrap, topic, PARTITIONS, None, timeout=60)
    numbers = []
    for p, recs in got.items():
        offsets = [m.offset for m in recs]
        assert offsets == list(range(len(recs))), f"partition {p}: offsets not dense from 0"
        for m in recs:
            n = int(m.value.split(b":")[0])
            assert m.value == b"%d:payload-%d" % (n, n) + b"." * (n % 100), m
            assert n % PARTITIONS == p, f"record {n} in partition {p}"
            numbers.append(n)
    return got, numbers


def test_kill9_during_produce_keeps_acked_records(broker):
    topic = "crash"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    all_acked = set()
    next_n = 0
    for round_ in range(2):
        sp, _ = run_until_killed(broker, topic, next_n, min_acked=3000)
        all_acked |= sp.acked
        next_n = sp.next
        assert sp.n_acked() > 0
        # A new port: restarting on the same one is test_restart's business.
        broker.restart(new_port=True)
        wait_for_topic(broker.bootstrap, topic, PARTITIONS, timeout=30)
        got, numbers = read_all(broker, topic)
        print(f"round {round_}: sent up to #{sp.next}, "
              f"acked {len(sp.acked)} (errors {sp.errors}), read back {len(numbers)} in total")
        missing = all_acked - set(numbers)
        assert not missing, (
            f"round {round_}: {len(missing)} acknowledged records lost after kill -9, "
            f"e.g. {sorted(missing)[:10]} (acked {len(all_acked)}, read {len(numbers)})")
        assert len(numbers) == len(set(numbers)), "duplicate records after recovery"

    # The recovered log accepts new writes right after the surviving tail.
    ends = {p: len(recs) for p, recs in got.items()}
    reports = cf_produce(broker.bootstrap, topic,
                         [{"value": b"%d:payload-%d" % (n, n) + b"." * (n % 100),
                           "partition": n % PARTITIONS} for n in range(next_n, next_n + 10)])
    for r in reports:
        assert r.offset == ends[r.partition], (r, ends)
        ends[r.partition] += 1
