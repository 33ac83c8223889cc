"""Replication at 100 partitions per broker, for bench/replication_fanout.sh.

Three brokers of BINARY (one shard each, fsync never, embedded coordinator) on this
machine; a topic of PARTITIONS partitions with replication factor 3 and
min.insync.replicas=2, so every broker hosts PARTITIONS replicas. Reports:
- the broker-to-broker TCP connections once every partition is fully in sync (counted
  with `ss`: established connections from a broker process to another broker's port);
- acks=all produce throughput of MB megabytes of 1 KiB messages spread over all
  partitions (confluent-kafka, its defaults but acks=all), and the time until every
  follower holds every record (log end offsets equal on all replicas).

Usage: replication_fanout.py BINARY LABEL [PARTITIONS] [MB]
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

binary, label = sys.argv[1], sys.argv[2]
partitions = int(sys.argv[3]) if len(sys.argv) > 3 else 100
megabytes = int(sys.argv[4]) if len(sys.argv) > 4 else 200
ports = {1: 49191, 2: 49192, 3: 49193}
bootstrap = ",".join(f"127.0.0.1:{p}" for p in ports.values())
root = tempfile.mkdtemp(prefix="spate-fanout-")
procs = {}


def start(node):
    args = [binary, "serve", "--node-id", str(node), "--listen", f"127.0.0.1:{ports[node]}",
            "--data-dir", f"{root}/d{node}", "--cores", "1"]
    if node != 1:
        args += ["--coordinator", f"127.0.0.1:{ports[1]}"]
    log = open(f"{root}/l{node}", "w")
    procs[node] = subprocess.Popen(args, stdout=log, stderr=log)


def wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.2)
    raise SystemExit(f"{label}: {what} not reached in {timeout}s")


def in_sync(admin):
    md = admin.list_topics("fanout", timeout=10).topics["fanout"]
    return len(md.partitions) == partitions and all(len(p.isrs) == 3 for p in md.partitions.values())


def broker_connections():
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True).stdout
    pids = {str(p.pid) for p in procs.values()}
    n = 0
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 4:
            continue
        peer_port = int(cols[3].rsplit(":", 1)[1])
        owner = set(re.findall(r"pid=(\d+)", line))
        if peer_port in ports.values() and owner & pids:
            n += 1
    return n


def log_ends():
    """{(broker, partition): bytes in the replica's segments} (replicas hold the same
    bytes once caught up)."""
    ends = {}
    for node in ports:
        for p in range(partitions):
            d = f"{root}/d{node}/fanout-{p}"
            ends[(node, p)] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".log"))
    return ends


try:
    start(1)
    time.sleep(1)
    start(2)
    start(3)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wait(lambda: len(admin.list_topics(timeout=5).brokers) == 3, 30, "three brokers")
    fs = admin.create_topics([NewTopic("fanout", partitions, 3, config={"min.insync.replicas": "2"})])
    for f in fs.values():
        f.result(30)
    wait(lambda: in_sync(admin), 120, "all partitions in sync")
    time.sleep(2)
    connections = broker_connections()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    value = b"x" * 1024
    count = megabytes * 1024
    t0 = time.monotonic()
    for i in range(count):
        while True:
            try:
                producer.produce("fanout", value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    left = producer.flush(300)
    t_acked = time.monotonic() - t0
    if left:
        raise SystemExit(f"{label}: {left} messages not acknowledged")
    def replicas_equal():
        ends = log_ends()
        return all(len({ends[(n, q)] for n in ports}) == 1 for q in range(partitions))

    wait(replicas_equal, 120, "every replica holding every record")
    t_replicated = time.monotonic() - t0
    print(f"{label}: {partitions} partitions x RF 3: {connections} broker-to-broker connections; "
          f"{megabytes} MB acks=all in {t_acked:.1f} s = {megabytes / t_acked:.1f} MB/s; "
          f"all replicas equal after {t_replicated:.1f} s")
finally:
    for p in procs.values():
        p.kill()
        p.wait()
    shutil.rmtree(root, ignore_errors=True)
