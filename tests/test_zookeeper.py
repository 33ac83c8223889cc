"""Cluster metadata in a real ZooKeeper (`--metadata zookeeper://...`): the broker writes
Kafka's ZooKeeper layout, which a plain ZooKeeper client (kazoo) reads as Kafka's tools
would; the metadata outlives the broker's data dir; a killed broker's ephemeral nodes
go with its session and the next start is a new controller epoch."""

import json
import os
import time

from kazoo.client import KazooClient

from helpers.clients import cf_consume, cf_produce, create_topic, topic_metadata


def zk_client(hosts):
    zk = KazooClient(hosts=hosts, timeout=10)
    zk.start(timeout=15)
    return zk


def read_json(zk, path):
    data, _ = zk.get(path)
    return json.loads(data.decode())


def test_metadata_in_zookeeper_kafka_layout(broker_factory, zookeeper, tmp_path):
    url = f"zookeeper://{zookeeper}/spate"
    b = broker_factory("--metadata", url, "--node-id", "7")
    create_topic(b.bootstrap, "zk-topic", 3, config={"retention.ms": "3600000"})
    cf_produce(b.bootstrap, "zk-topic", [{"value": b"v%d" % i, "partition": i % 3} for i in range(9)])

    zk = zk_client(zookeeper)
    try:
        assert zk.get_children("/spate/brokers/ids") == ["7"]
        broker_doc = read_json(zk, "/spate/brokers/ids/7")
        assert broker_doc["version"] == 5
        assert broker_doc["endpoints"] == [f"PLAINTEXT://{b.bootstrap}"]
        assert (broker_doc["host"], broker_doc["port"]) == ("127.0.0.1", b.port)
        topic_doc = read_json(zk, "/spate/brokers/topics/zk-topic")
        assert topic_doc["partitions"] == {"0": [7], "1": [7], "2": [7]}
        assert topic_doc["version"] == 3 and len(topic_doc["topic_id"]) == 22
        state = read_json(zk, "/spate/brokers/topics/zk-topic/partitions/1/state")
        assert state["leader"] == 7 and state["isr"] == [7] and state["version"] == 1
        assert read_json(zk, "/spate/config/topics/zk-topic") == {"version": 1, "config": {"retention.ms": "3600000"}}
        assert read_json(zk, "/spate/controller")["brokerid"] == 7
        epoch1 = int(zk.get("/spate/controller_epoch")[0])
        assert epoch1 >= 1

        # kill -9: the broker's session (and its ephemeral nodes) end; a new broker on a
        # fresh data dir finds the topics in ZooKeeper, as a new controller epoch.
        b.kill()
        deadline = time.monotonic() + 40
        while zk.exists("/spate/controller") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not zk.exists("/spate/controller"), "ephemeral /controller outlived the killed broker's session"
        assert not zk.exists("/spate/brokers/ids/7")
        b2 = broker_factory("--metadata", url, "--node-id", "7", name="b-new-data-dir")
        md = topic_metadata(b2.bootstrap)
        assert md.get("zk-topic") == {0: 7, 1: 7, 2: 7}, md
        assert int(zk.get("/spate/controller_epoch")[0]) > epoch1
        create_topic(b2.bootstrap, "zk-topic-2", 1)
        assert zk.exists("/spate/brokers/topics/zk-topic-2")
        # Deleting a topic removes its documents.
        from helpers.clients import admin
        a = admin(b2.bootstrap)  # keep the client alive until the future resolves
        fs = a.delete_topics(["zk-topic-2"], operation_timeout=15)
        fs["zk-topic-2"].result(15)
        assert not zk.exists("/spate/brokers/topics/zk-topic-2")
        assert not zk.exists("/spate/config/topics/zk-topic-2")
    finally:
        zk.stop()
