"""Durability modes: `--fsync always` acknowledges only after an fdatasync that many
concurrent appends share (group commit), and topic `flush.messages=1` does the same
per topic. Shown with the broker's own fsync counter and kill -9."""

import threading
import urllib.request

from helpers.broker import free_port
from helpers.clients import cf_consume, cf_produce, create_topic


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def metric_sum(text, prefix):
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


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
    produce_concurrently(b.bootstrap, "dur", producers=4, per_producer=200)
    m = scrape(mport)
    fsyncs = metric_sum(m, "spate_fsyncs_total") - before
    produces = metric_sum(m, 'spate_request_duration_seconds_count{shard="0",api="Produce"}') + metric_sum(
        m, 'spate_request_duration_seconds_count{shard="1",api="Produce"}')
    assert fsyncs >= 1, m
    # Every ack waited for an fsync, but concurrent appends shared them.
    assert fsyncs < produces, f"{fsyncs} fsync rounds for {produces} produce requests"

    b.kill()
    b.restart(new_port=True)
    got = cf_consume(b.bootstrap, "dur", 4, count=800, timeout=60)
    assert sum(len(v) for v in got.values()) == 800


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
