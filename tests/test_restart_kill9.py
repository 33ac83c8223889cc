"""Restarts a supervisor does: kill -9, then the same command at once, ten times, with a
librdkafka producer connected throughout; and the data directory lock (`.lock`, as
Kafka's), which refuses a second broker on the same data directory."""

import os
import subprocess
import threading
import time

from confluent_kafka import Producer

from helpers.broker import Broker, free_port
from helpers.clients import cf_conf, cf_consume, cf_produce, create_topic, wait_for_topic

PARTITIONS = 2
RESTARTS = 10


class Streamer(threading.Thread):
    """One confluent Producer, alive across every restart, sending numbered records
    (a few hundred a second) and noting which ones the broker acknowledged."""

    def __init__(self, bootstrap, topic):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.acked = set()
        self.sent = 0
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()

    def run(self):
        p = Producer(cf_conf(self.bootstrap, **{
            "acks": "all", "linger.ms": 2, "enable.idempotence": False,
            "message.timeout.ms": 60000, "retries": 1000000}))

        def on_delivery(err, msg):
            if err is None:
                with self.lock:
                    self.acked.add(int(msg.value()))

        while not self.stop_flag.is_set():
            try:
                p.produce(self.topic, b"%d" % self.sent, partition=self.sent % PARTITIONS, on_delivery=on_delivery)
                self.sent += 1
            except BufferError:
                pass
            p.poll(0.003)
        p.flush(60)

    def n_acked(self):
        with self.lock:
            return len(self.acked)

    def wait_acked(self, n, timeout):
        deadline = time.monotonic() + timeout
        while self.n_acked() < n:
            assert self.is_alive(), "producer thread died"
            assert time.monotonic() < deadline, f"only {self.n_acked()} of {n} records acknowledged in {timeout}s"
            time.sleep(0.01)


def test_restart_at_once_after_kill9_ten_times(broker):
    topic = "kill9-restart"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    streamer = Streamer(broker.bootstrap, topic)
    streamer.start()
    try:
        streamer.wait_acked(200, timeout=30)
        for round_ in range(RESTARTS):
            before = streamer.n_acked()
            broker.kill()
            # The same command at once, as a supervisor does: no wait for the port.
            restarted = time.monotonic()
            broker.start()
            wait_for_topic(broker.bootstrap, topic, PARTITIONS, timeout=30)
            # It serves: the producer that never disconnected gets acks again...
            streamer.wait_acked(before + 100, timeout=60)
            served_s = time.monotonic() - restarted
            # ... and a consumer reads every record acknowledged before the kill.
            acked = set(streamer.acked)
            got = cf_consume(broker.bootstrap, topic, PARTITIONS, timeout=60)
            read = {int(m.value) for recs in got.values() for m in recs}
            missing = acked - read
            assert not missing, f"round {round_}: {len(missing)} acknowledged records missing, e.g. {sorted(missing)[:5]}"
            print(f"round {round_}: serving again {served_s:.2f}s after the restart; {len(read)} records read")
        log = broker.log_text()
        print("restarts that waited for a lingering listener:", log.count("waiting for it to go"))
        assert "another process is already listening" not in log
    finally:
        streamer.stop_flag.set()
        streamer.join(90)
    assert not streamer.is_alive()
    got = cf_consume(broker.bootstrap, topic, PARTITIONS, timeout=60)
    read = [int(m.value) for recs in got.values() for m in recs]
    assert not streamer.acked - set(read), "acknowledged records lost"
    for p, recs in got.items():
        assert [m.offset for m in recs] == list(range(len(recs))), f"partition {p}: offsets not dense"


def test_second_broker_on_the_same_data_dir_refuses_to_start(broker, tmp_path):
    topic = "locked"
    create_topic(broker.bootstrap, topic, 1)
    cf_produce(broker.bootstrap, topic, [{"value": b"before"}])
    binary = broker.command()[0]
    port = free_port()
    second = [binary, "serve", "--data-dir", str(broker.data_dir),
              "--listen", f"127.0.0.1:{port}", "--advertise", f"127.0.0.1:{port}"]
    started = time.monotonic()
    r = subprocess.run(second, capture_output=True, timeout=30, env={**os.environ, "NO_COLOR": "1"})
    took = time.monotonic() - started
    out = (r.stdout + r.stderr).decode(errors="replace")
    assert r.returncode != 0, f"second broker on the same data dir exited with 0:\n{out}"
    assert took < 10, f"second broker took {took:.1f}s to refuse"
    assert str(broker.data_dir) in out and "in use by another process" in out, out
    # The first broker never noticed.
    assert broker.alive()
    cf_produce(broker.bootstrap, topic, [{"value": b"after"}])
    got = cf_consume(broker.bootstrap, topic, 1, count=2, timeout=30)
    assert [m.value for m in got[0]] == [b"before", b"after"]
    assert (broker.data_dir / ".lock").exists()


def test_data_dir_lock_is_released_by_kill9(broker_factory, tmp_path):
    """The lock dies with the process: a broker on the same directory (another port)
    starts right after the first one was killed."""
    first = broker_factory(name="first")
    create_topic(first.bootstrap, "t", 1)
    cf_produce(first.bootstrap, "t", [{"value": b"x"}])
    first.kill()
    second = Broker("second", tmp_path / "second", data_dir=first.data_dir)
    try:
        second.start()
        got = cf_consume(second.bootstrap, "t", 1, count=1, timeout=30)
        assert [m.value for m in got[0]] == [b"x"]
    finally:
        second.kill()


def test_second_broker_on_a_port_a_live_broker_serves_refuses_at_once(broker, tmp_path):
    """Another data directory, the same port: the port's listener has a live owner, so
    the second broker refuses at once (no wait meant for a killed broker's socket)."""
    binary = broker.command()[0]
    second = [binary, "serve", "--data-dir", str(tmp_path / "other"),
              "--listen", broker.bootstrap, "--advertise", broker.bootstrap]
    started = time.monotonic()
    r = subprocess.run(second, capture_output=True, timeout=30, env={**os.environ, "NO_COLOR": "1"})
    took = time.monotonic() - started
    out = (r.stdout + r.stderr).decode(errors="replace")
    assert r.returncode != 0, out
    assert f"pid {broker.pid}" in out and "already listening" in out, out
    assert took < 5, f"took {took:.1f}s to refuse"
    assert broker.alive()
    create_topic(broker.bootstrap, "still", 1)
    cf_produce(broker.bootstrap, "still", [{"value": b"x"}])
