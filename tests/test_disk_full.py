"""A full disk degrades, it does not stop (issue 16). On a 64 MiB tmpfs with 16 MiB kept
free (--disk-free-min-bytes): produce fills it until the broker refuses, retriably
(KAFKA_STORAGE_ERROR), while Metadata, Fetch and consumer-group commits still work; the
broker restarts on the disk once something else filled it to the last byte (the
metadata reserve is released); deleting a topic frees space and a producer that kept
retrying gets its record delivered without help."""

import os
import shutil
import signal
import subprocess
import time

import pytest
from confluent_kafka import KafkaError, Producer

from helpers.clients import admin, cf_conf, cf_consume, cf_consumer, cf_produce, create_topic, wait_for_topic_gone

# Serial (scripts/test runs it alone, after the parallel part): it fills tmpfs file systems of its own and waits on the free-space floor.
pytestmark = [pytest.mark.serial, pytest.mark.timeout(300)]

THRESHOLD_BYTES = 16 * 1024 * 1024
VALUE = b"v" * 10_000


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB tmpfs (root only), unmounted at teardown (after the broker is killed:
    this fixture is set up before broker_factory)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 64 MiB tmpfs needs root")
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    yield d
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


def free_bytes(path):
    return shutil.disk_usage(path).free


def produce_batch(bootstrap, topic, n):
    """n records, no retries: the delivery error codes (None for delivered)."""
    p = Producer(cf_conf(bootstrap, **{"acks": 1, "retries": 0, "linger.ms": 5, "enable.idempotence": False,
                                       "message.timeout.ms": 20000}))
    codes = []
    for i in range(n):
        p.produce(topic, VALUE, partition=i % 2, on_delivery=lambda err, _m: codes.append(err and err.code()))
        p.poll(0)
    assert p.flush(30) == 0
    return codes


def fill_until_refused(bootstrap, data_dir):
    for _ in range(60):
        codes = produce_batch(bootstrap, "fill", 200)
        refused = [c for c in codes if c is not None]
        if refused:
            assert set(refused) == {KafkaError.KAFKA_STORAGE_ERROR}, refused
            return
    raise AssertionError(f"produce never refused; {free_bytes(data_dir)} bytes free")


def fill_disk(path):
    """Fill the file system to the last byte with a file of its own."""
    fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)


def check_serves(broker, keep_values):
    md = admin(broker.bootstrap).list_topics(timeout=10)
    assert "keep" in md.topics and "fill" in md.topics
    got = cf_consume(broker.bootstrap, "keep", 1, count=len(keep_values), timeout=30)
    assert [r.value for r in got[0]] == keep_values


def test_full_disk_refuses_produce_and_recovers(small_disk, broker_factory):
    data = small_disk / "data"
    broker = broker_factory("--disk-free-min-bytes", str(THRESHOLD_BYTES), "--disk-free-min-percent", "0",
                            data_dir=data)
    create_topic(broker.bootstrap, "keep", 1)
    create_topic(broker.bootstrap, "fill", 2, config={"segment.bytes": str(1 << 20)})
    keep_values = [b"keep-%d" % i for i in range(10)]
    cf_produce(broker.bootstrap, "keep", [{"value": v} for v in keep_values])

    # Fill with produce until the broker refuses; the threshold is kept (give or take
    # the batches in flight when the estimate crossed it).
    fill_until_refused(broker.bootstrap, small_disk)
    free = free_bytes(small_disk)
    print(f"\nrefused with {free} bytes free (threshold {THRESHOLD_BYTES})")
    assert free > THRESHOLD_BYTES // 2, free
    # Metadata, Fetch and a consumer group's offset commit still work.
    check_serves(broker, keep_values)
    c = cf_consumer(broker.bootstrap, **{"group.id": "full-disk", "session.timeout.ms": 6000})
    c.subscribe(["keep"])
    deadline = time.monotonic() + 30
    while True:
        m = c.poll(0.5)
        if m is not None and not m.error():
            break
        assert time.monotonic() < deadline, "group consumer got nothing"
    c.commit(message=m, asynchronous=False)
    c.close()

    # Something else takes the rest of the disk; the broker restarts all the same.
    assert broker.stop(signal.SIGTERM, timeout=30) == 0
    fill_disk(small_disk)
    print(f"disk filled: {free_bytes(small_disk)} bytes free")
    broker.start()
    check_serves(broker, keep_values)
    assert set(c for c in produce_batch(broker.bootstrap, "fill", 4)) == {KafkaError.KAFKA_STORAGE_ERROR}

    # A producer that retries (the clients' default) waits; deleting a topic frees
    # space, the broker notices within its check interval, and the record goes through.
    p = Producer(cf_conf(broker.bootstrap, **{"acks": 1, "linger.ms": 5, "message.timeout.ms": 60000,
                                              "retry.backoff.ms": 200}))
    delivered = []
    p.produce("keep", b"after", on_delivery=lambda err, _m: delivered.append(err))
    p.poll(2)
    assert not delivered, f"produced on a full disk: {delivered}"
    a = admin(broker.bootstrap)
    fs = a.delete_topics(["fill"], operation_timeout=30)
    fs["fill"].result(30)
    wait_for_topic_gone(broker.bootstrap, "fill")
    t0 = time.monotonic()
    assert p.flush(60) == 0
    print(f"space freed: {free_bytes(small_disk)} bytes free; produce resumed"
          f" {time.monotonic() - t0:.1f} s after the deletion")
    assert delivered == [None], delivered
    got = cf_consume(broker.bootstrap, "keep", 1, count=len(keep_values) + 1, timeout=30)
    assert [r.value for r in got[0]] == keep_values + [b"after"]


def isr_of(bootstrap, topic):
    md = admin(bootstrap).list_topics(topic, timeout=10)
    return {p.id: sorted(p.isrs) for p in md.topics[topic].partitions.values()}


def test_follower_below_the_floor_stops_fetching_and_catches_up_later(small_disk, broker_factory, tmp_path):
    """Broker 1 (plenty of disk) leads; broker 2, whose data dir is the small tmpfs,
    follows. Produced past broker 2's floor, broker 2 stops fetching (it falls out of the
    ISR) instead of filling its disk and taking its logs offline; once space is freed it
    fetches again and rejoins the ISR."""
    lag = ["--replica-lag-time-max-ms", "3000", "--broker-heartbeat-interval-ms", "300"]
    b1 = broker_factory("--node-id", "1", *lag, name="b1", cores=1)
    b2 = broker_factory("--node-id", "2", *lag, "--coordinator", b1.bootstrap,
                        "--disk-free-min-bytes", str(THRESHOLD_BYTES), "--disk-free-min-percent", "0",
                        name="b2", cores=1, data_dir=small_disk / "data")
    deadline = time.monotonic() + 20
    while len(admin(b1.bootstrap).list_topics(timeout=10).brokers) < 2:
        assert time.monotonic() < deadline, "broker 2 did not join"
        time.sleep(0.2)
    create_topic(b1.bootstrap, "rep", 4, replication_factor=2, config={"segment.bytes": str(1 << 20)})
    md = admin(b1.bootstrap).list_topics("rep", timeout=10)
    led_by_1 = sorted(p.id for p in md.topics["rep"].partitions.values() if p.leader == 1)
    assert led_by_1, "no partition led by broker 1"

    # 60 MB through broker 1: more than broker 2's 64 MiB disk minus its 16 MiB floor.
    p = Producer(cf_conf(b1.bootstrap, **{"linger.ms": 5}))
    for i in range(6000):
        p.produce("rep", VALUE, partition=led_by_1[i % len(led_by_1)])
        p.poll(0)
    assert p.flush(60) == 0
    deadline = time.monotonic() + 30
    while "replica fetch paused: disk below the free-space floor" not in b2.log_text():
        assert time.monotonic() < deadline, f"broker 2 never paused fetching; {free_bytes(small_disk)} free"
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    while any(isr_of(b1.bootstrap, "rep")[q] != [1] for q in led_by_1):
        assert time.monotonic() < deadline, f"broker 2 stayed in the ISR: {isr_of(b1.bootstrap, 'rep')}"
        time.sleep(0.3)
    free = free_bytes(small_disk)
    print(f"\nbroker 2 paused with {free} bytes free (floor {THRESHOLD_BYTES}); ISR {isr_of(b1.bootstrap, 'rep')}")
    assert free > THRESHOLD_BYTES // 2, free
    assert b2.alive
    text = b2.log_text()
    assert "No space left" not in text and "partition log goes offline" not in text, b2.log_tail()

    # Space freed on broker 2 (what an operator or retention would do): it fetches
    # again and every partition is back to both replicas.
    a = admin(b1.bootstrap)
    fs = a.delete_topics(["rep"], operation_timeout=30)
    fs["rep"].result(30)
    wait_for_topic_gone(b1.bootstrap, "rep")
    create_topic(b1.bootstrap, "after", 2, replication_factor=2, config={"min.insync.replicas": "2"})
    cf_produce(b1.bootstrap, "after", [{"value": b"a%d" % i, "partition": i % 2} for i in range(20)])
    deadline = time.monotonic() + 30
    while any(isr != [1, 2] for isr in isr_of(b1.bootstrap, "after").values()):
        assert time.monotonic() < deadline, f"ISR not back: {isr_of(b1.bootstrap, 'after')}"
        time.sleep(0.3)
    got = cf_consume(b2.bootstrap, "after", 2, count=20, timeout=30)
    assert sorted(r.value for part in got.values() for r in part) == sorted(b"a%d" % i for i in range(20))
