"""A broker that begins to lead a `__consumer_offsets` partition loads its groups from
the log off the data core: meanwhile the partition's group requests are answered
COORDINATOR_LOAD_IN_PROGRESS (which clients retry), and the shard serves everything else.

`--test-group-load-delay-ms` makes each read of the load sleep on the blocking pool, as a
slow disk or a large partition would."""

import struct
import time

from confluent_kafka import Consumer, TopicPartition

from helpers.clients import cf_conf, cf_produce, create_topic
from helpers.wire import connect, frame, recv_frame, request_header_v1

OFFSET_FETCH = 9
LIST_GROUPS = 16
NONE = 0
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
LOAD_DELAY_MS = 4000


def _string(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def offset_fetch_v3(group, topic, partition, correlation_id):
    body = _string(group) + struct.pack(">i", 1) + _string(topic) + struct.pack(">ii", 1, partition)
    return frame(request_header_v1(OFFSET_FETCH, 3, correlation_id) + body)


def parse_offset_fetch_v3(resp):
    """(top-level error code, [(partition, committed offset, error code)])."""
    pos = 4 + 4  # correlation id, throttle time
    (ntopics,) = struct.unpack_from(">i", resp, pos)
    pos += 4
    parts = []
    for _ in range(ntopics):
        (n,) = struct.unpack_from(">h", resp, pos)
        pos += 2 + n
        (nparts,) = struct.unpack_from(">i", resp, pos)
        pos += 4
        for _ in range(nparts):
            partition, offset, mlen = struct.unpack_from(">iqh", resp, pos)
            pos += 14 + max(mlen, 0)
            (code,) = struct.unpack_from(">h", resp, pos)
            pos += 2
            parts.append((partition, offset, code))
    (top,) = struct.unpack_from(">h", resp, pos)
    return top, parts


def fetch_committed(port, group, topic, correlation_id):
    s = connect(port)
    try:
        s.sendall(offset_fetch_v3(group, topic, 0, correlation_id))
        return parse_offset_fetch_v3(recv_frame(s, timeout=30))
    finally:
        s.close()


def list_groups(port, correlation_id):
    """ListGroups v0: (error code, [group ids])."""
    s = connect(port)
    try:
        s.sendall(frame(request_header_v1(LIST_GROUPS, 0, correlation_id)))
        resp = recv_frame(s, timeout=30)
    finally:
        s.close()
    (code, count) = struct.unpack_from(">hi", resp, 4)
    pos, groups = 10, []
    for _ in range(count):
        (n,) = struct.unpack_from(">h", resp, pos)
        groups.append(resp[pos + 2:pos + 2 + n].decode())
        pos += 2 + n
        (n,) = struct.unpack_from(">h", resp, pos)
        pos += 2 + n
    return code, groups


def group_reads(bootstrap, group, topic, count, timeout=60, subscribe=True, commit=False):
    """Offsets and values of the first `count` records a consumer of `group` (at its
    defaults but for the earliest reset) reads of `topic`; optionally commits them."""
    conf = {"group.id": group, "auto.offset.reset": "earliest"}
    if commit:
        conf["enable.auto.commit"] = False
    c = Consumer(cf_conf(bootstrap, **conf))
    got = []
    try:
        if subscribe:
            c.subscribe([topic])
        else:
            c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append((m.offset(), m.value()))
        assert len(got) == count, f"read {got}, want {count} records"
        if commit:
            c.commit(asynchronous=False)
    finally:
        c.close()
    return got


def test_groups_load_off_the_core_with_load_in_progress_meanwhile(broker_factory):
    b = broker_factory("--test-group-load-delay-ms", str(LOAD_DELAY_MS))
    topic, group = "loaded", "g-load"
    create_topic(b.bootstrap, topic, 1)
    cf_produce(b.bootstrap, topic, [{"value": f"v{i}".encode()} for i in range(10)])
    group_reads(b.bootstrap, group, topic, 10, subscribe=False, commit=True)
    assert fetch_committed(b.port, group, topic, 1) == (NONE, [(0, 10, NONE)])

    # A restart loads the group's partition again, slowly.
    b.restart()
    codes = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        top, parts = fetch_committed(b.port, group, topic, 2 + len(codes))
        codes.append(top)
        if top == COORDINATOR_LOAD_IN_PROGRESS:
            break
        assert top == COORDINATOR_NOT_AVAILABLE, f"before the load: {top} {parts}"
        time.sleep(0.05)
    assert codes[-1] == COORDINATOR_LOAD_IN_PROGRESS, f"never saw the load in progress: {codes}"

    # The groups cannot all be listed meanwhile: as Kafka, LOAD_IN_PROGRESS and none.
    assert list_groups(b.port, 50) == (COORDINATOR_LOAD_IN_PROGRESS, [])

    # The data core is not held by the load: a produce is answered while the load still
    # goes on (the group is still loading after the produce's answer).
    cf_produce(b.bootstrap, topic, [{"value": b"during the load"}])
    top, _ = fetch_committed(b.port, group, topic, 100)
    assert top == COORDINATOR_LOAD_IN_PROGRESS, f"the load ended before the produce was answered: {top}"

    # Then the committed offset, as it was.
    deadline = time.monotonic() + 30
    while True:
        top, parts = fetch_committed(b.port, group, topic, 101)
        if top != COORDINATOR_LOAD_IN_PROGRESS:
            break
        assert time.monotonic() < deadline, "the load never ended"
        time.sleep(0.2)
    assert (top, parts) == (NONE, [(0, 10, NONE)])
    assert list_groups(b.port, 102) == (NONE, [group])

    # A consumer at its defaults resumes at the committed offset (a client retries
    # LOAD_IN_PROGRESS; this one came after the load, so it simply reads on).
    assert group_reads(b.bootstrap, group, topic, 1) == [(10, b"during the load")]


def test_a_consumer_at_its_defaults_rides_through_the_load(broker_factory):
    """A consumer at its defaults that joins right after the load was seen under way
    (4 s of it left) resumes at the committed offset: its client retries whatever
    LOAD_IN_PROGRESS answers it gets."""
    b = broker_factory("--test-group-load-delay-ms", str(LOAD_DELAY_MS))
    topic, group = "loaded2", "g-load2"
    create_topic(b.bootstrap, topic, 1)
    cf_produce(b.bootstrap, topic, [{"value": f"v{i}".encode()} for i in range(5)])
    assert [o for o, _ in group_reads(b.bootstrap, group, topic, 5, commit=True)] == [0, 1, 2, 3, 4]
    b.restart()
    # Wait until the load is under way, then join.
    deadline = time.monotonic() + 30
    while fetch_committed(b.port, group, topic, 7)[0] != COORDINATOR_LOAD_IN_PROGRESS:
        assert time.monotonic() < deadline, "never saw the load in progress"
        time.sleep(0.05)
    cf_produce(b.bootstrap, topic, [{"value": b"after"}])
    assert group_reads(b.bootstrap, group, topic, 1) == [(5, b"after")], "resumed elsewhere than the committed offset"


def test_a_slow_load_does_not_hold_back_fsync_acks(broker_factory):
    """Each shard's blocking work runs on a pool of its own threads, so a slow read of a
    group load does not hold back the fsync round that acks wait for under
    `--fsync always` (with one thread per shard, the round queued behind the load's 4 s
    read and the produce was answered only after the load had ended). The produce
    writes to eight partitions, on every shard."""
    b = broker_factory("--test-group-load-delay-ms", str(LOAD_DELAY_MS), "--fsync", "always")
    topic, group = "loaded3", "g-load3"
    create_topic(b.bootstrap, topic, 8)
    cf_produce(b.bootstrap, topic, [{"value": b"v", "partition": 0}])
    group_reads(b.bootstrap, group, topic, 1, subscribe=False, commit=True)
    b.restart()
    deadline = time.monotonic() + 30
    while fetch_committed(b.port, group, topic, 7)[0] != COORDINATOR_LOAD_IN_PROGRESS:
        assert time.monotonic() < deadline, "never saw the load in progress"
        time.sleep(0.05)
    cf_produce(b.bootstrap, topic, [{"value": b"fsynced", "partition": p} for p in range(8)])
    top, _ = fetch_committed(b.port, group, topic, 8)
    assert top == COORDINATOR_LOAD_IN_PROGRESS, f"the fsync acks waited for the load to end: {top}"
