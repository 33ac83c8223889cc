#!/bin/bash
# TLS against plain text, side by side on one Spate broker: Apache Kafka's
# kafka-producer-perf-test and kafka-consumer-perf-test (the Java client at its defaults:
# acks=all, idempotence on) through the broker's PLAINTEXT listener, then through its SSL
# listener (rustls on the broker, TLS 1.3; the Java client's JSSE), alternating ROUNDS
# times on fresh topics. Certificates are made with openssl for the run.
# Usage: bench/tls.sh  (needs target/release/spate, java, mvn, openssl;
# RECORDS=300000, RECORD_SIZE=1024, PARTITIONS=8, ROUNDS=2, FSYNC=never|always)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/target/release/spate
TOOLS=$ROOT/tests/kafka-tools
RECORDS=${RECORDS:-300000}
RECORD_SIZE=${RECORD_SIZE:-1024}
PARTITIONS=${PARTITIONS:-8}
ROUNDS=${ROUNDS:-2}
PLAIN=${PLAIN_PORT:-49391}
TLS=${TLS_PORT:-49392}
D=$(mktemp -d /tmp/bench-tls.XXXX)
(cd "$TOOLS" && mvn -o -q -B dependency:build-classpath -Dmdep.outputFile="$D/classpath.txt") \
    || { echo "kafka-tools not resolved: run scripts/install-deps" >&2; exit 1; }
CP=$(cat "$D/classpath.txt")
tool() { java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$CP" "org.apache.kafka.tools.$1" "${@:2}"; }

cd "$D"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=bench-ca 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost 2>/dev/null
echo "subjectAltName=DNS:localhost,IP:127.0.0.1" > san.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 \
    -extfile san.ext 2>/dev/null
cat server.key server.pem > keystore.pem
printf 'ssl_keystore_location = "%s"\n' "$D/keystore.pem" > broker.toml
printf 'security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location=%s\n' "$D/ca.pem" > ssl.properties
: > plain.properties

$B serve --config broker.toml --data-dir $D/data --fsync "${FSYNC:-never}" \
    --listeners "PLAINTEXT://127.0.0.1:$PLAIN,SSL://127.0.0.1:$TLS" > $D/broker.log 2>&1 &
BROKER=$!
trap 'kill $BROKER 2>/dev/null; wait 2>/dev/null; rm -rf $D' EXIT
for _ in $(seq 100); do
    (exec 3<>/dev/tcp/127.0.0.1/$PLAIN) 2>/dev/null && break
    sleep 0.1  # polling the port, with a bound of 10 s
done

echo "$RECORDS records of $RECORD_SIZE bytes, $PARTITIONS partitions, fsync=${FSYNC:-never}, $(nproc) cores"
for round in $(seq "$ROUNDS"); do
    for kind in plain ssl; do
        port=$PLAIN; [ $kind = ssl ] && port=$TLS
        topic=perf-$kind-$round
        tool TopicCommand --bootstrap-server 127.0.0.1:$PLAIN --create --topic $topic \
            --partitions "$PARTITIONS" --replication-factor 1 > /dev/null
        printf 'round %s %-5s produce: ' "$round" "$kind"
        tool ProducerPerformance --topic $topic --num-records "$RECORDS" --record-size "$RECORD_SIZE" \
            --throughput -1 --producer.config $kind.properties \
            --producer-props bootstrap.servers=127.0.0.1:$port | tail -1
        printf 'round %s %-5s consume: ' "$round" "$kind"
        tool ConsumerPerformance --bootstrap-server 127.0.0.1:$port --topic $topic \
            --num-records "$RECORDS" --timeout 60000 --command-config $kind.properties | tail -1
    done
done
