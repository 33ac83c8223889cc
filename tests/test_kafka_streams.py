"""Kafka Streams against the real broker: the word count of Kafka Streams' examples
(tests/kafka-streams, WordCount.java; kafka-streams 4.4.0 with its kafka-clients 4.4.0,
pinned in tests/kafka-streams/pom.xml and resolved by scripts/install-deps), one
broker.

The topology splits each line of the input topic into words, re-keys by word (groupBy:
Streams writes the words through a repartition topic it creates,
<application.id>-word-counts-repartition) and counts them in a persistent (RocksDB)
key-value store, "word-counts", backed by a changelog topic Streams creates compacted
(<application.id>-word-counts-changelog); every change of a count goes to the output
topic (key: the word, value: its count as an 8-byte big-endian long). Streams keeps
its defaults and its clients': the Java producer's (idempotent, acks=all), the
consumers', commit.interval.ms (30 s under at-least-once, 100 ms under exactly-once),
the record cache (10 MB: a count reaches the changelog and the output when the cache is
flushed, at each commit), session.timeout.ms (45 s). Set are only what Streams requires
(application.id, bootstrap.servers), state.dir (a per-test folder) and, in the second
test, processing.guarantee. The broker runs with --group-initial-rebalance-delay-ms 300,
as in the other group tests.

The test produces FIRST_LINES lines of words with known counts (confluent-kafka), starts
the app and waits until the output topic's latest record for every word is that word's
count, exactly. Then:
- the two internal topics exist with the input's 3 partitions, and DescribeConfigs shows
  the configs Streams set on them and nothing else: the changelog {cleanup.policy=compact,
  message.timestamp.type=CreateTime}, the repartition topic {cleanup.policy=delete,
  retention.ms=-1, segment.bytes=52428800, message.timestamp.type=CreateTime};
- the store (an interactive query) and the changelog's latest record per word hold the
  same counts.
The group's committed offsets are waited for at the input's and the repartition topic's
end offsets (everything of the first batch committed). Then the first half of a second
batch is produced and, as soon as the app has started on it (the repartition topic
grows), the JVM is killed with kill -9. The second half is produced while it is down,
and a new instance is started on an empty state directory (the old one was lost with
its machine), so its store can only come from the changelog.

What the restart is checked for:
- restoration: for each changelog partition one restore_start (StateRestoreListener)
  from offset 0 to the changelog's end offset after the kill, and one restore_end whose
  count is the number of records in the changelog below that offset (read back with
  confluent-kafka);
- then, once the group's committed offsets are at the end offsets of the input and the
  repartition topic (Streams commits only after flushing its cache and its producer, so
  the output is final then): the store, the changelog's latest record per word and the
  output's latest record per word hold the same counts, for the same words, exactly the
  words of the input;
- at-least-once, exactly as Streams recovers: the new instance restores each count from
  the changelog (its latest record there), then resumes both sub-topologies at the
  group's committed offsets, so what the killed app had done since its last commit is
  done again: its input lines at or past the committed input offsets go to the
  repartition topic a second time, and its repartition records at or past the committed
  repartition offsets are counted a second time. So for every word, exactly:
      final(w) = restored(w)
               + its records in the repartition topic in [committed, end) at the kill
               + its occurrences in the input in [committed at the kill, end)
  every term read from the broker (the repartition records before the new instance
  purges them). And never below the true count: nothing is lost. With the kill this
  early the killed app has not committed any of the second batch, so typically a
  couple of thousand words are counted twice (printed); how many depends on how far it
  got, which the formula reads back rather than assumes.

test_kafka_streams_word_count_exactly_once runs the same with
processing.guarantee=exactly_once_v2, except that after the restart the counts must be
the true counts, nothing counted twice (what it waits for: read committed, the output
shows only committed transactions, and a transaction commits the offsets with the
output, so the first batch's visible counts also stand for its commit); and the restore
may end below the changelog's end offset (read committed: at the last stable offset,
before a transaction the killed app left open, which the broker aborts after
transaction.timeout.ms).

If the producer's TransactionManager log ever shows FindCoordinator refusing a
transaction key again ("transactions are not supported yet", the answer before issue
13), the test fails at once with TransactionsUnsupported instead of waiting out
Streams' timeouts.

The module is compiled with Maven offline, only when pom.xml or the source changed.
Java and Maven missing is a skip on a developer's machine and a failure under CI=true
(tests/README.md). SPATE_STREAMS_LOG_LEVEL (default info) sets the app's log level
(slf4j-simple); the tail of its log is printed when the test fails."""

import collections
import hashlib
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import threading
import time

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, TopicPartition
from confluent_kafka.admin import ConfigResource

from helpers.broker import REPO_ROOT
from helpers.clients import admin, cf_conf, cf_produce, create_topic
from helpers.maven import maven_classpath

STREAMS_DIR = REPO_ROOT / "tests" / "kafka-streams"
CLASSES = STREAMS_DIR / "target" / "classes"

INPUT = "wordcount-lines"
OUTPUT = "wordcount-counts"
PARTITIONS = 3
STORE = "word-counts"
FIRST_LINES = 4000
SECOND_LINES = 4000  # half before the kill, half while the app is down
VOCABULARY = 400

# What Kafka Streams 4.4 sets on the topics it creates (InternalTopicManager: the
# changelog of an unwindowed key-value store; a repartition topic). DescribeConfigs must
# show exactly these as the topics' own configs (source DYNAMIC_TOPIC_CONFIG).
CHANGELOG_CONFIGS = {"cleanup.policy": "compact", "message.timestamp.type": "CreateTime"}
REPARTITION_CONFIGS = {"cleanup.policy": "delete", "message.timestamp.type": "CreateTime",
                       "retention.ms": "-1", "segment.bytes": "52428800"}
DYNAMIC_TOPIC_CONFIG = 1

# JVM start, the first rebalance, processing, and the first commit (commit.interval.ms,
# 30 s). After the kill -9 the new instance's group completes its rebalance only once the
# broker expired the killed member (session.timeout.ms, 45 s), then a commit.
FIRST_TIMEOUT_S = 150
RESTART_TIMEOUT_S = 200
READ_TIMEOUT_S = 60

GROUP_ARGS = ["--group-initial-rebalance-delay-ms", "300"]

# Spate's FindCoordinator answer to a transaction coordinator key (issue 13), as the
# Java producer's TransactionManager logs it at TRACE.
TXN_UNSUPPORTED = "errorCode=15, errorMessage='transactions are not supported yet'"
TXN_LOGGER = "org.apache.kafka.clients.producer.internals.TransactionManager"


class TransactionsUnsupported(AssertionError):
    """The Streams app's transactional producer was told that the broker has no
    transaction coordinator."""


def sources_digest():
    h = hashlib.sha256()
    for f in [STREAMS_DIR / "pom.xml"] + sorted((STREAMS_DIR / "src").rglob("*")):
        if f.is_file():
            h.update(str(f.relative_to(STREAMS_DIR)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


@pytest.fixture(scope="session")
def streams_classpath():
    """Compiles tests/kafka-streams (offline) unless its sources are unchanged since the
    last build; returns the classpath for `java -cp`."""
    deps = maven_classpath(STREAMS_DIR, sources_digest(), goals=("compile",), fresh_also=CLASSES.is_dir)
    return f"{CLASSES}:{deps}"


# ---------------------------------------------------------------- the input

def vocabulary():
    """VOCABULARY distinct lowercase words of 1 to 12 letters."""
    rng = random.Random(19)
    words = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 12))))
    return sorted(words)


def make_lines(seed, count):
    """`count` lines of 1 to 12 words separated by single spaces, words drawn with
    Zipf-like weights (a few words thousands of times, many a handful)."""
    words = vocabulary()
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(len(words))]
    return [" ".join(rng.choices(words, weights, k=rng.randint(1, 12))) for _ in range(count)]


def word_counts(lines):
    return collections.Counter(w for line in lines for w in line.split(" "))


def produce_lines(bootstrap, lines):
    """Keyless records, one per line, round-robin over the partitions. (Left to
    librdkafka's sticky partitioner, a fast run put every line in one partition, and
    Streams commits nothing for a partition it never read: CI on 6d83df1 waited 150 s
    for committed offsets on two empty partitions.)"""
    cf_produce(bootstrap, INPUT, [{"value": line.encode(), "partition": i % PARTITIONS} for i, line in enumerate(lines)],
               timeout=60)


# ---------------------------------------------------------------- the app

class StreamsApp:
    """One WordCount JVM. Its events (stdout, "EVENT {json}") are collected by a reader
    thread; its log (stderr) goes to a file."""

    def __init__(self, classpath, workdir, name, bootstrap, application_id, guarantee):
        self.classpath = classpath
        self.name = name
        self.state_dir = workdir / f"{name}-state"
        self.log_path = workdir / f"{name}.log"
        self.events_path = workdir / f"{name}.events"
        self.args = [bootstrap, application_id, INPUT, OUTPUT, self.state_dir, guarantee]
        self.guarantee = guarantee
        self.events = []
        self.lock = threading.Lock()
        self.proc = None
        self.reader = None
        self.queries = 0

    def start(self):
        level = os.environ.get("SPATE_STREAMS_LOG_LEVEL", "info")
        cmd = ["java", f"-Dorg.slf4j.simpleLogger.defaultLogLevel={level}",
               "-Dorg.slf4j.simpleLogger.showDateTime=true",
               "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS"]
        if self.guarantee != "default":
            # The transactional producer's requests and answers (TRACE), to tell why it waits.
            cmd.append(f"-Dorg.slf4j.simpleLogger.log.{TXN_LOGGER}=trace")
        cmd += ["-cp", self.classpath, "spate.streams.WordCount", *map(str, self.args)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True)
        self.reader = threading.Thread(target=self._read_events, daemon=True)
        self.reader.start()

    def _read_events(self):
        with open(self.events_path, "wb") as out:
            for raw in self.proc.stdout:
                out.write(raw)
                out.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                if line.startswith("EVENT "):
                    with self.lock:
                        self.events.append(json.loads(line[len("EVENT "):]))

    def events_of(self, kind):
        with self.lock:
            return [e for e in self.events if e["event"] == kind]

    def assert_running(self):
        """Fails at once if the JVM exited, Streams reported an uncaught exception, or
        (exactly-once) the broker told its producer that it has no transactions."""
        errors = self.events_of("error")
        assert not errors, f"{self.name}: Streams failed: {errors}"
        rc = self.proc.poll()
        assert rc is None, f"{self.name}: the Streams JVM exited with {rc}"
        if self.guarantee != "default":
            refused = next((line for line in self.log_lines() if TXN_UNSUPPORTED in line), None)
            if refused is not None:
                raise TransactionsUnsupported(
                    f"{self.name}: the broker has no transaction coordinator; the producer logged:\n{refused}")

    def query_store(self, timeout=30):
        """The store's contents, {word: count}, by an interactive query (retried while
        the store cannot be queried, during a rebalance)."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            self.assert_running()
            self.queries += 1
            qid = str(self.queries)
            self.proc.stdin.write(f"store {qid}\n".encode())
            self.proc.stdin.flush()
            answer = wait_for(f"{self.name}: the answer to store query {qid}",
                              lambda: next((e for e in self.events_of("store") if e["id"] == qid), None),
                              lambda e: e is not None, 30, self)
            if "counts" in answer:
                return answer["counts"]
            last = answer["error"]
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: the store could not be queried within {timeout}s: {last}")
            time.sleep(0.5)

    def kill(self):
        """kill -9 and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        if self.reader is not None:
            self.reader.join(10)

    def log_lines(self):
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def log_tail(self, max_lines=150):
        return "\n".join(line[:2000] for line in self.log_lines()[-max_lines:])


@pytest.fixture
def streams_app(streams_classpath, tmp_path):
    """make(name, bootstrap, application_id, guarantee) -> a StreamsApp, not started;
    every app is killed at teardown."""
    apps = []

    def make(name, bootstrap, application_id, guarantee):
        app = StreamsApp(streams_classpath, tmp_path, name, bootstrap, application_id, guarantee)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.kill()


# ---------------------------------------------------------------- reading the broker

def wait_for(what, read, done, timeout, app=None, interval=0.5):
    """Polls read() until done(value) (failing at once if `app` failed); returns the
    value. AssertionError with the last value after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if app is not None:
            app.assert_running()
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            shown = value
            if isinstance(value, list) and len(value) > 10:
                shown = f"{len(value)} items, first {value[:10]}"
            raise AssertionError(f"{what}: not within {timeout}s; last seen: {shown}")
        time.sleep(interval)


def end_offsets(bootstrap, topic):
    c = Consumer(cf_conf(bootstrap, **{"group.id": "spate-streams-watermarks"}))
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in range(PARTITIONS)}
    finally:
        c.close()


def committed_offsets(bootstrap, group, topic):
    """{partition: offset} `group` committed on `topic` (-1001 where none)."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    a = admin(bootstrap)  # kept referenced until the future is done
    fs = a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)], request_timeout=15)
    return {tp.partition: tp.offset for tp in fs[group].result(20).topic_partitions}


def read_range(bootstrap, topic, ranges):
    """The records of `topic` in [start, end) per partition, ranges {partition: (start,
    end)}: {partition: [Message]}, read committed (librdkafka's default). A partition is
    read once a record at end - 1 or beyond came, or the end of the partition at or past
    `end` (past control records, under transactions). A start the broker no longer has
    is an error (auto.offset.reset=error), not a silent jump."""
    c = Consumer(cf_conf(bootstrap, **{"group.id": "spate-streams-reader", "enable.auto.commit": False,
                                        "enable.partition.eof": True, "auto.offset.reset": "error"}))
    got = {p: [] for p in ranges}
    done = {p for p, (start, end) in ranges.items() if start >= end}
    try:
        c.assign([TopicPartition(topic, p, start) for p, (start, _) in ranges.items()])
        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(done) < len(ranges):
            assert time.monotonic() < deadline, (
                f"{topic}: not read up to {ranges} within {READ_TIMEOUT_S}s; read"
                f" { {p: len(ms) for p, ms in got.items()} }, done {sorted(done)}")
            m = c.poll(0.2)
            if m is None:
                continue
            p = m.partition()
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    if m.offset() >= ranges[p][1]:
                        done.add(p)
                    continue
                assert m.error().retriable(), f"{topic}: {m.error()}"
                continue
            if m.offset() < ranges[p][1]:
                got[p].append(m)
            if m.offset() >= ranges[p][1] - 1:
                done.add(p)
    finally:
        c.close()
    return got


def read_all(bootstrap, topic):
    """Everything in `topic` between its log start and end offsets now."""
    c = Consumer(cf_conf(bootstrap, **{"group.id": "spate-streams-watermarks"}))
    try:
        ranges = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15) for p in range(PARTITIONS)}
    finally:
        c.close()
    return read_range(bootstrap, topic, ranges)


def latest_counts(records):
    """{word: count} from the latest of each word's records, {partition: [Message]} of an
    output or changelog topic (String keys, 8-byte big-endian long values). Asserts that
    each word's records are all in one partition (Streams partitions by key)."""
    latest = {}
    partition_of = {}
    for p, msgs in records.items():
        for m in msgs:
            word = m.key().decode()
            assert partition_of.setdefault(word, p) == p, f"{word!r} in partitions {partition_of[word]} and {p}"
            (latest[word],) = struct.unpack(">q", m.value())
    return latest


def topic_configs(bootstrap, topic):
    """The configs set on `topic` itself, by DescribeConfigs."""
    a = admin(bootstrap)  # kept referenced until the future is done
    fs = a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)], request_timeout=15)
    entries = next(iter(fs.values())).result(20)
    return {name: e.value for name, e in entries.items() if e.source == DYNAMIC_TOPIC_CONFIG}


def count_differences(want, got):
    """Words whose count differs: [(word, want, got)], the most off first."""
    diff = [(w, want.get(w), got.get(w)) for w in set(want) | set(got) if want.get(w) != got.get(w)]
    return sorted(diff, key=lambda d: -abs((d[1] or 0) - (d[2] or 0)))


def wait_committed(app, bootstrap, group, internal_repartition, timeout):
    """Waits until the group's committed offsets are the end offsets of the input and of
    the repartition topic (input first: once it is all committed, nothing more goes
    to the repartition topic). Returns (input ends, repartition ends)."""
    def read():
        ends_in = end_offsets(bootstrap, INPUT)
        committed_in = committed_offsets(bootstrap, group, INPUT)
        ends_rep = end_offsets(bootstrap, internal_repartition)
        committed_rep = committed_offsets(bootstrap, group, internal_repartition)
        return ends_in, committed_in, ends_rep, committed_rep
    ends_in, _, ends_rep, _ = wait_for(
        f"{group}: committed offsets at the end offsets (input, input committed, repartition, repartition committed)",
        read, lambda v: v[0] == v[1] and v[2] == v[3], timeout, app)
    return ends_in, ends_rep


# ---------------------------------------------------------------- the test

def run_word_count(bootstrap, streams_app, guarantee):
    at_least_once = guarantee == "default"
    application_id = f"spate-wordcount-{guarantee.replace('_', '-')}"
    changelog = f"{application_id}-{STORE}-changelog"
    repartition = f"{application_id}-{STORE}-repartition"
    create_topic(bootstrap, INPUT, PARTITIONS)
    create_topic(bootstrap, OUTPUT, PARTITIONS)
    first = make_lines(1, FIRST_LINES)
    second = make_lines(2, SECOND_LINES)
    half = SECOND_LINES // 2
    expected = word_counts(first)
    produce_lines(bootstrap, first)

    app = streams_app("first", bootstrap, application_id, guarantee)
    started = time.monotonic()
    app.start()
    try:
        wait_for("the first batch's counts as the output's latest record per word",
                 lambda: count_differences(expected, latest_counts(read_all(bootstrap, OUTPUT))),
                 lambda diff: not diff, FIRST_TIMEOUT_S, app, interval=1)
        first_output_s = time.monotonic() - started

        md = admin(bootstrap).list_topics(timeout=15).topics
        for topic in (changelog, repartition):
            assert topic in md, f"Streams did not create {topic}; topics: {sorted(md)}"
            assert len(md[topic].partitions) == PARTITIONS, (topic, len(md[topic].partitions))
        assert topic_configs(bootstrap, changelog) == CHANGELOG_CONFIGS
        assert topic_configs(bootstrap, repartition) == REPARTITION_CONFIGS
        assert app.query_store() == dict(expected), "the store after the first batch"
        assert latest_counts(read_all(bootstrap, changelog)) == dict(expected), "the changelog after the first batch"

        # Everything of the first batch committed (under exactly-once the output is
        # visible only once its transaction, offsets included, committed); then half the
        # second batch, and the kill as soon as the app has started on it.
        if at_least_once:
            ends_in, ends_rep = wait_committed(app, bootstrap, application_id, repartition, FIRST_TIMEOUT_S)
        else:
            ends_in, ends_rep = end_offsets(bootstrap, INPUT), end_offsets(bootstrap, repartition)
        produce_lines(bootstrap, second[:half])
        wait_for(f"the app at work on the second batch (the repartition topic past {ends_rep})",
                 lambda: end_offsets(bootstrap, repartition),
                 lambda now: sum(now.values()) > sum(ends_rep.values()), FIRST_TIMEOUT_S, app, interval=0.05)
        app.kill()
    except BaseException:
        print(f"----- {app.name}: Streams log ({app.log_path}), last lines:\n{app.log_tail()}")
        raise

    # The rest of the second batch while the app is down. Then what the killed app left:
    # its committed offsets and the end offsets it wrote to, read after that produce, so
    # that nothing it had sent before the kill can still land.
    produce_lines(bootstrap, second[half:])
    expected.update(word_counts(second))
    committed_in = committed_offsets(bootstrap, application_id, INPUT)
    committed_rep = committed_offsets(bootstrap, application_id, repartition)
    killed_ends_rep = end_offsets(bootstrap, repartition)
    killed_ends_changelog = end_offsets(bootstrap, changelog)
    assert all(committed_in[p] >= ends_in[p] for p in range(PARTITIONS)), (committed_in, ends_in)
    if at_least_once:
        # Read now: once the new instance has committed past them, Streams purges them
        # (DeleteRecords).
        redo_rep = read_range(bootstrap, repartition, {p: (committed_rep[p], killed_ends_rep[p])
                                                       for p in range(PARTITIONS)})
    shutil.rmtree(app.state_dir)

    again = streams_app("restarted", bootstrap, application_id, guarantee)
    restarted = time.monotonic()
    again.start()
    try:
        wait_for("a restore_end for every changelog partition",
                 lambda: sorted(e["partition"] for e in again.events_of("restore_end")),
                 lambda got: got == list(range(PARTITIONS)), RESTART_TIMEOUT_S, again)
        restored_s = time.monotonic() - restarted
        starts = sorted((e["partition"], e["topic"], e["store"], e["starting_offset"])
                        for e in again.events_of("restore_start"))
        assert starts == [(p, changelog, STORE, 0) for p in range(PARTITIONS)], (
            f"restore_start events (partition, changelog, store, starting offset): {starts}")
        restored_to = {e["partition"]: e["ending_offset"] for e in again.events_of("restore_start")}
        if at_least_once:
            assert restored_to == killed_ends_changelog, (restored_to, killed_ends_changelog)
        else:
            # Read committed: up to the last stable offset, before a transaction the
            # killed app left open (aborted by the broker after transaction.timeout.ms).
            assert all(restored_to[p] <= killed_ends_changelog[p] for p in range(PARTITIONS)), (
                restored_to, killed_ends_changelog)

        if at_least_once:
            wait_committed(again, bootstrap, application_id, repartition, RESTART_TIMEOUT_S)
        else:
            wait_for("the final counts as the output's latest record per word",
                     lambda: count_differences(expected, latest_counts(read_all(bootstrap, OUTPUT))),
                     lambda diff: not diff, RESTART_TIMEOUT_S, again, interval=1)
        final_s = time.monotonic() - restarted
        output = latest_counts(read_all(bootstrap, OUTPUT))
        store = again.query_store()
        changelog_counts = latest_counts(read_all(bootstrap, changelog))
        assert set(output) == set(expected), sorted(set(output) ^ set(expected))[:10]
        assert store == output, f"store and output differ: {count_differences(output, store)[:10]}"
        assert changelog_counts == output, (
            f"changelog and output differ: {count_differences(output, changelog_counts)[:10]}")

        # The changelog is compacted, but only rolled segments are cleaned (1 GiB each
        # here): what the restore read is all still there.
        restored_from = {e["partition"]: e["starting_offset"] for e in again.events_of("restore_start")}
        restored = read_range(bootstrap, changelog, {p: (restored_from[p], restored_to[p]) for p in range(PARTITIONS)})
        totals = {e["partition"]: e["total_restored"] for e in again.events_of("restore_end")}
        assert totals == {p: len(restored[p]) for p in range(PARTITIONS)}, (totals, restored_to)

        if at_least_once:
            redo_in = read_range(bootstrap, INPUT, {p: (committed_in[p], end)
                                                    for p, end in end_offsets(bootstrap, INPUT).items()})
            predicted = collections.Counter(latest_counts(restored))
            predicted.update(m.key().decode() for ms in redo_rep.values() for m in ms)
            predicted.update(word_counts([m.value().decode() for ms in redo_in.values() for m in ms]))
            diff = count_differences(predicted, output)
            assert not diff, (f"{len(diff)} words whose count is not the restored count plus the records"
                              f" processed since the committed offsets (word, predicted, counted): {diff[:10]}")
            low = [(w, expected[w], output[w]) for w in expected if output[w] < expected[w]]
            assert not low, f"{len(low)} words counted less than they occur (word, true, counted): {low[:10]}"
        else:
            diff = count_differences(expected, output)
            assert not diff, f"{len(diff)} words with a wrong count (word, true, counted): {diff[:10]}"
        extra = sum(output[w] - expected[w] for w in expected)
        print(f"{guarantee}: first batch's counts in the output {first_output_s:.1f}s after the app started;"
              f" killed at committed input offsets {committed_in} (first batch's ends {ends_in}), repartition"
              f" {committed_rep} (ends {killed_ends_rep}); restored {sum(totals.values())} changelog records"
              f" {restored_s:.1f}s after the restart, final counts {final_s:.1f}s after it; counted {extra} words"
              f" more than they occur ({sum(1 for w in expected if output[w] > expected[w])} words over)")
    except BaseException:
        print(f"----- {again.name}: Streams log ({again.log_path}), last lines:\n{again.log_tail()}")
        raise


@pytest.mark.slow
@pytest.mark.timeout(3 * FIRST_TIMEOUT_S + 2 * RESTART_TIMEOUT_S + 120)
def test_kafka_streams_word_count_at_least_once(broker_factory, streams_app):
    b = broker_factory(*GROUP_ARGS, cores=2)
    run_word_count(b.bootstrap, streams_app, "default")


@pytest.mark.timeout(3 * FIRST_TIMEOUT_S + 2 * RESTART_TIMEOUT_S + 120)
def test_kafka_streams_word_count_exactly_once(broker_factory, streams_app):
    b = broker_factory(*GROUP_ARGS, cores=2)
    run_word_count(b.bootstrap, streams_app, "exactly_once_v2")
