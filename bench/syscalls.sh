#!/usr/bin/env bash
# System calls per request (issue 20; vs_kafka.sh SYSCALLS=1 does the same for Kafka and
# the null broker per MB moved): what Spate asks of the kernel for each Produce and
# each Fetch, counted with `perf trace -s` (syscall tracepoints, no ptrace, so the broker
# runs at close to its normal speed) on the broker process only, over a whole
# spate-bench run. Requests are counted from the broker's own /metrics
# (spate_request_duration_seconds_count by api) over the same window.
#
# Phases, each on a fresh broker at its defaults (fsync never):
#   produce  8 partitions, acks=1, 1 KiB records, 128 KiB batches, 5 in flight, flat out
#   consume  the backlog left by produce, one consumer from the earliest offset
#   producers200  200 producer connections, 16 KiB batches, linger 5 ms (small requests)
#
#   cargo build --release && cargo build --release -p spate-bench
#   bench/syscalls.sh          # DURATION=10 DATA=/var/tmp/spate-syscalls OUT=... SPATE_BIN=...
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
DURATION="${DURATION:-10}"
DATA="${DATA:-/var/tmp/spate-syscalls}"
PORT="${PORT:-19192}"
MPORT=$((PORT + 1))
OUT="${OUT:-$DATA/out}"
SPATE_BIN="${SPATE_BIN:-$BIN/spate}"

requests() { # API: the broker's request count for it
  curl -s "127.0.0.1:$MPORT/metrics" |
    awk -v api="$1" '$1 ~ /^spate_request_duration_seconds_count\{/ && index($1, "api=\"" api "\"") { s += $2 } END { print s + 0 }'
}

rm -rf "$DATA"
mkdir -p "$DATA" "$OUT"
"$SPATE_BIN" serve --data-dir "$DATA/data" --listen "127.0.0.1:$PORT" --advertise "127.0.0.1:$PORT" \
  --metrics-listen "127.0.0.1:$MPORT" > "$DATA/broker.log" 2>&1 &
PID=$!
# Waited for: the next run's broker needs the ports (closing the logs takes seconds).
trap 'kill $PID 2> /dev/null || true; wait $PID 2> /dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "127.0.0.1:$MPORT/metrics" > /dev/null && break; sleep 0.1; done
curl -sf "127.0.0.1:$MPORT/metrics" > /dev/null || { tail -5 "$DATA/broker.log" >&2; exit 1; }

phase() { # NAME API TOPIC SPATE-BENCH-ARGS...: the whole run traced, warm-up included
  local name=$1 api=$2 topic=$3
  shift 3
  local before after tracer
  before=$(requests "$api")
  # -s: per-syscall summary of the broker's threads; its own overhead shows in MB/s.
  perf trace -s -p "$PID" -o "$OUT/$name.trace" > /dev/null 2>&1 &
  tracer=$!
  sleep 1
  "$BIN/spate-bench" --bootstrap "127.0.0.1:$PORT" --topic "$topic" --partitions 8 \
    --duration "$DURATION" --json "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
  kill -INT "$tracer"
  wait "$tracer" || true
  after=$(requests "$api")
  python3 "$ROOT/bench/syscall_summary.py" "$OUT/$name.trace" "$OUT/$name.json" "spate $name" $((after - before)) "$api"
}

phase produce Produce p8 --create-topic --producers 1 --acks 1 --batch-bytes 131072 --linger-ms 1 --in-flight 5
# The backlog is read at GB/s: the run ends when it is drained, well within DURATION.
phase consume Fetch p8 --producers 0 --consumers 1 --consume-from earliest
# Many small requests: vs_kafka.sh's 200-producer workload.
phase producers200 Produce p200 --create-topic --producers 200 --acks 1 --batch-bytes 16384 \
  --linger-ms 5 --in-flight 5
