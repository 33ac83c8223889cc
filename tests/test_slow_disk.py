"""Produce faster than the disk can take: the broker's memory stays bounded, producers
are slowed to the disk's rate, and every acknowledged message can be read back.

The disk is made slow for the broker alone with the kernel's block throttle on the data
dir's device, in a cgroup the broker runs in: cgroup v2 `io.max wbps=` where the io
controller is on the unified hierarchy (a current Debian), else cgroup v1
`blkio.throttle.write_bps_device`. Both throttle the writeback an fdatasync starts from
the broker's threads, so the broker runs with `--fsync always`: every produce is
answered only once an fdatasync covering it is done, whatever its acks. (With Kafka's
default, `--fsync never`, acks wait for the page cache only and the kernel's dirty-page
throttling slows the writes; the memory bound below is the same.)

What bounds the broker's memory: a produce request keeps its frame's share of
`queued.max.request.bytes` until its record bytes are written (and fsynced when asked),
and connections stop reading while the budget is used up. So bytes waiting for the
disk never exceed that budget; the test sets it small and measures RSS.
"""

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer, TopicPartition

from helpers.broker import REPO_ROOT
from helpers.clients import RDKAFKA_LOGGER, cf_consume, cf_consumer, create_topic

# Serial (scripts/test runs it alone, after the parallel part): it throttles a cgroup's block I/O and times what the broker does about it.
pytestmark = [pytest.mark.serial]

MiB = 1024 * 1024

DISK_WRITE_BYTES_PER_S = 8 * MiB
QUEUED_REQUEST_BYTES_MAX = 16 * MiB
# RSS above the idle broker's: the request budget plus what the broker allocates
# besides (answers, indexes, allocator slack).
RSS_GROWTH_BYTES_MAX = QUEUED_REQUEST_BYTES_MAX + 24 * MiB
PRODUCERS = 12
# Each producer's local queue (librdkafka's default holds 1 GB): together the producers
# keep about 96 MB outstanding, six times the broker's request budget (without the
# budget the broker would hold it all), and that much drains through the throttled disk
# within librdkafka's request.timeout.ms (30 s).
PRODUCER_QUEUE_MESSAGES = 8000
PARTITIONS = 4
VALUE_BYTES = 1000
PRODUCE_SECONDS = 15


def block_device(path):
    """(major, minor) of the whole disk holding `path`, or None when its file system has
    no block device (tmpfs, overlayfs)."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    sys_dev = Path(f"/sys/dev/block/{major}:{minor}")
    if major == 0 or not sys_dev.exists():
        return None
    if (sys_dev / "partition").exists():
        major, minor = map(int, (sys_dev.resolve().parent / "dev").read_text().split(":"))
    return major, minor


def make_throttled_cgroup(device, write_bps):
    """A new cgroup whose writes to `device` are limited to `write_bps`; returns
    (cgroup dir, how) or skips with the reason."""
    if os.geteuid() != 0:
        pytest.skip("throttling a disk needs root (a cgroup's block I/O limit)")
    name = f"spate-slow-disk-{os.getpid()}"
    major, minor = device
    v2 = Path("/sys/fs/cgroup")
    v1 = Path("/sys/fs/cgroup/blkio")
    try:
        if (v2 / "cgroup.controllers").exists() and "io" in (v2 / "cgroup.controllers").read_text().split():
            # Buffered writes are charged to a cgroup's io limit through its memory
            # controller (cgroup writeback): both are enabled for the child.
            enabled = (v2 / "cgroup.subtree_control").read_text().split()
            for controller in ("memory", "io"):
                if controller not in enabled:
                    (v2 / "cgroup.subtree_control").write_text(f"+{controller}")
            cg = v2 / name
            cg.mkdir(exist_ok=True)
            (cg / "io.max").write_text(f"{major}:{minor} wbps={write_bps}")
            return cg, "cgroup v2 io.max"
        if (v1 / "blkio.throttle.write_bps_device").exists():
            cg = v1 / name
            cg.mkdir(exist_ok=True)
            (cg / "blkio.throttle.write_bps_device").write_text(f"{major}:{minor} {write_bps}")
            return cg, "cgroup v1 blkio.throttle.write_bps_device"
    except OSError as e:
        pytest.skip(f"cannot set up a block I/O throttle on {major}:{minor}: {e}")
    pytest.skip("no block I/O throttle: neither cgroup v2's io controller nor cgroup v1's blkio is mounted")


def remove_cgroup(cg):
    parent_procs = cg.parent / "cgroup.procs"
    for pid in (cg / "cgroup.procs").read_text().split():
        try:
            parent_procs.write_text(pid)
        except OSError:
            pass
    for _ in range(50):
        try:
            cg.rmdir()
            return
        except OSError:
            time.sleep(0.1)


@pytest.fixture
def slow_disk(tmp_path):
    """(data dir on a real block device, the cgroup to run the broker in)."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    device = block_device(data_dir)
    if device is None:
        # /tmp is a tmpfs on some systems: the build directory is on a disk.
        data_dir = REPO_ROOT / "target" / f"slow-disk-{os.getpid()}"
        data_dir.mkdir(parents=True, exist_ok=True)
        device = block_device(data_dir)
    if device is None:
        pytest.skip(f"{data_dir} is on a file system with no block device to throttle")
    cg, how = make_throttled_cgroup(device, DISK_WRITE_BYTES_PER_S)
    yield data_dir, cg, how
    remove_cgroup(cg)
    if not str(data_dir).startswith(str(tmp_path)):
        shutil.rmtree(data_dir, ignore_errors=True)


def test_producers_faster_than_the_disk_are_slowed_and_memory_stays_bounded(broker_factory, slow_disk):
    data_dir, cg, how = slow_disk
    # The broker runs inside the throttled cgroup (its threads inherit it).
    wrap = ["sh", "-c", f'echo $$ > {cg / "cgroup.procs"} && exec "$@"', "sh"]
    broker = broker_factory("--fsync", "always", "--queued-max-request-bytes", str(QUEUED_REQUEST_BYTES_MAX),
                            data_dir=data_dir, wrap=wrap)
    topic = "slow-disk"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    # The idle baseline once every partition's log is open and answering (its
    # watermarks), not a moment after CreateTopics returned.
    c = cf_consumer(broker.bootstrap)
    try:
        for p in range(PARTITIONS):
            assert tuple(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)) == (0, 0)
    finally:
        c.close()
    rss_idle = broker.rss_bytes()

    acked = {}  # value -> (partition, offset)
    failed = []
    lock = threading.Lock()
    waits = [0] * PRODUCERS  # produce() calls refused for a full local queue
    unanswered = [None] * PRODUCERS  # messages still in flight after the final flush
    stop = threading.Event()

    def on_delivery(err, msg):
        with lock:
            if err is None:
                acked[msg.value()] = (msg.partition(), msg.offset())
            elif err.code() != KafkaError._PURGE_QUEUE:
                failed.append(err)

    def produce(i):
        # librdkafka's defaults (timeouts, batching, in-flight requests), but for the
        # local queue: producing faster than it drains shows as BufferError.
        p = Producer({
            "bootstrap.servers": broker.bootstrap,
            "broker.address.family": "v4",
            "acks": "all" if i % 2 else "1",
            "queue.buffering.max.messages": PRODUCER_QUEUE_MESSAGES,
            "logger": RDKAFKA_LOGGER,
        })
        seq = 0
        while not stop.is_set():
            value = f"{i}-{seq}-".encode().ljust(VALUE_BYTES, b"x")
            try:
                p.produce(topic, value=value, on_delivery=on_delivery)
                seq += 1
            except BufferError:
                waits[i] += 1
                p.poll(0.05)
            p.poll(0)
        # What the producer still queues is dropped (never sent, never acked); what is
        # in flight gets its answer.
        p.purge(in_queue=True, in_flight=False)
        unanswered[i] = p.flush(120)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    rss = []
    while time.monotonic() - started < PRODUCE_SECONDS:
        assert broker.alive(), "the broker died under load"
        rss.append(broker.rss_bytes())
        time.sleep(0.25)
    with lock:
        acked_in_window = len(acked)
    stop.set()
    for t in threads:
        t.join(180)
    elapsed = time.monotonic() - started
    assert broker.alive(), "the broker died under load"

    rate = acked_in_window * VALUE_BYTES / PRODUCE_SECONDS
    peak = max(rss)
    print(f"\nthrottle: {how}, {DISK_WRITE_BYTES_PER_S / MiB:.1f} MiB/s; {PRODUCERS} producers;"
          f" acked {acked_in_window} messages in {PRODUCE_SECONDS}s = {rate / MiB:.2f} MiB/s;"
          f" local queue full {sum(waits)} times; RSS idle {rss_idle / MiB:.1f} MiB,"
          f" peak {peak / MiB:.1f} MiB (+{(peak - rss_idle) / MiB:.1f}); total {len(acked)} acked"
          f" after {elapsed:.1f}s")

    assert unanswered == [0] * PRODUCERS, f"in-flight messages never answered: {unanswered}"
    assert not failed, f"produce errors besides purged local queues: {failed[:5]}"
    assert peak - rss_idle <= RSS_GROWTH_BYTES_MAX, (
        f"broker RSS grew by {(peak - rss_idle) / MiB:.1f} MiB under a slow disk"
        f" (bound {RSS_GROWTH_BYTES_MAX / MiB:.0f} MiB)")
    # Slowed to the disk: acks come no faster than fdatasync can cover them (the
    # record bytes, their index entries and the file system's journal all go through
    # the throttle); and not stalled either.
    assert rate <= 1.25 * DISK_WRITE_BYTES_PER_S, f"acked {rate / MiB:.2f} MiB/s through a {DISK_WRITE_BYTES_PER_S / MiB:.0f} MiB/s disk"
    assert rate >= 0.2 * DISK_WRITE_BYTES_PER_S, f"only {rate / MiB:.2f} MiB/s acked: producers starved"
    assert all(waits), f"some producer was never slowed (local queue full counts: {waits})"

    # Every acknowledged message is there, at the offset it was acknowledged with.
    got = cf_consume(broker.bootstrap, topic, PARTITIONS, timeout=120)
    stored = {r.value: (p, r.offset) for p, recs in got.items() for r in recs}
    missing = [v for v, at in acked.items() if stored.get(v) != at]
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages not read back as acked"
