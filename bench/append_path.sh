#!/usr/bin/env bash
# What limits produce on this host (issue 20): the cost of the page cache's fresh pages,
# and Spate's three ways of writing appends side by side.
#
# 1. First touch: dd 2 GiB into a new file (every page-cache page fresh) and again over
#    the same, still cached, file (conv=notrunc: pages already there), on tmpfs and on
#    the data directory's file system. Any broker that writes into the page cache pays
#    the first; null-broker pays neither.
# 2. Appends, three ways, rotated, ROUNDS times, a fresh data directory each run:
#    `inline` (the default: pwritev on the shard while the kernel would not throttle
#    writers, io_uring past that), `ring` (`--append-inline false`: every write through
#    io_uring, which on ext4 means one of its worker threads) and `pwrite`
#    (`--append-io-uring false`: the log's own pwrite per piece); spate-bench produces
#    flat out to 8 partitions, acks=1, 1 KiB records, 128 KiB batches, 5 requests in
#    flight. Reported: MB/s, publish p50 / p99, the broker's mean Produce handling time
#    (/metrics) and the broker's CPU seconds (/proc/PID/stat, the whole run) per GB
#    produced (the warm-up's bytes estimated at the measured rate).
#
#   cargo build --release && cargo build --release -p spate-bench
#   bench/append_path.sh        # ROUNDS=3 DURATION=10 DATA=/var/tmp/spate-append-path
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-10}"
DATA="${DATA:-/var/tmp/spate-append-path}"
PORT="${PORT:-19092}"
MPORT=$((PORT + 1))
SHM="${SHM:-/dev/shm}"

first_touch() { # DIR: fresh pages, then the same pages again
  local f="$1/first-touch.$$"
  rm -f "$f"
  local fresh again
  fresh=$(dd if=/dev/zero of="$f" bs=1M count=2048 2>&1 | tail -1 | awk -F, '{print $NF}')
  again=$(dd if=/dev/zero of="$f" bs=1M count=2048 conv=notrunc 2>&1 | tail -1 | awk -F, '{print $NF}')
  rm -f "$f"
  printf '%-24s fresh pages:%s   same pages again:%s\n' "$1" "$fresh" "$again"
}

echo "== first touch (dd, 2 GiB, 1 MiB writes)"
mkdir -p "$DATA"
first_touch "$SHM"
first_touch "$DATA"

one() { # MODE ROUND
  local d="$DATA/run" mode=$1 flags
  case $mode in
    inline) flags=(--append-inline true) ;;
    ring) flags=(--append-inline false) ;;
    pwrite) flags=(--append-io-uring false) ;;
  esac
  rm -rf "$d"
  mkdir -p "$d"
  "$BIN/spate" serve --data-dir "$d/data" --listen "127.0.0.1:$PORT" --advertise "127.0.0.1:$PORT" \
    --metrics-listen "127.0.0.1:$MPORT" "${flags[@]}" > "$d/broker.log" 2>&1 &
  local pid=$!
  for _ in $(seq 50); do curl -sf "127.0.0.1:$MPORT/metrics" > /dev/null && break; sleep 0.1; done
  local cpu0 cpu1
  cpu0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  "$BIN/spate-bench" --bootstrap "127.0.0.1:$PORT" --topic p8 --create-topic --partitions 8 --producers 1 \
    --acks 1 --batch-bytes 131072 --linger-ms 1 --in-flight 5 --warmup 3 --duration "$DURATION" \
    --json "$d/r.json" > "$d/r.txt" 2>&1
  cpu1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  curl -s "127.0.0.1:$MPORT/metrics" > "$d/metrics.txt"
  kill "$pid"
  wait "$pid" 2> /dev/null || true
  python3 - "$d/r.json" "$d/metrics.txt" "$mode" "$2" $((cpu1 - cpu0)) "$(getconf CLK_TCK)" <<'PY'
import json, re, sys
j = json.load(open(sys.argv[1]))
m = open(sys.argv[2]).read()
s = sum(float(v) for v in re.findall(r'spate_request_duration_seconds_sum\{[^}]*api="Produce"\} (\S+)', m))
n = sum(float(v) for v in re.findall(r'spate_request_duration_seconds_count\{[^}]*api="Produce"\} (\S+)', m))
bytes_all = j["produce"]["bytes"] / max(j["measured_secs"], 1e-9) * (j["measured_secs"] + 3)  # with the warm-up
cpu = int(sys.argv[5]) / int(sys.argv[6])
l = j["publish_latency"]
inline = sum(float(v) for v in re.findall(r'spate_append_writes_inline_total\{[^}]*\} (\S+)', m))
writes = sum(float(v) for v in re.findall(r'spate_append_writes_total\{[^}]*\} (\S+)', m))
print(f"{sys.argv[3]:6} round {sys.argv[4]}: {j['produce']['mb_per_sec']:7.1f} MB/s  "
      f"publish p50 {l['p50_ms']:.2f} p99 {l['p99_ms']:.2f} ms  handler mean {s / max(n, 1) * 1e3:.3f} ms  "
      f"broker CPU {cpu / (bytes_all / 1e9):.2f} s/GB  writes on the shard {inline:.0f}/{writes:.0f}")
PY
}

echo "== appends: inline / ring / pwrite (8 partitions, acks=1, ${DURATION} s + 3 s warm-up)"
modes=(inline ring pwrite)
# The first run after dd writes into a page cache still settling: run one, unreported.
one inline 0 > /dev/null
for r in $(seq "$ROUNDS"); do
  for i in 0 1 2; do one "${modes[$(( (i + r - 1) % 3 ))]}" "$r"; done
done
rm -rf "$DATA/run"
