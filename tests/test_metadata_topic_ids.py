"""Metadata v12 looked up by topic id, on the wire as the Java admin sends it.

The Java client's Admin.describeTopics(TopicCollection.ofTopicIds(..)) sends Metadata v12
with each topic's id and an EMPTY name (its generated default), not a null one. Kafka
looks a topic up by id whenever the id is set. Spate used to take the empty name as the
topic's name and answer INVALID_TOPIC_EXCEPTION with no id, on which the Java admin
failed with "IllegalStateException: Use errors() when managing topic using topic name"
(found by tests/test_java_client.py). An unknown id is answered, as Kafka does, with
UNKNOWN_TOPIC_ID, the id echoed and a null name."""

import struct
import uuid

from helpers.clients import create_topic
from helpers.wire import _varint_unsigned, call, frame, request_header_v1

UNKNOWN_TOPIC_ID = 100


def metadata_v12(topics, correlation_id=7):
    """topics: [(uuid.UUID or None, name str or None)]."""
    body = _varint_unsigned(len(topics) + 1)
    for tid, name in topics:
        body += (tid.bytes if tid else bytes(16))
        body += b"\x00" if name is None else _varint_unsigned(len(name) + 1) + name.encode()
        body += b"\x00"  # tagged fields
    body += b"\x00\x00\x00"  # allow_auto_topic_creation, include_topic_authorized_operations, tags
    return frame(request_header_v1(3, 12, correlation_id) + b"\x00" + body)


class Reader:
    def __init__(self, data):
        self.d, self.i = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.i)
        self.i += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def uvarint(self):
        shift = out = 0
        while True:
            b = self.d[self.i]
            self.i += 1
            out |= (b & 0x7F) << shift
            if b < 0x80:
                return out
            shift += 7

    def compact_string(self):
        n = self.uvarint()
        if n == 0:
            return None
        s = self.d[self.i:self.i + n - 1].decode()
        self.i += n - 1
        return s

    def compact_array(self, item):
        n = self.uvarint()
        return None if n == 0 else [item() for _ in range(n - 1)]

    def tags(self):
        for _ in range(self.uvarint()):
            self.uvarint()
            self.i += self.uvarint()


def parse_metadata_v12(resp):
    """-> [(error_code, name, uuid.UUID, partition count)] from a v12 response."""
    r = Reader(resp)
    r.take(">i")  # correlation id
    r.tags()  # response header v1
    r.take(">i")  # throttle

    def broker():
        r.take(">i"), r.compact_string(), r.take(">i"), r.compact_string(), r.tags()

    def int32():
        return r.take(">i")

    def partition():
        r.take(">hiii")
        r.compact_array(int32), r.compact_array(int32), r.compact_array(int32)
        r.tags()

    def topic():
        error = r.take(">h")
        name = r.compact_string()
        tid = uuid.UUID(bytes=bytes(r.d[r.i:r.i + 16]))
        r.i += 16
        r.take(">?")
        parts = r.compact_array(partition)
        r.take(">i")
        r.tags()
        return error, name, tid, len(parts or [])

    r.compact_array(broker)
    r.compact_string()  # cluster id
    r.take(">i")  # controller
    topics = r.compact_array(topic)
    r.tags()
    assert r.i == len(resp), f"{len(resp) - r.i} bytes left over"
    return topics


def test_metadata_v12_by_topic_id_with_an_empty_name(broker):
    create_topic(broker.bootstrap, "by-id", partitions=2)
    [(error, name, tid, parts)] = parse_metadata_v12(call(broker.port, metadata_v12([(None, "by-id")])))
    assert (error, name, parts) == (0, "by-id", 2)
    assert tid != uuid.UUID(int=0)

    # As the Java admin asks: the id, and "" for the name.
    got = parse_metadata_v12(call(broker.port, metadata_v12([(tid, "")])))
    assert got == [(0, "by-id", tid, 2)], got
    # A null name.
    got = parse_metadata_v12(call(broker.port, metadata_v12([(tid, None)])))
    assert got == [(0, "by-id", tid, 2)], got

    # An id that names no topic: UNKNOWN_TOPIC_ID, the id echoed, no name.
    other = uuid.uuid4()
    got = parse_metadata_v12(call(broker.port, metadata_v12([(other, "")])))
    assert got == [(UNKNOWN_TOPIC_ID, None, other, 0)], got
