"""ISR replication across three real brokers (embedded coordinator).

- every replica of a replication-factor-3 topic holds the same bytes as its leader;
- acks=all with min.insync.replicas=2: a confluent-kafka producer under load while the
  partition leaders are killed with SIGKILL and restarted, and while one broker is cut
  off (frozen with SIGSTOP: no heartbeats, no fetches, then back with a stale view);
  afterwards every acknowledged message is read back, in order within its partition;
- too few in-sync replicas: acks=all is refused with NOT_ENOUGH_REPLICAS, acks=1 works;
- a restarted replica catches up and rejoins the ISR; leaders are elected only from it.
"""

import hashlib
import os
import re
import signal
import subprocess
import threading
import time

import pytest
from confluent_kafka import Producer

from helpers.broker import SPATE_BIN  # noqa: E402
from helpers.clients import admin, cf_consume, cf_read_partition, create_topic
from test_cluster import SESSION_MS, cluster_args, wait_brokers, wait_for

LAG_MS = 3000
SPATE = str(SPATE_BIN)


def start_cluster(broker_factory, *more):
    extra = ["--replica-lag-time-max-ms", str(LAG_MS), *more]
    b1 = broker_factory(*cluster_args(1), *extra, name="b1", cores=1)
    brokers = {1: b1}
    for i in (2, 3):
        brokers[i] = broker_factory(*cluster_args(i), *extra, "--coordinator", b1.bootstrap, name=f"b{i}", cores=1)
    wait_brokers(b1.bootstrap, {b.port for b in brokers.values()})
    return brokers


def partition_states(bootstrap, topic):
    """{partition: (leader, replicas, isr)} from Metadata."""
    md = admin(bootstrap).list_topics(topic, timeout=10)
    return {p: (t.leader, list(t.replicas), sorted(t.isrs)) for p, t in md.topics[topic].partitions.items()}


def wait_states(bootstrap, topic, predicate, timeout=30, what="condition"):
    return wait_for(lambda: partition_states(bootstrap, topic), predicate, timeout, what)


def full_isr(states):
    return all(l >= 0 and isr == sorted(r) for l, r, isr in states.values())


def preferred_leaders(states):
    return all(l == r[0] for l, r, _ in states.values())


def log_digests(broker, topic, partition):
    d = broker.data_dir / f"{topic}-{partition}"
    h = hashlib.sha256()
    for f in sorted(d.glob("*.log")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def wait_identical_replicas(brokers, topic, partitions, timeout=30, first=0):
    """Wait until partitions first..first+partitions-1 hold the same bytes on `brokers`."""
    deadline = time.monotonic() + timeout
    while True:
        digests = {p: {i: log_digests(b, topic, p) for i, b in brokers.items()} for p in range(first, first + partitions)}
        if all(len(set(d.values())) == 1 for d in digests.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"replicas differ: {digests}")
        time.sleep(0.3)


class LoadProducer:
    """acks=all, idempotent, one request in flight per connection unless `conf` says
    otherwise, explicit partitions (message n goes to partition n mod partitions, its
    value is n); records what was acknowledged and when.

    Idempotent because the checks read acknowledged messages back in order: without it
    librdkafka's in-flight limit is per connection, not per partition, so across a
    leader change a batch retried on the new leader can land after a later one (seen
    once under load: "acknowledged messages out of order"); Kafka promises the order
    only to idempotent producers then."""

    def __init__(self, bootstrap, topic, partitions, **conf):
        self.topic, self.partitions = topic, partitions
        self.p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                           "max.in.flight.requests.per.connection": 1, "linger.ms": 2,
                           "message.timeout.ms": 120000, "retry.backoff.ms": 100,
                           "topic.metadata.refresh.interval.ms": 1000, **conf})
        self.acked = []  # (partition, offset, seq, wall time)
        self.failed = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        seq = 0
        while not self.stop.is_set():
            part = seq % self.partitions

            def cb(err, msg, seq=seq):
                if err is not None:
                    self.failed.append((seq, err.str()))
                else:
                    self.acked.append((msg.partition(), msg.offset(), seq, time.monotonic()))

            try:
                self.p.produce(self.topic, value=str(seq).encode(), partition=part, on_delivery=cb)
                seq += 1
            except BufferError:
                pass
            self.p.poll(0.001 if seq % 50 else 0.01)
        self.p.flush(120)

    def start(self):
        self.thread.start()

    def finish(self):
        self.stop.set()
        self.thread.join(180)

    def acks_for(self, partition):
        return [a for a in self.acked if a[0] == partition]


def check_everything_acked_is_there(bootstrap, topic, partitions, acked):
    got = cf_consume(bootstrap, topic, partitions, timeout=120)
    by_pos = {(r.partition, r.offset): int(r.value) for recs in got.values() for r in recs}
    lost = [(p, o, s) for p, o, s, _ in acked if by_pos.get((p, o)) != s]
    assert not lost, f"{len(lost)} acknowledged messages lost or changed, e.g. {lost[:5]}"
    for p in range(partitions):
        seqs = [s for (pp, o, s, _) in sorted(acked) if pp == p]
        assert seqs == sorted(seqs), f"partition {p}: acknowledged messages out of order"
    return sum(len(v) for v in got.values())


def finish_and_verify(prod, brokers, topic, parts):
    """Stop producing, then: every acknowledged message is read back in order, and every
    replica holds the same bytes. Returns how many records were read."""
    prod.finish()
    assert len(prod.acked) > 1000, len(prod.acked)
    n = check_everything_acked_is_there(brokers[1].bootstrap, topic, parts, prod.acked)
    wait_identical_replicas(brokers, topic, parts)
    return n


def wait_acks_after(prod, partitions, t, timeout=60, what="acknowledgements"):
    """Wait until each of `partitions` has an acknowledgement later than `t`: producing
    to them goes on (instead of sleeping for a while and hoping it did)."""
    deadline = time.monotonic() + timeout
    while True:
        behind = [p for p in partitions if not any(pp == p and at > t for pp, _, _, at in list(prod.acked))]
        if not behind:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: no acknowledgement on partitions {behind} within {timeout} s")
        time.sleep(0.1)


def failover_gap(acked, partitions, t_fault, window_s=60):
    """Longest pause between consecutive acknowledgements on `partitions` that ends after
    `t_fault` (within `window_s`): how long producing to them stalled."""
    worst = 0.0
    for p in partitions:
        times = sorted(t for pp, _, _, t in acked if pp == p)
        for a, b in zip(times, times[1:]):
            if t_fault < b <= t_fault + window_s:
                worst = max(worst, b - a)
    return worst


def test_replicas_hold_the_leaders_bytes(broker_factory):
    brokers = start_cluster(broker_factory)
    b1 = brokers[1]
    create_topic(b1.bootstrap, "copies", 3, config={"min.insync.replicas": "2"}, replication_factor=3)
    states = partition_states(b1.bootstrap, "copies")
    assert all(sorted(r) == [1, 2, 3] and isr == [1, 2, 3] for _, r, isr in states.values()), states
    assert sorted(l for l, _, _ in states.values()) == [1, 2, 3], "leaders spread"
    prod = LoadProducer(brokers[2].bootstrap, "copies", 3)
    prod.start()
    time.sleep(3)
    prod.finish()
    assert not prod.failed, prod.failed[:3]
    assert len(prod.acked) > 1000
    wait_identical_replicas(brokers, "copies", 3)
    n = check_everything_acked_is_there(brokers[3].bootstrap, "copies", 3, prod.acked)
    assert n == len(prod.acked)
    # Every replica's leader-epoch checkpoint starts at epoch 0, offset 0 (Kafka's format).
    for b in brokers.values():
        lines = (b.data_dir / "copies-0" / "leader-epoch-checkpoint").read_text().split("\n")
        assert lines[0] == "0" and lines[2] == "0 0", lines


def test_not_enough_replicas_refuses_acks_all(broker_factory):
    brokers = start_cluster(broker_factory)
    b1 = brokers[1]
    create_topic(b1.bootstrap, "few", 1, config={"min.insync.replicas": "2"}, replication_factor=3)
    for i in (2, 3):
        brokers[i].kill()
    wait_states(b1.bootstrap, "few", lambda s: s[0][2] == [1], timeout=SESSION_MS / 1000 + 10, what="ISR [1]")
    r = subprocess.run([SPATE, "produce", "few", "--bootstrap", b1.bootstrap, "--acks", "all"],
                       input=b"x\n", capture_output=True, timeout=60)
    assert r.returncode == 1 and b"NOT_ENOUGH_REPLICAS" in r.stderr, r
    r = subprocess.run([SPATE, "produce", "few", "--bootstrap", b1.bootstrap, "--acks", "1"],
                       input=b"y\n", capture_output=True, timeout=60)
    assert r.returncode == 0, r
    # The replicas come back, catch up, and rejoin the ISR.
    for i in (2, 3):
        brokers[i].restart()
    wait_states(b1.bootstrap, "few", full_isr, timeout=30, what="full ISR")
    r = subprocess.run([SPATE, "produce", "few", "--bootstrap", b1.bootstrap, "--acks", "all"],
                       input=b"z\n", capture_output=True, timeout=60)
    assert r.returncode == 0, r
    # The refused write is nowhere, the accepted ones are there in order, and every
    # replica holds the same bytes as the leader.
    got = cf_consume(b1.bootstrap, "few", 1, count=2, timeout=60)
    assert [m.value for m in got[0]] == [b"y", b"z"], got
    wait_identical_replicas(brokers, "few", 1)


def kill_leaders_then_freeze(brokers, topic, prod, kills):
    """Under `prod`'s load: `kills` times kill -9 a broker that leads a partition (never
    broker 1, which runs the coordinator) and restart it once its leaderships moved and
    producing to them resumed; then freeze broker 3 (SIGSTOP: no heartbeats, no
    fetches) until it leaves the ISR, and let it come back. The cluster must run with a
    short leader-imbalance check, so each restarted broker gets its preferred
    leaderships back and the next kill has a leader to hit. Returns, per kill, the
    victim and the longest pause in acknowledgements of the partitions it led."""
    b1 = brokers[1]
    gaps = []
    for _ in range(kills):
        states = wait_states(b1.bootstrap, topic, lambda s: full_isr(s) and any(l != 1 for l, _, _ in s.values()),
                             timeout=60, what="full ISR and a leader other than broker 1")
        victim = next(l for _, (l, _, _) in sorted(states.items()) if l != 1)
        led = [p for p, (l, _, _) in states.items() if l == victim]
        assert led, (victim, states)
        t_kill = time.monotonic()
        brokers[victim].kill()
        wait_states(b1.bootstrap, topic, lambda s: all(s[p][0] not in (victim, -1) for p in led),
                    timeout=SESSION_MS / 1000 + 15, what=f"leaders moved off broker {victim}")
        wait_acks_after(prod, led, time.monotonic(), what=f"producing after broker {victim}'s leaderships moved")
        gaps.append((victim, failover_gap(prod.acked, led, t_kill)))
        brokers[victim].restart()
    wait_states(b1.bootstrap, topic, full_isr, timeout=60, what="full ISR")
    frozen = 3
    os.kill(brokers[frozen].pid, signal.SIGSTOP)
    try:
        wait_states(b1.bootstrap, topic, lambda s: all(frozen not in isr for _, _, isr in s.values()),
                    timeout=SESSION_MS / 1000 + 15, what="frozen broker out of the ISR")
        wait_acks_after(prod, range(prod.partitions), time.monotonic(), what="producing with broker 3 cut off")
    finally:
        os.kill(brokers[frozen].pid, signal.SIGCONT)
    wait_states(b1.bootstrap, topic, full_isr, timeout=60, what="full ISR after the cut-off broker returned")
    wait_acks_after(prod, range(prod.partitions), time.monotonic(), what="producing after broker 3 returned")
    return gaps


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_acks_all_survives_leader_kills_and_a_cut_off_broker(broker_factory):
    brokers = start_cluster(broker_factory, "--leader-imbalance-check-interval-ms", "2000")
    b1 = brokers[1]
    topic, parts = "durable", 3
    create_topic(b1.bootstrap, topic, parts, config={"min.insync.replicas": "2"}, replication_factor=3)
    prod = LoadProducer(brokers[1].bootstrap + "," + brokers[2].bootstrap + "," + brokers[3].bootstrap, topic, parts)
    prod.start()
    wait_acks_after(prod, range(parts), 0, what="producing before the first kill")
    gaps = kill_leaders_then_freeze(brokers, topic, prod, kills=3)
    assert len(gaps) == 3, gaps
    n = finish_and_verify(prod, brokers, topic, parts)
    print(f"acks=all under 3 leader kills and a frozen broker: {len(prod.acked)} acknowledged, "
          f"{len(prod.failed)} failed, {n} read back, lost 0; killed leaders and failover gaps (s): "
          f"{', '.join(f'broker {v} {g:.1f}' for v, g in gaps)} (broker.session.timeout.ms={SESSION_MS})")


@pytest.mark.slow
def test_rolling_restart_with_sigterm_fails_no_produce(broker_factory):
    """Controlled shutdown: SIGTERM moves leadership away before the broker exits, so a
    rolling restart under acks=all load costs no failed or lost message; afterwards the
    preferred leaders (first replicas) get their leadership back."""
    brokers = start_cluster(broker_factory, "--leader-imbalance-check-interval-ms", "2000")
    b1 = brokers[1]
    topic, parts = "rolling", 3
    create_topic(b1.bootstrap, topic, parts, config={"min.insync.replicas": "2"}, replication_factor=3)
    prod = LoadProducer(",".join(b.bootstrap for b in brokers.values()), topic, parts)
    prod.start()
    wait_acks_after(prod, range(parts), 0, what="producing before the first restart")
    gaps = []
    for victim in (2, 3):  # broker 1 runs the embedded coordinator
        states = wait_states(b1.bootstrap, topic, lambda s: full_isr(s) and preferred_leaders(s), timeout=60,
                             what="full ISR, preferred leaders")
        led = [p for p, (l, _, _) in states.items() if l == victim]
        assert led, (victim, states)
        t_stop = time.monotonic()
        assert brokers[victim].stop() == 0
        # It exited after the coordinator moved its leaderships (a controlled shutdown),
        # not after its session expired: the broker says so in its log.
        last_run = brokers[victim].log_path.read_text(errors="replace").rsplit("===== start #", 1)[-1]
        assert re.search(r"controlled shutdown: left the cluster.*done=true", last_run), last_run[-3000:]
        moved = wait_states(b1.bootstrap, topic, lambda s: all(s[p][0] not in (victim, -1) for p in led),
                            timeout=SESSION_MS / 1000 + 15, what=f"leaders moved off broker {victim}")
        assert all(victim not in isr for _, _, isr in moved.values()), moved
        wait_acks_after(prod, led, time.monotonic(), what=f"producing after broker {victim} stopped")
        gaps.append(failover_gap(prod.acked, led, t_stop))
        brokers[victim].restart()
    wait_states(b1.bootstrap, topic, full_isr, timeout=60, what="full ISR")
    # Leadership went to the brokers that stayed up; the periodic preferred-leader
    # election gives it back to each partition's first replica.
    wait_states(b1.bootstrap, topic, preferred_leaders, timeout=30, what="preferred leaders back")
    wait_acks_after(prod, range(parts), time.monotonic(), what="producing to the preferred leaders")
    prod.finish()
    assert not prod.failed, prod.failed[:5]
    check_everything_acked_is_there(b1.bootstrap, topic, parts, prod.acked)
    print(f"rolling restart (SIGTERM) under acks=all: {len(prod.acked)} acknowledged, 0 failed, 0 lost; "
          f"longest pause in acks on the moved partitions (s): {', '.join(f'{g * 1000:.0f} ms' for g in gaps)}")


def test_leaders_come_only_from_the_isr_unless_unclean_election_is_enabled(broker_factory):
    brokers = start_cluster(broker_factory)
    b1 = brokers[1]
    brokers[4] = broker_factory(*cluster_args(4), "--replica-lag-time-max-ms", str(LAG_MS), "--coordinator",
                                b1.bootstrap, name="b4", cores=1)
    wait_brokers(b1.bootstrap, {b.port for b in brokers.values()})
    create_topic(b1.bootstrap, "isr-only", 12, replication_factor=2)
    states = partition_states(b1.bootstrap, "isr-only")
    # A partition whose two replicas are not broker 1 (it runs the coordinator).
    p, (leader, replicas, _) = next((p, s) for p, s in sorted(states.items()) if 1 not in s[1])
    other = next(r for r in replicas if r != leader)
    # Another partition `other` replicates, with its other replica on a broker that stays
    # up: `other` rejoining its ISR shows the coordinator has dealt with its return.
    q = next(q for q, (_, r, _) in sorted(states.items()) if other in r and leader not in r)
    # Written to both replicas (acks=all, full ISR): it survives any election.
    wait_states(b1.bootstrap, "isr-only", lambda s: s[p][2] == sorted(replicas), what="full ISR")
    produce_one(b1.bootstrap, "isr-only", p, b"in-sync", "all")
    # The follower dies: out of the ISR; the leader takes writes it never sees.
    brokers[other].kill()
    wait_states(b1.bootstrap, "isr-only", lambda s: s[p][2] == [leader], timeout=SESSION_MS / 1000 + 10,
                what="ISR shrunk to the leader")
    produce_one(b1.bootstrap, "isr-only", p, b"only-on-the-leader", "1")
    # The leader dies too: the last ISR member is kept, the partition is offline, and the
    # out-of-sync replica coming back does not lead it (no unclean election by default).
    brokers[leader].kill()
    wait_states(b1.bootstrap, "isr-only", lambda s: s[p][0] == -1, timeout=SESSION_MS / 1000 + 10, what="offline")
    brokers[other].restart()
    wait_brokers(b1.bootstrap, {brokers[i].port for i in brokers if i != leader})
    seen = wait_states(b1.bootstrap, "isr-only", lambda s: other in s[q][2] or s[p][0] != -1, timeout=60,
                       what=f"broker {other} back in partition {q}'s ISR")
    assert seen[p][0] == -1, f"an out-of-sync replica was elected: {seen[p]}"
    assert partition_states(b1.bootstrap, "isr-only")[p][0] == -1, "an out-of-sync replica was elected"
    # With unclean.leader.election.enable=true on the topic, it is (data loss accepted).
    a = admin(b1.bootstrap)
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    entry = ConfigEntry("unclean.leader.election.enable", "true",
                        incremental_operation=AlterConfigOpType.SET)
    fs = a.incremental_alter_configs([ConfigResource("topic", "isr-only", incremental_configs=[entry])])
    for f in fs.values():
        f.result(20)
    brokers[other].kill()
    brokers[other].restart()
    wait_states(b1.bootstrap, "isr-only", lambda s: s[p][0] == other, timeout=SESSION_MS / 1000 + 15,
                what="unclean leader elected")
    # The new leader takes writes. What is lost is exactly what unclean election allows:
    # the write only the old leader had; the one both replicas had is kept.
    produce_one(b1.bootstrap, "isr-only", p, b"after-unclean", "1")
    assert cf_read_partition(b1.bootstrap, "isr-only", p) == [b"in-sync", b"after-unclean"]
    # The old leader comes back as a follower: it drops its divergent write and holds
    # the new leader's bytes.
    brokers[leader].restart()
    wait_states(b1.bootstrap, "isr-only", lambda s: s[p][0] == other and s[p][2] == sorted(replicas),
                timeout=60, what=f"broker {leader} back in partition {p}'s ISR")
    wait_identical_replicas({i: brokers[i] for i in replicas}, "isr-only", 1, first=p)
    assert cf_read_partition(b1.bootstrap, "isr-only", p) == [b"in-sync", b"after-unclean"]


def produce_one(bootstrap, topic, partition, value, acks):
    r = subprocess.run([SPATE, "produce", topic, "--bootstrap", bootstrap, "--partition", str(partition),
                        "--acks", acks], input=value + b"\n", capture_output=True, timeout=60)
    assert r.returncode == 0, r


# ---- a broker cut off by the network (Linux network namespaces, iproute2) ----

class Netns:
    """Brokers in their own network namespaces on one bridge; the test (and its clients)
    sit in the root namespace on the bridge too. `cut(n)` blackholes, inside broker n's
    namespace, the routes to every other broker: n still runs and still talks to
    clients, but not to its peers or the coordinator."""

    def __init__(self):
        tag = os.getpid() % 10000
        self.bridge = f"spbr{tag}"
        self.tag = tag
        self.names = {}
        self.subnet = "10.77.0"
        self._ip("link", "add", self.bridge, "type", "bridge")
        self._ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")

    @staticmethod
    def _ip(*args, ns=None):
        cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")

    def addr(self, n):
        return f"{self.subnet}.{n}"

    def add(self, n):
        ns, host_if = f"spns{self.tag}-{n}", f"spv{self.tag}{n}"
        self._ip("netns", "add", ns)
        self.names[n] = ns
        self._ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._ip("link", "set", host_if, "master", self.bridge)
        self._ip("link", "set", host_if, "up")
        self._ip("addr", "add", f"{self.addr(n)}/24", "dev", "eth0", ns=ns)
        self._ip("link", "set", "eth0", "up", ns=ns)
        self._ip("link", "set", "lo", "up", ns=ns)
        return ["ip", "netns", "exec", ns]

    def cut(self, n):
        for other in self.names:
            if other != n:
                self._ip("route", "add", "blackhole", f"{self.addr(other)}/32", ns=self.names[n])

    def heal(self, n):
        for other in self.names:
            if other != n:
                self._ip("route", "del", "blackhole", f"{self.addr(other)}/32", ns=self.names[n])

    def close(self):
        for ns in self.names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@pytest.fixture
def netns():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    try:
        net = Netns()
    except (RuntimeError, FileNotFoundError) as e:
        pytest.skip(f"cannot create network namespaces here: {e}")
    try:
        yield net
    finally:
        net.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_acks_all_survives_a_leader_cut_off_from_its_peers(broker_factory, netns):
    extra = ["--replica-lag-time-max-ms", str(LAG_MS)]
    brokers = {}
    for n in (1, 2, 3):
        wrap = netns.add(n)
        args = cluster_args(n) + extra
        if n > 1:
            args += ["--coordinator", f"{netns.addr(1)}:9092"]
        brokers[n] = broker_factory(*args, name=f"b{n}", cores=1, host=netns.addr(n), port=9092, wrap=wrap)
    b1 = brokers[1]
    wait_brokers(b1.bootstrap, {9092})  # every broker listens on 9092 of its own address
    md = admin(b1.bootstrap).list_topics(timeout=10)
    assert sorted(md.brokers) == [1, 2, 3], md.brokers
    topic, parts = "partitioned", 3
    create_topic(b1.bootstrap, topic, parts, config={"min.insync.replicas": "2"}, replication_factor=3)
    states = wait_states(b1.bootstrap, topic, full_isr, timeout=30, what="full ISR")
    victim = next(l for l, _, _ in states.values() if l != 1)
    led = [p for p, (l, _, _) in states.items() if l == victim]
    prod = LoadProducer(",".join(b.bootstrap for b in brokers.values()), topic, parts)
    prod.start()
    time.sleep(2)
    # Cut the victim off its peers while it leads: it keeps running and clients still
    # reach it, but its followers cannot fetch and it cannot reach the coordinator.
    t_cut = time.monotonic()
    netns.cut(victim)
    try:
        wait_states(b1.bootstrap, topic, lambda s: all(s[p][0] not in (victim, -1) for p in led),
                    timeout=SESSION_MS / 1000 + 20, what=f"leaders moved off the cut-off broker {victim}")
        time.sleep(3)  # the producer keeps going against the new leaders (and the stale one)
    finally:
        netns.heal(victim)
    wait_states(b1.bootstrap, topic, full_isr, timeout=60, what="full ISR after healing")
    time.sleep(2)
    n = finish_and_verify(prod, brokers, topic, parts)
    gap = failover_gap(prod.acked, led, t_cut)
    print(f"leader cut off from its peers under acks=all: {len(prod.acked)} acknowledged, "
          f"{len(prod.failed)} failed, {n} read back, lost 0; longest pause in acks {gap:.1f}s "
          f"(broker.session.timeout.ms={SESSION_MS})")
