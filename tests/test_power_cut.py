"""Power cuts (issue 49): the broker's data dir on cutfs (tests/cutfs), a FUSE file system
that, told the power went, kills the broker and keeps only what was made durable: file
data up to its last fsync, directory entries up to their directory's last fsync
(tests/README.md, "Power cuts"). kill -9 keeps the page cache; these tests do not."""

import os
import random
import subprocess
import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from helpers.clients import admin, cf_conf, cf_produce, create_topic, topic_metadata
from helpers.cutfs import CutFs, usable

pytestmark = pytest.mark.skipif(usable() is not None, reason=str(usable()))

SEED = int(os.environ.get("SPATE_TEST_SEED", "0") or 0)


@pytest.fixture
def cutfs_factory(request, tmp_path):
    """cutfs_factory() -> a new mounted CutFs (one per simulated machine)."""
    mounted = []

    def make():
        mounted.append(CutFs(tmp_path / f"fs{len(mounted)}"))
        return mounted[-1]

    yield make
    # The brokers on them go first (broker_factory's teardown comes after this one's).
    for b in getattr(request.node, "_spate_brokers", []):
        b.kill()
    for fs in mounted:
        fs.close()


@pytest.fixture
def cutfs(cutfs_factory):
    return cutfs_factory()


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
        # 60 s without a record or an end: a long soak's millions of records take longer
        # than any fixed deadline to read back.
        deadline = time.monotonic() + 60
        while len(at_eof) < partitions:
            assert time.monotonic() < deadline, f"no end of {topic} within 60 s of the last record: {sorted(at_eof)}"
            m = c.poll(0.2)
            if m is None:
                continue
            deadline = time.monotonic() + 60
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    at_eof.add(m.partition())
                continue
            at_eof.discard(m.partition())
            out[m.partition()].append((m.offset(), m.value()))
    finally:
        c.close()
    return out


def stale_recovery_points(data, topic, partitions):
    """The partitions of `topic` whose recovery point, as a power cut left it, is missing,
    garbled or below the second-newest segment: a restart would recover (read and check)
    that much more of the log. Each round that passes a segment's base writes it and the
    next round syncs it, so only the newest two segments can be above it (checked from
    the third segment on: the first checkpoint comes with the first roll)."""
    stale = {}
    for p in range(partitions):
        d = data / f"{topic}-{p}"
        bases = sorted(int(f.name[:20]) for f in d.glob("*.log"))
        if len(bases) < 3:
            continue
        try:
            version, offset, _crc = (d / "spate-recovery-point").read_text().split()
            point = int(offset) if version == "1" else -1
        except (OSError, ValueError):
            point = -1
        if point < bases[-2]:
            stale[p] = (point, bases[-3:])
    return stale


def torn_indexes(data, topic, partitions):
    """The index files, as a power cut left them, of `topic`'s segments below the newest
    two whose length is not whole entries. Only the newest two can hold an unsynced
    length (the active one's preallocation; the last rolled one's trim until the round
    after the roll); a start that rebuilds an older one syncs it, or every later cut
    brings it back and every start recovers (and replays) the log from there."""
    torn = []
    for p in range(partitions):
        d = data / f"{topic}-{p}"
        bases = sorted(f.name[:20] for f in d.glob("*.log"))
        for base in bases[:-2]:
            for suffix, entry in ((".index", 8), (".timeindex", 12)):
                f = d / (base + suffix)
                if f.exists() and f.stat().st_size % entry:
                    torn.append((f.name, f.stat().st_size))
    return torn


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


def commit_transaction(bootstrap, topic, values, abort=False):
    p = Producer(cf_conf(bootstrap, **{"transactional.id": "power-cut-txn"}))
    p.init_transactions(60)
    p.begin_transaction()
    for v in values:
        p.produce(topic, v, partition=0)
    if abort:
        p.flush(60)
        p.abort_transaction(60)
    else:
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
    fsync: the broker halts, and the cut finds it dead) on a random partition first. Prints cuts, records acknowledged, lost (must be
    0) and the time from each cut to the broker answering and to acks again.
    SPATE_POWER_CUTS_MINUTES=M ends the cuts after M minutes (the read-back and every
    check still run): the way to end a soak early without losing its loss count."""
    rounds = int(os.environ.get("SPATE_POWER_CUTS", "3"))
    # A soak that must end by a time (SPATE_POWER_CUTS_MINUTES) stops cutting then and
    # still reads everything back and counts what was lost.
    ends_at = time.monotonic() + 60 * float(os.environ.get("SPATE_POWER_CUTS_MINUTES", "inf"))
    rng = random.Random(SEED)
    data = cutfs.mnt / "data"
    durable_mkdir(data)
    b = broker_factory("--fsync", "always", cores=2, data_dir=data)
    # 256 KiB segments: the cuts meet rolls (a roll's fsyncs, producer snapshots, new
    # files, the recovery point), several per partition even in the three-cut run.
    create_topic(b.bootstrap, "pc", 4, config={"segment.bytes": str(1 << 18)})
    # Small segments: transactions end up in segments below the recovery point, whose
    # transaction index is not rebuilt at open (it must have been synced).
    create_topic(b.bootstrap, "pc-txn", 1, config={"segment.bytes": "100"})
    # Records deleted before each cut (DeleteRecords): the log start offset must stay.
    create_topic(b.bootstrap, "pc-start", 1)
    cf_produce(b.bootstrap, "pc-start", [{"value": f"s-{i}".encode(), "partition": 0} for i in range(rounds + 10)])
    log_start = 0
    # A long soak paces the writers: every acknowledged record is kept and read back.
    pace = {} if rounds <= 3 else {"rate": 2000}
    writers = [Writer(b.bootstrap, "pc", 4, "idem", enable_idempotence=True, **pace),
               Writer(b.bootstrap, "pc", 4, "acks1", acks=1, **pace)]
    for w in writers:
        w.start()
    txn_values, cuts, stalled, made, faults, committed = [], [], [], 0, 0, None
    to_ready, to_acks = [], []
    for rnd in range(rounds):
        if rnd >= 3 and time.monotonic() > ends_at:
            print(f"SPATE_POWER_CUTS_MINUTES reached after {rnd} cuts", flush=True)
            break
        tear = ["none", "keep", "zero"][rnd] if rnd < 3 else rng.choice(["none", "keep", "zero"])
        time.sleep(rng.uniform(0.5, 1.5))
        if rnd >= 3 and rng.random() < 0.5:
            op, kind = rng.choice([("write", "short"), ("write", "eio"), ("fsync", "eio")])
            # A segment file: an mmap'ed index's write fails in the kernel's writeback,
            # where no process hears of it (Kafka's indexes likewise). A failed write
            # stays failed: FUSE splits a large write into requests, and a later one's
            # EIO reaches the writer as a short write, whose rest the broker rightly
            # writes again (a fault that fired once was then passed without a halt).
            count = 1000 if (op, kind) == ("write", "eio") else 1
            cutfs.fail(op, kind, path=f"/pc-{rng.randrange(4)}/*.log", count=count)
            faults += 1
            if kind == "eio":
                # A failed disk halts the broker; the power cut then finds it dead.
                try:
                    status = b.proc.wait(20)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"cut {rnd}: the broker did not halt after EIO from {op}")
                assert status == 1, (status, b.log_tail())
            time.sleep(rng.uniform(0, 0.5))
        if b.alive():
            commit_offset(b.bootstrap, "power-cut-group", "pc", 100 + rnd)
            committed = 100 + rnd
            # Aborted (its records on the disk, the abort in the transaction index):
            # read_committed must skip them after the cut, as before it. The commits
            # after it move the recovery point and the producer snapshots (a roll per
            # batch) past the abort, so that the next start trusts the abort's segment
            # and its transaction index instead of replaying them.
            commit_transaction(b.bootstrap, "pc-txn", [f"aborted-{rnd}-{i}".encode() for i in range(3)], abort=True)
            values = [f"txn-{rnd}-{i}".encode() for i in range(5)]
            commit_transaction(b.bootstrap, "pc-txn", values[:2])
            commit_transaction(b.bootstrap, "pc-txn", values[2:])
            txn_values += values
            a = admin(b.bootstrap)
            deleted = a.delete_records([TopicPartition("pc-start", 0, rnd + 1)], request_timeout=30)
            assert deleted[TopicPartition("pc-start", 0)].result(30).low_watermark == rnd + 1
            log_start = rnd + 1
        if rnd < 3:
            # A partition made just now, written, acknowledged, and the power goes at
            # once: its directory's entry must be as durable as its record.
            create_topic(b.bootstrap, f"made-{rnd}", 2)
            cf_produce(b.bootstrap, f"made-{rnd}", [{"value": b"first", "partition": 1}])
            made += 1
        before = [len(w.acked) for w in writers]
        cuts.append(cutfs.cut(b.pid, tear=tear, seed=rng.getrandbits(32)))
        cutfs.call("clear")
        stale = stale_recovery_points(data, "pc", 4)
        assert not stale, f"cut {rnd}: recovery points (point, newest three segments) {stale}"
        torn = torn_indexes(data, "pc", 4)
        assert not torn, f"cut {rnd}: torn indexes below the newest two segments {torn}"
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
        if rounds > 3:
            print(f"cut {rnd + 1}: tear {tear}, faults {faults}, acknowledged {sum(len(w.acked) for w in writers)},"
                  f" ready {to_ready[-1]:.2f} s, acks {to_acks[-1]:.2f} s", flush=True)
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
    assert committed_offset(b.bootstrap, "power-cut-group", "pc") == committed
    txn = [v for _, v in read_all(b.bootstrap, "pc-txn", 1, "read_committed")[0]]
    assert txn == txn_values, f"committed transactions after the cuts: {txn}"
    start = [o for o, _ in read_all(b.bootstrap, "pc-start", 1)[0]]
    assert start == list(range(log_start, rounds + 10)), f"after DeleteRecords up to {log_start} and the cuts: {start}"

    # A clean stop writes each recovery point beside the clean-shutdown marker; the next
    # start removes the marker, and a cut then, before any roll, must still find them.
    assert b.stop() == 0, b.log_tail()
    b.restart()
    cutfs.cut(b.pid, tear="none")
    stale = stale_recovery_points(data, "pc", 4)
    assert not stale, f"a clean stop, a start, a cut: recovery points (point, newest three segments) {stale}"


def test_a_failed_fsync_or_write_is_never_acknowledged(broker_factory, cutfs):
    """fsyncgate: after EIO from an fsync, Linux marks the pages clean, and a second fsync
    succeeds though the data never reached the disk. cutfs does the same (the failed
    data is gone at the next cut), so a broker that retried the fsync and acknowledged
    would lose those records here. Short writes are finished and acknowledged. EIO from
    an fsync, and then from a write, each fail the log dir: the broker logs it and halts,
    as Kafka does when its only log dir has failed (nothing on it is trusted until a
    restart recovers it). After each, a power cut and a restart: the producer's retries
    land, and everything acknowledged is there, once."""
    data = cutfs.mnt / "data"
    durable_mkdir(data)
    b = broker_factory("--fsync", "always", cores=1, data_dir=data)
    create_topic(b.bootstrap, "fe", 4)
    w = Writer(b.bootstrap, "fe", 4, "fe", enable_idempotence=True)
    w.start()

    def wait_for_acks(partitions, timeout=30):
        start = len(w.acked)
        deadline = time.monotonic() + timeout
        while any(sum(1 for p, _, _ in w.acked[start:] if p == q) < 10 for q in partitions):
            assert time.monotonic() < deadline, f"partitions {partitions}: no acks; {b.log_tail()}"
            time.sleep(0.05)

    wait_for_acks([0, 1, 2, 3])
    cutfs.fail("write", "short", path="/fe-1/*.log", count=5)
    wait_for_acks([0, 1])
    assert int(cutfs.stats()["faults_armed"]) == 0, cutfs.stats()
    for op, partition in [("fsync", 3), ("write", 2)]:
        cutfs.fail(op, "eio", path=f"/fe-{partition}/*.log")
        try:
            status = b.proc.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the broker did not halt after EIO from {op}; {b.log_tail()}")
        assert status == 1 and "log dir failed" in b.log_text(), (status, b.log_tail())
        cutfs.cut(b.pid, seed=SEED)
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


def test_a_replica_that_lost_its_tail_in_a_power_cut_is_not_elected(broker_factory, cutfs):
    """KIP-966's case, `--fsync never` (Kafka's default), replication factor 3,
    min.insync.replicas=2, acks=all. Replicas [2, 3, 1], leader 2, all in sync and
    holding every acknowledged record, in their page caches only. Broker 3 loses power
    (its copy is gone: nothing was fsynced) and broker 2 is killed at once; 3 is back
    before 2's session expires, so the controller has not yet seen 3 leave the ISR. When
    2's session expires, the next leader in replica order still in the ISR is 3, with an
    empty log: electing it would lose every acknowledged record (and 1 would truncate its
    own copy to match). A broker that registers again fences its previous incarnation,
    which takes it out of every ISR, so broker 1 is elected and nothing is lost."""
    from confluent_kafka.admin import NewTopic

    from helpers.clients import admin
    from test_cluster import cluster_args, wait_brokers
    from test_replication import partition_states, wait_states

    data3 = cutfs.mnt / "data"
    durable_mkdir(data3)
    b1 = broker_factory(*cluster_args(1), name="b1", cores=1)
    b2 = broker_factory(*cluster_args(2), "--coordinator", b1.bootstrap, name="b2", cores=1)
    b3 = broker_factory(*cluster_args(3), "--coordinator", b1.bootstrap, name="b3", cores=1, data_dir=data3)
    wait_brokers(b1.bootstrap, {b.port for b in (b1, b2, b3)})
    a = admin(b1.bootstrap)
    a.create_topics([NewTopic("k", 1, replica_assignment=[[2, 3, 1]],
                              config={"min.insync.replicas": "2"})])["k"].result(20)
    wait_states(b1.bootstrap, "k", lambda s: s[0][0] == 2 and s[0][2] == [1, 2, 3], what="leader 2, ISR 1,2,3")
    values = [f"k-{i}".encode() for i in range(200)]
    cf_produce(b1.bootstrap, "k", [{"value": v, "partition": 0} for v in values], acks="all",
               enable_idempotence=True)

    cut = cutfs.cut(b3.pid)
    b2.kill()
    assert int(cut["bytes_dropped"]) > 0, cut
    b3.proc.wait(10)
    b3.restart()
    states = wait_states(b1.bootstrap, "k", lambda s: s[0][0] not in (-1, 2), timeout=30, what="a new leader")
    b2.restart()
    wait_states(b1.bootstrap, "k", lambda s: s[0][2] == [1, 2, 3], timeout=30, what="every replica in sync")
    got = [v for _, v in read_all(b1.bootstrap, "k", 1)[0]]
    assert got == values, (f"leader after the cut: {states[0][0]} (ISR {states[0][2]}); {len(got)} records"
                           f" of {len(values)} acknowledged: {got[:3]}; now {partition_states(b1.bootstrap, 'k')}")


def test_one_broker_at_a_time_loses_power_under_fsync_never(broker_factory, cutfs_factory):
    """`--fsync never` (Kafka's default): three brokers, each on its own cutfs, a topic
    with replication factor 3 and min.insync.replicas=2, an idempotent acks=all producer
    writing throughout. Each broker in turn loses power (its unsynced records are gone)
    and comes back; the next cut waits until it is in sync again. Nothing acknowledged is
    lost: every acknowledged record was in at least two page caches, and a replica back
    from a cut is fenced out of the ISR until it has caught up."""
    from test_cluster import cluster_args, wait_brokers
    from test_replication import full_isr, wait_states

    rng = random.Random(SEED)
    fss = [cutfs_factory() for _ in range(3)]
    for fs in fss:
        durable_mkdir(fs.mnt / "data")
    b1 = broker_factory(*cluster_args(1), name="b1", cores=1, data_dir=fss[0].mnt / "data")
    brokers = [b1] + [broker_factory(*cluster_args(i), "--coordinator", b1.bootstrap, name=f"b{i}", cores=1,
                                     data_dir=fss[i - 1].mnt / "data") for i in (2, 3)]
    wait_brokers(b1.bootstrap, {b.port for b in brokers})
    bootstrap = ",".join(b.bootstrap for b in brokers)
    create_topic(b1.bootstrap, "rf3", 3, replication_factor=3, config={"min.insync.replicas": "2"})
    wait_states(b1.bootstrap, "rf3", full_isr, what="every replica in sync")
    w = Writer(bootstrap, "rf3", 3, "rf3", enable_idempotence=True)
    w.start()
    cuts = []
    for victim in [2, 3, 1]:
        time.sleep(rng.uniform(1.0, 2.0))
        b = brokers[victim - 1]
        cuts.append(fss[victim - 1].cut(b.pid, tear=rng.choice(["none", "keep", "zero"]), seed=rng.getrandbits(32)))
        b.proc.wait(10)
        b.restart()
        wait_states(b1.bootstrap, "rf3", full_isr, timeout=60, what=f"broker {victim} back in sync")
    start = len(w.acked)
    deadline = time.monotonic() + 30
    while len(w.acked) < start + 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    stalled = len(w.acked) < start + 100
    w.stop.set()
    w.join(150)
    assert sum(int(c["bytes_dropped"]) for c in cuts) > 0, cuts
    logs = read_all(b1.bootstrap, "rf3", 3)
    at = {p: dict(recs) for p, recs in logs.items()}
    lost = [(p, o, v) for p, o, v in w.acked if at[p].get(o) != v]
    assert not lost, f"{len(lost)} of {len(w.acked)} acknowledged records lost, first {lost[:5]}; cuts {cuts}"
    assert not stalled, f"no acks within 30 s of the last cut; failed {w.failed[:3]}"
    for p, recs in logs.items():
        seqs = [int(v.split(b"-")[1]) for _, v in recs]
        assert seqs == sorted(set(seqs)), f"rf3-{p}: duplicated or reordered"


def test_a_failed_disk_moves_the_leadership(broker_factory, cutfs):
    """A leader's disk fails (EIO from a write): the broker halts, as Kafka does when its
    only log dir has failed, the controller fences it when its session expires, and the
    partition's next in-sync replica leads; the producer goes on there with nothing
    acknowledged lost. The failed broker comes back (after a power cut, the worst case)
    and catches up."""
    from confluent_kafka.admin import NewTopic

    from helpers.clients import admin
    from test_cluster import cluster_args, wait_brokers
    from test_replication import wait_states

    data2 = cutfs.mnt / "data"
    durable_mkdir(data2)
    b1 = broker_factory(*cluster_args(1), name="b1", cores=1)
    b2 = broker_factory(*cluster_args(2), "--coordinator", b1.bootstrap, name="b2", cores=1, data_dir=data2)
    b3 = broker_factory(*cluster_args(3), "--coordinator", b1.bootstrap, name="b3", cores=1)
    wait_brokers(b1.bootstrap, {b.port for b in (b1, b2, b3)})
    a = admin(b1.bootstrap)
    a.create_topics([NewTopic("ld", 1, replica_assignment=[[2, 3, 1]],
                              config={"min.insync.replicas": "2"})])["ld"].result(20)
    wait_states(b1.bootstrap, "ld", lambda s: s[0][0] == 2 and s[0][2] == [1, 2, 3], what="leader 2, ISR 1,2,3")
    w = Writer(",".join(b.bootstrap for b in (b1, b2, b3)), "ld", 1, "ld", enable_idempotence=True)
    w.start()

    def wait_for_acks(n, timeout):
        start = len(w.acked)
        deadline = time.monotonic() + timeout
        while len(w.acked) < start + n:
            assert time.monotonic() < deadline, f"no acks; failed {w.failed[:3]}; {b1.log_tail()}"
            time.sleep(0.05)

    wait_for_acks(100, 30)
    cutfs.fail("write", "eio", path="/ld-0/*.log")
    try:
        status = b2.proc.wait(20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the leader did not halt on its failed disk; {b2.log_tail()}")
    assert status == 1 and "log dir failed" in b2.log_text(), (status, b2.log_tail())
    wait_states(b1.bootstrap, "ld", lambda s: s[0][0] in (1, 3), timeout=30, what="a new leader")
    wait_for_acks(100, 30)
    cutfs.cut(b2.pid, seed=SEED)
    b2.restart()
    wait_states(b1.bootstrap, "ld", lambda s: s[0][2] == [1, 2, 3], timeout=60, what="broker 2 back in sync")
    w.stop.set()
    w.join(150)
    got = dict(read_all(b1.bootstrap, "ld", 1)[0])
    lost = [(o, v) for _, o, v in w.acked if got.get(o) != v]
    assert not lost, f"{len(lost)} of {len(w.acked)} acknowledged records lost, first {lost[:5]}"
    seqs = [int(v.split(b"-")[1]) for v in got.values()]
    assert seqs == sorted(set(seqs)), "duplicated or reordered"
