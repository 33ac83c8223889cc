#!/usr/bin/env python3
"""Recovery after a power cut at many partitions (issue 49), beside recovery after kill -9.

One broker (`--fsync always`, 2 cores), one topic of PARTITIONS partitions, RECORDS
records of 100 B acknowledged in each (librdkafka, acks=all). Then, ROUNDS times each,
alternated:
  cut     the data dir on cutfs (tests/cutfs): the power goes (unsynced data and
          directory entries dropped), the broker is killed; restart
  kill9   the same data dir, kill -9 only (the page cache survives); restart
and for each: seconds from the kill to the port accepting, to Metadata naming a leader
for every partition, and to one more record acknowledged in every partition.
Both run on cutfs, so FUSE's cost is in both; kill9 is the baseline.

Usage: bench/power_cut_recovery.py   (needs root, /dev/fuse, target/ci/spate and
target/ci/cutfs: cargo build --profile ci -p spate -p cutfs;
env: PARTITIONS=1000 RECORDS=4 ROUNDS=3 SPATE_BIN=path)
"""

import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from confluent_kafka import Producer  # noqa: E402

from helpers.broker import Broker, port_open  # noqa: E402
from helpers.clients import admin, cf_conf, create_topic  # noqa: E402
from helpers.cutfs import CutFs, usable  # noqa: E402

PARTITIONS = int(os.environ.get("PARTITIONS", "1000"))
RECORDS = int(os.environ.get("RECORDS", "4"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))


def produce_everywhere(bootstrap, n):
    p = Producer(cf_conf(bootstrap, acks="all", linger_ms=5))
    failed = []
    for part in range(PARTITIONS):
        for _ in range(n):
            p.produce("many", b"x" * 100, partition=part,
                      on_delivery=lambda err, _m: failed.append(err) if err else None)
        p.poll(0)
    assert p.flush(120) == 0 and not failed, failed[:3]


def all_led(bootstrap):
    try:
        t = admin(bootstrap).list_topics("many", timeout=5).topics["many"]
        return len(t.partitions) == PARTITIONS and all(p.leader >= 0 for p in t.partitions.values())
    except Exception:  # noqa: BLE001 - not answering yet
        return False


def recover(b):
    t0 = time.monotonic()
    b.restart()
    while not port_open(b.host, b.port):
        time.sleep(0.01)
    ready = time.monotonic() - t0
    while not all_led(b.bootstrap):
        time.sleep(0.05)
    led = time.monotonic() - t0
    produce_everywhere(b.bootstrap, 1)
    return ready, led, time.monotonic() - t0


def main():
    why = usable()
    if why:
        sys.exit(f"cutfs cannot run here: {why}")
    work = tempfile.mkdtemp(prefix="power-cut-recovery-")
    fs = CutFs(os.path.join(work, "fs"))
    data = fs.mnt / "data"
    os.mkdir(data)
    fd = os.open(fs.mnt, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    b = Broker("b", os.path.join(work, "b"), ["--fsync", "always"], cores=2, data_dir=data)
    try:
        b.start(timeout=120)
        create_topic(b.bootstrap, "many", PARTITIONS, timeout=120)
        produce_everywhere(b.bootstrap, RECORDS)
        results = {"cut": [], "kill9": []}
        for _ in range(ROUNDS):
            for mode in ("cut", "kill9"):
                if mode == "cut":
                    dropped = fs.cut(b.pid)["bytes_dropped"]
                    b.proc.wait(30)
                else:
                    dropped = "-"
                    b.kill()
                r = recover(b)
                results[mode].append(r)
                print(f"{mode:6} ready {r[0]:6.2f} s  all led {r[1]:6.2f} s  all acked {r[2]:6.2f} s"
                      f"  (bytes dropped {dropped})", flush=True)
        for mode, rs in results.items():
            print(f"{mode:6} median: ready {statistics.median(r[0] for r in rs):.2f} s,"
                  f" all led {statistics.median(r[1] for r in rs):.2f} s,"
                  f" all acked {statistics.median(r[2] for r in rs):.2f} s ({PARTITIONS} partitions)")
    finally:
        b.kill()
        fs.close()


if __name__ == "__main__":
    main()
