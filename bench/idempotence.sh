#!/bin/bash
# Idempotent producer on vs off, side by side in one run: one broker (fsync never, or
# FSYNC=always), 8 partitions, spate-bench producers at acks=all, 5 requests in flight,
# 1 KiB messages, flat out; the two modes alternate ROUNDS times so machine noise hits
# both alike. Prints msg/s and publish latency percentiles per run, then the medians.
# Usage: bench/idempotence.sh   (needs target/release/spate and spate-bench:
# cargo build --release --workspace; SECONDS_PER_RUN=10, ROUNDS=3, PRODUCERS=2)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/target/release/spate
SB=$ROOT/target/release/spate-bench
D=$(mktemp -d /tmp/bench-idem.XXXX)
PORT=${PORT:-49191}
$B serve --listen 127.0.0.1:$PORT --data-dir $D/data --fsync "${FSYNC:-never}" > $D/broker.log 2>&1 &
trap 'kill %1 2>/dev/null; wait 2>/dev/null; rm -rf $D' EXIT
sleep 2
run() { # $1: label, rest: extra flags
    local label=$1; shift
    $SB --bootstrap 127.0.0.1:$PORT --topic idem-bench --partitions 8 --create-topic \
        --message-size 1024 --producers "${PRODUCERS:-2}" --acks -1 --in-flight 5 --rate 0 \
        --duration "${SECONDS_PER_RUN:-10}" --warmup 2 --json $D/$label.json "$@" > $D/$label.out 2>&1 \
        || { cat $D/$label.out; exit 1; }
    python3 - "$D/$label.json" "$label" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p, t = r["publish_latency"], r["produce"]
print(f"{sys.argv[2]:>14}: {t['msgs_per_sec']:>10.0f} msg/s  publish p50 {p['p50_ms']:.2f} ms  "
      f"p99 {p['p99_ms']:.2f} ms  p99.9 {p['p999_ms']:.2f} ms  errors {r['produce_errors']}")
PY
}
echo "spate idempotence on/off: fsync=${FSYNC:-never}, 8 partitions, acks=all, 1 KiB, $(nproc) cores"
for i in $(seq "${ROUNDS:-3}"); do
    run "plain-$i"
    run "idempotent-$i" --idempotent
done
