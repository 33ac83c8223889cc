#!/usr/bin/env bash
# How Spate's throughput scales with its cores: one broker with --cores N pinned to CPUs
# 0..N-1, spate-bench pinned to the CPUs above them, produce flat out then consume the
# backlog, for each N in CORES. Needs a machine with more CPUs than the largest N plus the
# client's; on the 2-core dev VM it only shows that the script works.
#
#   bench/cores_scaling.sh          # CORES="1 2 4 8" CLIENT_CPUS=8-15 DURATION=8 PARTITIONS=32
#
# Env: SPATE_BIN, SPATE_BENCH_BIN (default target/release/...), OUT (results: one JSON
# per run, broker logs, table.md), PRODUCERS and CONSUMERS (connections, default 8 and 4),
# MSG (1024), FSYNC (never).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
SPATE_BENCH_BIN="${SPATE_BENCH_BIN:-$ROOT/target/release/spate-bench}"
CORES="${CORES:-1 2 4 8}"
CLIENT_CPUS="${CLIENT_CPUS:-8-15}"
DURATION="${DURATION:-8}"
PARTITIONS="${PARTITIONS:-32}"
PRODUCERS="${PRODUCERS:-8}"
CONSUMERS="${CONSUMERS:-4}"
MSG="${MSG:-1024}"
FSYNC="${FSYNC:-never}"
OUT="${OUT:-/tmp/spate-cores-$(date +%s)}"
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*" >&2; }
log "$(nproc) CPUs online; $(uname -sr); spate on CPUs 0..N-1, client on $CLIENT_CPUS"

wait_port() { # PORT -> 0 once something answers there, 1 after 20 s
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

threads_cpu() { # PID -> one line per thread: tid, name, CPU ticks (user + system)
  for t in /proc/"$1"/task/*; do
    [ -r "$t/stat" ] || continue
    python3 -c 'import sys; s=open(sys.argv[1]).read(); n=s[s.index("(")+1:s.rindex(")")]; f=s[s.rindex(")")+2:].split(); print(sys.argv[2], n.replace(" ", "_"), int(f[11])+int(f[12]))' "$t/stat" "${t##*/}" 2>/dev/null
  done
}
threads_report() { # BEFORE AFTER SECONDS -> the broker's CPU during the produce run, by thread name
  python3 - "$@" <<'PY'
import os, re, sys
hz = os.sysconf("SC_CLK_TCK")
read = lambda p: {l.split()[0]: (l.split()[1], int(l.split()[2])) for l in open(p) if l.strip()}
before, after, secs = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
groups = {}
for tid, (name, ticks) in after.items():
    used = ticks - before.get(tid, (name, 0))[1]
    key = re.sub(r"[-_]?\d+$", "-N", name)
    g = groups.setdefault(key, [0, 0]); g[0] += 1; g[1] += used
for key, (count, ticks) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
    print(f"  broker threads {key:24} x{count:<3} {100.0 * ticks / hz / secs:7.1f}% of one CPU")
PY
}

printf 'cores\tproduce MB/s\tproduce msg/s\tpublish p50 ms\tpublish p99 ms\tconsume MB/s\n' > "$OUT/results.tsv"
port=19092
for n in $CORES; do
  port=$((port + 1))
  dir="$OUT/cores-$n"; mkdir -p "$dir"
  taskset -c "0-$((n - 1))" "$SPATE_BIN" serve --cores "$n" --data-dir "$dir/data" \
    --listen "127.0.0.1:$port" --fsync "$FSYNC" > "$dir/broker.log" 2>&1 &
  bpid=$!
  if ! wait_port "$port"; then
    log "spate --cores $n did not listen on $port; its log:"; tail -30 "$dir/broker.log" >&2
    kill "$bpid" 2>/dev/null || true; exit 1
  fi
  B="taskset -c $CLIENT_CPUS $SPATE_BENCH_BIN --bootstrap 127.0.0.1:$port --message-size $MSG"
  log "cores $n: produce, $PRODUCERS producers, $PARTITIONS partitions"
  threads_cpu "$bpid" > "$dir/threads.before"; t0=$(date +%s.%N)
  $B --topic t --partitions "$PARTITIONS" --create-topic --producers "$PRODUCERS" --consumers 0 --acks 1 \
     --duration "$DURATION" --warmup 2 --batch-bytes 131072 --linger-ms 1 --in-flight 5 \
     --json "$dir/produce.json" > "$dir/produce.txt" 2> "$dir/produce.err" || log "produce failed: $(tail -3 "$dir/produce.err")"
  threads_cpu "$bpid" > "$dir/threads.after"
  threads_report "$dir/threads.before" "$dir/threads.after" "$(python3 -c "print($(date +%s.%N) - $t0)")" | tee "$dir/threads.txt" >&2
  log "cores $n: consume the backlog, $CONSUMERS consumers"
  $B --topic t --producers 0 --consumers "$CONSUMERS" --consume-from earliest --duration "$DURATION" \
     --json "$dir/consume.json" > "$dir/consume.txt" 2> "$dir/consume.err" || log "consume failed: $(tail -3 "$dir/consume.err")"
  kill "$bpid" 2>/dev/null || true; wait "$bpid" 2>/dev/null || true
  python3 - "$n" "$dir" >> "$OUT/results.tsv" <<'PY'
import json, sys, os
n, d = sys.argv[1], sys.argv[2]
def load(name):
    p = os.path.join(d, name)
    return json.load(open(p)) if os.path.exists(p) and os.path.getsize(p) else None
p, c = load("produce.json"), load("consume.json")
row = [n]
if p:
    lat = p["publish_latency"]
    row += [f"{p['produce']['mb_per_sec']:.1f}", f"{p['produce']['msgs_per_sec']:.0f}", f"{lat['p50_ms']:.2f}", f"{lat['p99_ms']:.2f}"]
else:
    row += ["-"] * 4
row.append(f"{c['consume']['mb_per_sec']:.1f}" if c else "-")
print("\t".join(row))
PY
  rm -rf "$dir/data"
done
python3 - "$OUT/results.tsv" > "$OUT/table.md" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
hdr, rows = rows[0], rows[1:]
base = next((float(r[1]) for r in rows if r[1] != "-"), None)
print("| " + " | ".join(hdr + ["produce x first row"]) + " |")
print("|" + "---|" * (len(hdr) + 1))
for r in rows:
    x = f"{float(r[1]) / base:.2f}" if base and r[1] != "-" else "-"
    print("| " + " | ".join(r + [x]) + " |")
PY
cat "$OUT/table.md"
