#!/bin/bash
# Spate's publish and end-to-end latency at a fixed rate with N shards (`--cores N`),
# pinned (the default) or not (`N-unpinned`: `--pin-shards false`): one spate-bench
# producer and one consumer, 8 partitions, 1 KiB records, fsync never. On the 2-core
# development VM this separated the pinned shards' cost from the rest (bench/README.md,
# "Apache Kafka side by side"; tuning.md).
# Usage: bench/latency_cores.sh   (CORES="2 1" RATE=54078 SECS=45, ROUNDS=1: the list run
# that many times; e.g. CORES="2 2-unpinned 1"; SPATE_ARGS: more broker flags; needs target/release/spate,
# target/release/spate-bench and .venv from scripts/install-deps)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
for round in $(seq "${ROUNDS:-1}"); do
for mode in ${CORES:-2 1}; do
  cores=${mode%-unpinned}
  pin=true; [ "$mode" = "$cores" ] || pin=false
  D=$(mktemp -d /tmp/latency-cores.XXXX)
  P=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  ./target/release/spate serve --data-dir "$D/data" --listen "127.0.0.1:$P" --cores "$cores" --pin-shards $pin ${SPATE_ARGS:-} > "$D/broker.log" 2>&1 &
  B=$!
  .venv/bin/python bench/topic.py create "$P" lat 8
  ./target/release/spate-bench --bootstrap "127.0.0.1:$P" --topic lat --producers 1 --consumers 1 --acks 1 \
    --rate "${RATE:-54078}" --warmup 5 --duration "${SECS:-45}" --batch-bytes 131072 --linger-ms 1 --in-flight 5 \
    > "$D/out.txt" 2> /dev/null
  echo "cores=$mode $(grep -E '^(publish|e2e)' "$D/out.txt" | tr -s ' ' | tr '\n' ' ')"
  kill "$B"; wait "$B" 2>/dev/null || true
  rm -rf "$D"
done
done
