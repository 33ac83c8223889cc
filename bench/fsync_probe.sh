#!/usr/bin/env bash
# One fresh `spate serve --fsync always` broker, rdkafka_performance producing COUNT 1 KiB
# records to an 8-partition topic at librdkafka's defaults (it sets linger.ms=1000 itself),
# then: the producer's MB/s, the group-commit rounds and their total length and the
# Produce requests' total time (from /metrics), and each broker thread's on-CPU and
# run-queue time (/proc/PID/task/TID/schedstat) over the run. PERF=1 also records the
# broker with `perf record -g` (report: perf report -i $OUT/perf.data --sort comm,symbol).
#
#   bench/fsync_probe.sh                       # COUNT=2000000 OUT=/tmp/spate-fsync-probe
#   EXTRA='--append-inline false' bench/fsync_probe.sh   # extra `spate serve` arguments
#
# On the 2-core dev VM (bench/README.md, 2026-12-04) the same command ran at ~600 MB/s in
# some runs and ~200 in others; the slow ones had the shard copying appends into fresh
# page-cache memory. Run it several times, alternating what you compare.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
COUNT="${COUNT:-2000000}"
OUT="${OUT:-/tmp/spate-fsync-probe}"
PY="$ROOT/.venv/bin/python"
RDKAFKA_PERF=$("$ROOT/bench/rdkafka_perf.sh")
PORT=29092 MPORT=29093
rm -rf "$OUT"; mkdir -p "$OUT"
# shellcheck disable=SC2086 # EXTRA is a list of arguments
"$SPATE_BIN" serve --data-dir "$OUT/data" --listen "127.0.0.1:$PORT" --metrics-listen "127.0.0.1:$MPORT" \
  --fsync always ${EXTRA:-} > "$OUT/broker.log" 2>&1 &
B=$!
trap 'kill $B 2>/dev/null || true; rm -rf "$OUT/data"' EXIT
"$PY" "$ROOT/bench/topic.py" create "$PORT" rdk 8
threads() { for t in /proc/$B/task/*; do echo "$(cat "$t/comm")@${t##*/} $(cat "$t/schedstat")"; done; }
threads > "$OUT/sched0.txt"
curl -s "127.0.0.1:$MPORT/metrics" > "$OUT/metrics0.txt"
P=""
if [ "${PERF:-0}" = 1 ]; then perf record -F 499 -g -p "$B" -o "$OUT/perf.data" > /dev/null 2>&1 & P=$!; sleep 0.5; fi
timeout 300 "$RDKAFKA_PERF" -P -t rdk -b "127.0.0.1:$PORT" -s 1024 -c "$COUNT" -q > "$OUT/rdk.log" 2>&1 || true
if [ -n "$P" ]; then kill -INT "$P"; wait "$P" || true; fi
threads > "$OUT/sched1.txt"
curl -s "127.0.0.1:$MPORT/metrics" > "$OUT/metrics1.txt"
grep -o "[0-9]* messages produced.*" "$OUT/rdk.log" | tail -1
"$PY" - "$OUT" <<'PY'
import collections, os, re, sys
out = sys.argv[1]
def metric(name, api=None):
    total = 0.0
    for f, sign in (("metrics1.txt", 1), ("metrics0.txt", -1)):
        for line in open(os.path.join(out, f)):
            if line.startswith(name + "{") and (api is None or f'api="{api}"' in line):
                total += sign * float(line.split()[-1])
    return total
rounds = metric("spate_fsync_duration_seconds_count")
print(f"group-commit rounds {rounds:.0f}, {metric('spate_fsync_duration_seconds_sum'):.2f} s in all; "
      f"Produce requests {metric('spate_request_duration_seconds_count', 'Produce'):.0f}, "
      f"{metric('spate_request_duration_seconds_sum', 'Produce'):.2f} s in all")
def sched(f):
    d = collections.defaultdict(lambda: [0, 0])
    for line in open(os.path.join(out, f)):
        name, run, wait = line.split()[:3]
        d[name][0] += int(run); d[name][1] += int(wait)
    return d
a, b = sched("sched0.txt"), sched("sched1.txt")
for k in sorted(b):
    run, wait = (b[k][0] - a[k][0]) / 1e9, (b[k][1] - a[k][1]) / 1e9
    if run + wait > 0.05:
        print(f"  thread {k:28} on-CPU {run:6.2f} s, run-queue wait {wait:6.2f} s")
PY
