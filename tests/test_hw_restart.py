"""High watermarks survive a restart (Kafka's replication-offset-checkpoint).

What a restarted broker knows of a partition's high watermark before anyone tells it
comes from its checkpoint alone. The test makes that the only source: three brokers, a
replication-factor-3 partition led by broker 2, acks=all records (the high watermark
covers them, and follower 3 learns it and checkpoints it); then broker 3 is killed with
SIGKILL, its leader is frozen (SIGSTOP: no fetch response can bring the high watermark
back), and broker 3 restarts. The checkpoint it writes after the restart (each shard
writes one as soon as it holds its partitions) must still say the old high watermark;
had the checkpoint not been read at start, the partition's high watermark would be 0,
and a second crash would lose it for good.

Why not through a client: a restarted broker that registers with the coordinator is
fenced out of every ISR first (KIP-903, its previous incarnation), so it leads again
only after fetching from a leader, or as the only ISR member, where the high watermark
is its own log end; and a restarted broker cut off from the coordinator does not lead
replicated partitions from its cached snapshot (ClusterView::may_take_roles). Neither
path lets a client see the checkpointed value.
"""

import os
import signal
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from helpers.broker import threads_stopped
from helpers.clients import cf_conf, cf_read_partition, create_topic
from test_cluster import start_embedded_cluster, wait_for
from test_replication import partition_states

# Long enough that broker 1's dead followers stay in the ISR for the whole check.
SESSION_MS = 120_000
LAG_MS = 120_000
RECORDS = 50


def cluster(broker_factory):
    """Brokers 1, 2 and 3 by id; followers stay in the ISR for the whole test."""
    brokers = start_embedded_cluster(broker_factory, session_ms=SESSION_MS,
                                     extra=["--replica-lag-time-max-ms", str(LAG_MS)])
    return dict(zip((1, 2, 3), brokers))


def checkpoint_files(broker):
    return [f for f in broker.data_dir.glob("replication-offset-checkpoint*") if not f.name.endswith(".tmp")]


def checkpointed_hw(files, topic, partition):
    """The high watermark of `topic`-`partition` in these replication-offset-checkpoint
    files (None: not in them)."""
    best = None
    for f in files:
        for line in f.read_text().splitlines()[2:]:
            t, p, hw = line.rsplit(" ", 2)
            if t == topic and int(p) == partition:
                best = max(best if best is not None else -1, int(hw))
    return best


def latest(bootstrap, topic, partition):
    c = Consumer(cf_conf(bootstrap, **{"group.id": "hw-probe"}))
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
    finally:
        c.close()


def test_a_restarted_follower_keeps_its_checkpointed_high_watermark(broker_factory):
    brokers = cluster(broker_factory)
    b1, b2, b3 = brokers[1], brokers[2], brokers[3]
    create_topic(b1.bootstrap, "hw", 3, config={"min.insync.replicas": "2"}, replication_factor=3)
    states = wait_for(lambda: partition_states(b1.bootstrap, "hw"),
                      lambda s: all(isr == [1, 2, 3] for _, _, isr in s.values()) and
                      any(leader == 2 for leader, _, _ in s.values()), 30, "a partition led by 2, full ISR")
    part = next(p for p, (leader, _, _) in states.items() if leader == 2)

    p = Producer(cf_conf(b2.bootstrap))  # librdkafka's defaults: acks=all
    values = [b"hw-%d" % i for i in range(RECORDS)]
    reports = []
    for v in values:
        p.produce("hw", v, partition=part, on_delivery=lambda err, msg: reports.append(err))
    assert p.flush(60) == 0
    assert reports == [None] * RECORDS, reports
    assert latest(b2.bootstrap, "hw", part) == (0, RECORDS)
    assert cf_read_partition(b2.bootstrap, "hw", part) == values

    wait_for(lambda: checkpointed_hw(checkpoint_files(b3), "hw", part), lambda hw: hw == RECORDS, 30,
             f"follower 3 checkpoints high watermark {RECORDS}")
    b3.kill()
    before = {f.name: f.stat().st_mtime_ns for f in checkpoint_files(b3)}
    os.kill(b2.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: threads_stopped(b2.pid), bool, 30, "leader 2 stopped")
        b3.restart()

        def rewritten():
            files = [f for f in checkpoint_files(b3) if f.stat().st_mtime_ns != before.get(f.name)]
            return checkpointed_hw(files, "hw", part)
        hw = wait_for(rewritten, lambda hw: hw is not None, 30, "broker 3 rewrites its checkpoint")
        assert hw == RECORDS, f"broker 3 forgot the high watermark in its restart: checkpoint says {hw}"
        # Nothing could have told it: its leader is still frozen.
        assert b2.alive()
    finally:
        os.kill(b2.pid, signal.SIGCONT)


def test_a_slow_clean_shutdown_keeps_every_checkpointed_high_watermark(broker_factory):
    """A clean shutdown whose close of the logs is slow (a large dirty page cache; here
    the hidden --test-fsync-delay-ms sleeps before the close) while housekeeping ticks
    every second: the checkpoint still holds every high watermark afterwards, and no
    thread panics. Before, a tick during the close checkpointed the shard already emptied
    for it ("0\\n0\\n": every high watermark on disk erased), and blocking work still
    running when the shard's executor ended panicked its thread ("failed to send
    response")."""
    close_delay_ms = 3000
    b = broker_factory("--test-fsync-delay-ms", str(close_delay_ms), cores=1)
    create_topic(b.bootstrap, "slow-close", 2)
    p = Producer(cf_conf(b.bootstrap))
    for i in range(RECORDS):
        p.produce("slow-close", b"v%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    want = {0: RECORDS // 2, 1: RECORDS - RECORDS // 2}
    for part, n in want.items():
        wait_for(lambda: checkpointed_hw(checkpoint_files(b), "slow-close", part), lambda hw: hw == n, 30,
                 f"partition {part} checkpointed at {n}")
    started = time.monotonic()
    assert b.stop(timeout=60) == 0
    took = time.monotonic() - started
    assert took >= close_delay_ms / 1000, f"the close was not slowed down ({took:.1f} s): the test shows nothing"
    log = b.log_text()
    assert "spate stopped cleanly" in log
    assert "panicked" not in log, log[-3000:]
    files = checkpoint_files(b)
    assert files, "no checkpoint file"
    for part, n in want.items():
        assert checkpointed_hw(files, "slow-close", part) == n, [f.read_text() for f in files]
    b.restart()
    assert cf_read_partition(b.bootstrap, "slow-close", 0) == [b"v%d" % i for i in range(0, RECORDS, 2)]
