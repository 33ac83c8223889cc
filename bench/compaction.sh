#!/bin/bash
# The log cleaner's cost to producers, side by side in one run: the same keyed load on a
# compacted topic (8 partitions, 8 MiB segments, min.cleanable.dirty.ratio 0.1, 10,000
# keys, 1 KiB values, acks=1, a fixed rate) against a broker with the cleaner on and one
# with it off (--log-cleaner-enable false), alternating ROUNDS times so machine noise
# hits both alike. Prints msg/s and publish latency percentiles per run, the medians,
# and the cleaner's throughput (bytes read+written over the time its passes took, from
# the broker's "log cleaner pass" lines) and how much it removed.
# Usage: bench/compaction.sh   (needs target/release/spate and spate-bench:
# cargo build --release --workspace; RATE=20000, SECONDS_PER_RUN=20, ROUNDS=3, FSYNC=never)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$ROOT/target/release/spate
SB=$ROOT/target/release/spate-bench
D=$(mktemp -d /tmp/bench-compaction.XXXX)
PORT=${PORT:-49291}
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf $D' EXIT
run() { # $1: label, $2: true/false (cleaner)
    local label=$1 cleaner=$2
    rm -rf $D/data
    $B serve --listen 127.0.0.1:$PORT --data-dir $D/data --fsync "${FSYNC:-never}" \
        --log-cleaner-enable "$cleaner" > $D/$label.log 2>&1 &
    local pid=$!
    for _ in $(seq 100); do $B topic list --bootstrap 127.0.0.1:$PORT >/dev/null 2>&1 && break; sleep 0.1; done
    $B topic create cmp --partitions 8 --bootstrap 127.0.0.1:$PORT --config cleanup.policy=compact \
        --config segment.bytes=8388608 --config min.cleanable.dirty.ratio=0.1 >/dev/null
    $SB --bootstrap 127.0.0.1:$PORT --topic cmp --message-size 1024 --producers 2 --acks 1 \
        --rate "${RATE:-20000}" --duration "${SECONDS_PER_RUN:-20}" --warmup 2 \
        --key-distribution random --key-space 10000 --json $D/$label.json > $D/$label.out 2>&1 \
        || { cat $D/$label.out; exit 1; }
    kill $pid; wait $pid 2>/dev/null || true
    python3 - "$D/$label.json" "$label" "$D/$label.log" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
p, t = r["publish_latency"], r["produce"]
lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in open(sys.argv[3])]  # the log's colours
passes = [dict(kv.split("=", 1) for kv in re.findall(r"(\w+=\S+)", line))
          for line in lines if "log cleaner pass" in line and "bytes_read=" in line]
failed = [line for line in lines if "pass failed" in line]
if failed: print("cleaner failures:", failed[:2])
io = sum(int(x["bytes_read"]) + int(x["bytes_written"]) for x in passes)
ms = sum(int(x["elapsed_ms"]) for x in passes)
removed = sum(int(x["records_removed"]) for x in passes)
clean = f"  cleaner: {len(passes)} passes, {io / 1e6:.0f} MB in {ms / 1e3:.1f} s ({io / 1e3 / max(ms, 1):.0f} MB/s), {removed} records removed" if passes else ""
print(f"{sys.argv[2]:>12}: {t['msgs_per_sec']:>8.0f} msg/s  publish p50 {p['p50_ms']:.2f} ms  p99 {p['p99_ms']:.2f} ms  "
      f"p99.9 {p['p999_ms']:.2f} ms  max {p['max_ms']:.2f} ms  errors {r['produce_errors']}{clean}")
json.dump({"p99": p["p99_ms"], "p999": p["p999_ms"]}, open(sys.argv[1] + ".sum", "w"))
PY
}
echo "spate compaction cost: fsync=${FSYNC:-never}, 8 partitions, acks=1, 1 KiB, 10,000 keys, ${RATE:-20000} msg/s, $(nproc) cores"
for i in $(seq "${ROUNDS:-3}"); do
    run "cleaner-on-$i" true
    run "cleaner-off-$i" false
done
python3 - "$D" <<'PY'
import glob, json, statistics, sys
for mode in ("cleaner-on", "cleaner-off"):
    s = [json.load(open(f)) for f in sorted(glob.glob(f"{sys.argv[1]}/{mode}-*.json.sum"))]
    print(f"median {mode:>12}: publish p99 {statistics.median(x['p99'] for x in s):.2f} ms  "
          f"p99.9 {statistics.median(x['p999'] for x in s):.2f} ms")
PY
