"""Durability modes: `--fsync always` acknowledges only after an fdatasync that many
concurrent appends share (group commit), and topic `flush.messages=1` does the same
per topic. Shown with the broker's own fsync counter, kill -9, and a slowed fsync
(the hidden `--test-fsync-delay-ms`: each group-commit round sleeps after its
fdatasyncs, before its acks go out), since data surviving kill -9 is in the page
cache whether or not the ack waited for the disk."""

import ctypes
import mmap
import os
import subprocess
import threading
import time

import pytest
from confluent_kafka import Producer

from helpers.metrics import metric_sum, scrape
from helpers.broker import free_port
from helpers.clients import cf_conf, cf_consume, cf_produce, create_topic
from helpers.wire import (call, connect, init_producer_id, parse_init_producer_id, parse_produce_v3,
                          parse_write_txn_markers, produce_v3, produce_v3_settled, record_batch, recv_frame,
                          write_txn_markers)


def produce_concurrently(bootstrap, topic, producers, per_producer):
    errors = []

    def run(i):
        try:
            recs = [{"value": f"{i}-{n}".encode(), "partition": n % 4} for n in range(per_producer)]
            cf_produce(bootstrap, topic, recs, timeout=60, **{"linger.ms": 0, "batch.num.messages": 1})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_fsync_always_group_commits_and_survives_kill9(broker_factory):
    mport = free_port()
    b = broker_factory("--fsync", "always", "--metrics-listen", f"127.0.0.1:{mport}", cores=2)
    create_topic(b.bootstrap, "dur", 4)
    before = metric_sum(scrape(mport), "spate_fsyncs_total")
    producers, per_producer = 4, 200
    produce_concurrently(b.bootstrap, "dur", producers, per_producer)
    m = scrape(mport)
    fsyncs = metric_sum(m, "spate_fsyncs_total") - before
    produces = metric_sum(m, 'spate_request_duration_seconds_count{shard="0",api="Produce"}') + metric_sum(
        m, 'spate_request_duration_seconds_count{shard="1",api="Produce"}')
    assert fsyncs >= 1, m
    # Every ack waited for an fsync, but concurrent appends shared them.
    assert fsyncs < produces, f"{fsyncs} fsync rounds for {produces} produce requests"

    b.kill()
    b.restart(new_port=True)
    got = cf_consume(b.bootstrap, "dur", 4, count=producers * per_producer, timeout=60)
    # Every value, on its partition, each producer's in the order it sent them (the
    # producers' records interleave).
    for p in range(4):
        values = [m.value.decode() for m in got[p]]
        for i in range(producers):
            mine = [v for v in values if v.startswith(f"{i}-")]
            assert mine == [f"{i}-{n}" for n in range(p, per_producer, 4)], (p, i, mine[:10])
        assert len(values) == producers * per_producer // 4, (p, len(values))


def test_topic_flush_messages_1_fsyncs_without_the_broker_flag(broker_factory):
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}")
    create_topic(b.bootstrap, "plain", 1)
    create_topic(b.bootstrap, "flushed", 1, config={"flush.messages": "1"})
    base = metric_sum(scrape(mport), "spate_fsyncs_total")
    cf_produce(b.bootstrap, "plain", [{"value": b"x"}] * 20, timeout=30)
    after_plain = metric_sum(scrape(mport), "spate_fsyncs_total")
    assert after_plain == base, "Kafka's default: no fsync on the produce path"
    cf_produce(b.bootstrap, "flushed", [{"value": b"x"}] * 20, timeout=30, **{"linger.ms": 0})
    assert metric_sum(scrape(mport), "spate_fsyncs_total") > after_plain


def test_flush_ms_flushes_an_idle_partition(broker_factory):
    """flush.ms: a partition that took records and then nothing more is fsynced once
    flush.ms has passed (the tick's flush used to wait for the next append, so an idle
    partition never flushed)."""
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}")
    create_topic(b.bootstrap, "idle", 1, config={"flush.ms": "1000"})
    base = metric_sum(scrape(mport), "spate_fsyncs_total")
    cf_produce(b.bootstrap, "idle", [{"value": b"x"}] * 5, timeout=30)
    deadline = time.monotonic() + 30
    while metric_sum(scrape(mport), "spate_fsyncs_total") == base:
        assert time.monotonic() < deadline, "no fsync 30 s after the last append, with flush.ms=1000"
        time.sleep(0.2)


@pytest.mark.parametrize("args, per_round, calls_min", [
    ((), 200, 3),
    (("--write-behind-bytes", "65536"), 100, 3),
    (("--write-behind-bytes", "0"), 100, 0),
    (("--fsync", "always"), 100, 0),
])
def test_write_behind_hands_appended_pages_to_writeback_under_fsync_never(broker_factory, args, per_round, calls_min):
    """Under --fsync never the broker hands each segment's appended pages to the kernel's
    writeback every --write-behind-bytes (default 1 MiB; sync_file_range, so the flusher
    never meets ~30 s of appends at once). Four rounds of records 0.3 s apart, each
    more than the threshold (2 MB at the default, 1 MB at 64 KiB), make at least 3 such
    calls (one per file at a time: a call due while one is out waits for the next
    append). None with --write-behind-bytes 0, none under --fsync always (group commit
    writes every byte); the records read back the same either way."""
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}", *args)
    create_topic(b.bootstrap, "wb", 1)
    records = [{"value": b"%06d" % i + b"x" * 9_994} for i in range(4 * per_round)]
    for r in range(4):
        cf_produce(b.bootstrap, "wb", records[r * per_round:(r + 1) * per_round], timeout=60)
        time.sleep(0.3)
    calls = metric_sum(scrape(mport), "spate_write_behind_calls_total")
    if calls_min:
        assert calls >= calls_min, calls
    else:
        assert calls == 0, calls
    got = cf_consume(b.bootstrap, "wb", 1, len(records))
    assert [m.value for m in got[0]] == [r["value"] for r in records]


def resident_fraction(path, length):
    """The share of the first `length` bytes' pages of `path` in the page cache (mincore
    of a read-only shared mapping, which faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    pages = (length + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, length, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(b & 1 for b in vec.raw[:pages]) / pages
        finally:
            libc.munmap(addr, length)
    finally:
        os.close(fd)


@pytest.mark.parametrize("args, dropped", [
    (("--drop-behind-bytes", "4194304"), True),
    (("--drop-behind-bytes", "4194304", "--fsync", "always"), True),
    ((), False),
])
def test_drop_behind_keeps_only_the_newest_appended_bytes_in_the_page_cache(broker_factory, tmp_path, args, dropped):
    """Each shard keeps only its --drop-behind-bytes most recently appended bytes in the
    page cache: 4 MB produced (within a 4 MiB budget), a pause for writeback, 6 MB more,
    and the segment's first 2 MB have left the page cache (fadvise DONTNEED; the kernel
    drops only written-back pages, so a range dropped while still dirty stays: hence the
    pause), under either fsync mode; by default (0: the kernel decides, as with Kafka)
    they stay. The records read back the same either way."""
    if subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip() == "tmpfs":
        pytest.skip("tmpfs: its pages cannot be dropped")
    mport = free_port()
    b = broker_factory("--metrics-listen", f"127.0.0.1:{mport}", *args, cores=1)
    create_topic(b.bootstrap, "dbh", 1)
    records = [{"value": b"%06d" % i + b"x" * 9_994} for i in range(1000)]
    cf_produce(b.bootstrap, "dbh", records[:400], timeout=60)
    time.sleep(1.5)
    cf_produce(b.bootstrap, "dbh", records[400:], timeout=60)
    time.sleep(0.5)
    metrics = scrape(mport)
    calls = metric_sum(metrics, "spate_drop_behind_calls_total")
    dropped_bytes = metric_sum(metrics, "spate_drop_behind_bytes_total")
    segment = b.data_dir / "dbh-0" / ("0" * 20 + ".log")
    resident = resident_fraction(segment, 2 << 20)
    if dropped:
        assert calls >= 2 and dropped_bytes >= 4_000_000, (calls, dropped_bytes)
        assert resident <= 0.05, f"{resident:.0%} of the first 2 MB still cached"
    else:
        assert calls == dropped_bytes == 0, (calls, dropped_bytes)
        assert resident >= 0.95, f"only {resident:.0%} of the first 2 MB cached without drop-behind"
    got = cf_consume(b.bootstrap, "dbh", 1, len(records))
    assert [m.value for m in got[0]] == [r["value"] for r in records]


FSYNC_DELAY_MS = 2000
PRODUCES = 5


def ack_latencies(bootstrap, topic, n=PRODUCES):
    """Seconds from produce() to its acks=1 delivery report, for `n` records sent one at
    a time by one producer (its connection and metadata made by a first record)."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0})
    try:
        latencies = []
        for i in range(n + 1):
            done = []
            t0 = time.monotonic()
            p.produce(topic, f"v{i}".encode(), on_delivery=lambda err, msg: done.append(err))
            left = p.flush(60)
            assert left == 0 and done == [None], (left, done)
            latencies.append(time.monotonic() - t0)
        return latencies[1:]
    finally:
        p.flush(10)


def test_fsync_always_acks_wait_for_the_fsync(broker_factory):
    """With `--fsync always` and each fsync round slowed by D, every acks=1 produce is
    answered no sooner than D: the ack waits for the fsync. With the default mode the
    same delay is never on the produce path (acks go out once the page cache has the
    bytes), so the check fails both ways; a topic with flush.messages=1 waits again."""
    delay_s = FSYNC_DELAY_MS / 1000
    b = broker_factory("--fsync", "always", "--test-fsync-delay-ms", str(FSYNC_DELAY_MS), cores=1)
    create_topic(b.bootstrap, "slow-sync", 1)
    synced = ack_latencies(b.bootstrap, "slow-sync")
    assert min(synced) >= delay_s, \
        f"acks=1 answered in {min(synced):.3f} s, before the {delay_s} s fsync: {synced}"
    got = cf_consume(b.bootstrap, "slow-sync", 1, count=PRODUCES + 1)
    assert [m.value for m in got[0]] == [f"v{i}".encode() for i in range(PRODUCES + 1)]

    b = broker_factory("--test-fsync-delay-ms", str(FSYNC_DELAY_MS), name="default-mode", cores=1)
    create_topic(b.bootstrap, "page-cache", 1)
    unsynced = ack_latencies(b.bootstrap, "page-cache")
    # The fastest of several: one slow answer on a loaded machine is not the delay.
    assert min(unsynced) < delay_s / 2, \
        f"default mode: every ack took {min(unsynced):.3f} s or more, as if it waited for the fsync: {unsynced}"
    create_topic(b.bootstrap, "flushed-each", 1, config={"flush.messages": "1"})
    flushed = ack_latencies(b.bootstrap, "flushed-each")
    assert min(flushed) >= delay_s, \
        f"flush.messages=1: answered in {min(flushed):.3f} s, before the {delay_s} s fsync: {flushed}"


def test_fsync_always_acks_wait_when_a_round_covers_many_partitions(broker_factory):
    """A group-commit round's partitions are synced by several blocking jobs at once
    (`limits::group_commit_sync_jobs_max`, 6), each job's fsync slowed by D. Sixteen
    producers, a partition and a connection each, send one record at once, half a
    second into a round started by a seventeenth: they all share the next round, dealt
    over the jobs. Every ack must come no sooner than D after its send, whatever round
    it fell in; a round that released a job's partitions before that job's fsync would
    ack most of them after D minus the half second. Every record is read back."""
    delay_s = FSYNC_DELAY_MS / 1000
    b = broker_factory("--fsync", "always", "--test-fsync-delay-ms", str(FSYNC_DELAY_MS), cores=1)
    parts = 16
    create_topic(b.bootstrap, "wide", parts + 1)
    producers = [Producer({"bootstrap.servers": b.bootstrap, "acks": 1, "linger.ms": 0}) for _ in range(parts + 1)]
    try:
        for i, p in enumerate(producers):  # connections and metadata, before the timed sends
            p.produce("wide", b"warm", partition=i)
        assert all(p.flush(60) == 0 for p in producers)
        acked = {}
        producers[parts].produce("wide", b"blocker", partition=parts)
        producers[parts].poll(0)
        time.sleep(0.5)  # not synchronization: the assertion below holds at any timing
        for i in range(parts):
            sent = time.monotonic()
            producers[i].produce("wide", f"w{i}".encode(), partition=i,
                                 on_delivery=lambda err, msg, sent=sent:
                                 acked.__setitem__(msg.partition(), (err, time.monotonic() - sent)))
            producers[i].poll(0)
        assert all(p.flush(60) == 0 for p in producers)
    finally:
        for p in producers:
            p.flush(10)
    assert sorted(acked) == list(range(parts)), acked
    assert all(err is None for err, _ in acked.values()), acked
    early = {q: round(t, 3) for q, (_, t) in acked.items() if t < delay_s}
    assert not early, f"acked before the {delay_s} s fsync: {early}"
    got = cf_consume(b.bootstrap, "wide", parts + 1, count=2 * parts + 2)
    want = [b"warm"] * (parts + 1) + [b"blocker"] + [f"w{i}".encode() for i in range(parts)]
    assert sorted(m.value for ms in got.values() for m in ms) == sorted(want)



def test_fsync_always_a_record_sent_during_a_round_waits_for_the_next(broker_factory):
    """A group-commit round covers the offsets written when it was taken. One
    producer's record starts a round slowed by D; a second producer's record to the
    same partition, sent half a second in, lands at the very next offset. It must wait
    for the next round, which starts once the blocker's (sent after t0) has taken D:
    acked no sooner than 2D after t0. (The round's end is exclusive and the shard
    compared with <=: that record was acked by the round that had not synced it, 2.002 s
    against the blocker's 2.002 s.) The bound is not "D after the blocker's ack": the
    next round may start a few ms before the client sees that ack (CI r17: 4.003 s
    against 2.006 + 2.0). Both read back."""
    delay_s = FSYNC_DELAY_MS / 1000
    b = broker_factory("--fsync", "always", "--test-fsync-delay-ms", str(FSYNC_DELAY_MS), cores=1)
    create_topic(b.bootstrap, "next-round", 1)
    first = Producer({"bootstrap.servers": b.bootstrap, "acks": 1, "linger.ms": 0})
    second = Producer({"bootstrap.servers": b.bootstrap, "acks": 1, "linger.ms": 0})
    for p in (first, second):  # connections and metadata, before the timed sends
        p.produce("next-round", b"warm", partition=0)
        assert p.flush(60) == 0
    acked = {}
    t0 = time.monotonic()
    first.produce("next-round", b"blocker", partition=0,
                  on_delivery=lambda err, msg: acked.__setitem__("blocker", (err, time.monotonic() - t0)))
    first.poll(0)
    time.sleep(0.5)  # into the blocker's round; the ack times below show it was
    sent = time.monotonic() - t0
    second.produce("next-round", b"during", partition=0,
                   on_delivery=lambda err, msg: acked.__setitem__("during", (err, time.monotonic() - t0)))
    assert first.flush(60) == 0 and second.flush(60) == 0
    assert acked["blocker"][0] is None and acked["during"][0] is None, acked
    blocker_at, during_at = acked["blocker"][1], acked["during"][1]
    assert sent < blocker_at, f"sent at {sent:.3f} s, after the blocker's round ended ({blocker_at:.3f} s)"
    assert during_at >= 2 * delay_s, \
        f"acked at {during_at:.3f} s, by the round that was out when it was sent (the blocker's, {blocker_at:.3f} s)"
    got = cf_consume(b.bootstrap, "next-round", 1, count=4)
    assert [m.value for m in got[0]] == [b"warm", b"warm", b"blocker", b"during"]


def test_fsync_always_transactions_wait_for_the_fsync(broker_factory):
    """Under `--fsync always` the broker's own writes for a transaction wait for an
    fsync as produce does. The coordinator's PrepareCommit record: commit_transaction is
    answered only after a slowed round (D). A partition leader's marker: a
    WriteTxnMarkers request (sent raw here, as a coordinator sends it) is answered only
    after one. (Both were answered from the page cache: a power loss after
    commit_transaction returned could turn the committed transaction into an aborted
    one.) The committed record reads back under read_committed."""
    delay_s = FSYNC_DELAY_MS / 1000
    b = broker_factory("--fsync", "always", "--test-fsync-delay-ms", str(FSYNC_DELAY_MS), cores=1)
    create_topic(b.bootstrap, "txn-durable", 1)
    create_topic(b.bootstrap, "marked", 1)
    p = Producer(cf_conf(b.bootstrap, **{"transactional.id": "tx-durable"}))
    p.init_transactions(60)
    p.begin_transaction()
    p.produce("txn-durable", b"committed", partition=0)
    assert p.flush(60) == 0
    t0 = time.monotonic()
    p.commit_transaction(60)
    took = time.monotonic() - t0
    assert took >= delay_s, f"commit_transaction answered in {took:.3f} s, before the {delay_s} s fsync"
    got = cf_consume(b.bootstrap, "txn-durable", 1, count=1, isolation_level="read_committed")
    assert [m.value for m in got[0]] == [b"committed"]

    s = connect(b.port, timeout=30)
    try:
        t0 = time.monotonic()
        s.sendall(write_txn_markers([(4242, 0, True, 0, {"marked": [0]})], correlation_id=7))
        answer = parse_write_txn_markers(recv_frame(s, timeout=30))
        took = time.monotonic() - t0
    finally:
        s.close()
    assert answer == {(4242, "marked", 0): 0}, answer
    assert took >= delay_s, f"WriteTxnMarkers answered in {took:.3f} s, before the {delay_s} s fsync"


def test_fsync_always_a_retried_idempotent_batch_waits_for_the_fsync(broker_factory):
    """An idempotent producer's retry of a batch whose original still waits for its
    round is answered with the original's offsets, but only once an fsync covers them.
    Connection A sends a batch into a round slowed by D; connection B sends the same
    batch (same producer id, epoch and sequence) half a second later, as a client
    resending over a new connection does. Both answers carry the same offset, and B's
    comes no sooner than D after A's send. (B's came at once: the duplicate was acked
    from the page cache, before the original's fsync.)"""
    delay_s = FSYNC_DELAY_MS / 1000
    b = broker_factory("--fsync", "always", "--test-fsync-delay-ms", str(FSYNC_DELAY_MS), cores=1)
    create_topic(b.bootstrap, "retried", 1)
    assert produce_v3_settled(b.port, "retried", 0, record_batch([b"warm"]), acks=1) == (0, 0)
    err, pid, epoch = parse_init_producer_id(call(b.port, init_producer_id()))
    assert err == 0, err
    batch = record_batch([b"once"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    a, c = connect(b.port, timeout=30), connect(b.port, timeout=30)
    try:
        t0 = time.monotonic()
        a.sendall(produce_v3("retried", 0, batch, correlation_id=1, acks=1))
        time.sleep(0.5)  # into the original's round; the answers below show it was
        c.sendall(produce_v3("retried", 0, batch, correlation_id=2, acks=1))
        retry = parse_produce_v3(recv_frame(c, timeout=30))
        retry_at = time.monotonic() - t0
        first = parse_produce_v3(recv_frame(a, timeout=30))
    finally:
        a.close()
        c.close()
    assert first == (0, 1) and retry == (0, 1), (first, retry)
    assert retry_at >= delay_s, f"the retry was answered {retry_at:.3f} s after the original, before its fsync"
    got = cf_consume(b.bootstrap, "retried", 1, count=2)
    assert [m.value for m in got[0]] == [b"warm", b"once"]
