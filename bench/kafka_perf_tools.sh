#!/bin/bash
# Apache Kafka's own perf tools against one Spate broker: kafka-producer-perf-test
# (org.apache.kafka.tools.ProducerPerformance) then kafka-consumer-perf-test
# (org.apache.kafka.tools.ConsumerPerformance), both from the kafka-tools 4.4.0 jar that
# tests/kafka-tools/pom.xml pins (resolved offline by scripts/install-deps), with the Java
# client at its defaults (acks=all, idempotence on) apart from what each tool sets.
# Prints both tools' summary lines. The broker waits for its port before the tools start.
# Usage: bench/kafka_perf_tools.sh  (needs target/release/spate, java, mvn;
# RECORDS=1000000, RECORD_SIZE=1024, PARTITIONS=8, FSYNC=never|always, PORT=49291)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/target/release/spate
TOOLS=$ROOT/tests/kafka-tools
RECORDS=${RECORDS:-1000000}
RECORD_SIZE=${RECORD_SIZE:-1024}
PARTITIONS=${PARTITIONS:-8}
PORT=${PORT:-49291}
D=$(mktemp -d /tmp/bench-kafka-perf.XXXX)
(cd "$TOOLS" && mvn -o -q -B dependency:build-classpath -Dmdep.outputFile="$D/classpath.txt") \
    || { echo "kafka-tools not resolved: run scripts/install-deps" >&2; exit 1; }
CP=$(cat "$D/classpath.txt")
tool() { java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$CP" "org.apache.kafka.tools.$1" "${@:2}"; }

$B serve --listen 127.0.0.1:$PORT --data-dir $D/data --fsync "${FSYNC:-never}" > $D/broker.log 2>&1 &
BROKER=$!
trap 'kill $BROKER 2>/dev/null; wait 2>/dev/null; rm -rf $D' EXIT
for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break
    sleep 0.1  # polling the port, with a bound of 10 s
done

tool TopicCommand --bootstrap-server 127.0.0.1:$PORT --create --topic perf \
    --partitions "$PARTITIONS" --replication-factor 1 > /dev/null
echo "kafka-producer-perf-test: $RECORDS records of $RECORD_SIZE bytes, $PARTITIONS partitions," \
    "fsync=${FSYNC:-never}, $(nproc) cores"
tool ProducerPerformance --topic perf --num-records "$RECORDS" --record-size "$RECORD_SIZE" \
    --throughput -1 --producer-props bootstrap.servers=127.0.0.1:$PORT | tail -1
echo "kafka-consumer-perf-test: the same records"
tool ConsumerPerformance --bootstrap-server 127.0.0.1:$PORT --topic perf --num-records "$RECORDS" \
    --timeout 60000
