"""--cores 2: partitions spread over two shards, connections spread by SO_REUSEPORT;
every partition must work from every connection. Shards are pinned to a CPU each unless
--pin-shards false."""

import os
import threading

import pytest

from helpers.clients import (cf_consume, cf_produce, create_topic, kp_consume, kp_produce,
                             topic_metadata)

PARTITIONS = 8


@pytest.mark.broker_args("--cores", "2")
def test_two_cores_all_partitions(broker):
    topic = "multicore"
    create_topic(broker.bootstrap, topic, PARTITIONS)

    # Fresh connections land on either shard: each must see the full, same metadata.
    for _ in range(10):
        md = topic_metadata(broker.bootstrap)
        assert topic in md and sorted(md[topic]) == list(range(PARTITIONS)), md.get(topic)
        assert len(set(md[topic].values())) == 1 and -1 not in md[topic].values()

    # Several producers (each with its own connections) write to every partition at once.
    results, errors = {}, []

    def run(i):
        try:
            recs = [{"key": b"p%d" % i, "value": b"producer-%d-msg-%d" % (i, j),
                     "partition": j % PARTITIONS} for j in range(400)]
            if i == 3:
                results[i] = kp_produce(broker.bootstrap, topic, recs)
            else:
                results[i] = cf_produce(broker.bootstrap, topic, recs,
                                        **{"compression.type": ["none", "lz4", "zstd"][i % 3]})
        except Exception as e:  # noqa: BLE001
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(results) == 4

    expected = {p: {} for p in range(PARTITIONS)}
    for i, reps in results.items():
        for r in reps:
            assert r.offset not in expected[r.partition], f"offset {r.offset} acked twice"
            assert r.value.startswith(b"producer-%d-" % i)
            expected[r.partition][r.offset] = r.value
    for p in range(PARTITIONS):
        assert sorted(expected[p]) == list(range(200)), f"partition {p} offsets not dense"

    # Read everything back from separate clients.
    for consume in (cf_consume, kp_consume):
        got = consume(broker.bootstrap, topic, PARTITIONS, 4 * 400)
        for p in range(PARTITIONS):
            assert {m.offset: m.value for m in got[p]} == expected[p], f"partition {p}"
            # per producer, order within the partition is the send order
            for i in range(4):
                seq = [int(m.value.rsplit(b"-", 1)[1]) for m in got[p]
                       if m.value.startswith(b"producer-%d-" % i)]
                assert seq == sorted(seq) and len(seq) == 50, (p, i, seq)


@pytest.mark.broker_args("--cores", "2")
def test_two_cores_topic_created_on_one_connection_used_on_others(broker):
    # create several topics in a row, each immediately used by fresh clients
    for n in range(4):
        topic = f"fresh-{n}"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        cf_produce(broker.bootstrap, topic,
                   [{"value": b"%d" % p, "partition": p} for p in range(PARTITIONS)])
        got = cf_consume(broker.bootstrap, topic, PARTITIONS, PARTITIONS)
        assert {p: [m.value for m in got[p]] for p in got} == {
            p: [b"%d" % p] for p in range(PARTITIONS)}


def cpu_list(text):
    """The CPUs of a /proc cpu list such as "0-2,5"."""
    cpus = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def allowed_cpus(pid, tid):
    for line in open(f"/proc/{pid}/task/{tid}/status"):
        if line.startswith("Cpus_allowed_list:"):
            return cpu_list(line.split(":", 1)[1])
    raise AssertionError(f"no Cpus_allowed_list for thread {tid}")


def shard_threads(pid):
    """{"spate-shard-N": the CPUs its executor thread may run on}, from /proc. glommio
    names a shard's blocking-pool threads as the shard ("spate-shard-N-<executor id>");
    the executor thread is the first of them (the lowest thread id): it starts its pool."""
    by_name = {}
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            if name.startswith("spate-shard-"):
                shard = "-".join(name.split("-")[:3])
                by_name.setdefault(shard, allowed_cpus(pid, tid))
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return by_name


def two_cpus_or_skip():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("pinning two shards needs two CPUs")


def produce_and_read_back(bootstrap, topic):
    create_topic(bootstrap, topic, PARTITIONS)
    cf_produce(bootstrap, topic, [{"value": b"%d" % p, "partition": p} for p in range(PARTITIONS)])
    got = cf_consume(bootstrap, topic, PARTITIONS, PARTITIONS)
    assert {p: [m.value for m in got[p]] for p in got} == {p: [b"%d" % p] for p in range(PARTITIONS)}


@pytest.mark.broker_args("--cores", "2")
def test_two_cores_each_shard_pinned_to_its_own_cpu(broker):
    two_cpus_or_skip()
    shards = shard_threads(broker.pid)
    assert sorted(shards) == ["spate-shard-0", "spate-shard-1"], shards
    assert all(len(cpus) == 1 for cpus in shards.values()), shards
    assert shards["spate-shard-0"] != shards["spate-shard-1"], shards
    produce_and_read_back(broker.bootstrap, "pinned")


@pytest.mark.broker_args("--cores", "2", "--pin-shards", "false")
def test_two_cores_unpinned_shards_may_run_on_every_cpu(broker):
    two_cpus_or_skip()
    process_cpus = allowed_cpus(broker.pid, broker.pid)
    assert len(process_cpus) >= 2
    shards = shard_threads(broker.pid)
    assert sorted(shards) == ["spate-shard-0", "spate-shard-1"], shards
    assert all(cpus == process_cpus for cpus in shards.values()), (process_cpus, shards)
    produce_and_read_back(broker.bootstrap, "unpinned")
