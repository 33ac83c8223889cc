"""kcat (Debian's kcat 1.7.1 on librdkafka 2.0.2) against the broker."""

import json

import pytest

from helpers.clients import create_topic, kcat

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


def test_kcat_metadata_lists_broker_and_topics(broker):
    create_topic(broker.bootstrap, "kcat-meta-a", 1)
    create_topic(broker.bootstrap, "kcat-meta-b", 3)

    r = kcat(broker.bootstrap, "-L")
    out = r.stdout.decode()
    assert "1 brokers:" in out, out
    assert f"at {broker.bootstrap}" in out, out
    assert 'topic "kcat-meta-a" with 1 partitions' in out, out
    assert 'topic "kcat-meta-b" with 3 partitions' in out, out

    r = kcat(broker.bootstrap, "-L", "-J")
    md = json.loads(r.stdout)
    assert [b["name"] for b in md["brokers"]] == [broker.bootstrap], md
    broker_id = md["brokers"][0]["id"]
    topics = {t["topic"]: t for t in md["topics"]}
    assert {"kcat-meta-a", "kcat-meta-b"} <= set(topics), md
    parts = topics["kcat-meta-b"]["partitions"]
    assert sorted(p["partition"] for p in parts) == [0, 1, 2]
    for p in parts:
        assert p["leader"] == broker_id, p
        assert [r["id"] for r in p["replicas"]] == [broker_id], p
        assert [r["id"] for r in p["isrs"]] == [broker_id], p


def test_kcat_produce_consume_roundtrip(broker):
    create_topic(broker.bootstrap, "kcat-lines", 1)
    lines = [f"line {i} {'x' * (i % 50)} \u00e9\u4e2d" for i in range(500)]
    payload = ("\n".join(lines) + "\n").encode()
    kcat(broker.bootstrap, "-P", "-t", "kcat-lines", "-p", "0", input=payload)

    r = kcat(broker.bootstrap, "-C", "-t", "kcat-lines", "-e", "-o", "beginning", "-q")
    assert r.stdout.decode().splitlines() == lines

    # offsets, partitions and a second produce appended after the first
    kcat(broker.bootstrap, "-P", "-t", "kcat-lines", "-p", "0", input=b"tail-1\ntail-2\n")
    r = kcat(broker.bootstrap, "-C", "-t", "kcat-lines", "-e", "-o", "beginning", "-q",
             "-f", "%p %o %s\\n")
    got = r.stdout.decode().splitlines()
    assert got == [f"0 {i} {v}" for i, v in enumerate(lines + ["tail-1", "tail-2"])]

    # relative / absolute start offsets
    r = kcat(broker.bootstrap, "-C", "-t", "kcat-lines", "-e", "-o", "-2", "-q")
    assert r.stdout.decode().splitlines() == ["tail-1", "tail-2"]
    r = kcat(broker.bootstrap, "-C", "-t", "kcat-lines", "-e", "-o", "498", "-q", "-c", "3")
    assert r.stdout.decode().splitlines() == lines[498:] + ["tail-1"]


def test_kcat_keys_headers_partitions(broker):
    create_topic(broker.bootstrap, "kcat-keyed", 3)
    for p in range(3):
        data = "".join(f"k{p}-{i}:v{p}-{i}\n" for i in range(50)).encode()
        kcat(broker.bootstrap, "-P", "-t", "kcat-keyed", "-p", str(p), "-K", ":",
             "-H", f"part={p}", "-H", "dup=a", "-H", "dup=b", input=data)
    for p in range(3):
        r = kcat(broker.bootstrap, "-C", "-t", "kcat-keyed", "-p", str(p), "-e",
                 "-o", "beginning", "-q", "-f", "%o|%k|%s|%h\\n")
        got = r.stdout.decode().splitlines()
        assert got == [f"{i}|k{p}-{i}|v{p}-{i}|part={p},dup=a,dup=b" for i in range(50)]


@pytest.mark.parametrize("codec", CODECS)
def test_kcat_compression(broker, codec):
    topic = f"kcat-z-{codec}"
    create_topic(broker.bootstrap, topic, 1)
    lines = [f"{codec} {i} " + "abcdefgh" * (i % 30) for i in range(1000)]
    kcat(broker.bootstrap, "-P", "-t", topic, "-z", codec, "-X", "linger.ms=50",
         input=("\n".join(lines) + "\n").encode())
    r = kcat(broker.bootstrap, "-C", "-t", topic, "-e", "-o", "beginning", "-q")
    assert r.stdout.decode().splitlines() == lines


@pytest.mark.broker_args("--auto-create-topics", "true", "--num-partitions", "2")
def test_kcat_auto_create_topic(broker):
    kcat(broker.bootstrap, "-P", "-t", "kcat-auto", "-p", "1", input=b"a\nb\nc\n")
    r = kcat(broker.bootstrap, "-L", "-J", "-t", "kcat-auto")
    md = json.loads(r.stdout)
    t = [t for t in md["topics"] if t["topic"] == "kcat-auto"]
    assert t and len(t[0]["partitions"]) == 2, md
    r = kcat(broker.bootstrap, "-C", "-t", "kcat-auto", "-p", "1", "-e", "-o", "beginning", "-q")
    assert r.stdout.decode().splitlines() == ["a", "b", "c"]
