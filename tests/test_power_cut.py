"""Power cuts (issue 49): the broker's data dir on cutfs (tests/cutfs), a FUSE file system
that, told the power went, kills the broker and keeps only what was made durable: file
data up to its last fsync, directory entries up to their directory's last fsync
(tests/README.md, "Power cuts"). kill -9 keeps the page cache; these tests do not."""

import os
import random
import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from helpers.clients import cf_conf, cf_produce, create_topic, topic_metadata
from helpers.cutfs import CutFs, usable

pytestmark = pytest.mark.skipif(usable() is not None, reason=str(usable()))

SEED = int(os.environ.get("SPATE_TEST_SEED", "0") or 0)


@pytest.fixture
def cutfs(request, tmp_path):
    fs = CutFs(tmp_path / "fs")
    yield fs
    # The brokers on it go first (broker_factory's teardown comes after this one's).
    for b in getattr(request.node, "_spate_brokers", []):
        b.kill()
    fs.close()


class Writer(threading.Thread):
    """Produces `name-N` records round-robin over the topic's partitions until stopped,
    keeping what was acknowledged: (partition, offset, value)."""

    def __init__(self, bootstrap, topic, partitions, name, rate=None, **conf):
        super().__init__(daemon=True)
        self.topic, self.partitions, self.name, self.rate = topic, partitions, name, rate
        self.producer = Producer(cf_conf(bootstrap, **conf))
        self.acked, self.failed = [], []
        self.stop = threading.Event()

    def on_delivery(self, err, msg):
        if err is None:
            self.acked.append((msg.partition(), msg.offset(), msg.value()))
        else:
            self.failed.append((msg.value(), err))

    def run(self):
        n, started = 0, time.monotonic()
        while not self.stop.is_set():
            if self.rate and n > self.rate * (time.monotonic() - started):
                self.producer.poll(0.01)
                continue
            try:
                self.producer.produce(self.topic, f"{self.name}-{n}".encode(), partition=n % self.partitions,
                                      on_delivery=self.on_delivery)
                n += 1
            except BufferError:
                pass
            self.producer.poll(0.002 if n % 20 == 0 else 0)
        assert self.producer.flush(120) == 0, "records still queued 120 s after the last cut"


def read_all(bootstrap, topic, partitions, isolation="read_uncommitted"):
    """{partition: [(offset, value)]} up to each partition's end."""
    c = Consumer(cf_conf(bootstrap, **{"group.id": "power-cut-reader", "enable.partition.eof": True,
                                        "enable.auto.commit": False, "isolation.level": isolation}))
    out = {p: [] for p in range(partitions)}
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        at_eof = set()
        deadline = time.monotonic() + 60
        while len(at_eof) < partitions:
            assert time.monotonic() < deadline, f"no end of {topic} within 60 s: {sorted(at_eof)}"
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    at_eof.add(m.partition())
                continue
            at_eof.discard(m.partition())
            out[m.partition()].append((m.offset(), m.value()))
    finally:
        c.close()
    return out


def durable_mkdir(path):
    """The data dir, as an installer leaves it: made, and its entry fsynced."""
    os.mkdir(path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_offset(bootstrap, group, topic, offset):
    c = Consumer(cf_conf(bootstrap, **{"group.id": group, "enable.auto.commit": False}))
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def committed_offset(bootstrap, group, topic):
    c = Consumer(cf_conf(bootstrap, **{"group.id": group, "enable.auto.commit": False}))
    try:
        return c.committed([TopicPartition(topic, 0)], timeout=30)[0].offset
    finally:
        c.close()


def commit_transaction(bootstrap, topic, values):
    p = Producer(cf_conf(bootstrap, **{"transactional.id": "power-cut-txn"}))
    p.init_transactions(60)
    p.begin_transaction()
    for v in values:
        p.produce(topic, v, partition=0)
    p.commit_transaction(60)


def test_acknowledged_writes_survive_power_cuts_under_fsync_always(broker_factory, cutfs):
    """`--fsync always`, one broker, power cuts while two producers write (librdkafka's
    idempotent producer, acks=all, and a plain one with acks=1), each cut right after a
    group's offset was committed and a transaction committed (and, the first three, right
    after a new topic's first record was acknowledged); the first three cuts drop the
    unsynced tails whole, keep part of them, and keep them as zeros. After each restart,
    with no human: every acknowledged record at its offset, the idempotent producer's
    records once each and in order, the topics, the committed offset, and the committed
    transactions' records under read_committed.

    Soak (by hand): SPATE_POWER_CUTS=N runs N cuts; past the third, a random tear, a random
    interval and, every other cut on average, a fault (short write, EIO from a write or an
    fsync) on a random partition first. Prints cuts, records acknowledged, lost (must be
    0) and the time from each cut to the broker answering and to acks again."""
    rounds = int(os.environ.get("SPATE_POWER_CUTS", "3"))
    rng = random.Random(SEED)
    data = cutfs.mnt / "data"
    durable_mkdir(data)
    b = broker_factory("--fsync", "always", cores=2, data_dir=data)
    create_topic(b.bootstrap, "pc", 4)
    create_topic(b.bootstrap, "pc-txn", 1)
    # A long soak paces the writers: every acknowledged record is kept and read back.
    pace = {} if rounds <= 3 else {"rate": 2000}
    writers = [Writer(b.bootstrap, "pc", 4, "idem", enable_idempotence=True, **pace),
               Writer(b.bootstrap, "pc", 4, "acks1", acks=1, **pace)]
    for w in writers:
        w.start()
    txn_values, cuts, stalled, made, faults = [], [], [], 0, 0
    to_ready, to_acks = [], []
    for rnd in range(rounds):
        tear = ["none", "keep", "zero"][rnd] if rnd < 3 else rng.choice(["none", "keep", "zero"])
        time.sleep(rng.uniform(0.5, 1.5))
        if rnd >= 3 and rng.random() < 0.5:
            op, kind = rng.choice([("write", "short"), ("write", "eio"), ("fsync", "eio")])
            cutfs.fail(op, kind, path=f"/pc-{rng.randrange(4)}/")
            faults += 1
            time.sleep(rng.uniform(0, 0.5))
        commit_offset(b.bootstrap, "power-cut-group", "pc", 100 + rnd)
        values = [f"txn-{rnd}-{i}".encode() for i in range(5)]
        commit_transaction(b.bootstrap, "pc-txn", values)
        txn_values += values
        if rnd < 3:
            # A partition made just now, written, acknowledged, and the power goes at
            # once: its directory's entry must be as durable as its record.
            create_topic(b.bootstrap, f"made-{rnd}", 2)
            cf_produce(b.bootstrap, f"made-{rnd}", [{"value": b"first", "partition": 1}])
            made += 1
        before = [len(w.acked) for w in writers]
        cuts.append(cutfs.cut(b.pid, tear=tear, seed=rng.getrandbits(32)))
        cutfs.call("clear")
        cut_at = time.monotonic()
        b.proc.wait(10)
        b.restart()
        to_ready.append(time.monotonic() - cut_at)
        # The writers go on after the restart: records acknowledged from now on count too.
        deadline = time.monotonic() + 30
        while any(len(w.acked) <= n for w, n in zip(writers, before)) and time.monotonic() < deadline:
            time.sleep(0.02)
        to_acks.append(time.monotonic() - cut_at)
        stalled = [w.name for w, n in zip(writers, before) if len(w.acked) <= n]
        if stalled:
            break
    for w in writers:
        w.stop.set()
    for w in writers:
        w.join(150)
        assert not w.is_alive()
    assert sum(int(c["bytes_dropped"]) for c in cuts) > 0, f"the cuts dropped nothing: {cuts}"

    logs = read_all(b.bootstrap, "pc", 4)
    at = {p: dict(recs) for p, recs in logs.items()}
    lost = {w.name: [(p, o, v) for p, o, v in w.acked if at[p].get(o) != v] for w in writers}
    to_ready.sort()
    to_acks.sort()
    print(f"power cuts: {len(cuts)} (faults {faults}), acknowledged {sum(len(w.acked) for w in writers)},"
          f" lost {sum(len(v) for v in lost.values())}; cut to broker ready p50 {to_ready[len(to_ready) // 2]:.2f} s"
          f" max {to_ready[-1]:.2f} s, cut to acks again p50 {to_acks[len(to_acks) // 2]:.2f} s"
          f" max {to_acks[-1]:.2f} s")
    for w in writers:
        assert not lost[w.name], (f"{w.name}: {len(lost[w.name])} of {len(w.acked)} acknowledged records lost"
                                  f" or changed, first {lost[w.name][:5]}; cuts {cuts}")
    assert not stalled, (f"no acks for {stalled} within 30 s of restart {len(cuts)}: {cuts[-1]},"
                         f" {[w.failed[:3] for w in writers]}")
    for p, recs in logs.items():
        idem = [int(v.split(b"-")[1]) for _, v in recs if v.startswith(b"idem-")]
        assert idem == sorted(set(idem)), f"partition {p}: the idempotent producer's records duplicated or reordered"

    topics = topic_metadata(b.bootstrap)
    assert all(f"made-{r}" in topics for r in range(made)), sorted(topics)
    for r in range(made):
        assert read_all(b.bootstrap, f"made-{r}", 2) == {0: [], 1: [(0, b"first")]}, f"made-{r}"
    assert committed_offset(b.bootstrap, "power-cut-group", "pc") == 100 + len(cuts) - 1
    txn = [v for _, v in read_all(b.bootstrap, "pc-txn", 1, "read_committed")[0]]
    assert txn == txn_values, f"committed transactions after the cuts: {txn}"


def test_a_failed_fsync_or_write_is_never_acknowledged(broker_factory, cutfs):
    """fsyncgate: after EIO from an fsync, Linux marks the pages clean, and a second fsync
    succeeds though the data never reached the disk. cutfs does the same (the failed
    data is gone at the next cut), so a broker that retried the fsync and acknowledged
    would lose those records here. One partition of four takes short writes (finished,
    and acknowledged), one EIO from a write, one EIO from an fsync (each offline, nothing
    acknowledged); the fourth goes on. After a power cut and a restart, the producer's
    retries land, and everything acknowledged is there, once."""
    data = cutfs.mnt / "data"
    durable_mkdir(data)
    b = broker_factory("--fsync", "always", cores=1, data_dir=data)
    create_topic(b.bootstrap, "fe", 4)
    w = Writer(b.bootstrap, "fe", 4, "fe", enable_idempotence=True)
    w.start()

    def acked_in(partition, after):
        return sum(1 for p, _, _ in w.acked[after:] if p == partition)

    def wait_for_acks(partitions, timeout=30):
        start = len(w.acked)
        deadline = time.monotonic() + timeout
        while any(acked_in(p, start) < 10 for p in partitions):
            assert time.monotonic() < deadline, f"partitions {partitions}: no acks; {b.log_tail()}"
            time.sleep(0.05)

    wait_for_acks([0, 1, 2, 3])
    cutfs.fail("write", "short", path="/fe-1/", count=5)
    cutfs.fail("write", "eio", path="/fe-2/")
    cutfs.fail("fsync", "eio", path="/fe-3/")
    wait_for_acks([0, 1])
    assert int(cutfs.stats()["faults_armed"]) == 0, cutfs.stats()
    # fe-2 and fe-3 failed: nothing more is acknowledged there until the restart.
    stuck_from = len(w.acked)
    wait_for_acks([0, 1])
    assert acked_in(2, stuck_from) == acked_in(3, stuck_from) == 0, "acknowledged after a failed write or fsync"
    cutfs.cut(b.pid, seed=SEED)
    b.proc.wait(10)
    b.restart()
    wait_for_acks([0, 1, 2, 3], timeout=60)
    w.stop.set()
    w.join(150)
    logs = read_all(b.bootstrap, "fe", 4)
    at = {p: dict(recs) for p, recs in logs.items()}
    lost = [(p, o, v) for p, o, v in w.acked if at[p].get(o) != v]
    assert not lost, f"{len(lost)} of {len(w.acked)} acknowledged records lost or changed, first {lost[:5]}"
    for p, recs in logs.items():
        seqs = [int(v.split(b"-")[1]) for _, v in recs]
        assert seqs == sorted(set(seqs)), f"fe-{p}: duplicated or reordered"
