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
