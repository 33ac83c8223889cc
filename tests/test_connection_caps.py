"""Connection caps against the real binary, with raw sockets: max.connections,
max.connections.per.ip, connections.max.idle.ms, and queued.max.request.bytes (the
bytes that requests being read may hold), measured by the broker's RSS."""

import socket
import struct
import threading
import time

import pytest

from helpers import wire
from helpers.clients import cf_consume, cf_produce, create_topic

MiB = 1024 * 1024


def admitted(port):
    """A new connection that gets an ApiVersions answer (a socket), or None when the
    broker closes it unanswered."""
    s = wire.connect(port)
    try:
        s.sendall(wire.api_versions_request(correlation_id=7))
        body = wire.recv_frame(s, timeout=5)
        assert struct.unpack(">i", body[:4])[0] == 7
        return s
    except (ConnectionError, OSError):
        s.close()
        return None


def wait_admitted(port, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = admitted(port)
        if s is not None:
            return s
        time.sleep(0.05)
    raise AssertionError(f"no connection admitted within {timeout}s")


def assert_serves(broker, topic):
    create_topic(broker.bootstrap, topic, 1)
    cf_produce(broker.bootstrap, topic, [{"value": b"v%d" % i} for i in range(10)])
    got = cf_consume(broker.bootstrap, topic, 1, count=10, timeout=30)
    assert [m.value for m in got[0]] == [b"v%d" % i for i in range(10)]


@pytest.mark.parametrize("flag", ["--max-connections-per-ip", "--max-connections"])
def test_connections_over_the_cap_are_closed_and_a_freed_place_is_reused(broker_factory, flag):
    cap = 5
    broker = broker_factory(flag, str(cap))
    # The readiness probe's connection may still hold a place for a moment.
    held = [wait_admitted(broker.port)]
    for _ in range(cap - 1):
        s = admitted(broker.port)
        assert s is not None, f"connection {len(held) + 1} of {cap} refused"
        held.append(s)
    for _ in range(3):
        assert admitted(broker.port) is None, f"a connection past {flag} {cap} was served"
    # Every admitted connection still works.
    for s in held:
        s.sendall(wire.api_versions_request(correlation_id=9))
        assert struct.unpack(">i", wire.recv_frame(s)[:4])[0] == 9
    held.pop().close()
    held.append(wait_admitted(broker.port))
    for s in held:
        s.close()
    wait_admitted(broker.port).close()
    assert "refusing a connection" in broker.log_text()


def test_idle_connections_are_closed(broker_factory):
    idle_ms = 1000
    broker = broker_factory("--connections-max-idle-ms", str(idle_ms))
    silent = wire.connect(broker.port, timeout=10)
    partial = wire.connect(broker.port, timeout=10)
    partial.sendall(b"\x00\x00")  # half a length prefix, then nothing
    busy = wire.connect(broker.port, timeout=10)
    started = time.monotonic()
    # `busy` talks every 300 ms for 3 idle periods: it is never idle.
    for i in range(10):
        busy.sendall(wire.api_versions_request(correlation_id=i))
        assert struct.unpack(">i", wire.recv_frame(busy)[:4])[0] == i
        time.sleep(0.3)
    for name, s in (("silent", silent), ("partial", partial)):
        assert wire.outcome_after(s, timeout=10) == "closed", f"{name} connection not closed"
    took = time.monotonic() - started
    assert took >= idle_ms / 1000 * 0.9
    busy.sendall(wire.api_versions_request(correlation_id=99))
    assert struct.unpack(">i", wire.recv_frame(busy)[:4])[0] == 99
    for s in (silent, partial, busy):
        s.close()


RSS_WINDOW_S = 2.0


def rss_mib(broker):
    return broker.rss_bytes() / MiB


def open_frames(port, n, frame_bytes, send):
    """`n` connections that each declare a `frame_bytes` frame and send `send` bytes of
    it (as far as the broker reads), then stall."""
    payload = b"\x00" * send
    conns = []

    def push(s):
        s.settimeout(3)
        try:
            s.sendall(payload)
        except OSError:
            pass  # the broker stopped reading: our send buffer is full

    pushers = []
    for _ in range(n):
        s = wire.connect(port, timeout=5)
        s.sendall(struct.pack(">i", frame_bytes))
        conns.append(s)
        t = threading.Thread(target=push, args=(s,), daemon=True)
        t.start()
        pushers.append(t)
    for t in pushers:
        t.join(30)
    return conns


def rss_peak_mib(broker, window_s=RSS_WINDOW_S):
    """The largest RSS seen over `window_s`: a bound that must hold while the broker
    works through what it was sent is watched for a while, not read once (this wait is
    deliberate: it shows that something does not happen)."""
    peak = 0.0
    deadline = time.monotonic() + window_s
    while True:
        peak = max(peak, rss_mib(broker))
        if time.monotonic() >= deadline:
            return peak
        time.sleep(0.1)


def test_declared_and_trickled_frames_hold_no_more_than_the_request_byte_cap(broker_factory):
    cap_mib = 128
    broker = broker_factory("--queued-max-request-bytes", str(cap_mib * MiB))
    assert_serves(broker, "before")
    base = rss_mib(broker)
    conns = []
    try:
        # 1. Forty connections declare a 100 MB frame (under socket.request.max.bytes)
        # and send 4 bytes of it; one more trickles a frame a byte at a time.
        conns += open_frames(broker.port, 40, 100_000_000, 4)
        trickle = wire.connect(broker.port, timeout=5)
        trickle.sendall(struct.pack(">i", 100_000_000))
        for _ in range(5):
            trickle.sendall(b"\x00")
            time.sleep(0.2)  # pacing: the trickle is the point
        conns.append(trickle)
        declared = rss_peak_mib(broker)
        print(f"RSS before {base:.0f} MiB; 40 x 100 MB declared + 4 bytes sent, one trickled: {declared:.0f} MiB")
        assert declared - base < 64, f"declared frames pinned {declared - base:.0f} MiB"
        # Small requests still find budget.
        assert_serves(broker, "during-declared")
        for s in conns:
            s.close()
        conns = []

        # 2. Forty connections send 16 MB each of a 20 MB frame (640 MB offered): the
        # broker reads as many frames as the cap covers and no more.
        conns += open_frames(broker.port, 40, 20_000_000, 16 * MiB)
        deadline = time.monotonic() + 30
        while rss_mib(broker) - base <= 32:
            assert time.monotonic() < deadline, "the broker read none of the frames the cap covers in 30 s"
            time.sleep(0.1)
        loaded = rss_peak_mib(broker)
        print(f"RSS with 40 x 16 MB of 20 MB frames sent: {loaded:.0f} MiB (cap {cap_mib} MiB)")
        # The slack: growing bodies' reallocations, and (since `spate serve` keeps freed
        # request memory for the next requests: limits::malloc_reuse_bytes, 32 MiB of
        # trim threshold) heap the frames freed that glibc has not handed back. A run
        # of 2026-12-07 peaked at 198 MiB over the base against the old 64 MiB slack.
        slack_mib = 64 + 32
        assert loaded - base < cap_mib + slack_mib, f"{loaded - base:.0f} MiB held, cap is {cap_mib} MiB"
        assert_serves(broker, "during-loaded")
        assert broker.alive()
    finally:
        for s in conns:
            s.close()
    # The attackers gone, their bytes are given back and the broker serves.
    assert_serves(broker, "after")
    after = rss_mib(broker)
    print(f"RSS after the connections closed: {after:.0f} MiB")
    assert after - base < cap_mib + 64
