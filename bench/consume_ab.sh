#!/bin/bash
# Consume throughput of two broker binaries over the same backlog, alternated.
# Usage: bench/consume_ab.sh OLD_BIN NEW_BIN [ROUNDS=3]
# CORES=1 shards, fsync never. The backlog is ~20 s of 1 KiB records in 8 partitions,
# written with OLD_BIN by spate-bench (128 KiB batches, every partition), or with
# BACKLOG=rdkafka by rdkafka_performance at its defaults (linger.ms=1000, ~1 MB batches,
# sticky: nearly all in one partition; vs_kafka.sh's rdkafka consume row). Each round
# restarts the broker on that data directory with OLD_BIN, then NEW_BIN, and drains the
# whole backlog with spate-bench (`--producers 0 --consume-from earliest`), kcat
# (Debian's librdkafka) and, where bench/rdkafka_perf.sh has it, rdkafka_performance -C
# (current librdkafka). The page cache is warm for both binaries (the first, unreported
# drain warms it). The broker's CPU time (user + system, from /proc) over the drains is
# printed too: on a 2-core machine the clients bound the MB/s, so the broker's CPU per
# drain is the more telling number.
set -u
OLD=$1; NEW=$2; ROUNDS=${3:-3}
BENCH=$(dirname "$0")/../target/release/spate-bench
D=/tmp/consume-ab; rm -rf $D; mkdir -p $D
PORT=39411
CORES=${CORES:-1}
RDK=$("$(dirname "$0")/rdkafka_perf.sh" 2>/dev/null || true)
serve() { $1 serve --data-dir $D/data --listen 127.0.0.1:$PORT --cores $CORES --fsync never > $D/broker.log 2>&1 & PID=$!
  for _ in $(seq 1 100); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done; sleep 0.5; }
cpu_s() { awk -v hz=$(getconf CLK_TCK) '{printf "%.2f", ($14+$15)/hz}' /proc/$PID/stat; }
stop() { kill $PID; wait $PID 2>/dev/null; sleep 1; }
drain_bench() { $BENCH --bootstrap 127.0.0.1:$PORT --topic r --partitions 8 --producers 0 --consumers 1 \
  --consume-from earliest --duration 60 --message-size 1024 2>&1 | grep -iE 'consum.*MB/s|MB/s' | tail -1; }
drain_kcat() { local s=$(date +%s.%N)
  kcat -b 127.0.0.1:$PORT -C -t r -o beginning -e -q -X fetch.max.bytes=52428800 > /dev/null 2>$D/kcat.err
  echo "kcat $(echo "$MB / ($(date +%s.%N) - $s)" | bc) MB/s"; }
drain_rdk() { [ -n "$RDK" ] || return 0; local s=$(date +%s.%N) parts="" p
  for p in 0 1 2 3 4 5 6 7; do parts="$parts -p $p"; done
  "$RDK" -C -t r -b 127.0.0.1:$PORT $parts -o beginning -e -q > $D/rdk.out 2>&1
  echo " | rdkafka_performance $(echo "$MB / ($(date +%s.%N) - $s)" | bc) MB/s"; }
serve $OLD
if [ "${BACKLOG:-spate-bench}" = rdkafka ]; then
  [ -n "$RDK" ] || { echo "BACKLOG=rdkafka: no rdkafka_performance (bench/rdkafka_perf.sh)"; exit 1; }
  "$(dirname "$0")/../.venv/bin/python" "$(dirname "$0")/topic.py" create $PORT r 8
  timeout -s INT 20 "$RDK" -P -t r -b 127.0.0.1:$PORT -s 1024 -c 1000000000 -q > $D/prod.txt 2>&1
else
  $BENCH --bootstrap 127.0.0.1:$PORT --topic r --partitions 8 --create-topic --producers 1 --acks 1 \
    --duration 20 --message-size 1024 --batch-bytes 131072 --linger-ms 5 > $D/prod.txt 2>&1
fi
MB=$(( $(du -sb $D/data | cut -f1) / 1048576 ))
echo "backlog: ${MB} MB"
drain_kcat > /dev/null
stop
for r in $(seq 1 $ROUNDS); do
  for b in old new; do
    if [ $b = old ]; then serve $OLD; else serve $NEW; fi
    c0=$(cpu_s)
    echo "round $r $b: spate-bench $(drain_bench) | $(drain_kcat)$(drain_rdk) | broker CPU $(echo "$(cpu_s) - $c0" | bc) s for the drains"
    stop
  done
done
