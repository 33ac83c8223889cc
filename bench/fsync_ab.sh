#!/usr/bin/env bash
# A/B of two spate binaries with `--fsync always` (group commit), alternated ROUNDS times,
# the order swapped every round. Each run starts a fresh broker and produces 1 KiB
# records flat out with acks=1:
#   spate-bench: 8 partitions (128 KiB batches, linger 1 ms, 5 in flight) and
#                PARTS_MANY partitions (16 KiB batches), DURATION s each;
#   rdkafka_performance: RDK_RECORDS records at librdkafka's defaults (acks=all), 8 partitions.
# Per run: MB/s, and from the broker's /metrics the group-commit rounds and their mean
# length (spate_fsyncs_total / spate_fsync_duration_seconds, summed over shards).
#
#   bench/fsync_ab.sh OLD_SPATE NEW_SPATE     # ROUNDS=3 DURATION=10 PARTS_MANY=100 RDK_RECORDS=2000000
#                                              # WORKLOADS=regex: only the workloads it matches
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OLD=$1 NEW=$2
ROUNDS="${ROUNDS:-3}" DURATION="${DURATION:-10}" PARTS_MANY="${PARTS_MANY:-100}" RDK_RECORDS="${RDK_RECORDS:-2000000}"
SB="${SPATE_BENCH_BIN:-$ROOT/target/release/spate-bench}"
PY="$ROOT/.venv/bin/python"
RDKAFKA_PERF=$("$ROOT/bench/rdkafka_perf.sh")
OUT="${OUT:-/tmp/spate-fsync-ab-$(date +%s)}"
mkdir -p "$OUT"
printf 'binary\tworkload\tround\tMB/s\tfsync rounds\tmean round ms\n' > "$OUT/results.tsv"
D="$OUT/data" PORT=39192 MPORT=39193
trap 'kill %1 2>/dev/null || true; rm -rf "$D"' EXIT

metric_sum() { # FILE NAME -> the metric summed over its labelled series
  awk -v m="$2" '$1 ~ "^"m"[{]" { s += $NF } END { printf "%.6f", s }' "$1"
}
one() { # LABEL BIN WORKLOAD ROUND: a fresh broker, one workload, one TSV row
  local label=$1 bin=$2 workload=$3 r=$4 mbs
  rm -rf "$D"
  "$bin" serve --data-dir "$D" --listen "127.0.0.1:$PORT" --metrics-listen "127.0.0.1:$MPORT" --fsync always \
    > "$OUT/broker-$label-$r.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
  case $workload in
    rdkafka*)
      "$PY" "$ROOT/bench/topic.py" create "$PORT" rdk 8 ;;
  esac
  curl -s "127.0.0.1:$MPORT/metrics" > "$OUT/m0"
  case $workload in
    *partitions) # 8 partitions with 128 KiB batches, PARTS_MANY with 16 KiB
      local parts=${workload%% *} batch=16384
      [ "$parts" = 8 ] && batch=131072
      "$SB" --bootstrap "127.0.0.1:$PORT" --topic p --partitions "$parts" --create-topic --producers 1 --acks 1 \
        --batch-bytes "$batch" --linger-ms 1 --in-flight 5 --warmup 2 --duration "$DURATION" --json "$OUT/j.json" > /dev/null 2>&1
      mbs=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["produce"]["mb_per_sec"], 1))' "$OUT/j.json") ;;
    rdkafka*) timeout 300 "$RDKAFKA_PERF" -P -t rdk -b "127.0.0.1:$PORT" -s 1024 -c "$RDK_RECORDS" -q > "$OUT/rdk.log" 2>&1 || true
      mbs=$(python3 -c '
import re, sys
m = re.findall(r"(\d+) messages produced \(\d+ bytes\).*? in (\d+)ms", open(sys.argv[1], errors="replace").read())
print(f"{int(m[-1][0]) * 1024 / 1e6 / (int(m[-1][1]) / 1e3):.1f}" if m else "-")' "$OUT/rdk.log") ;;
  esac
  curl -s "127.0.0.1:$MPORT/metrics" > "$OUT/m1"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  python3 - "$label" "$workload" "$r" "$mbs" \
    "$(metric_sum "$OUT/m0" spate_fsyncs_total)" "$(metric_sum "$OUT/m1" spate_fsyncs_total)" \
    "$(metric_sum "$OUT/m0" spate_fsync_duration_seconds_sum)" "$(metric_sum "$OUT/m1" spate_fsync_duration_seconds_sum)" \
    >> "$OUT/results.tsv" <<'PY'
import sys
label, workload, r, mbs, n0, n1, s0, s1 = sys.argv[1:9]
n = float(n1) - float(n0); s = float(s1) - float(s0)
print(f"{label}\t{workload}\t{r}\t{mbs}\t{n:.0f}\t{(1e3 * s / n) if n else 0:.2f}")
PY
  tail -1 "$OUT/results.tsv" >&2
}

for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then pair="old:$OLD new:$NEW"; else pair="new:$NEW old:$OLD"; fi
  for w in "8 partitions" "$PARTS_MANY partitions" "rdkafka_performance"; do
    echo "$w" | grep -Eq "${WORKLOADS:-.}" || continue
    for lb in $pair; do one "${lb%%:*}" "${lb#*:}" "$w" "$r"; done
  done
done
"$PY" - "$OUT/results.tsv" <<'PY' | tee "$OUT/medians.txt"
import csv, statistics, sys
runs = {}
for row in csv.DictReader(open(sys.argv[1]), delimiter="\t"):
    if row["MB/s"] != "-":
        runs.setdefault((row["workload"], row["binary"]), []).append((float(row["MB/s"]), float(row["mean round ms"])))
for (w, b), v in sorted(runs.items()):
    print(f"{w:22} {b}: median {statistics.median(x for x, _ in v):7.1f} MB/s (runs {', '.join(f'{x:.0f}' for x, _ in v)}), "
          f"mean round {statistics.median(y for _, y in v):.2f} ms")
PY
echo "results in $OUT" >&2
