#!/bin/bash
# Spate's publish and end-to-end latency at a fixed rate with N shards (`--cores N`),
# pinned (the default) or not (`N-unpinned`: `--pin-shards false`), or against
# null-broker (`null`: the client's and the machine's own floor): one spate-bench
# producer and one consumer, 8 partitions, 1 KiB records, fsync never. On the 2-core
# development VM this separated the pinned shards' cost from the rest (bench/README.md,
# "Apache Kafka side by side"; tuning.md). For Spate it also prints how its own Produce
# and Fetch handling times fell into /metrics' buckets (share of requests at or under
# each bound, from decoded header to response, all shards).
# Usage: bench/latency_cores.sh   (CORES="2 1" RATE=54078 SECS=45, ROUNDS=1: the list run
# that many times; e.g. CORES="2 2-unpinned 1 null"; SPATE_ARGS: more broker flags; needs
# target/release/spate, target/release/spate-bench, target/release/null-broker (cargo build
# --release in bench/loadgen) and .venv from scripts/install-deps)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Share of requests of one API handled within each bucket bound, summed over shards.
handling() {
  curl -s "http://127.0.0.1:$1/metrics" | python3 -c '
import re, sys, collections
api = sys.argv[1]; b = collections.Counter()
for l in sys.stdin:
    m = re.match(r"spate_request_duration_seconds_bucket\{shard=\"\d+\",api=\"%s\",le=\"([^\"]+)\"\} (\d+)" % api, l)
    if m: b[m.group(1)] += int(m.group(2))
n = b.get("+Inf", 0)
if n:
    print(api, "n=%d" % n, " ".join("<=%gms:%.4f" % (float(k) * 1e3, v / n) for k, v in b.items() if k != "+Inf" and 0.0005 <= float(k) <= 0.025))' "$2"
}
for round in $(seq "${ROUNDS:-1}"); do
for mode in ${CORES:-2 1}; do
  D=$(mktemp -d /tmp/latency-cores.XXXX)
  P=$(free_port)
  M=
  if [ "$mode" = null ]; then
    ./target/release/null-broker --listen "127.0.0.1:$P" > "$D/broker.log" 2>&1 &
  else
    cores=${mode%-unpinned}
    pin=true; [ "$mode" = "$cores" ] || pin=false
    M=$(free_port)
    ./target/release/spate serve --data-dir "$D/data" --listen "127.0.0.1:$P" --metrics-listen "127.0.0.1:$M" \
      --cores "$cores" --pin-shards $pin ${SPATE_ARGS:-} > "$D/broker.log" 2>&1 &
  fi
  B=$!
  .venv/bin/python bench/topic.py create "$P" lat 8
  ./target/release/spate-bench --bootstrap "127.0.0.1:$P" --topic lat --producers 1 --consumers 1 --acks 1 \
    --rate "${RATE:-54078}" --warmup 5 --duration "${SECS:-45}" --batch-bytes 131072 --linger-ms 1 --in-flight 5 \
    > "$D/out.txt" 2> /dev/null
  echo "cores=$mode $(grep -E '^(publish|e2e)' "$D/out.txt" | tr -s ' ' | tr '\n' ' ')"
  if [ -n "$M" ]; then
    handling "$M" Produce
    handling "$M" Fetch
  fi
  kill "$B"; wait "$B" 2>/dev/null || true
  rm -rf "$D"
done
done
