#!/bin/bash
# A/B of two spate binaries on one node, alternated ROUNDS times (fsync never,
# spate-bench 1 KiB x 8 partitions, acks=1, 8 s produce then 8 s consume).
# Usage: bench/ab.sh OLD_SPATE NEW_SPATE      (ACKS_ALL=1 adds an acks=all run of NEW;
# BATCH_BYTES=16384 for smaller produce requests, default 131072). Each produce line
# also gives the broker's CPU time (user + system) per GB produced.
# Build an old one with: git worktree add /tmp/old REV && (cd /tmp/old &&
#   CARGO_TARGET_DIR=/tmp/old-target cargo build --release --bin spate)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD=$1; NEW=$2; SB=$ROOT/target/release/spate-bench
cpu_ticks() { awk '{ print $14 + $15 }' /proc/$1/stat; } # user + system, in clock ticks
run() { # label bin acks
  local label=$1 bin=$2 acks=$3 d=/tmp/bench-data-$$
  rm -rf $d; $bin serve --data-dir $d --listen 127.0.0.1:39092 > /tmp/bench-broker.log 2>&1 & local pid=$!
  sleep 1.5
  local t0; t0=$(cpu_ticks $pid)
  $SB --bootstrap 127.0.0.1:39092 --topic p --partitions 8 --create-topic --producers 1 --acks $acks --duration 8 \
      --message-size 1024 --batch-bytes ${BATCH_BYTES:-131072} --linger-ms 1 --in-flight 5 --json /tmp/bench-p.json > /dev/null 2>&1
  local t1; t1=$(cpu_ticks $pid)
  $SB --bootstrap 127.0.0.1:39092 --topic p --producers 0 --consumers 1 --consume-from earliest --duration 8 --json /tmp/bench-c.json > /dev/null 2>&1
  python3 - "$label" "$acks" $((t1 - t0)) "$(getconf CLK_TCK)" <<'PY'
import json,sys
p=json.load(open('/tmp/bench-p.json')); c=json.load(open('/tmp/bench-c.json'))
cpu_s = int(sys.argv[3]) / int(sys.argv[4]); gb = p['produce']['bytes'] / 1e9
per_gb = f"  broker CPU {cpu_s / gb:5.2f} s per GB produced" if gb else ""
print(f"{sys.argv[1]:>4} acks={sys.argv[2]:>2}  produce {p['produce']['mb_per_sec']:7.1f} MB/s  publish p50 {p['publish_latency']['p50_ms']} ms p99 {p['publish_latency']['p99_ms']} ms  consume {c['consume']['mb_per_sec']:7.1f} MB/s{per_gb}")
PY
  kill $pid; wait $pid 2>/dev/null; rm -rf $d
}
for i in $(seq 1 ${ROUNDS:-2}); do run old $OLD 1; run new $NEW 1; done
[ -n "${ACKS_ALL:-}" ] && run new $NEW -1
