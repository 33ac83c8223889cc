#!/usr/bin/env bash
# Broker CPU per GB produced by many producer connections, two broker binaries alternated.
# Usage: bench/producers_ab.sh OLD_BIN NEW_BIN [ROUNDS=3]
# vs_kafka.sh's 200-producer workload against one fresh broker per run (fsync never,
# its defaults; EXTRA='flags' adds `spate serve` flags): spate-bench with 200 producer
# connections, acks=1, 16 KiB batches, linger 5 ms, 5 in flight, 8 partitions, 3 s
# warm-up then 15 s. Prints the MB/s, the broker's CPU seconds (user + system, from
# /proc) over the whole run and per GB produced, and the client's. On a 2-core machine
# the client takes most of the CPU, so the broker's CPU per GB is the telling number.
set -u
OLD=$1; NEW=$2; ROUNDS=${3:-3}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BENCH="$ROOT/target/release/spate-bench"
D=/tmp/producers-ab; rm -rf $D; mkdir -p $D
PORT=39421
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$1/stat"; }
run() { # LABEL BIN
  # shellcheck disable=SC2086 # EXTRA is a list of flags
  "$2" serve --data-dir $D/data --listen 127.0.0.1:$PORT --fsync never ${EXTRA:-} > $D/broker.log 2>&1 &
  local b=$! c0 c1
  sleep 1
  "$ROOT/.venv/bin/python" "$ROOT/bench/topic.py" create $PORT p200 8
  c0=$(cpu_s $b)
  /usr/bin/time -f "%U %S" -o $D/client.time "$BENCH" --bootstrap 127.0.0.1:$PORT --message-size 1024 --topic p200 \
    --producers 200 --acks 1 --batch-bytes 16384 --linger-ms 5 --in-flight 5 --warmup 3 --duration 15 \
    --json $D/run.json > $D/run.txt 2>&1
  c1=$(cpu_s $b)
  kill $b; wait $b 2>/dev/null; rm -rf $D/data
  python3 - "$1" "$c0" "$c1" $D/run.json $D/client.time <<'PY'
import json, sys
label, c0, c1, path, client = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
d = json.load(open(path))
gb = d["produce"]["msgs"] * 1024 / 1e9  # counted over the measured 15 s
broker = c1 - c0                        # over the whole run, warm-up included
print(f"{label}: {d['produce']['mb_per_sec']:.1f} MB/s, broker CPU {broker:.2f} s ({broker / gb:.2f} s per GB measured), "
      f"client CPU {sum(map(float, open(client).read().split()[-2:])):.2f} s")
PY
}
for r in $(seq "$ROUNDS"); do run "round $r old" "$OLD"; run "round $r new" "$NEW"; done
