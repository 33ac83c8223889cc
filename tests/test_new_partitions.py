"""A new topic's partition logs are created off the data core (issue 15): requests that
reach a partition while its log is being opened are parked and run in arrival order
once it is installed, so a producer that pipelines requests to a topic it has just
created sees its records in the order it sent them (a polling wait once ran them in
whatever order their timers fired)."""

from confluent_kafka import Producer

from helpers.clients import cf_conf, cf_consume, create_topic


def test_pipelined_produce_to_a_just_created_topic_keeps_its_order(broker):
    for round_ in range(8):
        topic = f"fresh-{round_}"
        create_topic(broker.bootstrap, topic, 2, wait=False)
        # One record per request, many requests in flight per partition.
        p = Producer(cf_conf(broker.bootstrap, **{"linger.ms": 0, "batch.num.messages": 1}))
        offsets = {0: [], 1: []}

        def report(err, msg):
            assert err is None, err
            offsets[msg.partition()].append((int(msg.value()), msg.offset()))

        for i in range(100):
            p.produce(topic, b"%d" % i, partition=i % 2, on_delivery=report)
            p.poll(0)
        assert p.flush(30) == 0
        for part, got in offsets.items():
            sent = [v for v, _ in sorted(got, key=lambda vo: vo[1])]
            assert sent == sorted(sent), f"{topic}-{part}: records stored out of send order: {sent}"
            assert [o for _, o in sorted(got, key=lambda vo: vo[1])] == list(range(50))
        stored = cf_consume(broker.bootstrap, topic, 2, count=100, timeout=30)
        for part, recs in stored.items():
            assert [int(r.value) for r in recs] == list(range(part, 100, 2))
