#!/bin/bash
# Three brokers on one 2-core VM (one shard each), fsync never; librdkafka's
# rdkafka_performance producing 1 KiB messages to 8 partitions.
# Usage: bench/replication.sh   (needs target/release/spate and rdkafka_performance,
# which bench/compare.sh builds into ~/.cache/spate-bench; COUNT=messages per run)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/target/release/spate
RP=${RDKAFKA_PERF:-$HOME/.cache/spate-bench/librdkafka/examples/rdkafka_performance}
D=/tmp/benchrepl; rm -rf $D; mkdir -p $D
A="--cores 1"
$B serve --node-id 1 --listen 127.0.0.1:49091 --data-dir $D/d1 $A > $D/l1 2>&1 &
sleep 1
for n in 2 3; do $B serve --node-id $n --listen 127.0.0.1:4909$n --data-dir $D/d$n $A --coordinator 127.0.0.1:49091 > $D/l$n 2>&1 & done
sleep 2
BS=127.0.0.1:49091,127.0.0.1:49092,127.0.0.1:49093
$B topic create rf1 --partitions 8 --replication-factor 1 --bootstrap 127.0.0.1:49091 > /dev/null
$B topic create rf3 --partitions 8 --replication-factor 3 --config min.insync.replicas=2 --bootstrap 127.0.0.1:49091 > /dev/null
sleep 1
for t in rf1 rf3; do for acks in 1 -1; do
  out=$($RP -P -t $t -s 1024 -c ${COUNT:-1000000} -a $acks -b $BS -X linger.ms=5 -X batch.size=1000000 -q 2>&1 | grep -E "msgs/s|MB/s" | tail -1)
  echo "$t acks=$acks: $out"
done; done
kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf $D
