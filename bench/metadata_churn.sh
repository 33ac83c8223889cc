#!/bin/bash
# Produce tail latency with and without metadata churn, side by side in one run.
#
# One spate broker on a real ZooKeeper (--metadata zookeeper://...), fsync never.
# spate-bench produces at a fixed rate (coordinated-omission corrected) for DURATION
# seconds, once quiet and once while bench/admin_churn.py creates, alters and deletes
# topics in a loop through the same broker. Each binary given is run ROUNDS times,
# alternating, and one line per run is printed: publish p50/p99/p99.9/max and the admin
# operations done meanwhile.
#
# Usage: bench/metadata_churn.sh SPATE_BIN [SPATE_BIN...]
#   RATE (msg/s, 5000), DURATION (s, 20), ROUNDS (2), SIZE (bytes, 1024),
#   CHURN_ARGS (passed to admin_churn.py: --read-only makes the same loop change nothing),
#   CHURN_ELSEWHERE=1 (a third run per round: the same loop against a second, independent
#   broker on the same ZooKeeper (a chroot of its own) while the first one is measured:
#   the CPU and disk the churn takes on this machine, without the measured broker
#   seeing any metadata change),
#   ZK_LOG_DIR (ZooKeeper's dataLogDir, its fsynced transaction log; default: beside its
#   snapshots under /tmp, on the broker's disk. ZooKeeper's admin guide asks for a device
#   of its own; a tmpfs path such as /dev/shm/zk stands in for one here)
# Needs: Debian's zookeeper package (scripts/install-deps), .venv (confluent-kafka),
#   cargo build --release -p spate-bench.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SB=$ROOT/target/release/spate-bench
PY=$ROOT/.venv/bin/python
RATE=${RATE:-5000}; DURATION=${DURATION:-20}; ROUNDS=${ROUNDS:-2}; SIZE=${SIZE:-1024}
ZK_JAR=/usr/share/java/zookeeper.jar
WORK=$(mktemp -d /tmp/churn-bench.XXXX)
ZK_PORT=39181; PORT=39092

cat > $WORK/zoo.cfg <<EOF
tickTime=500
dataDir=$WORK/zk
${ZK_LOG_DIR:+dataLogDir=$ZK_LOG_DIR}
clientPort=$ZK_PORT
clientPortAddress=127.0.0.1
admin.enableServer=false
maxClientCnxns=0
EOF
mkdir -p $WORK/zk ${ZK_LOG_DIR:-}
java -cp /etc/zookeeper/conf:$ZK_JAR org.apache.zookeeper.server.ZooKeeperServerMain $WORK/zoo.cfg > $WORK/zk.log 2>&1 &
ZK_PID=$!
trap 'kill $ZK_PID 2>/dev/null; rm -rf $WORK ${ZK_LOG_DIR:-}' EXIT
for _ in $(seq 1 100); do (echo > /dev/tcp/127.0.0.1/$ZK_PORT) 2>/dev/null && break; sleep 0.2; done

run() { # label bin churn(0|1) round
    local label=$1 bin=$2 churn=$3 round=$4 data=$WORK/data
    rm -rf $data
    $bin serve --data-dir $data --listen 127.0.0.1:$PORT --fsync never --node-id 1 \
        --metadata "zookeeper://127.0.0.1:$ZK_PORT/churn-$label-$round-$churn" > $WORK/broker.log 2>&1 &
    local pid=$!
    for _ in $(seq 1 100); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
    sleep 1
    local admin_pid="" other_pid="" target=$PORT
    if [ "$churn" = elsewhere ]; then
        target=$((PORT + 1))
        rm -rf $data-other
        $bin serve --data-dir $data-other --listen 127.0.0.1:$target --fsync never --node-id 1 \
            --metadata "zookeeper://127.0.0.1:$ZK_PORT/churn-other-$label-$round" > $WORK/broker-other.log 2>&1 &
        other_pid=$!
        for _ in $(seq 1 100); do (echo > /dev/tcp/127.0.0.1/$target) 2>/dev/null && break; sleep 0.1; done
        sleep 1
    fi
    if [ "$churn" != 0 ]; then
        $PY $ROOT/bench/admin_churn.py 127.0.0.1:$target $((DURATION + 4)) ${CHURN_ARGS:-} > $WORK/admin.txt 2>&1 &
        admin_pid=$!
    fi
    $SB --bootstrap 127.0.0.1:$PORT --topic load --partitions 8 --create-topic --producers 1 --acks 1 \
        --rate $RATE --duration $DURATION --warmup 2 --message-size $SIZE --batch-bytes 131072 --linger-ms 1 \
        --in-flight 5 --json $WORK/p.json > $WORK/bench.txt 2>&1
    local admin="-"
    if [ -n "$admin_pid" ]; then wait $admin_pid; admin=$(tail -1 $WORK/admin.txt); fi
    "$PY" - "$label" "$churn" "$admin" $WORK/p.json <<'PY'
import json, sys
label, churn, admin, path = sys.argv[1:5]
l = json.load(open(path))["publish_latency"]
print(f"{label:>6} churn={churn}  publish ms p50 {l['p50_ms']:.3f}  p99 {l['p99_ms']:.3f}  "
      f"p99.9 {l['p999_ms']:.3f}  max {l['max_ms']:.3f}  n={l['count']}  admin: {admin}")
PY
    kill $pid; wait $pid 2>/dev/null
    if [ -n "$other_pid" ]; then kill $other_pid; wait $other_pid 2>/dev/null; fi
}

echo "rate=$RATE msg/s x $SIZE B, acks=1, 8 partitions, ${DURATION}s, fsync never, ZooKeeper metadata"
for round in $(seq 1 $ROUNDS); do
    i=0
    for bin in "$@"; do
        i=$((i + 1))
        run "bin$i" "$bin" 0 $round
        run "bin$i" "$bin" 1 $round
        if [ "${CHURN_ELSEWHERE:-0}" = 1 ]; then run "bin$i" "$bin" elsewhere $round; fi
    done
done
