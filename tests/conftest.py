"""Integration-test harness for Spate.

Every test gets its own broker: the real binary (``SPATE_BIN``, see below) started on a
free port (helpers/broker.py: each pytest-xdist worker has its own range) with a fresh
data directory, waited for until the port accepts TCP connections, and killed at teardown.  When a
test fails, the broker's log (stderr + stdout) is attached to the pytest report.

Environment knobs:
  SPATE_BIN           path to the broker binary (default: the newer of <repo>/target/ci/spate,
                      which scripts/test builds, and <repo>/target/release/spate)
  SPATE_TEST_TANSU    path to a Tansu binary: run the tests against Tansu instead
                      (debugging aid for the test code only; Tansu keeps data in
                      memory, so restart tests fail there, and spate-only flags are
                      ignored)
  RUST_LOG            passed through to the broker (default: info)
  CI                  when "true" (set by .ci/run), a skipped test FAILS: see
                      pytest_runtest_makereport below and tests/README.md
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers.broker import Broker, REPO_ROOT, free_port, port_open  # noqa: E402

ZK_JAR = "/usr/share/java/zookeeper.jar"

# Per-test wall-clock limit; overridable with `--timeout` on the command line.
DEFAULT_TEST_TIMEOUT = 180

# Under CI every test must run: a skip there means CI lacks a dependency (node, root,
# a cgroup, ...) and would report as passed what it never ran. Every skip, however it
# was asked for (pytest.skip in a test or fixture, a skip/skipif marker, a module-level
# skip or importorskip at collection), is reported as a failure with its reason.
# Deselection (-k, -m) is not a skip and is unaffected.
SKIPS_FAIL = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_reason(rep):
    longrepr = rep.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return longrepr[2]
    return str(longrepr)


def fail_skip_under_ci(rep):
    """Turns a skipped report into a failed one when SKIPS_FAIL (an xfail stays one)."""
    if SKIPS_FAIL and rep.skipped and not hasattr(rep, "wasxfail"):
        rep.outcome = "failed"
        rep.longrepr = (f"skipped under CI=true, which must run every test: {skip_reason(rep)}\n"
                        "(install what it needs in scripts/install-deps; see tests/README.md)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "broker_args(*args): extra command-line flags for the `broker` fixture")
    config.addinivalue_line("markers", "slow: a test that takes more than a few seconds")
    config.addinivalue_line(
        "markers", "serial: a module that measures time, CPU or memory, or loads the machine: scripts/test "
        "runs these alone after the parallel part (-m 'not serial' -n N, then -m serial)")


# Test brokers refuse produce below this much free space on their data dir's file system
# (the default --disk-free-min-bytes; helpers/broker.py sets --disk-free-min-percent 0).
BROKER_FREE_FLOOR_BYTES = 1024**3
# Below this no test is started: the suite stops with the reading, instead of every
# later test failing with KAFKA_STORAGE_ERROR until CI's time runs out (stop 42: 30
# tests failed that way on a CI machine whose disk had filled).
MIN_FREE_BYTES = BROKER_FREE_FLOOR_BYTES + 512 * 1024**2


def pytest_runtest_setup(item):
    where = os.path.abspath(item.config.option.basetemp or tempfile.gettempdir())
    while not os.path.exists(where):  # a --basetemp not made yet: its file system
        where = os.path.dirname(where)
    free = shutil.disk_usage(where).free
    if free < MIN_FREE_BYTES:
        pytest.exit(f"only {free / 1024**2:.0f} MiB free on the file system of {where} before {item.nodeid}: "
                    f"test brokers refuse produce below {BROKER_FREE_FLOOR_BYTES / 1024**2:.0f} MiB, so the suite "
                    f"stops here (need "
                    f"{MIN_FREE_BYTES / 1024**2:.0f} MiB; free disk space and run again)", returncode=3)


def pytest_collection_modifyitems(config, items):
    # Every test gets a timeout (pytest-timeout) unless it sets its own.
    if config.pluginmanager.hasplugin("timeout"):
        for item in items:
            if item.get_closest_marker("timeout") is None and not config.getoption("timeout", None):
                item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    fail_skip_under_ci(rep)
    if rep.failed:
        for b in getattr(item, "_spate_brokers", []):
            rep.sections.append((f"broker {b.name} log ({b.log_path})", b.log_tail()))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    fail_skip_under_ci(outcome.get_result())


@pytest.fixture
def broker_factory(request, tmp_path):
    """Returns start(*extra_args, name=..., cores=None) -> a started Broker.

    All brokers started through it are killed at teardown; their logs are attached
    to the report of a failing test."""
    brokers = []
    request.node._spate_brokers = brokers

    def start(*extra_args, name=None, cores=None, data_dir=None, port=None, host="127.0.0.1", wrap=()):
        name = name or f"b{len(brokers)}"
        b = Broker(
            name=name,
            workdir=tmp_path / name,
            extra_args=list(extra_args),
            cores=cores,
            data_dir=data_dir,
            port=port,
            host=host,
            wrap=wrap,
        )
        brokers.append(b)
        b.start()
        return b

    yield start
    for b in brokers:
        b.kill()


@pytest.fixture
def broker(request, broker_factory):
    """A single running broker. Extra flags: @pytest.mark.broker_args("--cores", "2")."""
    m = request.node.get_closest_marker("broker_args")
    args = list(m.args) if m else []
    return broker_factory(*args)


@pytest.fixture(scope="session")
def repo_root():
    return REPO_ROOT


@pytest.fixture
def zookeeper(tmp_path):
    """A real Apache ZooKeeper (Debian's package) on a free port; yields "host:port"."""
    if not os.path.exists(ZK_JAR) or not shutil.which("java"):
        pytest.fail("ZooKeeper is not installed: run scripts/install-deps (Debian package zookeeper)")
    port = free_port()
    data = tmp_path / "zk"
    data.mkdir()
    cfg = tmp_path / "zoo.cfg"
    cfg.write_text(f"tickTime=500\ndataDir={data}\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
                   "admin.enableServer=false\nmaxClientCnxns=0\nmaxSessionTimeout=60000\n")
    log = open(tmp_path / "zk.log", "wb")
    proc = subprocess.Popen(["java", "-cp", f"/etc/zookeeper/conf:{ZK_JAR}",
                             "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
                            stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 30
    while not port_open("127.0.0.1", port):
        assert proc.poll() is None, (tmp_path / "zk.log").read_text()
        assert time.monotonic() < deadline, "ZooKeeper did not start"
        time.sleep(0.1)
    yield f"127.0.0.1:{port}"
    proc.kill()
    proc.wait(10)
