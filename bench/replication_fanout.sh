#!/bin/bash
# Replica fetchers at 100 partitions per broker, two builds side by side in one run:
# three brokers (one shard each, fsync never) of OLD, then of NEW, twice, alternating.
# Prints broker-to-broker connections and acks=all replication throughput per run.
# Usage: bench/replication_fanout.sh OLD_BINARY NEW_BINARY [PARTITIONS] [MB]
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
for round in 1 2; do
  for which in old new; do
    bin=$1; [ "$which" = new ] && bin=$2
    "$PY" "$ROOT/bench/replication_fanout.py" "$bin" "$which#$round" "${3:-100}" "${4:-200}"
  done
done
