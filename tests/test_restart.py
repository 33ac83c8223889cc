"""Restarting on the same port right after a shutdown, with clients still connected.

When the broker closes connections itself (clean shutdown, or the kernel closing them
after kill -9), the server side of each lingers in FIN-WAIT-2/TIME-WAIT on the listen
port for a minute or more.  Those sockets inherit the listener's SO_REUSEADDR /
SO_REUSEPORT flags; a new bind() only succeeds next to them if the flags match
(both SO_REUSEADDR, or both SO_REUSEPORT).  Kafka sets SO_REUSEADDR, so
`systemctl restart` just works."""

import signal
import time

import pytest

from helpers import wire
from helpers.broker import BrokerDied
from helpers.clients import cf_consume, cf_produce, create_topic


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_restart_same_port_with_connected_clients(broker, how):
    create_topic(broker.bootstrap, "same-port", 1)
    cf_produce(broker.bootstrap, "same-port", [{"value": b"before"}])
    clients = []
    for i in range(3):
        s = wire.connect(broker.port)
        s.sendall(wire.api_versions_request(correlation_id=i))
        wire.recv_frame(s)
        clients.append(s)
    try:
        if how == "SIGTERM":
            assert broker.stop(signal.SIGTERM, timeout=20) == 0
        else:
            broker.kill()
        for s in clients:  # the broker side is gone: EOF (or RST)
            assert wire.outcome_after(s, 5) == "closed"
        # Retry a few seconds: after kill -9 the kernel tears down io_uring rings (and the
        # sockets they hold) asynchronously.  The connections above stay open meanwhile,
        # so their server-side sockets keep lingering: retrying cannot hide a bind-flag
        # mismatch.
        deadline = time.monotonic() + 5
        while True:
            try:
                broker.restart(new_port=False)
                break
            except BrokerDied as e:
                if "Address already in use" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.25)
    finally:
        for s in clients:
            s.close()
    cf_produce(broker.bootstrap, "same-port", [{"value": b"after"}])
    got = cf_consume(broker.bootstrap, "same-port", 1, 2)
    assert [m.value for m in got[0]] == [b"before", b"after"]
