"""Segment files open on demand and close when idle (issue 52): a broker's file
descriptors follow the partitions in use, not every partition it hosts. Here the
segment files' budget is 8 (`--test-segment-files-budget`; the broker derives it from
the open-files limit otherwise) for a topic of 40 partitions: every produce round opens
files the shards' sweeps close again, and every record still reads back, before and
after a restart."""

import os
import time

from helpers.clients import cf_consume, cf_produce, create_topic

BUDGET = 8
PARTITIONS = 40


def segment_files_open(broker):
    """The broker's descriptors on `.log` files under its data dir."""
    data = str(broker.data_dir.resolve())
    fd_dir = f"/proc/{broker.pid}/fd"
    held = 0
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue  # closed meanwhile
        held += target.startswith(data) and target.endswith(".log")
    return held


def wait_for(cond, timeout):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def test_idle_segment_files_close_and_every_record_reads_back(broker_factory):
    b = broker_factory("--test-segment-files-budget", str(BUDGET))
    create_topic(b.bootstrap, "fds", PARTITIONS)
    sent = {p: [] for p in range(PARTITIONS)}
    for round_ in range(3):
        records = [{"value": b"r%d-p%d" % (round_, p), "partition": p} for p in range(PARTITIONS)]
        cf_produce(b.bootstrap, "fds", records)
        for r in records:
            sent[r["partition"]].append(r["value"])
        assert segment_files_open(b) > BUDGET, "the round's appends opened the files"
        # Sweeps once a second: a file not used since the last one closes.
        wait_for(lambda: segment_files_open(b) <= BUDGET * 3 // 4, timeout=15)
    got = cf_consume(b.bootstrap, "fds", PARTITIONS, count=3 * PARTITIONS)
    assert {p: [r.value for r in recs] for p, recs in got.items()} == sent
    b.restart()
    got = cf_consume(b.bootstrap, "fds", PARTITIONS, count=3 * PARTITIONS)
    assert {p: [r.value for r in recs] for p, recs in got.items()} == sent
    assert b.alive()
