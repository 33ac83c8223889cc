#!/usr/bin/env bash
# Spate with `--cores 1` against `--cores 2` on the same machine, alternated round by
# round (the order swapped every round), for the two workloads of bench/vs_kafka.sh that
# stayed furthest from their goals on the 2-core development VM: 200 spate-bench producer
# connections (16 KiB batches, linger 5 ms, 5 in flight, acks=1, 8 partitions), and
# librdkafka's rdkafka_performance draining an 8-partition backlog it produced itself
# (a fixed count of 1 KiB records at librdkafka's defaults, so every drain reads the same
# number of records). Both brokers run for the whole script, fsync never.
#
#   bench/cores_ab.sh            # ROUNDS=3 DURATION=15 RDK_RECORDS=4000000 CORES="1 2"
#
# Output: one TSV row per run (cores, workload, round, MB/s, p50/p99 ms for spate-bench)
# in $OUT/results.tsv, and the medians at the end. Needs target/release/spate,
# target/release/spate-bench, .venv (confluent-kafka, to create topics) and
# bench/rdkafka_perf.sh's rdkafka_performance (built on first use; RDKAFKA_PERF=path).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
SPATE_BENCH_BIN="${SPATE_BENCH_BIN:-$ROOT/target/release/spate-bench}"
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-15}"
RDK_RECORDS="${RDK_RECORDS:-4000000}"
CORES="${CORES:-1 2}"
OUT="${OUT:-/tmp/spate-cores-ab-$(date +%s)}"
PY="$ROOT/.venv/bin/python"
mkdir -p "$OUT"
RESULTS="$OUT/results.tsv"
printf 'cores\tworkload\tround\tMB/s\tp50 ms\tp99 ms\n' > "$RESULTS"
log() { echo "== $(date +%T) $*" >&2; }
RDKAFKA_PERF=$("$ROOT/bench/rdkafka_perf.sh")

declare -A PORT PID
cleanup() {
  for c in $CORES; do kill "${PID[$c]:-}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for c in $CORES; do rm -rf "$OUT/cores-$c/data"; done
}
trap cleanup EXIT

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
topic() { # PORT create|delete NAME: create (8 partitions, every leader known) or delete it
  if [ "$2" = create ]; then "$PY" "$ROOT/bench/topic.py" create "$1" "$3" 8; else "$PY" "$ROOT/bench/topic.py" delete "$1" "$3"; fi
}

for c in $CORES; do
  mkdir -p "$OUT/cores-$c"
  PORT[$c]=$(free_port)
  "$SPATE_BIN" serve --data-dir "$OUT/cores-$c/data" --listen "127.0.0.1:${PORT[$c]}" --cores "$c" \
    > "$OUT/cores-$c/broker.log" 2>&1 &
  PID[$c]=$!
  topic "${PORT[$c]}" create warm
  log "spate --cores $c ready on ${PORT[$c]}"
done

order() { # ROUND -> CORES in order, reversed on even rounds
  if [ $(( $1 % 2 )) -eq 1 ]; then echo $CORES; else echo $CORES | tr ' ' '\n' | tac | tr '\n' ' '; fi
}

for r in $(seq "$ROUNDS"); do
  for c in $(order "$r"); do
    p=${PORT[$c]} d="$OUT/cores-$c"
    log "--cores $c: 200 producers (round $r)"
    topic "$p" create p200
    "$SPATE_BENCH_BIN" --bootstrap "127.0.0.1:$p" --topic p200 --producers 200 --acks 1 --batch-bytes 16384 \
      --linger-ms 5 --in-flight 5 --warmup 3 --duration "$DURATION" --json "$d/p200-$r.json" \
      > "$d/p200-$r.txt" 2> "$d/p200-$r.err" || log "failed: $(tail -2 "$d/p200-$r.err")"
    "$PY" - "$c" "$r" "$d/p200-$r.json" >> "$RESULTS" <<'PY'
import json, sys
c, r, path = sys.argv[1:4]
d = json.load(open(path))
lat = d["publish_latency"]
print(f"{c}\t200 producers\t{r}\t{d['produce']['mb_per_sec']:.1f}\t{lat['p50_ms']:.2f}\t{lat['p99_ms']:.2f}")
PY
    topic "$p" delete p200

    log "--cores $c: rdkafka_performance $RDK_RECORDS records, then drain (round $r)"
    topic "$p" create rdk
    timeout 300 "$RDKAFKA_PERF" -P -t rdk -b "127.0.0.1:$p" -s 1024 -c "$RDK_RECORDS" -q > "$d/rdk-produce-$r.log" 2>&1 || true
    parts=""; for q in 0 1 2 3 4 5 6 7; do parts="$parts -p $q"; done
    timeout 120 "$RDKAFKA_PERF" -C -t rdk -b "127.0.0.1:$p" $parts -o beginning -e -q > "$d/rdk-consume-$r.log" 2>&1 || true
    for kind in produce consume; do
      "$PY" - "$c" "$r" "$kind" "$d/rdk-$kind-$r.log" >> "$RESULTS" <<'PY'
import re, sys
c, r, kind, path = sys.argv[1:5]
m = re.findall(r"(\d+) messages (?:produced )?\((\d+) bytes\).*? in (\d+)ms", open(path, errors="replace").read())
if m:
    msgs, nbytes, ms = map(int, m[-1])
    print(f"{c}\trdkafka {kind} ({msgs} records)\t{r}\t{msgs * 1024 / 1e6 / (ms / 1e3):.1f}\t-\t-")
PY
    done
    topic "$p" delete rdk
  done
done

"$PY" - "$RESULTS" <<'PY' | tee "$OUT/medians.txt"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
runs = {}
for r in rows:
    runs.setdefault((r["workload"], r["cores"]), []).append(float(r["MB/s"]))
for (w, c), v in sorted(runs.items()):
    print(f"{w:40} --cores {c}: median {statistics.median(v):7.1f} MB/s  runs {', '.join(f'{x:.0f}' for x in v)}")
PY
log "results in $OUT"
