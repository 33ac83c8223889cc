"""What a healthy broker logs, and OffsetCommit's answer for an unknown topic.

A clean single-node start and stop used to log a WARN "broker fenced: no heartbeat
within broker.session.timeout.ms" about the broker itself (its restart fencing its
previous incarnation, and its controlled shutdown, were both reported as a missed
heartbeat), and one INFO line per partition ("leading", "opened partition": 100 lines
for `__consumer_offsets` alone) at every start."""

import re
import signal

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from helpers.clients import cf_conf, cf_produce, create_topic

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A start and a stop log a couple of dozen lines; one line per partition would be 100+.
LINES_PER_START_STOP_MAX = 40


def start_stop_lines(broker, start_no):
    """The log lines of start number `start_no` (1-based) of `broker`."""
    text = ANSI.sub("", broker.log_text())
    runs = re.split(r"\n===== start #\d+: .*\n", text)
    return [line for line in runs[start_no].splitlines() if line.strip()]


def test_clean_start_and_stop_log_no_warning_and_one_line_per_shard_for_roles(broker):
    create_topic(broker.bootstrap, "t", 3)
    cf_produce(broker.bootstrap, "t", [{"value": b"x", "partition": p} for p in range(3)])
    # A group's first FindCoordinator creates `__consumer_offsets` (50 partitions).
    c = Consumer(cf_conf(broker.bootstrap, **{"group.id": "g"}))
    try:
        assert commit_errors(c, [TopicPartition("t", 0, 1)]) == {("t", 0): None}
    finally:
        c.close()
    assert broker.stop(signal.SIGTERM) == 0
    broker.start()  # a restart: the registration fences the previous incarnation
    assert broker.stop(signal.SIGTERM) == 0
    for start_no in (1, 2):
        lines = start_stop_lines(broker, start_no)
        joined = "\n".join(lines)
        warnings = [line for line in lines if " WARN " in line or " ERROR " in line]
        assert not warnings, f"start #{start_no}: a clean start and stop warned:\n" + "\n".join(warnings)
        assert "stopped cleanly" in joined
        assert not [line for line in lines if re.search(r"INFO (leading|following|opened partition) ", line)], joined
        assert len(lines) <= LINES_PER_START_STOP_MAX, f"start #{start_no}: {len(lines)} lines:\n{joined}"
    restart = "\n".join(start_stop_lines(broker, 2))
    # The roles are still told, summarised: 53 partitions led over the shards.
    led = sum(int(n) for n in re.findall(r"partition roles taken .*?leading=(\d+)", restart))
    assert led == 53, restart
    assert "previous incarnation is fenced" in restart


def commit_errors(consumer, offsets):
    """{(topic, partition): error code or None} of a synchronous commit of `offsets`."""
    try:
        result = consumer.commit(offsets=offsets, asynchronous=False)
    except KafkaException as e:
        # librdkafka raises when any partition failed; the partitions are in the error's
        # args when it can tell them apart.
        return {"request": e.args[0].code()}
    return {(tp.topic, tp.partition): (tp.error.code() if tp.error else None) for tp in result}


def test_offset_commit_for_an_unknown_topic_gets_unknown_topic_or_partition(broker):
    create_topic(broker.bootstrap, "known", 1)
    c = Consumer(cf_conf(broker.bootstrap, **{"group.id": "g-unknown", "enable.auto.commit": False}))
    try:
        errors = commit_errors(c, [TopicPartition("no-such-topic", 0, 5)])
        codes = set(errors.values())
        assert codes == {KafkaError.UNKNOWN_TOPIC_OR_PART}, errors
        # A partition past a known topic's count is unknown too; the known one is
        # committed all the same.
        errors = commit_errors(c, [TopicPartition("known", 0, 7), TopicPartition("known", 4, 1)])
        if "request" not in errors:
            assert errors == {("known", 0): None, ("known", 4): KafkaError.UNKNOWN_TOPIC_OR_PART}, errors
        else:
            assert errors["request"] == KafkaError.UNKNOWN_TOPIC_OR_PART, errors
        committed = c.committed([TopicPartition("known", 0), TopicPartition("no-such-topic", 0)], timeout=10)
        by_tp = {(tp.topic, tp.partition): tp.offset for tp in committed}
        assert by_tp[("known", 0)] == 7, by_tp
        assert by_tp[("no-such-topic", 0)] < 0, f"an unknown topic's offset was stored: {by_tp}"
    finally:
        c.close()
