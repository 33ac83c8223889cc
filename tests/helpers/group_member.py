"""One consumer-group member, run as its own process so a test can SIGKILL it.

    python group_member.py --client confluent|kafka-python --bootstrap HOST:PORT \
        --group G --topic T [--assignor range] [--instance-id I] ...

It subscribes to the topic, and for every message: prints a `consumed` line, sleeps
--delay-ms ("processing"), commits offset+1 synchronously (every --commit-every
messages) and prints `committed` (or `commit_failed`).  Rebalance callbacks print
`assign` / `revoke` / `lost` lines; every change of the effective assignment prints an
`assignment` line.  All lines are JSON objects with "ev" and "t" (time.time()), flushed
at once, so what a SIGKILLed member printed before it died reaches the test.

Standard input: a line "close" closes the consumer (consumer.close()) and exits 0;
EOF on stdin (the test went away) does the same.  --max-runtime-s bounds its life.
"""

import argparse
import json
import os
import sys
import threading
import time

_out_lock = threading.Lock()


def emit(ev, **kw):
    kw = {"ev": ev, "t": time.time(), **kw}
    line = json.dumps(kw, sort_keys=True)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--client", choices=["confluent", "kafka-python"], default="confluent")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--assignor", default=None,
                    help="confluent partition.assignment.strategy (default: the client's)")
    ap.add_argument("--instance-id", default=None, help="group.instance.id (static member)")
    ap.add_argument("--group-protocol", choices=["classic", "consumer"], default="classic",
                    help="confluent group.protocol; with consumer (KIP-848) the session and the"
                         " assignor are the broker's, and --assignor is group.remote.assignor")
    ap.add_argument("--session-timeout-ms", type=int, default=4000)
    ap.add_argument("--heartbeat-interval-ms", type=int, default=500)
    ap.add_argument("--max-poll-interval-ms", type=int, default=20000)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="processing time per message")
    ap.add_argument("--commit-every", type=int, default=1)
    ap.add_argument("--max-runtime-s", type=float, default=150.0)
    ap.add_argument("--client-id", default=None)
    return ap.parse_args()


class Control:
    """Watches stdin for "close" (or EOF)."""

    def __init__(self):
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        for line in sys.stdin:
            if line.strip() == "close":
                break
        self.stop.set()


# ---------------------------------------------------------------- confluent-kafka

def run_confluent(a, ctl):
    from confluent_kafka import Consumer, KafkaException
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from clients import cf_conf

    conf = cf_conf(a.bootstrap, **{
        "group.id": a.group,
        "client.id": a.client_id or f"member-{os.getpid()}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "max.poll.interval.ms": a.max_poll_interval_ms,
    })
    if a.group_protocol == "consumer":
        conf["group.protocol"] = "consumer"
        if a.assignor:
            conf["group.remote.assignor"] = a.assignor
    else:
        conf["session.timeout.ms"] = a.session_timeout_ms
        conf["heartbeat.interval.ms"] = a.heartbeat_interval_ms
        if a.assignor:
            conf["partition.assignment.strategy"] = a.assignor
    if a.instance_id:
        conf["group.instance.id"] = a.instance_id
    c = Consumer(conf)

    def parts(ps):
        return sorted(p.partition for p in ps)

    def on_assign(consumer, ps):
        emit("assign", parts=parts(ps))

    def on_revoke(consumer, ps):
        emit("revoke", parts=parts(ps))

    def on_lost(consumer, ps):
        emit("lost", parts=parts(ps))

    c.subscribe([a.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    emit("ready", pid=os.getpid(), client="confluent")
    last_assignment = None
    pending = []
    deadline = time.monotonic() + a.max_runtime_s
    try:
        while not ctl.stop.is_set() and time.monotonic() < deadline:
            m = c.poll(0.1)
            cur = parts(c.assignment())
            if cur != last_assignment:
                last_assignment = cur
                emit("assignment", parts=cur)
            if m is None:
                continue
            if m.error():
                emit("error", err=str(m.error()))
                continue
            emit("consumed", p=m.partition(), o=m.offset())
            if a.delay_ms:
                time.sleep(a.delay_ms / 1000.0)
            pending.append(m)
            if len(pending) >= a.commit_every:
                latest = {}
                for pm in pending:
                    latest[pm.partition()] = pm
                pending = []
                for pm in latest.values():
                    try:
                        c.commit(message=pm, asynchronous=False)
                        emit("committed", p=pm.partition(), o=pm.offset() + 1)
                    except KafkaException as e:
                        emit("commit_failed", p=pm.partition(), o=pm.offset() + 1, err=str(e))
    finally:
        emit("closing")
        c.close()
        emit("closed")


# ---------------------------------------------------------------- kafka-python

def run_kafka_python(a, ctl):
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata

    kw = dict(
        bootstrap_servers=[a.bootstrap],
        group_id=a.group,
        client_id=a.client_id or f"member-{os.getpid()}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        session_timeout_ms=a.session_timeout_ms,
        heartbeat_interval_ms=a.heartbeat_interval_ms,
        max_poll_interval_ms=a.max_poll_interval_ms,
        request_timeout_ms=max(30000, a.session_timeout_ms + 5000),
        reconnect_backoff_max_ms=1000,
    )
    if a.instance_id:
        kw["group_instance_id"] = a.instance_id
    c = KafkaConsumer(**kw)

    class L(ConsumerRebalanceListener):
        def on_partitions_assigned(self, assigned):
            emit("assign", parts=sorted(tp.partition for tp in assigned))

        def on_partitions_revoked(self, revoked):
            emit("revoke", parts=sorted(tp.partition for tp in revoked))

        def on_partitions_lost(self, lost):
            emit("lost", parts=sorted(tp.partition for tp in lost))

    c.subscribe([a.topic], listener=L())
    emit("ready", pid=os.getpid(), client="kafka-python")
    last_assignment = None
    deadline = time.monotonic() + a.max_runtime_s
    n = 0
    try:
        while not ctl.stop.is_set() and time.monotonic() < deadline:
            batch = c.poll(timeout_ms=100, max_records=a.commit_every)
            cur = sorted(tp.partition for tp in c.assignment())
            if cur != last_assignment:
                last_assignment = cur
                emit("assignment", parts=cur)
            latest = {}
            for tp, msgs in batch.items():
                for m in msgs:
                    emit("consumed", p=tp.partition, o=m.offset)
                    if a.delay_ms:
                        time.sleep(a.delay_ms / 1000.0)
                    latest[tp] = m.offset + 1
                    n += 1
            if latest:
                try:
                    c.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in latest.items()})
                    for tp, o in latest.items():
                        emit("committed", p=tp.partition, o=o)
                except KafkaError as e:
                    for tp, o in latest.items():
                        emit("commit_failed", p=tp.partition, o=o, err=repr(e))
    finally:
        emit("closing")
        c.close()
        emit("closed")


def main():
    a = parse_args()
    ctl = Control()
    if a.client == "confluent":
        run_confluent(a, ctl)
    else:
        run_kafka_python(a, ctl)


if __name__ == "__main__":
    main()
