#!/usr/bin/env bash
# Heap allocations per Produce request (issue 52), counted by valgrind's DHAT on the
# broker: like bench/callgrind.sh, a count that does not depend on how busy this
# machine is, so two builds can be compared on a noisy 2-core VM.
#
# One broker on one shard (`--cores 1`, fsync never) runs under `valgrind --tool=dhat`;
# spate-bench creates the topic and produces for $SECONDS_PER_RUN s (1 KiB records,
# 16 KiB batches, acks=1; PRODUCERS=N runs N producers with a connection each and
# LINGER_MS, default 5, as vs_kafka.sh's "200 producers" workload does). DHAT counts the
# whole run, start-up and shutdown included; with ~12,000 requests those add well
# under one allocation per request.
#
# Printed: allocations (blocks) per request, the whole process and the shard's thread
# apart, and every allocation site that ran at least 0.3 times per request, named by
# its first frames in Spate or glommio.
#
#   cargo build --release && cargo build --release -p spate-bench
#   bench/allocs.sh [SPATE_BIN]     # SECONDS_PER_RUN=10 DATA=/var/tmp/spate-allocs PORT=39611 PRODUCERS=1
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
SPATE_BIN="${1:-$BIN/spate}"
SECONDS_PER_RUN="${SECONDS_PER_RUN:-10}"
DATA="${DATA:-/var/tmp/spate-allocs}"
PORT="${PORT:-39611}"
PRODUCERS="${PRODUCERS:-1}"
LINGER=()
if [ "$PRODUCERS" != 1 ]; then LINGER=(--linger-ms "${LINGER_MS:-5}"); fi
BENCH="$BIN/spate-bench"

rm -rf "$DATA"
mkdir -p "$DATA"
valgrind --tool=dhat --dhat-out-file="$DATA/dhat.json" \
  "$SPATE_BIN" serve --data-dir "$DATA/data" --listen "127.0.0.1:$PORT" --cores 1 --fsync never \
  > "$DATA/broker.log" 2>&1 &
PID=$!
trap 'kill -KILL $PID 2> /dev/null || true' EXIT
for _ in $(seq 300); do (echo > "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null && break; sleep 0.2; done

# The first produce under valgrind can outlast spate-bench's read timeout; a second run
# then succeeds. Every run's requests count.
: > "$DATA/produce.txt"
for try in 1 2 3; do
  "$BENCH" --bootstrap "127.0.0.1:$PORT" --topic cg --partitions 1 --create-topic --producers 1 \
    --acks 1 --duration 3 --message-size 1024 --batch-bytes 16384 >> "$DATA/produce.txt" 2>&1 && break
  [ $try = 3 ] && { cat "$DATA/produce.txt" >&2; exit 1; }
done
"$BENCH" --bootstrap "127.0.0.1:$PORT" --topic cg --producers "$PRODUCERS" --acks 1 \
  --duration "$SECONDS_PER_RUN" --message-size 1024 --batch-bytes 16384 "${LINGER[@]}" >> "$DATA/produce.txt" 2>&1

# A clean shutdown under valgrind is slow; the second signal exits at once, and DHAT
# writes its file on the way out.
kill -INT $PID
sleep 5
kill -INT $PID 2> /dev/null || true
for _ in $(seq 600); do [ -s "$DATA/dhat.json" ] && ! kill -0 $PID 2> /dev/null && break; sleep 0.5; done
trap - EXIT

requests=$(sed -n 's/^produce: .*(\([0-9]*\) msgs, \([0-9]*\) requests.*/\2/p' "$DATA/produce.txt" | paste -sd+ | bc)
echo "DHAT on $SPATE_BIN (sha256 $(sha256sum "$SPATE_BIN" | cut -c1-12), built $(date -r "$SPATE_BIN" -u +%FT%TZ); repository at $(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo '?')), --cores 1, fsync never, $PRODUCERS producers"
python3 - "$DATA/dhat.json" "$requests" << 'EOF'
import json, re, sys
d = json.load(open(sys.argv[1]))
requests = int(sys.argv[2])
ftbl, pps = d["ftbl"], d["pps"]
def frames(pp):
    return [re.sub(r"^0x[0-9A-Fa-f]+: ", "", ftbl[i]) for i in pp["fs"]]
total = sum(p["tbk"] for p in pps)
shard = sum(p["tbk"] for p in pps if any("run_task_queues" in f for f in frames(p)))
print(f"produce requests: {requests}")
print(f"allocations per request: {total / requests:.1f} in the process, {shard / requests:.1f} in the shard's tasks (glommio's own reactor work apart)")
print("sites with at least 0.3 per request (per request, mean bytes, first frames in Spate or glommio):")
for p in sorted(pps, key=lambda p: -p["tbk"]):
    if p["tbk"] < 0.3 * requests:
        break
    named = [re.sub(r"<.*?>", "", f) for f in frames(p) if "spate::" in f or "glommio" in f][:3]
    print(f"  {p['tbk'] / requests:5.2f} {p['tb'] / p['tbk']:7.0f} B  " + " <- ".join(n[:80] for n in named))
EOF
