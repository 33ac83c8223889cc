"""Transactional offset commits (TxnOffsetCommit, KIP-98 / KIP-447) against the real
broker, driven on the wire with kafka-python's protocol classes (no transactional client
is needed: the transaction coordinator's part is played by the test).

- KIP-447 fencing: a commit carrying a stale generation, a fenced static member or an
  unknown member is refused, and nothing is committed.
- Visibility: the offsets are pending until the producer's marker lands in the group's
  `__consumer_offsets` partition (written here with WriteTxnMarkers, as the transaction
  coordinator does); a read_committed consumer's OffsetFetch (require_stable) is answered
  UNSTABLE_OFFSET_COMMIT meanwhile; COMMIT publishes them, ABORT drops them; a restart
  reloads them as they were (still pending when their transaction is open).
"""

import pytest

from kafka.protocol.consumer.group import (
    JoinGroupRequest,
    JoinGroupResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.producer.transaction import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)

from group_helpers import wait_until
from helpers.clients import create_topic
from helpers.wire import api_versions_request, connect, kp_call, parse_api_versions_v0, recv_frame
from helpers.kafka_hash import java_hash_partition

NONE = 0
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
FENCED_INSTANCE_ID = 82
UNKNOWN_TOPIC_OR_PARTITION = 3
UNSTABLE_OFFSET_COMMIT = 88
INVALID_PRODUCER_EPOCH = 47
TXN_OFFSET_COMMIT = 28

GROUP = "txn-group"
TOPIC = "txn-in"
GROUP_ARGS = ("--group-initial-rebalance-delay-ms", "100")


def call(port, req, resp_cls, version, timeout=30):
    return kp_call(port, req, resp_cls, version, timeout, client_id="spate-txn-offsets")


def coordinator_ready(port):
    """FindCoordinator for GROUP until it answers (the first one creates
    `__consumer_offsets`, whose partitions then open and load)."""
    def found():
        resp = call(port, FindCoordinatorRequest(version=3, key=GROUP, key_type=0), FindCoordinatorResponse, 3)
        return resp.error_code == NONE
    wait_until(found, 60, f"a coordinator for {GROUP}")


def join_static(port, instance):
    """A static member of GROUP joins and syncs (it leads): (member id, generation)."""
    P = JoinGroupRequest.JoinGroupRequestProtocol
    req = JoinGroupRequest(
        version=5, group_id=GROUP, session_timeout_ms=120_000, rebalance_timeout_ms=10_000,
        member_id="", group_instance_id=instance, protocol_type="consumer",
        protocols=[P(name="range", metadata=b"")])
    joined = call(port, req, JoinGroupResponse, 5)
    assert joined.error_code == NONE, joined
    A = SyncGroupRequest.SyncGroupRequestAssignment
    req = SyncGroupRequest(
        version=3, group_id=GROUP, generation_id=joined.generation_id, member_id=joined.member_id,
        group_instance_id=instance, assignments=[A(member_id=joined.member_id, assignment=b"")])
    synced = call(port, req, SyncGroupResponse, 3)
    assert synced.error_code == NONE, synced
    return joined.member_id, joined.generation_id


def txn_commit(port, producer, offsets, member="", instance=None, generation=-1, version=3):
    """TxnOffsetCommit of {(topic, partition): offset}: {(topic, partition): error code}."""
    T = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    P = T.TxnOffsetCommitRequestPartition
    topics = {}
    for (t, p), o in offsets.items():
        topics.setdefault(t, []).append(
            P(partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=""))
    req = TxnOffsetCommitRequest(
        version=version, transactional_id="txn-offsets", group_id=GROUP,
        producer_id=producer[0], producer_epoch=producer[1], generation_id=generation,
        member_id=member, group_instance_id=instance,
        topics=[T(name=t, partitions=ps) for t, ps in topics.items()])
    resp = call(port, req, TxnOffsetCommitResponse, version)
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


def fetch(port, partitions, require_stable):
    """OffsetFetch v7 of GROUP: {(topic, partition): (offset, error code)}."""
    T = OffsetFetchRequest.OffsetFetchRequestTopic
    by_topic = {}
    for t, p in partitions:
        by_topic.setdefault(t, []).append(p)
    req = OffsetFetchRequest(
        version=7, group_id=GROUP, require_stable=require_stable,
        topics=[T(name=t, partition_indexes=ps) for t, ps in by_topic.items()])
    resp = call(port, req, OffsetFetchResponse, 7)
    assert resp.error_code == NONE, resp
    return fetched(resp)


def fetched(resp):
    return {(t.name, p.partition_index): (p.committed_offset, p.error_code) for t in resp.topics for p in t.partitions}


def fetch_v8(port, partitions, require_stable):
    """OffsetFetch v8 (groups batched) of GROUP: {(topic, partition): (offset, error code)}."""
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    T = G.OffsetFetchRequestTopics
    by_topic = {}
    for t, p in partitions:
        by_topic.setdefault(t, []).append(p)
    req = OffsetFetchRequest(
        version=8, require_stable=require_stable,
        groups=[G(group_id=GROUP, topics=[T(name=t, partition_indexes=ps) for t, ps in by_topic.items()])])
    resp = call(port, req, OffsetFetchResponse, 8)
    (group,) = resp.groups
    assert group.error_code == NONE, resp
    return {(t.name, p.partition_index): (p.committed_offset, p.error_code) for t in group.topics for p in t.partitions}


def init_producer_id(port):
    req = InitProducerIdRequest(version=4, transactional_id=None, transaction_timeout_ms=60_000,
                                producer_id=-1, producer_epoch=-1)
    resp = call(port, req, InitProducerIdResponse, 4)
    assert resp.error_code == NONE, resp
    return resp.producer_id, resp.producer_epoch


def write_marker(port, producer, commit):
    """WriteTxnMarkers v1 for GROUP's offsets partition, as the transaction coordinator
    sends it: the error code."""
    M = WriteTxnMarkersRequest.WritableTxnMarker
    T = M.WritableTxnMarkerTopic
    req = WriteTxnMarkersRequest(version=1, markers=[M(
        producer_id=producer[0], producer_epoch=producer[1], transaction_result=commit,
        topics=[T(name="__consumer_offsets", partition_indexes=[java_hash_partition(GROUP)])],
        coordinator_epoch=0)])
    resp = call(port, req, WriteTxnMarkersResponse, 1)
    codes = [p.error_code for m in resp.markers for t in m.topics for p in t.partitions]
    assert len(codes) == 1, resp
    return codes[0]


@pytest.mark.broker_args(*GROUP_ARGS)
def test_txn_offset_commit_fences_zombies(broker):
    s = connect(broker.port)
    s.sendall(api_versions_request())
    _, _, apis = parse_api_versions_v0(recv_frame(s))
    s.close()
    assert apis.get(TXN_OFFSET_COMMIT) == (0, 6), apis.get(TXN_OFFSET_COMMIT)

    create_topic(broker.bootstrap, TOPIC, partitions=2)
    coordinator_ready(broker.port)
    zombie = (1000, 0)  # never appended: every request below is refused before that
    tp0 = (TOPIC, 0)
    assert txn_commit(broker.port, zombie, {tp0: 5}, member="m", generation=1) == {tp0: ILLEGAL_GENERATION}, \
        "a generation for a group that does not exist"

    member, generation = join_static(broker.port, "i1")
    cases = [
        (dict(member=member, instance="i1", generation=generation + 1), ILLEGAL_GENERATION),
        (dict(member=member, instance="i1", generation=generation - 1), ILLEGAL_GENERATION),
        (dict(member=member + "-old", instance="i1", generation=generation), FENCED_INSTANCE_ID),
        (dict(member="nobody", generation=generation), UNKNOWN_MEMBER_ID),
    ]
    for kw, code in cases:
        got = txn_commit(broker.port, zombie, {tp0: 5, (TOPIC, 1): 6}, **kw)
        assert got == {tp0: code, (TOPIC, 1): code}, (kw, got)
    # Unknown topics and partitions are refused per partition, before the group is asked.
    got = txn_commit(broker.port, zombie, {("no-such-topic", 0): 1, (TOPIC, 7): 1},
                     member=member, instance="i1", generation=generation)
    assert got == {("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION, (TOPIC, 7): UNKNOWN_TOPIC_OR_PARTITION}

    nothing = {tp0: (-1, NONE), (TOPIC, 1): (-1, NONE)}
    assert fetch(broker.port, [tp0, (TOPIC, 1)], require_stable=True) == nothing
    assert fetch(broker.port, [tp0, (TOPIC, 1)], require_stable=False) == nothing


def loaded_fetch(broker, partitions):
    """OffsetFetch v7 (require_stable) once the offsets partition is loaded after a
    restart (COORDINATOR_LOAD_IN_PROGRESS / NOT_COORDINATOR until then)."""
    T = OffsetFetchRequest.OffsetFetchRequestTopic

    def loaded():
        req = OffsetFetchRequest(version=7, group_id=GROUP, require_stable=True,
                                 topics=[T(name=t, partition_indexes=[p]) for t, p in partitions])
        resp = call(broker.port, req, OffsetFetchResponse, 7)
        return resp if resp.error_code == NONE else None

    return fetched(wait_until(loaded, 60, "the offsets partition loaded after the restart"))


@pytest.mark.broker_args(*GROUP_ARGS)
def test_txn_offsets_pending_until_their_transaction_ends(broker):
    """The transaction coordinator's part is not needed: the offsets are written in a
    transactional batch and stay pending (also across a restart) with no marker."""
    create_topic(broker.bootstrap, TOPIC, partitions=2)
    coordinator_ready(broker.port)
    member, generation = join_static(broker.port, "i1")
    pid, epoch = init_producer_id(broker.port)
    producer, stale = (pid, epoch + 1), (pid, epoch)  # as after an epoch bump
    tp0, tp1 = (TOPIC, 0), (TOPIC, 1)
    consumer = dict(member=member, instance="i1", generation=generation)

    assert txn_commit(broker.port, producer, {tp0: 10}, **consumer) == {tp0: NONE}
    assert txn_commit(broker.port, producer, {tp0: 11}, **consumer) == {tp0: NONE}, "the producer's next batch"
    # A plain commit of another partition is visible at once, beside the pending one.
    assert txn_commit(broker.port, (-1, -1), {tp1: 5}, **consumer) == {tp1: NONE}
    assert fetch(broker.port, [tp0, tp1], require_stable=True) == {tp0: (-1, UNSTABLE_OFFSET_COMMIT), tp1: (5, NONE)}
    assert fetch(broker.port, [tp0, tp1], require_stable=False) == {tp0: (-1, NONE), tp1: (5, NONE)}, \
        "pending offsets are not visible"
    assert fetch_v8(broker.port, [tp0, tp1], require_stable=True) == \
        {tp0: (-1, UNSTABLE_OFFSET_COMMIT), tp1: (5, NONE)}
    assert fetch_v8(broker.port, [tp0, tp1], require_stable=False) == {tp0: (-1, NONE), tp1: (5, NONE)}
    # A fenced (older) producer epoch is refused by the log, and commits nothing.
    assert txn_commit(broker.port, stale, {tp0: 12, tp1: 12}, **consumer) == \
        {tp0: INVALID_PRODUCER_EPOCH, tp1: INVALID_PRODUCER_EPOCH}
    assert fetch(broker.port, [tp1], require_stable=True) == {tp1: (5, NONE)}

    broker.restart()
    assert loaded_fetch(broker, [tp0, tp1]) == {tp0: (-1, UNSTABLE_OFFSET_COMMIT), tp1: (5, NONE)}


@pytest.mark.broker_args(*GROUP_ARGS)
def test_txn_offsets_visible_after_the_commit_marker(broker):
    create_topic(broker.bootstrap, TOPIC, partitions=2)
    coordinator_ready(broker.port)
    member, generation = join_static(broker.port, "i1")
    producer = init_producer_id(broker.port)
    tp0, tp1 = (TOPIC, 0), (TOPIC, 1)
    both = [tp0, tp1]
    consumer = dict(member=member, instance="i1", generation=generation)

    assert txn_commit(broker.port, producer, {tp0: 10, tp1: 20}, **consumer) == {tp0: NONE, tp1: NONE}
    assert fetch(broker.port, both, require_stable=True) == \
        {tp0: (-1, UNSTABLE_OFFSET_COMMIT), tp1: (-1, UNSTABLE_OFFSET_COMMIT)}
    assert write_marker(broker.port, producer, commit=True) == NONE
    assert fetch(broker.port, both, require_stable=True) == {tp0: (10, NONE), tp1: (20, NONE)}

    # The next transaction aborts: its offsets vanish.
    assert txn_commit(broker.port, producer, {tp0: 30}, **consumer) == {tp0: NONE}
    assert fetch(broker.port, both, require_stable=True)[tp0] == (-1, UNSTABLE_OFFSET_COMMIT)
    assert write_marker(broker.port, producer, commit=False) == NONE
    assert fetch(broker.port, both, require_stable=True) == {tp0: (10, NONE), tp1: (20, NONE)}

    # A v0 commit (no member: a producer that sent no group metadata) stays open over a
    # restart: the reloaded coordinator still holds it pending, and commits it at the marker.
    assert txn_commit(broker.port, producer, {tp1: 40}, version=0) == {tp1: NONE}
    broker.restart()
    assert loaded_fetch(broker, both) == {tp0: (10, NONE), tp1: (-1, UNSTABLE_OFFSET_COMMIT)}
    assert write_marker(broker.port, producer, commit=True) == NONE
    assert fetch(broker.port, both, require_stable=True) == {tp0: (10, NONE), tp1: (40, NONE)}
