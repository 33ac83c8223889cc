#!/bin/bash
# Consume throughput of two broker binaries over the same backlog, alternated.
# Usage: bench/consume_ab.sh OLD_BIN NEW_BIN [ROUNDS=3]
# One shard, fsync never. spate-bench writes ~20 s of 1 KiB records (128 KiB batches)
# into 8 partitions with OLD_BIN; then each round restarts the broker on that data
# directory with OLD_BIN, then NEW_BIN, and drains the whole backlog twice: spate-bench
# (`--producers 0 --consume-from earliest`) and kcat (librdkafka). The page cache is
# warm for both binaries (the first, unreported drain warms it). The broker's CPU time
# (user + system, from /proc) over both drains is printed too: on a 2-core machine the
# clients bound the MB/s, so the broker's CPU per drain is the more telling number.
set -u
OLD=$1; NEW=$2; ROUNDS=${3:-3}
BENCH=$(dirname "$0")/../target/release/spate-bench
D=/tmp/consume-ab; rm -rf $D; mkdir -p $D
PORT=39411
serve() { $1 serve --data-dir $D/data --listen 127.0.0.1:$PORT --cores 1 --fsync never > $D/broker.log 2>&1 & PID=$!
  for _ in $(seq 1 100); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done; sleep 0.5; }
cpu_s() { awk -v hz=$(getconf CLK_TCK) '{printf "%.2f", ($14+$15)/hz}' /proc/$PID/stat; }
stop() { kill $PID; wait $PID 2>/dev/null; sleep 1; }
drain_bench() { $BENCH --bootstrap 127.0.0.1:$PORT --topic r --partitions 8 --producers 0 --consumers 1 \
  --consume-from earliest --duration 60 --message-size 1024 2>&1 | grep -iE 'consum.*MB/s|MB/s' | tail -1; }
drain_kcat() { local s=$(date +%s.%N)
  kcat -b 127.0.0.1:$PORT -C -t r -o beginning -e -q -X fetch.max.bytes=52428800 > /dev/null 2>$D/kcat.err
  echo "kcat $(echo "$MB / ($(date +%s.%N) - $s)" | bc) MB/s"; }
serve $OLD
$BENCH --bootstrap 127.0.0.1:$PORT --topic r --partitions 8 --create-topic --producers 1 --acks 1 \
  --duration 20 --message-size 1024 --batch-bytes 131072 --linger-ms 5 > $D/prod.txt 2>&1
MB=$(( $(du -sb $D/data | cut -f1) / 1048576 ))
echo "backlog: ${MB} MB"
drain_kcat > /dev/null
stop
for r in $(seq 1 $ROUNDS); do
  for b in old new; do
    if [ $b = old ]; then serve $OLD; else serve $NEW; fi
    c0=$(cpu_s)
    echo "round $r $b: spate-bench $(drain_bench) | $(drain_kcat) | broker CPU $(echo "$(cpu_s) - $c0" | bc) s for both drains"
    stop
  done
done
