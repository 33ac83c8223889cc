"""The Java client (Apache Kafka's kafka-clients, pinned in tests/java/pom.xml) against
the real broker, on a single broker and on a three-broker cluster with replication
factor 3. The programs in tests/java/src check what they read back themselves and end
with "PASS: ..." (exit 0) or an AssertionError naming the difference:

- ProduceAndGroup: the producer with all its defaults (idempotent, acks=all, default
  partitioner) sends 3000 records to 6 partitions, send callbacks checked; a two-member
  group (the default assignors, then CooperativeStickyAssignor) reads them, one member
  leaves, the other takes its partitions over from its committed offsets; every record
  checked against what was acknowledged at its offset, commits read back with
  committed() and the admin; describeProducers shows the idempotent producer's sequences.
- AdminCheck: describeCluster, create/list/describe/delete topics, describeConfigs and
  incrementalAlterConfigs, consumer groups listed, described, their offsets listed,
  altered and deleted (deleteConsumerGroupOffsets), the group deleted.
- CodecsAndOffsets: the producer with each compression codec (none, gzip, snappy, lz4,
  zstd) read back by a consumer without a group; beginningOffsets / endOffsets /
  offsetsForTimes and the admin's listOffsets (inside compressed batches too);
  createPartitions.
- ConsumerProtocol: `group.protocol=consumer` (KIP-848): the consumer joins through
  ConsumerGroupHeartbeat, reads every record in order and commits (OffsetCommit v9).
- Transactions: the transactional producer, which runs transactions v2 (KIP-890 part
  2) on Spate: commits, an abort, offsets sent to the transaction, the epoch bumped at
  every end (DescribeTransactions), a fenced producer, read_committed reading exactly
  the committed records.

The module is compiled with Maven offline (scripts/install-deps resolves its
dependencies once), only when pom.xml or a source changed. Java and Maven missing is a
skip on a developer's machine and a failure under CI=true (tests/README.md).
SPATE_JAVA_LOG_LEVEL (default warn) sets the Java client's log level (slf4j-simple)."""

import hashlib
import os
import subprocess
import time

import pytest

from helpers.broker import REPO_ROOT
from helpers.maven import maven_classpath
from test_cluster import cluster_args, wait_brokers

JAVA_DIR = REPO_ROOT / "tests" / "java"
TARGET = JAVA_DIR / "target"
CLASSES = TARGET / "classes"
RUN_TIMEOUT_S = 240

# Fast group formation; the Java consumer's own session timeout (45 s) is left as is.
GROUP_ARGS = ["--group-initial-rebalance-delay-ms", "300"]


def sources_digest():
    h = hashlib.sha256()
    files = [JAVA_DIR / "pom.xml"] + sorted((JAVA_DIR / "src").rglob("*"))
    for f in files:
        if f.is_file():
            h.update(str(f.relative_to(JAVA_DIR)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


@pytest.fixture(scope="session")
def java_classpath():
    """Compiles tests/java (offline) unless its sources are unchanged since the last
    build; returns the classpath for `java -cp`."""
    deps = maven_classpath(JAVA_DIR, sources_digest(), goals=("compile",), fresh_also=CLASSES.is_dir)
    return f"{CLASSES}:{deps}"


def run_java(classpath, main, *args, timeout=RUN_TIMEOUT_S, check=True):
    """Runs spate.javatest.<main>; with `check`, asserts it exited 0 and printed its PASS
    line. Returns (exit code, output)."""
    level = os.environ.get("SPATE_JAVA_LOG_LEVEL", "warn")
    cmd = ["java", f"-Dorg.slf4j.simpleLogger.defaultLogLevel={level}",
           "-Dorg.slf4j.simpleLogger.showDateTime=true",
           "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
           "-cp", classpath, f"spate.javatest.{main}", *map(str, args)]
    started = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=JAVA_DIR, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
        pytest.fail(f"{main} did not finish within {timeout}s; output:\n{out}")
    out = r.stdout.decode(errors="replace")
    print(f"{main} {' '.join(map(str, args))}: {time.monotonic() - started:.1f}s\n{out}")
    if check:
        assert r.returncode == 0, f"{main} exited with {r.returncode}; output:\n{out}"
        assert any(line.startswith(f"[java-check] PASS: {main}") for line in out.splitlines()), out
    return r.returncode, out


def start_cluster(broker_factory):
    """Three brokers on the embedded coordinator, one core each."""
    first = broker_factory(*cluster_args(1), *GROUP_ARGS, name="b1", cores=1)
    brokers = [first]
    for i in (2, 3):
        brokers.append(broker_factory(*cluster_args(i), *GROUP_ARGS, "--coordinator", first.bootstrap,
                                      name=f"b{i}", cores=1))
    wait_brokers(first.bootstrap, {b.port for b in brokers})
    return brokers


@pytest.fixture(params=["single", "cluster"])
def setup(request, broker_factory):
    """(bootstrap, replication factor, broker count) for a single broker or a cluster.
    The cluster's bootstrap is broker 2, not the coordinator's broker."""
    if request.param == "single":
        b = broker_factory(*GROUP_ARGS, cores=2)
        return b.bootstrap, 1, 1
    brokers = start_cluster(broker_factory)
    return brokers[1].bootstrap, 3, 3


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("assignors", ["default", "cooperative"])
def test_java_producer_and_consumer_group(java_classpath, setup, assignors):
    bootstrap, rf, _ = setup
    run_java(java_classpath, "ProduceAndGroup", bootstrap, rf, assignors)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_java_admin_client(java_classpath, setup):
    bootstrap, rf, brokers = setup
    run_java(java_classpath, "AdminCheck", bootstrap, rf, brokers)


@pytest.mark.timeout(120)
def test_java_consumer_group_protocol_kip848(java_classpath, broker_factory):
    """The Java consumer with group.protocol=consumer (KIP-848) on Spate's broker-side
    assignor."""
    b = broker_factory(*GROUP_ARGS)
    rc, out = run_java(java_classpath, "ConsumerProtocol", b.bootstrap, timeout=90, check=False)
    assert rc == 0, f"ConsumerProtocol exited with {rc}; output:\n{out}"
    assert "[java-check] PASS: ConsumerProtocol" in out, out


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_java_transactions_v2(java_classpath, broker_factory):
    """The transactional Java producer at its defaults on a three-broker cluster, where it
    runs transactions v2 (KIP-890 part 2): the partitions and the group's offsets
    partition join through their leaders (most of them on another broker than the
    transaction coordinator), every end bumps the epoch."""
    brokers = start_cluster(broker_factory)
    run_java(java_classpath, "Transactions", brokers[1].bootstrap, 3)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_java_codecs_and_offsets(java_classpath, setup):
    bootstrap, rf, _ = setup
    run_java(java_classpath, "CodecsAndOffsets", bootstrap, rf)

