#!/bin/bash
# Where Spate's latency spikes come from: one latency run (spate-bench, 1 producer and 1
# consumer at a fixed rate, 8 partitions, 1 KiB records, fsync never) with the broker's
# system calls that take longer than SLOW_MS traced (`perf trace --duration`), the
# kernel's Dirty and Writeback page counts sampled every second (/proc/meminfo), and
# the latency per 5 s bucket. A spike that lines up with Writeback and with a slow
# pwritev on a shard thread is the page cache's writeback holding that core (how
# `--write-behind-bytes` was found; bench/README.md).
# Usage: bench/slow_syscalls.sh   (RATE=32883 SECS=60 SLOW_MS=15 SPATE_ARGS="..."; root for
# perf trace; needs target/release/spate, target/release/spate-bench and .venv)
# Output in OUT (default /tmp/slow-syscalls-<time>): trace.txt, meminfo.txt, latency.json,
# and a summary on stdout.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/slow-syscalls-$(date +%s)}
SECS=${SECS:-60}
mkdir -p "$OUT"
D=$(mktemp -d /tmp/slow-syscalls-data.XXXX)
P=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
./target/release/spate serve --data-dir "$D/data" --listen "127.0.0.1:$P" ${SPATE_ARGS:-} > "$OUT/broker.log" 2>&1 &
B=$!
trap 'kill $B 2>/dev/null; rm -rf "$D"' EXIT
.venv/bin/python bench/topic.py create "$P" lat 8
perf trace --duration "${SLOW_MS:-15}" -p "$B" -o "$OUT/trace.txt" > /dev/null 2>&1 &
T=$!
(for i in $(seq 1 $((SECS + 15))); do
   echo "$i $(grep -E '^(Dirty|Writeback):' /proc/meminfo | awk '{printf "%s %s kB ", $1, $2}')"; sleep 1
 done) > "$OUT/meminfo.txt" &
M=$!
./target/release/spate-bench --bootstrap "127.0.0.1:$P" --topic lat --producers 1 --consumers 1 --acks 1 \
  --rate "${RATE:-32883}" --warmup 5 --duration "$SECS" --batch-bytes 131072 --linger-ms 1 --in-flight 5 \
  --bucket-secs 5 --json "$OUT/latency.json" > "$OUT/latency.txt" 2> /dev/null
kill -INT $T 2>/dev/null || true; wait $T 2>/dev/null || true
kill $M 2>/dev/null || true
python3 - "$OUT" <<'PY'
import json, re, sys
out = sys.argv[1]
d = json.load(open(f"{out}/latency.json"))
print("bucket end s: publish p99 / max, e2e p99 / max (ms)")
for b in d["buckets"]:
    p, e = b["publish"], b["end_to_end"]
    print(f"{b['end_secs']:5.0f}: {p['p99_ms']:7.2f} / {p['max_ms']:7.2f}   {e['p99_ms']:7.2f} / {e['max_ms']:7.2f}")
slow = [l for l in open(f"{out}/trace.txt") if re.search(r"(pwritev|writev|sendto|recvfrom|sendfile)\(", l)]
print(f"slow socket/append syscalls (> SLOW_MS) of the broker: {len(slow)}")
for l in slow[:20]:
    print("  " + l.strip()[:150])
peak = max((int(x.split()[2]) for x in open(f"{out}/meminfo.txt") if len(x.split()) > 2), default=0)
print(f"peak Dirty: {peak // 1024} MB")
PY
