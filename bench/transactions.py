#!/usr/bin/env python3
"""Transactional produce beside plain idempotent produce, in one run (issue 13).

One broker (target/release/spate, fsync as FSYNC says, `never` by default), a topic of
8 partitions, 1 KiB values, confluent-kafka (librdkafka) with its defaults otherwise.
Modes, alternated ROUNDS times so machine noise hits all alike:
  idempotent        enable.idempotence=true (the default producer of current clients)
  txn-1 / -10 / -100  transactional.id set; begin, N records, commit_transaction, again
Each run produces for SECONDS_PER_RUN seconds and prints records/s and commits/s; the
medians per mode are printed at the end. A read_committed consumer then checks that
the topic holds exactly what was committed (nothing aborted here).

Usage: bench/transactions.py   (needs target/release/spate: cargo build --release;
env: ROUNDS=3 SECONDS_PER_RUN=10 FSYNC=never PORT=49293 SPATE_BIN=path)
"""

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SPATE_BIN", os.path.join(ROOT, "target", "release", "spate"))
PORT = int(os.environ.get("PORT", "49293"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SECONDS = float(os.environ.get("SECONDS_PER_RUN", "10"))
FSYNC = os.environ.get("FSYNC", "never")
BOOT = f"127.0.0.1:{PORT}"
VALUE = b"x" * 1024
MODES = ["idempotent", "txn-1", "txn-10", "txn-100"]


def wait_port():
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("broker did not start")


def run(mode, topic, run_id):
    conf = {"bootstrap.servers": BOOT, "linger.ms": 5, "enable.idempotence": True}
    per_txn = int(mode.split("-")[1]) if mode.startswith("txn") else None
    if per_txn:
        conf["transactional.id"] = f"bench-{mode}-{run_id}"
    p = Producer(conf)
    sent = commits = 0
    if per_txn:
        p.init_transactions(30)
    start = time.monotonic()
    while time.monotonic() - start < SECONDS:
        if per_txn:
            p.begin_transaction()
            for i in range(per_txn):
                p.produce(topic, VALUE, key=b"%d" % (sent + i))
            p.commit_transaction(30)
            sent += per_txn
            commits += 1
        else:
            for i in range(100):
                while True:
                    try:
                        p.produce(topic, VALUE, key=b"%d" % (sent + i))
                        break
                    except BufferError:
                        p.poll(0.01)
            sent += 100
            p.poll(0)
    assert p.flush(30) == 0
    elapsed = time.monotonic() - start
    del p  # closes its connections before the next mode starts
    return sent, sent / elapsed, commits / elapsed


def count_committed(topic, partitions):
    c = Consumer({"bootstrap.servers": BOOT, "group.id": "bench-check", "enable.auto.commit": False,
                  "enable.partition.eof": True, "isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    n, eof = 0, set()
    deadline = time.monotonic() + 120
    while len(eof) < partitions and time.monotonic() < deadline:
        for m in c.consume(1000, 0.5):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                continue
            eof.discard(m.partition())
            n += 1
    c.close()
    return n


def main():
    d = tempfile.mkdtemp(prefix="bench-txn.")
    log = open(os.path.join(d, "broker.log"), "w")
    broker = subprocess.Popen([BIN, "serve", "--listen", BOOT, "--data-dir", os.path.join(d, "data"),
                               "--fsync", FSYNC], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port()
        admin = AdminClient({"bootstrap.servers": BOOT})
        admin.create_topics([NewTopic("txn-bench", 8, 1)])["txn-bench"].result(30)
        results = {m: [] for m in MODES}
        total = 0
        for r in range(ROUNDS):
            for mode in MODES:
                sent, rps, cps = run(mode, "txn-bench", r)
                total += sent
                results[mode].append(rps)
                print(f"round {r} {mode:>10}: {rps:10.0f} records/s {cps:8.1f} commits/s", flush=True)
        print(f"\nmedians (fsync {FSYNC}, 8 partitions, 1 KiB values, librdkafka defaults + linger.ms=5):")
        base = statistics.median(results["idempotent"])
        for mode in MODES:
            m = statistics.median(results[mode])
            print(f"  {mode:>10}: {m:10.0f} records/s  ({m / base:.2f} of idempotent)")
        got = count_committed("txn-bench", 8)
        print(f"\nread_committed consumer read {got} records; {total} were committed")
        assert got == total, "committed records missing or extra"
    finally:
        broker.terminate()
        broker.wait(30)
        if not os.environ.get("KEEP"):
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
