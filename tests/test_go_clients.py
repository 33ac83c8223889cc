"""Go's Kafka clients against the broker: franz-go (kgo v1.22.3, kadm v1.20.0) and sarama
(v1.61.1), both with their defaults, from the Go test package in tests/go.

tests/go holds eight Go tests, built once per session into target/go-tests with
`go test -c` (offline: scripts/install-deps downloads the modules) and run against a
single broker and against a three-broker cluster (topics with three replicas there):

  TestFranzAdmin               kadm: describe cluster, create / list / describe / delete
                               topics, describe / incremental-alter configs (topic and
                               broker), list / describe / delete groups, commit / fetch
                               offsets, list start and end offsets.
  TestFranzProduceConsumeGroup kgo's default producer (idempotent, acks=all) writes 3,000
                               keyed records with headers to 6 partitions; a group of two
                               kgo consumers (cooperative-sticky) splits them, one commits
                               and leaves, the other takes its partitions over from the
                               commits: every record read exactly once, checked against
                               the producer's acks (key, value, header, partition, offset,
                               order), committed offsets = end offsets, lag 0.
  TestFranzCodecsTimestampsProducers
                               an idempotent kgo producer per codec (none, gzip, snappy,
                               lz4, zstd), records with their own timestamps, read back by
                               a partition consumer; ListOffsets by timestamp lands on the
                               record (inside compressed batches: a Spate fix, see
                               src/log/batch.rs); DescribeProducers shows each producer's
                               last sequence per partition; CreatePartitions.
  TestFranzGroupOffsetsAdmin   OffsetDelete, OffsetFetch of two groups in one request, a
                               static member (group.instance.id) that closes and comes
                               back to its partitions without a rebalance.
  TestSarama                   ClusterAdmin (describe cluster, create / list / describe /
                               delete topics, describe / alter / incremental-alter configs,
                               list / describe / delete groups, committed offsets); the
                               SyncProducer and AsyncProducer with sarama's defaults and the
                               idempotent AsyncProducer write 4,000 records, a ConsumerGroup
                               reads them all back and commits; started again it reads only
                               the 200 records written since.
  TestSaramaCodecsPartitionConsumer
                               a SyncProducer per codec (none, gzip, snappy, lz4, zstd),
                               records with their own timestamps, read back by partition
                               consumers; GetOffset by timestamp lands on the record.
  TestSaramaTwoMemberGroup     two members with the sticky strategy split the partitions
                               and read every record; committed offsets = end offsets.
  TestFranzNextGenGroup        a KIP-848 group (kgo.ServerSideBalancer) of three kgo
                               members subscribed by regex: the broker's uniform assignor
                               splits a topic's partitions, a topic created later is
                               assigned too, one member commits and leaves and the others
                               take its partitions over: every record read exactly once,
                               committed offsets = end offsets, the group Empty at the end.

Each Go test reports its own result; this file requires every one of them to pass (a
Go-side skip fails here). Without Go the tests skip with the reason, which fails the run
under CI=true (tests/README.md).
"""

import os
import re
import shutil
import subprocess

import pytest

from helpers.broker import REPO_ROOT
from test_cluster import cluster_args, wait_brokers

GO_DIR = REPO_ROOT / "tests" / "go"
BUILD_DIR = REPO_ROOT / "target" / "go-tests"
GO_TESTS = {"TestFranzAdmin", "TestFranzProduceConsumeGroup", "TestFranzCodecsTimestampsProducers",
            "TestFranzGroupOffsetsAdmin", "TestSarama", "TestSaramaCodecsPartitionConsumer",
            "TestSaramaTwoMemberGroup", "TestFranzNextGenGroup"}

GO_BUILD_TIMEOUT_S = 600
GO_RUN_TIMEOUT_S = 550  # the eight Go tests, each bounded at 150 s by the Go side

# Quick group formation: the kgo tests wait for a group of one, then of two (classic) or
# three (KIP-848: members reconcile at each heartbeat, every second here).
GROUP_ARGS = ("--group-initial-rebalance-delay-ms", "300", "--group-consumer-heartbeat-interval-ms", "1000")


def find_go():
    # ./.go is where scripts/install-deps puts a Go toolchain when the machine has none
    # able to build tests/go (none, or one older than 1.21): it comes first.
    for candidate in (str(REPO_ROOT / ".go" / "bin" / "go"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session")
def go_test_binary():
    """The Go tests compiled into one binary, offline (GOPROXY=off): a module missing from
    the module cache is an error that names scripts/install-deps, never a download."""
    go = find_go()
    if go is None:
        pytest.skip("go is not installed (Go 1.26 or a Go >= 1.21 that can switch toolchains): "
                    "run scripts/install-deps")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    out = BUILD_DIR / "spate-go.test"
    env = {**os.environ, "GOPROXY": "off", "GOFLAGS": (os.environ.get("GOFLAGS", "") + " -mod=readonly").strip()}
    try:
        r = subprocess.run([go, "test", "-c", "-o", str(out), "."], cwd=str(GO_DIR), env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=GO_BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"`go test -c` in tests/go took over {GO_BUILD_TIMEOUT_S}s: {(e.stdout or b'').decode()}")
    assert r.returncode == 0, (f"`go test -c` in tests/go failed ({r.returncode}); run scripts/install-deps "
                               f"to download the Go modules:\n{r.stdout.decode(errors='replace')}")
    return out


def run_go_tests(binary, bootstrap, brokers, replication_factor):
    env = {**os.environ, "SPATE_BOOTSTRAP": bootstrap, "SPATE_BROKERS": str(brokers),
           "SPATE_REPLICATION_FACTOR": str(replication_factor)}
    try:
        r = subprocess.run([str(binary), "-test.v", "-test.count=1", "-test.timeout", f"{GO_RUN_TIMEOUT_S - 10}s"],
                           cwd=str(GO_DIR), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=GO_RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the Go tests did not finish within {GO_RUN_TIMEOUT_S}s; output:\n"
                    f"{(e.stdout or b'').decode(errors='replace')}")
    out = r.stdout.decode(errors="replace")
    print(out)
    results = dict((name, result) for result, name in re.findall(r"^--- (PASS|FAIL|SKIP): (\w+) ", out, re.M))
    assert results == {name: "PASS" for name in GO_TESTS} and r.returncode == 0, (
        f"Go tests: {results or 'no results'} (exit {r.returncode}), want {sorted(GO_TESTS)} to pass; output:\n{out}")


@pytest.mark.slow
@pytest.mark.timeout(GO_BUILD_TIMEOUT_S + GO_RUN_TIMEOUT_S + 60)
def test_go_clients_single_broker(broker_factory, go_test_binary):
    b = broker_factory(*GROUP_ARGS)
    run_go_tests(go_test_binary, b.bootstrap, brokers=1, replication_factor=1)


@pytest.mark.slow
@pytest.mark.timeout(GO_BUILD_TIMEOUT_S + GO_RUN_TIMEOUT_S + 60)
def test_go_clients_three_brokers(broker_factory, go_test_binary):
    """Embedded coordinator on broker 1; every topic the Go tests create has 3 replicas,
    and the clients bootstrap from all three brokers."""
    first = broker_factory(*cluster_args(1), *GROUP_ARGS, name="b1", cores=1)
    brokers = [first] + [
        broker_factory(*cluster_args(i), *GROUP_ARGS, "--coordinator", first.bootstrap, name=f"b{i}", cores=1)
        for i in (2, 3)]
    wait_brokers(first.bootstrap, {b.port for b in brokers})
    run_go_tests(go_test_binary, ",".join(b.bootstrap for b in brokers), brokers=3, replication_factor=3)
