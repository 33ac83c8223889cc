"""One ProduceRequest whose record set for one partition holds 700 batches: more
pieces than one writev may carry (IOV_MAX = 1024; each batch is a patched header plus
its bytes). It used to fail with EINVAL and take the partition offline
(KAFKA_STORAGE_ERROR, "segment roll failed" every second until restart)."""

from helpers import wire
from helpers.clients import cf_consume, cf_produce, create_topic, kcat

BATCHES = 700


def test_one_produce_of_700_batches_for_one_partition(broker):
    topic = "many-batches"
    create_topic(broker.bootstrap, topic, 1)
    values = [b"batch-%04d" % i for i in range(BATCHES)]
    records = b"".join(wire.record_batch([v], timestamp_ms=1_700_000_000_000 + i) for i, v in enumerate(values))
    request = wire.produce_v3(topic, 0, records, acks=1, timeout_ms=30000)
    answer = wire.parse_produce_v3(wire.call(broker.port, request, timeout=30))
    assert answer == (0, 0), f"produce of {BATCHES} batches answered (error, base offset) {answer}"

    # Every record is there, for librdkafka through both clients...
    got = cf_consume(broker.bootstrap, topic, 1, count=BATCHES, timeout=60)
    assert [m.value for m in got[0]] == values
    assert [m.offset for m in got[0]] == list(range(BATCHES))
    out = kcat(broker.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-f", "%s\\n")
    assert out.stdout.decode().split() == [v.decode() for v in values]
    # ... and the partition still takes appends.
    reports = cf_produce(broker.bootstrap, topic, [{"value": b"after", "partition": 0}])
    assert reports[0].offset == BATCHES
    log = broker.log_text()
    assert "goes offline" not in log and "roll failed" not in log, broker.log_tail()
