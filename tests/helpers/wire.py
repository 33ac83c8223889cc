"""Raw Kafka wire-protocol bits for the bad-input tests."""

import socket
import struct
import time


def request_header_v1(api_key, api_version, correlation_id, client_id=b"spate-raw"):
    return struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id)) + client_id


def frame(payload):
    return struct.pack(">i", len(payload)) + payload


def api_versions_request(correlation_id=1, version=0):
    hdr = request_header_v1(18, version, correlation_id)
    if version >= 3:
        # header v2 (flexible): header v1 + empty tagged fields; body: compact strings
        # client_software_name, client_software_version, tagged fields
        name, ver = b"spate-raw", b"1.0"
        body = bytes([len(name) + 1]) + name + bytes([len(ver) + 1]) + ver + b"\x00"
        return frame(hdr + b"\x00" + body)
    return frame(hdr)


def connect(port, host="127.0.0.1", timeout=5):
    s = socket.create_connection((host, port), timeout=timeout)
    s.settimeout(timeout)
    return s


def recv_exact(s, n, timeout=5):
    s.settimeout(timeout)
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def recv_frame(s, timeout=5):
    (n,) = struct.unpack(">i", recv_exact(s, 4, timeout))
    return recv_exact(s, n, timeout)


def outcome_after(s, timeout=5):
    """What the broker does with a connection we sent something bad on.

    Returns "closed" (EOF or RST), or ("answered", first bytes); raises TimeoutError
    if the broker neither answers nor closes within `timeout` seconds."""
    s.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        data = s.recv(65536)
    except socket.timeout:
        raise TimeoutError(f"broker neither answered nor closed the connection in {timeout}s")
    except (ConnectionResetError, BrokenPipeError):
        return "closed"
    if not data:
        return "closed"
    # Answered: drain until close or a short quiet period (do not hang on it).
    s.settimeout(max(0.1, min(1.0, deadline - time.monotonic())))
    try:
        while True:
            more = s.recv(65536)
            if not more:
                break
            data += more
    except (socket.timeout, ConnectionResetError):
        pass
    return ("answered", data)


def parse_api_versions_v0(body):
    """body = response after the 4-byte length: correlation id, error, [key, min, max]."""
    corr, err, n = struct.unpack(">ihi", body[:10])
    apis = {}
    off = 10
    for _ in range(max(n, 0)):
        k, lo, hi = struct.unpack(">hhh", body[off:off + 6])
        apis[k] = (lo, hi)
        off += 6
    return corr, err, apis


# ---------------------------------------------------------------- idempotent producers

def _varint(v):
    """Kafka's zig-zag varint."""
    return _varint_unsigned((v << 1) ^ (v >> 63))


def record_batch(values, producer_id=-1, producer_epoch=-1, base_sequence=-1, timestamp_ms=None,
                 transactional=False, timestamps=None, gzip=False):
    """A magic-2 batch of `values` (bytes) with the given producer fields (attributes bit 4
    when `transactional`): every record stamped `timestamp_ms` (now when None), or each
    with its own of `timestamps`; the records gzip-compressed when `gzip`."""
    import crc32c
    import gzip as gz
    if timestamps is None:
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        timestamps = [ts] * len(values)
    assert len(timestamps) == len(values)
    base_ts = timestamps[0]
    body = b""
    for i, (v, t) in enumerate(zip(values, timestamps)):
        rec = b"\x00" + _varint(t - base_ts) + _varint(i) + _varint(-1) + _varint(len(v)) + v + _varint(0)
        body += _varint(len(rec)) + rec
    attributes = (0x10 if transactional else 0) | (1 if gzip else 0)
    if gzip:
        body = gz.compress(body)
    after_crc = struct.pack(">hiqqqhii", attributes, len(values) - 1, base_ts, max(timestamps), producer_id,
                            producer_epoch, base_sequence, len(values)) + body
    crc = crc32c.crc32c(after_crc)
    rest = struct.pack(">ibI", -1, 2, crc) + after_crc  # partitionLeaderEpoch, magic, crc
    return struct.pack(">qi", 0, len(rest)) + rest


def _string(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def produce_v3(topic, partition, batch, correlation_id=1, acks=-1, timeout_ms=10000, transactional_id=None):
    """Produce v3 (non-flexible) with one partition's record set."""
    tid = struct.pack(">h", -1) if transactional_id is None else _string(transactional_id)
    body = tid + struct.pack(">hi", acks, timeout_ms)
    body += struct.pack(">i", 1) + _string(topic) + struct.pack(">i", 1)
    body += struct.pack(">ii", partition, len(batch)) + batch
    return frame(request_header_v1(0, 3, correlation_id) + body)


def _single_topic_partitions(resp, off):
    """At `off`, a non-flexible response's topic array holding one topic: -> (the offset
    of its first partition entry, the partition count)."""
    (n,) = struct.unpack(">i", resp[off:off + 4])
    assert n == 1
    off += 4
    (tlen,) = struct.unpack(">h", resp[off:off + 2])
    off += 2 + tlen
    (pn,) = struct.unpack(">i", resp[off:off + 4])
    return off + 4, pn


def parse_produce_v3(resp):
    """-> (error_code, base_offset) of the single partition answered."""
    off, pn = _single_topic_partitions(resp, 4)  # after the correlation id
    assert pn == 1
    _index, error, base_offset, _append_time = struct.unpack(">ihqq", resp[off:off + 22])
    return error, base_offset


# Produce errors a Kafka client retries while a new partition or a new leader settles:
# UNKNOWN_TOPIC_OR_PARTITION and NOT_LEADER_OR_FOLLOWER (the broker has not yet taken the
# partition its controller assigned it).
PRODUCE_SETTLING = (3, 6)


def produce_v3_settled(port, topic, partition, batch, retry=PRODUCE_SETTLING, timeout=30, **kw):
    """Produce v3 of one batch to `port`, sent again (as a client would) while the answer's
    error is in `retry`: -> (error_code, base_offset) of the first other answer."""
    req = produce_v3(topic, partition, batch, **kw)
    deadline = time.monotonic() + timeout
    while True:
        got = parse_produce_v3(call(port, req))
        if got[0] not in retry:
            return got
        assert time.monotonic() < deadline, f"produce to {topic}-{partition} still {got} after {timeout}s"
        time.sleep(0.2)


def init_producer_id(transactional_id=None, producer_id=-1, producer_epoch=-1, correlation_id=1):
    """InitProducerId v3 (flexible; KIP-360 fields)."""
    hdr = request_header_v1(22, 3, correlation_id) + b"\x00"  # header v2: tagged fields
    if transactional_id is None:
        tid = b"\x00"
    else:
        t = transactional_id.encode()
        tid = _varint_unsigned(len(t) + 1) + t
    body = tid + struct.pack(">iqh", 60000, producer_id, producer_epoch) + b"\x00"
    return frame(hdr + body)


def _varint_unsigned(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def parse_init_producer_id(resp):
    """-> (error_code, producer_id, producer_epoch). Response header v1 (tagged fields)."""
    _corr, _tags, _throttle, error, pid, epoch = struct.unpack(">ibihqh", resp[:21])
    return error, pid, epoch


def call(port, request, host="127.0.0.1", timeout=10):
    """Send one request frame, return the response (after the length prefix)."""
    s = connect(port, host, timeout)
    try:
        s.sendall(request)
        return recv_frame(s, timeout)
    finally:
        s.close()


def kp_call(port, req, resp_cls, version, timeout=30, client_id="spate-test"):
    """One request built with kafka-python's protocol classes, on its own connection:
    the decoded answer."""
    req.with_header(correlation_id=7, client_id=client_id)
    s = connect(port, timeout=timeout)
    try:
        s.sendall(bytes(req.encode(version=version, header=True, framed=True)))
        data = recv_frame(s, timeout=timeout)
    finally:
        s.close()
    return resp_cls.decode(data, version=version, header=True)


def _compact_string(s):
    b = s.encode()
    return _varint_unsigned(len(b) + 1) + b


def write_txn_markers(markers, correlation_id=1):
    """WriteTxnMarkers v1 (flexible; Kafka 4 has no v0): `markers` is a list of
    (producer_id, producer_epoch, commit, coordinator_epoch, {topic: [partitions]})."""
    hdr = request_header_v1(27, 1, correlation_id) + b"\x00"  # header v2: tagged fields
    body = _varint_unsigned(len(markers) + 1)
    for pid, epoch, commit, coordinator_epoch, topics in markers:
        body += struct.pack(">qh?", pid, epoch, commit) + _varint_unsigned(len(topics) + 1)
        for topic, partitions in topics.items():
            body += _compact_string(topic) + _varint_unsigned(len(partitions) + 1)
            body += b"".join(struct.pack(">i", p) for p in partitions) + b"\x00"
        body += struct.pack(">i", coordinator_epoch) + b"\x00"
    return frame(hdr + body + b"\x00")


def _read_uvarint(buf, off):
    v, shift = 0, 0
    while True:
        b = buf[off]
        off += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            return v, off
        shift += 7


def parse_write_txn_markers(resp):
    """-> {(producer_id, topic, partition): error_code} from a WriteTxnMarkers v1 answer
    (response header v1: correlation id, tagged fields)."""
    off = 4
    _tags, off = _read_uvarint(resp, off)
    out = {}
    n, off = _read_uvarint(resp, off)
    for _ in range(n - 1):
        (pid,) = struct.unpack(">q", resp[off:off + 8])
        off += 8
        n_topics, off = _read_uvarint(resp, off)
        for _ in range(n_topics - 1):
            tlen, off = _read_uvarint(resp, off)
            topic = resp[off:off + tlen - 1].decode()
            off += tlen - 1
            n_parts, off = _read_uvarint(resp, off)
            for _ in range(n_parts - 1):
                partition, error = struct.unpack(">ih", resp[off:off + 6])
                off += 6
                _tags, off = _read_uvarint(resp, off)
                out[(pid, topic, partition)] = error
            _tags, off = _read_uvarint(resp, off)
        _tags, off = _read_uvarint(resp, off)
    return out


def list_offsets_latest_v2(topic, partition, isolation_level, correlation_id=1):
    """ListOffsets v2 for the latest offset of one partition."""
    body = struct.pack(">ib", -1, isolation_level) + struct.pack(">i", 1) + _string(topic)
    body += struct.pack(">i", 1) + struct.pack(">iq", partition, -1)
    return frame(request_header_v1(2, 2, correlation_id) + body)


def parse_list_offsets_v2(resp):
    """-> (error_code, offset) of the single partition answered."""
    off = 4 + 4  # correlation id, throttle time
    off += 4  # topics count
    (tlen,) = struct.unpack(">h", resp[off:off + 2])
    off += 2 + tlen + 4
    _partition, error, _ts, offset = struct.unpack(">ihqq", resp[off:off + 22])
    return error, offset


def add_partitions_to_txn_v1(transactional_id, producer_id, producer_epoch, topic, partitions, correlation_id=1):
    """AddPartitionsToTxn v1 (a client's request, non-flexible) for one topic."""
    body = _string(transactional_id) + struct.pack(">qh", producer_id, producer_epoch)
    body += struct.pack(">i", 1) + _string(topic) + struct.pack(">i", len(partitions))
    body += b"".join(struct.pack(">i", p) for p in partitions)
    return frame(request_header_v1(24, 1, correlation_id) + body)


def parse_add_partitions_to_txn_v1(resp):
    """-> {partition: error_code} of the single topic answered."""
    off, pn = _single_topic_partitions(resp, 4 + 4)  # after correlation id, throttle
    out = {}
    for _ in range(pn):
        p, e = struct.unpack(">ih", resp[off:off + 6])
        out[p] = e
        off += 6
    return out


def end_txn_v1(transactional_id, producer_id, producer_epoch, commit, correlation_id=1):
    """EndTxn v1 (non-flexible)."""
    body = _string(transactional_id) + struct.pack(">qhb", producer_id, producer_epoch, 1 if commit else 0)
    return frame(request_header_v1(26, 1, correlation_id) + body)


def parse_end_txn_v1(resp):
    """-> error_code."""
    _corr, _throttle, error = struct.unpack(">iih", resp[:10])
    return error


def find_coordinator_v1(key, key_type, correlation_id=1):
    """FindCoordinator v1 (non-flexible): key_type 0 group, 1 transaction."""
    return frame(request_header_v1(10, 1, correlation_id) + _string(key) + struct.pack(">b", key_type))


def parse_find_coordinator_v1(resp):
    """-> (error_code, node_id)."""
    off = 4 + 4  # correlation id, throttle
    (error,) = struct.unpack(">h", resp[off:off + 2])
    off += 2
    (mlen,) = struct.unpack(">h", resp[off:off + 2])
    off += 2 + max(mlen, 0)
    (node_id,) = struct.unpack(">i", resp[off:off + 4])
    return error, node_id
