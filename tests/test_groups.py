"""Consumer groups against the real binary (issue 5, "How it is shown").

Group members run as separate processes (helpers/group_member.py, driven by
group_helpers.Member) so they can be SIGKILLed: no LeaveGroup, no final commit.
Every member commits synchronously after each message it processed and prints what it
consumed and committed; the checks in group_helpers then prove at-least-once delivery
with duplicates only from the uncommitted window.
"""

import collections
import time

import pytest
from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException, TopicPartition
from confluent_kafka import ConsumerGroupTopicPartitions

from group_helpers import Member, check_uncommitted_window, dump_events, check_balanced, check_delivery, wait_until
from helpers.broker import BrokerDied
from helpers.clients import admin, cf_consumer, cf_produce, create_topic, kp_common

# Fast groups: a short initial rebalance delay and a low minimum session timeout.
GROUP_ARGS = ("--group-initial-rebalance-delay-ms", "300", "--group-min-session-timeout-ms", "1000")
SESSION_MS = 4000
PARTS = 6


@pytest.fixture
def members(tmp_path):
    """Start members with start(name, **kw); all are SIGKILLed at teardown."""
    started = []

    def start(name, bootstrap, group, topic, **kw):
        m = Member(name, tmp_path / "members", bootstrap, group, topic, **kw)
        started.append(m)
        return m

    start.all = started
    yield start
    for m in started:
        m.cleanup()


def diag(ms):
    return lambda: "\n".join(m.describe() for m in ms)


def produce_per_partition(bootstrap, topic, n_per_partition, tag, partitions=PARTS):
    recs = [{"partition": p, "key": f"{tag}-{p}".encode(), "value": f"{tag}-{p}-{i}".encode()}
            for i in range(n_per_partition) for p in range(partitions)]
    out = collections.defaultdict(set)
    for r in cf_produce(bootstrap, topic, recs):
        out[r.partition].add(r.offset)
    return out


def merge(*produced):
    out = collections.defaultdict(set)
    for d in produced:
        for p, offs in d.items():
            out[p] |= offs
    return out


def all_consumed(ms, produced):
    got = collections.defaultdict(set)
    for m in ms:
        for p, o, _ in m.consumed():
            got[p].add(o)
    return all(offs <= got[p] for p, offs in produced.items())


def balanced(ms, partitions=PARTS, sizes=None):
    a = [m.assignment for m in ms]
    if any(x is None for x in a):
        return False
    try:
        check_balanced(a, partitions)
    except AssertionError:
        return False
    return sizes is None or sorted(len(x) for x in a) == sorted(sizes)


def group_kill_member_scenario(b, members, topic, group, client, assignor=None, extra=(),
                               before_close=None):
    """Three members on a 6-partition topic: two partitions each.  SIGKILL one; after
    the session timeout the other two own all six; everything is consumed at least
    once; duplicates only from the uncommitted window."""
    create_topic(b.bootstrap, topic, PARTS)
    first = produce_per_partition(b.bootstrap, topic, 100, "a")
    ms = [members(f"m{i}", b.bootstrap, group, topic, client=client, assignor=assignor,
                  session_timeout_ms=SESSION_MS, delay_ms=15, extra=extra) for i in range(3)]
    wait_until(lambda: balanced(ms, sizes=[2, 2, 2]), 40,
               "three members with two partitions each", diag=diag(ms))
    # Let every member get going, so the victim dies with work in flight.
    wait_until(lambda: all(len(m.consumed()) >= 10 for m in ms), 30,
               "every member consumed something", diag=diag(ms))
    victim, survivors = ms[0], ms[1:]
    victim_parts = victim.assignment
    victim.kill()
    t_kill = time.time()
    second = produce_per_partition(b.bootstrap, topic, 30, "b")
    produced = merge(first, second)
    wait_until(lambda: balanced(survivors, sizes=[3, 3]), SESSION_MS / 1000 + 30,
               f"the two survivors owning all partitions (victim had {victim_parts})",
               diag=diag(ms))
    wait_until(lambda: all_consumed(ms, produced), 60, "every produced message consumed",
               diag=diag(ms))
    dump_events(ms, b.workdir.parent / "member-events.jsonl")
    dups = check_delivery(ms, produced)
    # Checked last (by the caller), so that the other checks run too.
    try:
        check_uncommitted_window(ms, victim, dups)
        window_error = None
    except AssertionError as e:
        window_error = str(e)
    # The victim's partitions were taken over, after the kill.
    for p in victim_parts:
        assert any(pp == p and t > t_kill for m in survivors for pp, _, t in m.consumed()), \
            f"nobody consumed partition {p} of the killed member after the kill"
    if before_close:
        before_close()
    for m in survivors:
        m.close()
    print("duplicates per partition:", {p: len(v) for p, v in dups.items()})
    return window_error


# ------------------------------------------------------------------------ 1

@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_confluent_group_assignors_and_member_kill(broker_factory, members, assignor):
    b = broker_factory(*GROUP_ARGS)
    window_error = group_kill_member_scenario(b, members, f"cg-{assignor}", f"grp-{assignor}",
                                              "confluent", assignor)
    assert window_error is None, window_error


# KIP-848: the broker's session timeout for consumer-protocol members.
CONSUMER_PROTOCOL_ARGS = ("--group-consumer-session-timeout-ms", str(SESSION_MS),
                          "--group-consumer-heartbeat-interval-ms", "500")


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_confluent_consumer_protocol_member_kill(broker_factory, members, assignor):
    """librdkafka with group.protocol=consumer (KIP-848) and each server-side assignor:
    three members, one SIGKILLed; the broker removes it after its session and the two
    others take its partitions (incremental reconciliation); at-least-once delivery with
    duplicates only from the uncommitted window."""
    from helpers.broker import free_port
    from helpers.metrics import scrape
    mport = free_port()
    b = broker_factory(*GROUP_ARGS, *CONSUMER_PROTOCOL_ARGS, "--metrics-listen", f"127.0.0.1:{mport}")
    group = f"grp848-{assignor}"

    def described():
        # Listed and described as a consumer group (ListGroups v5, ConsumerGroupDescribe)
        # while the two survivors hold three partitions each.
        a = admin(b.bootstrap)
        listed = {g.group_id: g for g in a.list_consumer_groups().result(timeout=30).valid}
        assert group in listed, listed
        d = a.describe_consumer_groups([group])[group].result(timeout=30)
        assert d.partition_assignor == assignor, vars(d)
        assert d.state == ConsumerGroupState.STABLE, vars(d)
        assert sorted(len(m.assignment.topic_partitions) for m in d.members) == [3, 3], vars(d)
        # /metrics shows the consumer group's own state.
        line = f'spate_group_members{{group="{group}",state="Stable"}} 2'
        assert line in scrape(mport).splitlines(), [x for x in scrape(mport).splitlines() if group in x]

    window_error = group_kill_member_scenario(b, members, f"cgp-{assignor}", group, "confluent", assignor,
                                              extra=("--group-protocol", "consumer"), before_close=described)
    assert window_error is None, window_error


# ------------------------------------------------------------------------ 2

def test_kafka_python_group_member_kill(broker_factory, members):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    b = broker_factory(*GROUP_ARGS)
    topic, group = "kp-topic", "kp-group"
    window_error = group_kill_member_scenario(b, members, topic, group, "kafka-python")
    # Commits stick: the group's committed offsets are the partitions' ends.
    c = KafkaConsumer(**kp_common(b.bootstrap), group_id=group, enable_auto_commit=False)
    try:
        tps = [KTP(topic, p) for p in range(PARTS)]
        ends = c.end_offsets(tps)
        committed = {tp.partition: c.committed(tp) for tp in tps}
        assert committed == {tp.partition: ends[tp] for tp in tps}
    finally:
        c.close()
    assert window_error is None, window_error


# ------------------------------------------------------------------------ 3

def restart_broker(b, same_port, timeout=5):
    """b.restart() after a kill -9.  On a new port unless `same_port` (a member that
    lives through the crash needs the old address).  Restarting on the same port is
    retried for a few seconds (the killed broker's io_uring rings, and the sockets they
    hold, are torn down asynchronously); if it still fails the test fails: server-side
    TIME_WAIT sockets of the killed broker's connections must not block the new bind
    (a bug once, see tests/test_restart.py)."""
    if not same_port:
        return b.restart(new_port=True)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return b.restart()
        except BrokerDied as e:
            if "Address already in use" not in str(e):
                raise
            if time.monotonic() > deadline:
                pytest.fail("restart on the same port failed with EADDRINUSE for "
                            f"{timeout}s (listener bug, see test_restart.py)")
            time.sleep(0.25)


def cf_committed(bootstrap, group, topic, partitions=PARTS):
    c = cf_consumer(bootstrap, **{"group.id": group})
    try:
        res = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=20)
        return {tp.partition: tp.offset for tp in res}
    finally:
        c.close()


@pytest.mark.parametrize("member_exit", ["killed", "closed", "alive"])
def test_committed_offsets_survive_broker_kill(broker_factory, members, member_exit):
    """kill -9 the broker while the group has committed offsets and its member was
    SIGKILLed, closed (LeaveGroup: the group is Empty), or is still running.  After a
    restart on the same data dir committed() returns the same offsets and the group's
    consumer resumes exactly there (no re-read)."""
    b = broker_factory(*GROUP_ARGS)
    topic, group = "crash-topic", "crash-group"
    create_topic(b.bootstrap, topic, PARTS)
    # Uneven per-partition counts so offsets can't match by accident.
    recs = [{"partition": p, "value": f"a-{p}-{i}".encode()}
            for p in range(PARTS) for i in range(10 + 7 * p)]
    first = collections.defaultdict(set)
    for r in cf_produce(b.bootstrap, topic, recs):
        first[r.partition].add(r.offset)
    ends = {p: max(v) + 1 for p, v in first.items()}
    m = members("m0", b.bootstrap, group, topic, session_timeout_ms=SESSION_MS)
    wait_until(lambda: {(p, c) for p, c, _ in m.commits()} >= set(ends.items()), 40,
               "the member committed the end of every partition", diag=diag([m]))
    before = cf_committed(b.bootstrap, group, topic)
    assert before == ends
    a = admin(b.bootstrap)
    if member_exit == "killed":
        m.kill()
    elif member_exit == "closed":
        m.close()
        g = a.describe_consumer_groups([group], request_timeout=15)[group].result(20)
        assert (g.state, len(g.members)) == (ConsumerGroupState.EMPTY, 0)
    b.kill()
    restart_broker(b, same_port=(member_exit == "alive"))
    after = cf_committed(b.bootstrap, group, topic)
    assert after == before, "committed offsets changed across a broker kill -9"
    if member_exit == "closed":
        # The member had left and the group was Empty before the crash: so it must be
        # after the restart (no member resurrected from the log).
        a2 = admin(b.bootstrap)  # keep a reference: the future needs the client alive
        g = a2.describe_consumer_groups([group], request_timeout=15)[group].result(20)
        assert (g.state, [x.member_id for x in g.members]) == (ConsumerGroupState.EMPTY, []), \
            (f"group {group} was Empty (its only member left) before the broker was killed;"
             f" after the restart it is {g.state} with members {[x.member_id for x in g.members]}")
    n_before = len(m.consumed())
    second = collections.defaultdict(set)
    for r in cf_produce(b.bootstrap, topic, [{"partition": p, "value": f"b-{p}-{i}".encode()}
                                             for p in range(PARTS) for i in range(5)]):
        second[r.partition].add(r.offset)
    m2 = m if member_exit == "alive" else members("m1", b.bootstrap, group, topic,
                                                  session_timeout_ms=SESSION_MS)
    # A SIGKILLed member restored from the log must first time out (one session).
    wait_until(lambda: all_consumed([m2], second), SESSION_MS / 1000 + 40,
               "the group's consumer consumed the new messages", diag=diag([m2]))
    got = collections.defaultdict(list)
    for p, o, _ in m2.consumed()[n_before if m2 is m else 0:]:
        got[p].append(o)
    for p in range(PARTS):
        assert got[p][0] == before[p], \
            f"partition {p}: resumed at {got[p][0]}, committed was {before[p]}"
        assert min(got[p]) >= before[p], f"partition {p}: re-read {sorted(got[p])[:5]}..."
    m2.close()
    assert cf_committed(b.bootstrap, group, topic) == {p: max(v) + 1 for p, v in second.items()}


# ------------------------------------------------------------------------ 4

NO_REBALANCE_WAIT_S = 5.0


def group_state(a, group):
    """(state, number of members) as the broker describes the group."""
    g = a.describe_consumer_groups([group], request_timeout=15)[group].result(20)
    return g.state, len(g.members)


def settled(a, group, ms, n_members):
    """The broker says Stable with n_members, and every member's last callback assigned
    what it owns now."""
    for m in ms:
        cbs = m.callbacks()
        if not cbs or cbs[-1]["ev"] != "assign" or tuple(cbs[-1]["parts"]) != m.assignment:
            return False
    return group_state(a, group) == (ConsumerGroupState.STABLE, n_members)


@pytest.mark.parametrize("how", ["kill", "close"])
def test_static_member_restart_without_rebalance(broker_factory, members, how):
    """Static members (group.instance.id): one stops (SIGKILL, or close(), which for a
    static librdkafka member sends no LeaveGroup) and comes back with the same instance
    id within the session timeout; it gets its partitions back and the others see no
    rebalance.  Done for every member in turn, so the leader is restarted too."""
    b = broker_factory(*GROUP_ARGS)
    topic, group = f"static-topic-{how}", f"static-group-{how}"
    session_ms = 10000
    create_topic(b.bootstrap, topic, PARTS)
    produce_per_partition(b.bootstrap, topic, 5, "a")
    ids = ["inst-a", "inst-b", "inst-c"]
    cur = {i: members(f"{i}-0", b.bootstrap, group, topic, assignor="range", instance_id=i,
                      session_timeout_ms=session_ms) for i in ids}
    wait_until(lambda: balanced(list(cur.values()), sizes=[2, 2, 2]), 40,
               "three static members with two partitions each", diag=diag(cur.values()))
    # The initial rebalances are over: the broker says Stable with the three members, and
    # each member's last callback assigned what it owns (no callback is still to come).
    a = admin(b.bootstrap)
    wait_until(lambda: settled(a, group, list(cur.values()), 3), 30,
               "the initial rebalances settled", diag=diag(cur.values()))
    produced = produce_per_partition(b.bootstrap, topic, 5, "x")  # noqa: F841
    for round_, inst in enumerate(ids):
        old = cur[inst]
        parts = old.assignment
        others = [m for i, m in cur.items() if i != inst]
        cb_before = {m.name: len(m.callbacks()) for m in others}
        t0 = time.monotonic()
        if how == "kill":
            old.kill()
        else:
            old.close()
        new = members(f"{inst}-{round_ + 1}", b.bootstrap, group, topic, assignor="range",
                      instance_id=inst, session_timeout_ms=session_ms)
        cur[inst] = new
        wait_until(lambda: new.assignment, 30, f"restarted {inst} gets an assignment",
                   diag=diag(cur.values()))
        elapsed = time.monotonic() - t0
        assert elapsed < session_ms / 1000, \
            f"{inst} took {elapsed:.1f}s to come back: not within the session timeout"
        assert new.assignment == parts, \
            f"{inst} had {parts} before the restart and {new.assignment} after"
        # Had the rejoin started a rebalance, the broker would say so now (it leaves
        # Stable before any other member hears of it, at its next heartbeat).
        state = group_state(a, group)
        assert state == (ConsumerGroupState.STABLE, 3), \
            f"restart of {inst}: group is {state} after the static member rejoined\n{diag(cur.values())()}"
        # And no member heard of one: a rebalance reaches them at their next heartbeat
        # (every 500 ms). Proving that something does NOT happen takes time: this wait
        # is deliberate, ten heartbeat intervals.
        time.sleep(NO_REBALANCE_WAIT_S)
        for m in others:
            assert len(m.callbacks()) == cb_before[m.name], \
                (f"restart of {inst}: {m.name} saw rebalance callbacks "
                 f"{m.callbacks()[cb_before[m.name]:]}\n{diag(cur.values())()}")
            assert m.alive()
        assert balanced(list(cur.values()), sizes=[2, 2, 2]), diag(cur.values())()
        # The restarted member only ever saw its old partitions assigned.
        assert [e["parts"] for e in new.evs("assign")] == [list(parts)], new.describe()


# ------------------------------------------------------------------------ 5

def test_admin_group_operations(broker_factory, members):
    b = broker_factory(*GROUP_ARGS)
    topic = "admin-topic"
    create_topic(b.bootstrap, topic, PARTS)
    produce_per_partition(b.bootstrap, topic, 3, "a")
    a = admin(b.bootstrap)
    m = members("m0", b.bootstrap, "live-group", topic, session_timeout_ms=SESSION_MS)
    wait_until(lambda: m.assignment == tuple(range(PARTS)), 30, "member owns all partitions",
               diag=diag([m]))
    wait_until(lambda: {(p, c) for p, c, _ in m.commits()} >= {(p, 3) for p in range(PARTS)}, 30,
               "member committed everything", diag=diag([m]))

    # An empty group with offsets (a "simple" consumer committing without joining).
    c = cf_consumer(b.bootstrap, **{"group.id": "empty-group"})
    try:
        c.commit(offsets=[TopicPartition(topic, p, 1 + p) for p in range(PARTS)],
                 asynchronous=False)
    finally:
        c.close()

    # ListGroups
    listed = a.list_consumer_groups(request_timeout=15).result(20)
    by_id = {g.group_id: g for g in listed.valid}
    assert not listed.errors, listed.errors
    assert {"live-group", "empty-group"} <= set(by_id), list(by_id)
    assert by_id["live-group"].state == ConsumerGroupState.STABLE, by_id["live-group"].state
    assert by_id["empty-group"].state == ConsumerGroupState.EMPTY, by_id["empty-group"].state
    assert not by_id["live-group"].is_simple_consumer_group

    # ListGroups with a states filter
    stable = a.list_consumer_groups(request_timeout=15,
                                    states={ConsumerGroupState.STABLE}).result(20)
    assert [g.group_id for g in stable.valid] == ["live-group"], stable.valid

    # DescribeGroups
    d = a.describe_consumer_groups(["live-group", "empty-group"], request_timeout=15)
    live = d["live-group"].result(20)
    assert live.state == ConsumerGroupState.STABLE
    assert live.partition_assignor == "range", live.partition_assignor
    assert len(live.members) == 1
    mem = live.members[0]
    assert mem.client_id == "live-group-m0", mem.client_id
    assert sorted(tp.partition for tp in mem.assignment.topic_partitions) == list(range(PARTS))
    assert {tp.topic for tp in mem.assignment.topic_partitions} == {topic}
    empty = d["empty-group"].result(20)
    assert empty.state == ConsumerGroupState.EMPTY and not empty.members

    # OffsetFetch through the admin API
    r = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions("live-group")],
                                      request_timeout=15)
    offs = r["live-group"].result(20)
    assert {(tp.topic, tp.partition, tp.offset) for tp in offs.topic_partitions} == \
        {(topic, p, 3) for p in range(PARTS)}
    r = a.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("empty-group", [TopicPartition(topic, 2)])],
        request_timeout=15)
    offs = r["empty-group"].result(20)
    assert [(tp.partition, tp.offset) for tp in offs.topic_partitions] == [(2, 3)]

    # DeleteGroups: a group with a member can't go, an empty one can.
    res = a.delete_consumer_groups(["live-group"], request_timeout=15)
    with pytest.raises(KafkaException) as ei:
        res["live-group"].result(20)
    assert ei.value.args[0].code() == KafkaError.NON_EMPTY_GROUP, ei.value
    res = a.delete_consumer_groups(["empty-group"], request_timeout=15)
    res["empty-group"].result(20)
    listed = a.list_consumer_groups(request_timeout=15).result(20)
    assert "empty-group" not in {g.group_id for g in listed.valid}
    assert cf_committed(b.bootstrap, "empty-group", topic) == {p: -1001 for p in range(PARTS)}
    # Deleting an unknown group fails with GROUP_ID_NOT_FOUND.
    res = a.delete_consumer_groups(["no-such-group"], request_timeout=15)
    with pytest.raises(KafkaException) as ei:
        res["no-such-group"].result(20)
    assert ei.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND, ei.value

    # The live group, once its member left, becomes Empty and can be deleted.
    m.close()
    wait_until(lambda: a.describe_consumer_groups(["live-group"], request_timeout=15)
               ["live-group"].result(20).state == ConsumerGroupState.EMPTY, 20,
               "live-group empty after its member closed")
    a.delete_consumer_groups(["live-group"], request_timeout=15)["live-group"].result(20)
    assert cf_committed(b.bootstrap, "live-group", topic) == {p: -1001 for p in range(PARTS)}


def test_fsync_always_sync_group_and_static_rejoin_wait_for_the_group_record(broker_factory):
    """SyncGroup answers once the group's metadata record, written when the leader brings
    the assignment, is stored: on the offsets partition's in-sync replicas and, under
    `--fsync always`, fsynced (each group-commit round slowed by 2 s here), as Kafka
    answers after its store. It was answered at once (appended with acks=1, not
    awaited), so a crash could bring back an older generation whose number the next
    rebalance hands out again. So is a static member's JoinGroup that replaces its old
    member id in a stable group (else the old id, a zombie's, could come back). After
    kill -9 and a restart the new member id and its generation hold, and the old id is
    fenced."""
    from kafka.protocol.consumer.group import (HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
                                               JoinGroupResponse, SyncGroupRequest, SyncGroupResponse)
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
    from helpers.wire import kp_call

    delay_s, group, instance = 2.0, "stored-group", "m1"
    b = broker_factory("--fsync", "always", "--test-fsync-delay-ms", str(int(delay_s * 1000)), *GROUP_ARGS,
                       cores=1)

    def coordinator_found():
        req = FindCoordinatorRequest(version=3, key=group, key_type=0)
        return kp_call(b.port, req, FindCoordinatorResponse, 3).error_code == 0
    wait_until(coordinator_found, 60, f"a coordinator for {group}")

    P = JoinGroupRequest.JoinGroupRequestProtocol
    join = JoinGroupRequest(version=5, group_id=group, session_timeout_ms=60_000, rebalance_timeout_ms=10_000,
                            member_id="", group_instance_id=instance, protocol_type="consumer",
                            protocols=[P(name="range", metadata=b"")])
    joined = kp_call(b.port, join, JoinGroupResponse, 5)
    assert joined.error_code == 0, joined
    member, generation = joined.member_id, joined.generation_id
    A = SyncGroupRequest.SyncGroupRequestAssignment
    sync = SyncGroupRequest(version=3, group_id=group, generation_id=generation, member_id=member,
                            group_instance_id=instance, assignments=[A(member_id=member, assignment=b"mine")])
    t0 = time.monotonic()
    synced = kp_call(b.port, sync, SyncGroupResponse, 3)
    took = time.monotonic() - t0
    assert synced.error_code == 0 and synced.assignment == b"mine", synced
    assert took >= delay_s, f"SyncGroup answered in {took:.3f} s, before the {delay_s} s fsync"

    # The same instance back under a new member id: no rebalance, its old id fenced.
    t0 = time.monotonic()
    rejoined = kp_call(b.port, join, JoinGroupResponse, 5)
    took = time.monotonic() - t0
    assert rejoined.error_code == 0 and rejoined.generation_id == generation, rejoined
    assert rejoined.member_id != member, rejoined
    assert took >= delay_s, f"the static rejoin answered in {took:.3f} s, before the {delay_s} s fsync"

    b.kill()
    b.restart()

    def heartbeat(member_id):
        req = HeartbeatRequest(version=3, group_id=group, generation_id=generation, member_id=member_id,
                               group_instance_id=instance)
        answers = []

        def answered():
            try:
                answers.append(kp_call(b.port, req, HeartbeatResponse, 3, timeout=10).error_code)
            except OSError:
                return False
            return answers[-1] not in (14, 15, 16)  # loading, not available, not coordinator
        wait_until(answered, 60, "the reloaded group to answer a heartbeat")
        return answers[-1]
    assert heartbeat(rejoined.member_id) == 0, f"the new member id in generation {generation} after kill -9"
    assert heartbeat(member) == 82, "the replaced member id is not fenced (FENCED_INSTANCE_ID) after kill -9"


@pytest.mark.broker_args(*GROUP_ARGS)
def test_a_static_leader_back_in_a_stable_group_skips_the_assignment(broker):
    """JoinGroup v9 (KIP-814): a static member that leads, back under a new member id in
    a stable group, is told it leads (with the members, whose subscriptions it watches)
    and to skip the assignment; its empty SyncGroup keeps every member's assignment. A v8
    leader gets no such flag (the field is new in v9) and runs the assignment itself."""
    from kafka.protocol.consumer.group import (JoinGroupRequest, JoinGroupResponse, SyncGroupRequest,
                                               SyncGroupResponse)
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
    from helpers.wire import kp_call

    group = "kip814-group"
    wait_until(lambda: kp_call(broker.port, FindCoordinatorRequest(version=3, key=group, key_type=0),
                               FindCoordinatorResponse, 3).error_code == 0, 60, f"a coordinator for {group}")
    P = JoinGroupRequest.JoinGroupRequestProtocol
    A = SyncGroupRequest.SyncGroupRequestAssignment

    def join(version):
        req = JoinGroupRequest(version=version, group_id=group, session_timeout_ms=60_000,
                               rebalance_timeout_ms=10_000, member_id="", group_instance_id="i1",
                               protocol_type="consumer", protocols=[P(name="range", metadata=b"sub")], reason=None)
        resp = kp_call(broker.port, req, JoinGroupResponse, version)
        assert resp.error_code == 0, resp
        return resp

    def sync(joined, assignments):
        req = SyncGroupRequest(version=5, group_id=group, generation_id=joined.generation_id,
                               member_id=joined.member_id, group_instance_id="i1", protocol_type="consumer",
                               protocol_name="range", assignments=[A(member_id=m, assignment=a) for m, a in assignments])
        resp = kp_call(broker.port, req, SyncGroupResponse, 5)
        assert resp.error_code == 0, resp
        return resp.assignment

    first = join(9)
    assert (first.leader, first.skip_assignment) == (first.member_id, False), first
    assert sync(first, [(first.member_id, b"mine")]) == b"mine"
    back = join(9)
    assert back.member_id != first.member_id and back.generation_id == first.generation_id, back
    assert (back.leader, back.skip_assignment) == (back.member_id, True), back
    assert [m.member_id for m in back.members] == [back.member_id], back
    assert sync(back, []) == b"mine", "the assignment kept"
    old = join(8)
    assert old.leader == old.member_id and len(old.members) == 1, old
