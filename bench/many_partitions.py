#!/usr/bin/env python3
"""Many partitions on one broker, Spate beside Apache Kafka 4.4, one broker at a time.

For each partition count and broker: a fresh single-node broker (fsync never, defaults
otherwise), one topic of N partitions created through the admin API, then

  first writes  a librdkafka producer (confluent-kafka, its defaults) writes 4 records of
                100 B to every partition; the time until 99% and all of them were
                acknowledged, and how many failed;
  steady        spate-bench produces 1 KiB records over all N partitions for STEADY
                seconds (4 producers, 16 KiB batches, acks=1): MB/s;

and per broker: its CPU seconds (user, system) over the steady phase per GB taken in,
the file descriptors it holds at the end, and the WARN/ERROR lines in its log.

Usage: bench/many_partitions.py [--partitions 5000,20000] [--brokers spate,kafka]
  [--spate target/release/spate] [--spate-args "--max-broker-partitions 20000"] [--steady 10]
Needs: .venv (confluent-kafka), cargo build --release -p spate-bench, Maven (Kafka's
classpath from bench/kafka-broker, resolved once).
"""
import argparse
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
KAFKA_JVM = ["-Xmx1G", "-Xms1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
             "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
             "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true"]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def kafka_classpath(work):
    out = os.path.join(work, "cp.txt")
    pom = os.path.join(ROOT, "bench", "kafka-broker")
    cmd = ["mvn", "-q", "-B", "dependency:build-classpath", f"-Dmdep.outputFile={out}"]
    if subprocess.run(["mvn", "-o"] + cmd[1:], cwd=pom, capture_output=True).returncode != 0:
        subprocess.run(["mvn", "-q", "-B", "dependency:go-offline"], cwd=pom, check=True)
        subprocess.run(cmd, cwd=pom, check=True)
    return open(out).read().strip()


def start_spate(binary, work, port, extra):
    log = open(os.path.join(work, "broker.log"), "w")
    return subprocess.Popen([binary, "serve", "--data-dir", os.path.join(work, "data"),
                             "--listen", f"127.0.0.1:{port}", "--fsync", "never"] + extra,
                            stdout=log, stderr=subprocess.STDOUT)


def start_kafka(cp, work, port):
    cport = free_port()
    props = os.path.join(work, "server.properties")
    with open(props, "w") as f:
        f.write(f"""process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{cport}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={work}/data
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
""")
    cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    subprocess.run(["java", "-cp", cp, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}",
                    "-c", props], check=True, capture_output=True)
    log = open(os.path.join(work, "broker.log"), "w")
    return subprocess.Popen(["java"] + KAFKA_JVM + ["-cp", cp, "kafka.Kafka", props],
                            stdout=log, stderr=subprocess.STDOUT)


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_ready(bootstrap):
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            admin.list_topics(timeout=2)
            return admin
        except Exception:
            time.sleep(0.2)
    sys.exit("broker not ready in 120 s")


def create(admin, topic, partitions):
    t0 = time.time()
    admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=600)[topic].result(timeout=600)
    deadline = t0 + 600
    while time.time() < deadline:
        md = admin.list_topics(topic, timeout=30).topics.get(topic)
        if md and len(md.partitions) == partitions and all(p.leader >= 0 for p in md.partitions.values()):
            return time.time() - t0
        time.sleep(0.5)
    sys.exit(f"{topic}: no leaders for all {partitions} partitions in 600 s")


def first_writes(bootstrap, topic, partitions):
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    total = 4 * partitions
    acked, failed, t99 = [0], [0], [None]
    t0 = time.time()

    def done(err, _msg):
        if err is None:
            acked[0] += 1
            if t99[0] is None and acked[0] >= 0.99 * total:
                t99[0] = time.time() - t0
        else:
            failed[0] += 1

    value = b"x" * 100
    for _ in range(4):
        for part in range(partitions):
            while True:
                try:
                    p.produce(topic, value, partition=part, on_delivery=done)
                    break
                except BufferError:
                    p.poll(0.05)
            p.poll(0)
    left = p.flush(300)
    return {"t99_s": t99[0], "all_s": time.time() - t0 if acked[0] == total else None,
            "acked": acked[0], "failed": failed[0] + left}


def steady(bootstrap, topic, seconds, work):
    bench = os.path.join(ROOT, "target", "release", "spate-bench")
    out = os.path.join(work, "steady.json")
    subprocess.run([bench, "--bootstrap", bootstrap, "--topic", topic, "--producers", "4",
                    "--message-size", "1024", "--batch-bytes", "16384", "--acks", "1",
                    "--duration", str(seconds), "--json", out],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.load(open(out))


def run(broker, partitions, args, cp):
    work = tempfile.mkdtemp(prefix=f"many-{broker}-{partitions}-", dir=args.work)
    port = free_port()
    proc = start_spate(args.spate, work, port, args.spate_args.split()) if broker == "spate" else start_kafka(cp, work, port)
    bootstrap = f"127.0.0.1:{port}"
    try:
        admin = wait_ready(bootstrap)
        topic = "many"
        created_s = create(admin, topic, partitions)
        fw = first_writes(bootstrap, topic, partitions)
        cpu0 = cpu_s(proc.pid)
        st = steady(bootstrap, topic, args.steady, work)
        cpu1 = cpu_s(proc.pid)
        gb = st["produce"]["bytes"] / 1e9
        user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        held = fds(proc.pid)
        ansi = re.compile(r"\x1b\[[0-9;]*m")
        warn = sum(1 for line in open(os.path.join(work, "broker.log"), errors="replace")
                   if re.search(r" (WARN|ERROR) ", ansi.sub("", line)))
        return {"broker": broker, "partitions": partitions, "create_s": round(created_s, 1),
                "first_writes": fw, "steady_mb_s": round(st["produce"]["mb_per_sec"], 1),
                "steady_errors": st["produce_errors"],
                "cpu_s_per_gb": {"user": round(user / gb, 2), "system": round(system / gb, 2)} if gb else None,
                "fds": held, "warn_error_lines": warn, "work": work}
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def read_ahead_kb(path):
    """The read-ahead of the disk under `path` (Kafka's preallocated, mmap'ed indexes
    fault in that much per first write: bench/README.md, "Kafka at 1,000 partitions")."""
    st = os.stat(path)
    dev = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for queue in (f"{dev}/queue/read_ahead_kb", f"{dev}/../queue/read_ahead_kb"):
        if os.path.exists(queue):
            return open(queue).read().strip()
    return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", default="5000,20000")
    ap.add_argument("--brokers", default="spate,kafka")
    ap.add_argument("--spate", default=os.path.join(ROOT, "target", "release", "spate"))
    ap.add_argument("--steady", type=float, default=10)
    ap.add_argument("--spate-args", default="", help="more flags for spate serve")
    ap.add_argument("--work", default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    brokers = args.brokers.split(",")
    cp = kafka_classpath(tempfile.mkdtemp()) if "kafka" in brokers else None
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} open-files limit {os.sysconf('SC_OPEN_MAX')}, "
          f"read_ahead_kb {read_ahead_kb(args.work or tempfile.gettempdir())}", flush=True)
    for n in [int(x) for x in args.partitions.split(",")]:
        for broker in brokers:
            print(json.dumps(run(broker, n, args, cp)), flush=True)


if __name__ == "__main__":
    main()
