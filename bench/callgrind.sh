#!/usr/bin/env bash
# Instructions per produced and per fetched record (issue 20), counted by callgrind on
# the broker: a count that does not depend on how busy this machine is, so two builds
# can be compared on a noisy 2-core VM.
#
# One broker on one shard (`--cores 1`, fsync never) runs under
# `valgrind --tool=callgrind` with collection off; spate-bench (native speed) creates the
# topic and warms the partition up. Then, each with the counters zeroed first:
#   produce  spate-bench, one producer flat out, acks=1, 1 KiB records, 16 KiB batches
#            (16 records per request), for $SECONDS_PER_PHASE s; PRODUCERS=N runs N
#            producers (one connection each) with LINGER_MS (default 5) instead, as
#            vs_kafka.sh's "200 producers" workload does
#   fetch    kcat reads the whole partition from the earliest offset (librdkafka's
#            default fetch sizes)
# Under callgrind the broker runs ~50x slower than natively, so it is the bottleneck
# and is never idle: what it counts is the work of the requests.
#
# Printed per phase: instructions (Ir) per record on the shard's thread (the glommio
# executor that serves the connections and owns the partition) and on the broker's
# other threads, whose work mostly follows the clock and not the load (the writeback
# monitor reads /proc/vmstat every 10 ms, the coordinator ticks, the disk-space
# check), so their share per record grows with the run's length under callgrind; and
# the shard's functions with the most instructions of their own. valgrind counts each iteration of a `rep`
# string instruction, which glibc's memcpy/memset use for larger sizes: their Ir are
# close to the bytes they move, not to their CPU time. They are printed apart.
#
#   cargo build --release && cargo build --release -p spate-bench
#   bench/callgrind.sh [SPATE_BIN]     # SECONDS_PER_PHASE=10 DATA=/var/tmp/spate-callgrind PORT=39511 PRODUCERS=1
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
SPATE_BIN="${1:-$BIN/spate}"
SECONDS_PER_PHASE="${SECONDS_PER_PHASE:-10}"
DATA="${DATA:-/var/tmp/spate-callgrind}"
PORT="${PORT:-39511}"
PRODUCERS="${PRODUCERS:-1}"
LINGER=()
if [ "$PRODUCERS" != 1 ]; then LINGER=(--linger-ms "${LINGER_MS:-5}"); fi
BENCH="$BIN/spate-bench"
TOPIC=cg

rm -rf "$DATA"
mkdir -p "$DATA"
valgrind --tool=callgrind --instr-atstart=no --separate-threads=yes \
  --callgrind-out-file="$DATA/cg.out" \
  "$SPATE_BIN" serve --data-dir "$DATA/data" --listen "127.0.0.1:$PORT" --cores 1 --fsync never \
  > "$DATA/broker.log" 2>&1 &
PID=$!
trap 'kill -INT $PID 2> /dev/null || true; wait $PID 2> /dev/null || true' EXIT
for _ in $(seq 300); do (echo > "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null && break; sleep 0.2; done

# Warm-up: the topic, its first segment and every code path once. The first produce
# under callgrind can outlast spate-bench's read timeout; a second run then succeeds.
for try in 1 2 3; do
  "$BENCH" --bootstrap "127.0.0.1:$PORT" --topic $TOPIC --partitions 1 --create-topic --producers 1 \
    --acks 1 --duration 3 > "$DATA/warmup.txt" 2>&1 && break
  [ $try = 3 ] && { cat "$DATA/warmup.txt" >&2; exit 1; }
done

measure() { # PHASE COMMAND...: counters zeroed, collected while COMMAND runs, dumped
  local phase=$1
  shift
  callgrind_control -z $PID > /dev/null
  callgrind_control -i on $PID > /dev/null
  "$@"
  callgrind_control -i off $PID > /dev/null
  callgrind_control -d "$phase" $PID > /dev/null
  sleep 1
}

produce() {
  "$BENCH" --bootstrap "127.0.0.1:$PORT" --topic $TOPIC --producers "$PRODUCERS" --acks 1 \
    --duration "$SECONDS_PER_PHASE" --message-size 1024 --batch-bytes 16384 "${LINGER[@]}" > "$DATA/produce.txt" 2>&1
}
fetch() {
  kcat -b "127.0.0.1:$PORT" -C -t $TOPIC -o beginning -e -q -f '%o\n' > "$DATA/fetch.txt" 2> "$DATA/kcat.err"
}
measure produce produce
measure fetch fetch

produced=$(sed -n 's/^produce: .*(\([0-9]*\) msgs, \([0-9]*\) requests.*/\1/p' "$DATA/produce.txt")
requests=$(sed -n 's/^produce: .*(\([0-9]*\) msgs, \([0-9]*\) requests.*/\2/p' "$DATA/produce.txt")
fetched=$(wc -l < "$DATA/fetch.txt")

# The dump of a phase is one file per thread: cg.out.<part>-<thread>, parts in order.
report() { # PHASE PART RECORDS
  local phase=$1 part=$2 records=$3
  local shard=0 other=0 bytes=0 f ir
  for f in "$DATA"/cg.out."$part"-*; do
    ir=$(sed -n 's/^totals: //p' "$f")
    if grep -q 'LocalExecutor::run_task_queues' "$f"; then
      shard=$((shard + ir))
      bytes=$((bytes + $(callgrind_annotate --threshold=100 "$f" 2> /dev/null |
        awk '/__mem(cpy|move|set)_[a-z0-9_]*unaligned_erms/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')))
      top=$f
    else
      other=$((other + ir))
    fi
  done
  echo "$phase: $records records; Ir per record: shard $((shard / records)) (of which memcpy/memset $((bytes / records)), the rest $(((shard - bytes) / records))), other threads $((other / records))"
  echo "  the shard's own Ir per record, top functions:"
  callgrind_annotate --threshold=100 "$top" 2> /dev/null | awk -v n="$records" '
    /^-+$/ { sep++ } sep >= 5 && $1 ~ /^[0-9,]+$/ && shown < 12 {
      c = $1; gsub(",", "", c); fn = $0; sub(/^ *[0-9,]+ +\([^)]*\) +/, "", fn); sub(/ \[.*$/, "", fn)
      printf "    %8.0f  %s\n", c / n, substr(fn, 1, 110); shown++ }'
}
# The binary is named by its hash and build time: the repository's HEAD need not be what
# built it (an older binary measured for a before/after).
echo "callgrind on $SPATE_BIN (sha256 $(sha256sum "$SPATE_BIN" | cut -c1-12), built $(date -r "$SPATE_BIN" -u +%FT%TZ); repository at $(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo '?')), --cores 1, fsync never"
echo "produce: $produced records in $requests requests ($PRODUCERS producers)"
report produce 1 "$produced"
report fetch 2 "$fetched"
