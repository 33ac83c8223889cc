"""acks=all when the followers stop: REQUEST_TIMED_OUT and
NOT_ENOUGH_REPLICAS_AFTER_APPEND, with raw Produce v3 requests (clients retry both
codes and would hide them).

Three brokers, a partition with replication factor 3 and min.insync.replicas=2 led by
broker 1 (which also runs the coordinator, so the ISR can shrink while the others are
frozen). Both followers are frozen with SIGSTOP; they are still in the ISR until
replica.lag.time.max.ms passes. Then, at once:
- acks=all with a 1 s request timeout is accepted (the ISR is full) but no follower
  fetches it: REQUEST_TIMED_OUT, after the timeout and not before;
- acks=all with a long timeout waits until the leader drops the frozen followers from
  the ISR; the high watermark then covers the batch with an ISR of 1 < 2:
  NOT_ENOUGH_REPLICAS_AFTER_APPEND, not before the lag time;
- both batches were appended: a consumer reads them back from the leader;
- a new acks=all produce is refused before the append: NOT_ENOUGH_REPLICAS.
"""

import os
import signal
import threading
import time

from helpers.broker import threads_stopped
from helpers.clients import cf_read_partition, create_topic
from helpers.wire import call, parse_produce_v3, produce_v3, record_batch
from test_cluster import start_embedded_cluster, wait_for
from test_replication import partition_states

NONE = 0
REQUEST_TIMED_OUT = 7
NOT_ENOUGH_REPLICAS = 19
NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20

LAG_MS = 8000  # long enough to send both requests while the ISR is still full
SESSION_MS = 120_000  # the frozen brokers are not fenced during the test
SHORT_TIMEOUT_MS = 1000


def cluster(broker_factory):
    """Brokers 1, 2 and 3 by id; followers stay in the ISR for the whole test."""
    brokers = start_embedded_cluster(broker_factory, session_ms=SESSION_MS,
                                     extra=["--replica-lag-time-max-ms", str(LAG_MS)])
    return dict(zip((1, 2, 3), brokers))


def produce(broker, part, value, timeout_ms, results, key):
    t0 = time.monotonic()
    resp = call(broker.port, produce_v3("acks", part, record_batch([value]), acks=-1, timeout_ms=timeout_ms),
                timeout=timeout_ms / 1000 + 60)
    results[key] = (parse_produce_v3(resp), time.monotonic() - t0)


def test_acks_all_times_out_then_fails_after_append_when_followers_freeze(broker_factory):
    brokers = cluster(broker_factory)
    b1 = brokers[1]
    create_topic(b1.bootstrap, "acks", 3, config={"min.insync.replicas": "2"}, replication_factor=3)
    states = wait_for(lambda: partition_states(b1.bootstrap, "acks"),
                      lambda s: all(isr == [1, 2, 3] for _, _, isr in s.values()) and
                      any(leader == 1 for leader, _, _ in s.values()), 30, "a partition led by 1, full ISR")
    part = next(p for p, (leader, _, _) in states.items() if leader == 1)
    # The ISR works: acks=all is answered at once.
    results = {}
    produce(b1, part, b"before", 30_000, results, "before")
    assert results["before"][0] == (NONE, 0), results

    for i in (2, 3):
        os.kill(brokers[i].pid, signal.SIGSTOP)
    try:
        wait_for(lambda: [threads_stopped(brokers[i].pid) for i in (2, 3)], all, 30, "followers stopped")
        t_freeze = time.monotonic()
        slow = threading.Thread(target=produce, args=(b1, part, b"after-append", 120_000, results, "long"))
        slow.start()
        produce(b1, part, b"timed-out", SHORT_TIMEOUT_MS, results, "short")
        (code, _), elapsed = results["short"]
        assert code == REQUEST_TIMED_OUT, results["short"]
        assert elapsed >= SHORT_TIMEOUT_MS / 1000 * 0.9, f"answered after {elapsed:.2f}s, before the timeout"
        assert time.monotonic() - t_freeze < LAG_MS / 1000, "too slow: the ISR may have shrunk already"

        slow.join(120 + 60)
        (code, _), _ = results["long"]
        assert code == NOT_ENOUGH_REPLICAS_AFTER_APPEND, results["long"]
        assert time.monotonic() - t_freeze >= LAG_MS / 1000 * 0.9, "answered before the followers could lag"
        assert partition_states(b1.bootstrap, "acks")[part][2] == [1]

        # Both batches are in the log, below the high watermark.
        got = cf_read_partition(b1.bootstrap, "acks", part)
        assert got[0] == b"before" and sorted(got[1:]) == [b"after-append", b"timed-out"], got
        # Now too few in-sync replicas: refused before the append.
        produce(b1, part, b"refused", 30_000, results, "refused")
        assert results["refused"][0][0] == NOT_ENOUGH_REPLICAS, results["refused"]
        assert len(cf_read_partition(b1.bootstrap, "acks", part)) == 3
    finally:
        for i in (2, 3):
            os.kill(brokers[i].pid, signal.SIGCONT)
