#!/usr/bin/env bash
# Spate against Apache Kafka itself, side by side in one run (issue 20).
#
# Also runs the spate-bench workloads against null-broker (bench/loadgen/src/null_broker.rs:
# a Kafka protocol responder that acknowledges without storing), the client's own limit.
#
# Starts Apache Kafka 4.4.0 (kafka_2.13 from Maven Central, pinned by
# bench/kafka-broker/pom.xml, resolved once and cached in ~/.m2) as a single-node KRaft
# broker with its start script's JVM settings (-Xmx1G -Xms1G, G1) and its defaults
# otherwise, beside a Spate broker at its defaults. Both run for the whole phase; each
# workload then runs against one, then the other, ROUNDS times, the order swapped every
# round, so drift on this noisy machine hits both alike. The same clients drive both:
# spate-bench (our load generator, raw Kafka protocol), librdkafka's rdkafka_performance
# (built once by bench/rdkafka_perf.sh; librdkafka's defaults: acks=all, its sticky
# partitioner, which with rdkafka_performance's linger.ms=1000 puts nearly every record
# in one partition, so its rows are "~1 partition") and Kafka's own kafka-producer-perf-test / kafka-consumer-perf-test (the
# Java client at its defaults: acks=all, idempotence on).
#
# Phases:
#   fsync never  (Kafka's default; Spate --fsync never)
#     produce 1 KiB flat out, 8 partitions, acks=1 and acks=all (sticky: no keys)
#     produce keyed (random keys), 8 partitions, acks=1
#     consume the 8-partition backlog from the start
#     produce at 1,000 partitions; produce from 200 producer connections (8 partitions)
#     rdkafka_performance: produce RDK_RECORDS records to an 8-partition topic (~1
#       partition gets the records), then consume that backlog (the same size on both
#       systems: a fixed count, since rdkafka_performance's consume MB/s rises with the
#       backlog's size, and a backlog made in DURATION s is as large as the produce was fast)
#     kafka-producer-perf-test / kafka-consumer-perf-test, 8 partitions
#     latency: 1 producer + 1 consumer at half the slower system's acks=1 maximum, LONG
#       seconds each, percentiles per BUCKET seconds (so a tail that grows shows), SVG plots
#   fsync on every batch (Kafka log.flush.interval.messages=1 = flush.messages=1;
#     Spate --fsync always, group commit)
#     produce flat out, 8 partitions, acks=1; rdkafka_performance; kafka-producer-perf-test
#
# Environment (all optional):
#   DURATION=15  seconds per flat-out workload     ROUNDS=2   runs per system and workload
#   LONG=600     seconds of the latency run          BUCKET=60  seconds per latency bucket
#   PERF_RECORDS=1000000  records per perf-tool run  SKIP_LONG=1 / SKIP_FSYNC=1 / SKIP_JAVA=1
#   RDK_RECORDS=4000000   records per rdkafka_performance produce (at most 8 x DURATION s)
#   SKIP_RDKAFKA=1  no rdkafka_performance (RDKAFKA_PERF=path: use that binary)
#   WORKLOADS=regex  only the spate-bench workloads whose name matches (grep -E)
#   SKIP_NULL=1  no null broker
#   SB_MSG       (per workload, set in the script) spate-bench's record size, else 1 KiB
#   Every spate-bench run also writes the broker's cost to cost.tsv (bench/cost.py: CPU
#   user and system, page faults, context switches, per GB; and the whole machine's busy
#   CPU less the client's, which counts the kernel threads' work for the broker, such
#   as writeback and deferred softirqs), and table.md ends with
#   their medians, Spate beside Kafka (not with SYSCALLS=1: the tracer's cost counts).
#   SYSCALLS=1   trace each broker's system calls over each spate-bench run (perf trace -s,
#                its own cost shows in the MB/s): per request and per MB in syscalls.txt
#   OUT=/tmp/spate-vs-kafka-<time>   results.tsv, table.md, JSON, SVG plots, broker logs,
#                cpu.tsv (each rdkafka consume run: wall, broker and client CPU seconds)
#   READ_AHEAD_KB=128  set the read-ahead of the disk under OUT for the run (root; restored
#                after). Kafka writes its sparse, mmap'ed index files without
#                MADV_RANDOM, so each first write to an index page reads around it as
#                far as the read-ahead: at this VM's 8192 KiB, Kafka at 1,000 partitions
#                ran at ~3 MB/s, at Linux's default of 128 KiB ~320 MB/s. The value in
#                force is printed and kept in $OUT/read_ahead_kb either way.
#   SPATE_UNPINNED=1  also run a second Spate with `--pin-shards false` ("Spate-unpinned")
#                through the fsync-never spate-bench workloads and the latency run: on a
#                host whose cores the broker shares with the clients, as here, pinned
#                shards wait for the client's threads on their own core
#   SPATE_TUNED='FLAGS'  also run a Spate started with these extra flags ("Spate-tuned"),
#                through the same workloads as Spate-unpinned, the rdkafka_performance runs
#                and the fsync-always phase (spate-bench and rdkafka_performance); e.g.
#                SPATE_TUNED='--pin-shards false --drop-behind-bytes 268435456' for a VM
#                shared with its clients whose host takes free memory back
#   RATE=N       the latency run's records/s (default: half the slower acks=1 maximum;
#                set it when WORKLOADS leaves the acks=1 run out)
#   SPATE_BIN, SPATE_BENCH_BIN
# Needs java 17 and mvn (scripts/install-deps resolves tests/kafka-tools; this script
# resolves bench/kafka-broker itself), .venv (confluent-kafka, to delete topics between
# workloads so the disk does not fill), cargo for spate-bench.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DURATION="${DURATION:-15}"
ROUNDS="${ROUNDS:-2}"
LONG="${LONG:-600}"
BUCKET="${BUCKET:-60}"
PERF_RECORDS="${PERF_RECORDS:-1000000}"
RDK_RECORDS="${RDK_RECORDS:-4000000}"
OUT="${OUT:-/tmp/spate-vs-kafka-$(date +%s)}"
SPATE_BIN="${SPATE_BIN:-$ROOT/target/release/spate}"
PY="$ROOT/.venv/bin/python"
MSG=1024
mkdir -p "$OUT"
RESULTS="$OUT/results.tsv"
: > "$RESULTS"
PIDS=()
# The read-ahead of the block device under OUT (a partition's disk, for vda1 too).
RA_FILE=""
dev=$(lsblk -no PKNAME "$(df --output=source "$OUT" | tail -1)" 2>/dev/null | head -1)
[ -n "$dev" ] || dev=$(basename "$(df --output=source "$OUT" | tail -1)")
[ -e "/sys/block/$dev/queue/read_ahead_kb" ] && RA_FILE="/sys/block/$dev/queue/read_ahead_kb"
RA_BEFORE=$([ -n "$RA_FILE" ] && cat "$RA_FILE" || echo unknown)
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true
  # The brokers' data (tens of GB after a latency run), also when the script stops early;
  # logs and results stay.
  rm -rf "$OUT"/*-never/data "$OUT"/*-always/data
  if [ -n "${READ_AHEAD_KB:-}" ] && [ -n "$RA_FILE" ]; then echo "$RA_BEFORE" > "$RA_FILE" || true; fi
}
trap cleanup EXIT
if [ -n "${READ_AHEAD_KB:-}" ]; then
  [ -n "$RA_FILE" ] || { echo "READ_AHEAD_KB: no block device found under $OUT" >&2; exit 1; }
  echo "$READ_AHEAD_KB" > "$RA_FILE"
fi
echo "${RA_FILE:-unknown}: $([ -n "$RA_FILE" ] && cat "$RA_FILE" || echo unknown) KiB (was $RA_BEFORE)" | tee "$OUT/read_ahead_kb" >&2
log() { echo "== $(date +%H:%M:%S) $*" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# ---------------------------------------------------------------- tools
if [ -z "${SPATE_BENCH_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p spate-bench >&2)
  SPATE_BENCH_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/spate-bench"
fi
NULL_BIN="${NULL_BIN:-$(dirname "$SPATE_BENCH_BIN")/null-broker}"
[ -x "$SPATE_BIN" ] || { echo "no spate binary at $SPATE_BIN (cargo build --release)" >&2; exit 1; }
[ -x "$PY" ] || { echo "no $PY: run scripts/install-deps" >&2; exit 1; }
classpath() { # POM-DIR -> classpath (resolved online once, offline after)
  (cd "$1" && { mvn -o -q -B dependency:build-classpath -Dmdep.outputFile="$OUT/cp.txt" >/dev/null 2>&1 \
    || { mvn -q -B dependency:go-offline >&2 && mvn -o -q -B dependency:build-classpath -Dmdep.outputFile="$OUT/cp.txt" >&2; }; })
  cat "$OUT/cp.txt"
}
if [ -z "${SKIP_RDKAFKA:-}" ]; then
  RDKAFKA_PERF=$("$ROOT/bench/rdkafka_perf.sh") || { log "no rdkafka_performance: its runs are skipped"; RDKAFKA_PERF=""; }
fi
KAFKA_CP=$(classpath "$ROOT/bench/kafka-broker")
TOOLS_CP=$(classpath "$ROOT/tests/kafka-tools")
tool() { java -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$TOOLS_CP" "org.apache.kafka.tools.$1" "${@:2}"; }

# ---------------------------------------------------------------- brokers
# kafka-server-start.sh / kafka-run-class.sh defaults.
KAFKA_JVM=(-Xmx1G -Xms1G -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
           -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -Djava.awt.headless=true)
start_kafka() { # FSYNC DIR PORT; sets LAST_PID
  local fsync=$1 dir=$2 port=$3 cport; cport=$(free_port)
  mkdir -p "$dir"
  cat > "$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
EOF
  if [ "$fsync" = always ]; then echo "log.flush.interval.messages=1" >> "$dir/server.properties"; fi
  java -cp "$KAFKA_CP" kafka.tools.StorageTool format --cluster-id="$(python3 -c 'import uuid,base64;print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')" \
    -c "$dir/server.properties" > "$dir/format.log" 2>&1
  java "${KAFKA_JVM[@]}" -cp "$KAFKA_CP" kafka.Kafka "$dir/server.properties" > "$dir/broker.log" 2>&1 &
  LAST_PID=$!
}
start_spate() { # FSYNC DIR PORT [FLAG...]; sets LAST_PID
  mkdir -p "$2"
  "$SPATE_BIN" serve --data-dir "$2/data" --listen "127.0.0.1:$3" --fsync "$1" --max-broker-partitions 10000 "${@:4}" \
    > "$2/broker.log" 2>&1 &
  LAST_PID=$!
}
wait_ready() { # PORT: Metadata answered (an open port alone is not a ready Kafka)
  "$PY" - "$1" <<'PY'
import sys, time
from confluent_kafka.admin import AdminClient
a = AdminClient({"bootstrap.servers": f"127.0.0.1:{sys.argv[1]}", "log_level": 0})
deadline = time.time() + 120
while time.time() < deadline:
    try:
        a.list_topics(timeout=2); sys.exit(0)
    except Exception:
        time.sleep(0.2)
sys.exit("broker not ready in 120 s")
PY
}
create_topic() { # PORT NAME PARTITIONS: created, and every partition takes a write
  "$PY" - "$@" <<'PY'
import sys, time
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
port, name, parts = sys.argv[1], sys.argv[2], int(sys.argv[3])
a = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
try:
    a.create_topics([NewTopic(name, parts, 1)], operation_timeout=60)[name].result()
except Exception as e:  # a later round appends to the topic an earlier one made
    if "TOPIC_ALREADY_EXISTS" not in str(e):
        raise
deadline = time.time() + 120
while True:
    t = a.list_topics(topic=name, timeout=10).topics.get(name)
    if t and t.error is None and len(t.partitions) == parts and all(p.leader >= 0 for p in t.partitions.values()):
        break
    if time.time() > deadline:
        sys.exit(f"{name}: partitions not led in 120 s")
    time.sleep(0.2)
# Metadata naming a leader is not enough: Kafka answered NOT_LEADER_OR_FOLLOWER for
# hundreds of a new 1,000-partition topic's partitions for the whole of a 18 s run. So
# one record goes to every partition (the producer retries until each is taken).
p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
failed = []
for i in range(parts):
    p.produce(name, b"warm-up", partition=i, on_delivery=lambda err, _m: err and failed.append(err))
    p.poll(0)
if p.flush(120) != 0 or failed:
    sys.exit(f"{name}: not every partition took a write in 120 s: {failed[:3]}")
PY
}
delete_topics() { # PORT: every topic but the internal ones, and wait until they are gone
  "$PY" - "$1" <<'PY'
import sys, time
from confluent_kafka.admin import AdminClient
a = AdminClient({"bootstrap.servers": f"127.0.0.1:{sys.argv[1]}"})
names = [t for t in a.list_topics(timeout=10).topics if not t.startswith("__")]
if names:
    for f in a.delete_topics(names, operation_timeout=60).values():
        try:
            f.result()
        except Exception as e:
            print(f"delete: {e}", file=sys.stderr)
    deadline = time.time() + 60
    while time.time() < deadline and any(n in a.list_topics(timeout=10).topics for n in names):
        time.sleep(0.2)
PY
}

# row SYSTEM FSYNC WORKLOAD TOOL ROUND MBPS MSGPS P50 P99 P999 P9999 MAX
bench_row() { # SYSTEM FSYNC WORKLOAD ROUND JSON
  "$PY" - "$@" >> "$RESULTS" <<'PY'
import json, sys
system, fsync, workload, rnd, path = sys.argv[1:6]
d = json.load(open(path))
t = d["consume"] if workload.startswith(("consume", "e2e")) else d["produce"]
lat = d["end_to_end_latency"] if workload.startswith("e2e") else d["publish_latency"]
f = lambda v: f"{v:.2f}" if lat["count"] and not workload.startswith("consume") else "-"
print("\t".join([system, fsync, workload, "spate-bench", rnd, f"{t['mb_per_sec']:.1f}", f"{t['msgs_per_sec']:.0f}",
                 f(lat["p50_ms"]), f(lat["p99_ms"]), f(lat["p999_ms"]), f(lat["p9999_ms"]), f(lat["max_ms"])]))
PY
}
perf_row() { # SYSTEM FSYNC WORKLOAD ROUND LOG (ProducerPerformance / ConsumerPerformance output)
  "$PY" - "$@" >> "$RESULTS" <<'PY'
import re, sys
system, fsync, workload, rnd, path = sys.argv[1:6]
text = open(path, errors="replace").read()
if workload.startswith("produce"):
    m = re.findall(r"records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), [\d.]+ ms avg latency, [\d.]+ ms max latency, "
                   r"(\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th", text)
    if m:
        rps, mbps, p50, _p95, p99, p999 = m[-1]
        print("\t".join([system, fsync, workload, "kafka-producer-perf-test", rnd, f"{float(mbps)*1.048576:.1f}",
                         f"{float(rps):.0f}", p50, p99, p999, "-", "-"]))
else:
    # start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, ...
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 6 and re.match(r"\d{4}-", parts[0]):
            print("\t".join([system, fsync, workload, "kafka-consumer-perf-test", rnd,
                             f"{float(parts[3])*1.048576:.1f}", f"{float(parts[5]):.0f}", "-", "-", "-", "-", "-"]))
PY
}

start_null() { # DIR PORT; sets LAST_PID
  mkdir -p "$1"
  "$NULL_BIN" --listen "127.0.0.1:$2" > "$1/broker.log" 2>&1 &
  LAST_PID=$!
}
declare -A PORT DIR PID
SYSTEMS="Spate Kafka"
phase_start() { # FSYNC SYSTEM...
  local fsync=$1; shift
  SYSTEMS="$*"
  for sys in $SYSTEMS; do
    PORT[$sys]=$(free_port); DIR[$sys]="$OUT/$sys-$fsync"
    case $sys in
      Spate) start_spate "$fsync" "${DIR[$sys]}" "${PORT[$sys]}" ;;
      Spate-unpinned) start_spate "$fsync" "${DIR[$sys]}" "${PORT[$sys]}" --pin-shards false ;;
      # shellcheck disable=SC2086 # a list of flags
      Spate-tuned) start_spate "$fsync" "${DIR[$sys]}" "${PORT[$sys]}" $SPATE_TUNED ;;
      Kafka) start_kafka "$fsync" "${DIR[$sys]}" "${PORT[$sys]}" ;;
      Null) start_null "${DIR[$sys]}" "${PORT[$sys]}" ;;
    esac
    PIDS+=("$LAST_PID"); PID[$sys]=$LAST_PID
    wait_ready "${PORT[$sys]}" || { tail -20 "${DIR[$sys]}/broker.log" >&2; exit 1; }
    log "$sys (fsync $fsync) ready on ${PORT[$sys]}"
  done
}
phase_stop() {
  for sys in $SYSTEMS; do kill "${PID[$sys]}" 2>/dev/null || true; done
  for sys in $SYSTEMS; do wait "${PID[$sys]}" 2>/dev/null || true; rm -rf "${DIR[$sys]}/data"; done
}
order() { # ROUND [SYSTEM...] -> the systems (default: the phase's), rotated by one every round
  local r=$1; shift
  local list=(${*:-$SYSTEMS}) n i
  n=${#list[@]}
  for i in $(seq 0 $((n - 1))); do printf '%s ' "${list[$(( (i + r - 1) % n ))]}"; done
}
# sb FSYNC WORKLOAD-NAME DELETE(0: keep, 1: after each run, 2: after the last round) TOPIC PARTITIONS(0: exists) spate-bench-args...:
# every round, both systems
sb() {
  local fsync=$1 name=$2 del=$3 topic=$4 parts=$5; shift 5
  if [ -n "${WORKLOADS:-}" ] && ! grep -qE "$WORKLOADS" <<< "$name"; then return 0; fi
  local tag; tag=$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_')
  for r in $(seq "$ROUNDS"); do
    for sys in $(order "$r"); do
      local j="${DIR[$sys]}/$tag-$r.json"
      log "$sys fsync=$fsync $name (round $r)"
      if [ "$parts" -gt 0 ]; then create_topic "${PORT[$sys]}" "$topic" "$parts"; fi
      local tracer=""
      if [ "${SYSCALLS:-0}" = 1 ]; then # the broker's system calls over the run (perf trace -s)
        perf trace -s -p "${PID[$sys]}" -o "${j%.json}.syscalls" > /dev/null 2>&1 & tracer=$!
        sleep 1
      fi
      python3 "$ROOT/bench/cost.py" snap "${PID[$sys]}" > "${j%.json}.cost0"
      /usr/bin/time -f "%U %S" -o "${j%.json}.client" \
        "$SPATE_BENCH_BIN" --bootstrap "127.0.0.1:${PORT[$sys]}" --message-size "${SB_MSG:-$MSG}" --topic "$topic" "$@" --label "$sys $name" \
        --json "$j" > "${j%.json}.txt" 2> "${j%.json}.err" || log "$sys $name failed: $(tail -2 "${j%.json}.err")"
      if [ -s "$j" ] && [ -z "$tracer" ]; then # the broker's cost over the run (a tracer's own cost would count)
        python3 "$ROOT/bench/cost.py" row "$sys" "$fsync" "$name" "$r" "${j%.json}.cost0" "${PID[$sys]}" "$j" "${j%.json}.client" >> "$OUT/cost.tsv"
      fi
      if [ -n "$tracer" ]; then
        kill -INT "$tracer"; wait "$tracer" || true
        if [ -s "$j" ]; then
          python3 "$ROOT/bench/syscall_summary.py" "${j%.json}.syscalls" "$j" "$sys fsync=$fsync $name round $r" >> "$OUT/syscalls.txt"
        fi
      fi
      if [ -s "$j" ]; then bench_row "$sys" "$fsync" "$name" "$r" "$j"; fi
      if [ "$del" = 1 ] || { [ "$del" = 2 ] && [ "$r" = "$ROUNDS" ]; }; then delete_topics "${PORT[$sys]}"; fi
    done
  done
}
# The first WARMUP seconds of each flat-out run are left out (Kafka's JIT warms up).
WARMUP="${WARMUP:-3}"
COMMON=(--batch-bytes 131072 --linger-ms 1 --in-flight 5 --warmup "$WARMUP" --duration "$DURATION")

run_java() { # FSYNC ROUND (the Java clients need groups and InitProducerId: not the null broker)
  local fsync=$1 r=$2
  for sys in $(order "$r" Spate Kafka); do
    local d="${DIR[$sys]}" b="127.0.0.1:${PORT[$sys]}"
    log "$sys fsync=$fsync kafka-producer-perf-test (round $r)"
    create_topic "${PORT[$sys]}" perf 8
    tool ProducerPerformance --topic perf --num-records "$PERF_RECORDS" --record-size $MSG --throughput -1 \
      --producer-props "bootstrap.servers=$b" > "$d/perf-produce-$r.log" 2>&1 || true
    perf_row "$sys" "$fsync" "produce 1 KiB x8p (Java client defaults: acks=all, idempotent)" "$r" "$d/perf-produce-$r.log"
    if [ "$fsync" = never ]; then
      tool ConsumerPerformance --bootstrap-server "$b" --topic perf --num-records "$PERF_RECORDS" --timeout 60000 \
        > "$d/perf-consume-$r.log" 2>&1 || true
      perf_row "$sys" "$fsync" "consume backlog x8p (Java consumer)" "$r" "$d/perf-consume-$r.log"
    fi
    delete_topics "${PORT[$sys]}"
  done
}

# CPU seconds (user + system) a process has used; cpu.tsv gets, per rdkafka consume run:
# system, workload, round, wall s, broker CPU s, client CPU s (on 2 cores the two share
# the machine, so a broker's CPU per MB is the client's loss).
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$1/stat"; }
rdk_row() { # SYSTEM FSYNC WORKLOAD ROUND LOG (rdkafka_performance's last "N msgs/s": its summary)
  "$PY" - "$@" >> "$RESULTS" <<'PY'
import re, sys
system, fsync, workload, rnd, path = sys.argv[1:6]
m = re.findall(r"([\d.]+) msgs/s", open(path, errors="replace").read())
if m:
    msgs = m[-1]
    print("\t".join([system, fsync, workload, "rdkafka_performance", rnd, f"{float(msgs) * 1024 / 1e6:.1f}",
                     f"{float(msgs):.0f}", "-", "-", "-", "-", "-"]))
PY
}
run_rdkafka() { # FSYNC ROUND: produce RDK_RECORDS at librdkafka's defaults, then (fsync never) consume them
  local fsync=$1 r=$2 parts="" p
  for p in 0 1 2 3 4 5 6 7; do parts="$parts -p $p"; done
  for sys in $(order "$r" Spate ${SPATE_TUNED:+Spate-tuned} Kafka); do
    local d="${DIR[$sys]}" b="127.0.0.1:${PORT[$sys]}"
    log "$sys fsync=$fsync rdkafka_performance (round $r)"
    create_topic "${PORT[$sys]}" rdk 8
    timeout -s INT $((8 * DURATION)) "$RDKAFKA_PERF" -P -t rdk -b "$b" -s $MSG -c "$RDK_RECORDS" -q \
      > "$d/rdk-produce-$r.log" 2>&1 || true
    rdk_row "$sys" "$fsync" "produce 1 KiB x8p topic, ~1p filled (librdkafka defaults: acks=all, sticky)" "$r" "$d/rdk-produce-$r.log"
    if [ "$fsync" = never ]; then
      local b0 t0 c1
      b0=$(cpu_s "${PID[$sys]}"); t0=$(date +%s.%N)
      /usr/bin/time -f "%U %S" -o "$d/rdk-consume-$r.time" \
        timeout 120 "$RDKAFKA_PERF" -C -t rdk -b "$b" $parts -o beginning -e -q > "$d/rdk-consume-$r.log" 2>&1 || true
      rdk_row "$sys" "$fsync" "consume backlog x8p topic, ~1p filled (librdkafka)" "$r" "$d/rdk-consume-$r.log"
      c1=$(tail -1 "$d/rdk-consume-$r.time" | awk '{printf "%.2f", $1 + $2}')
      printf '%s\t%s\t%s\t%.2f\t%.2f\t%s\n' "$sys" "rdkafka consume" "$r" "$(date +%s.%N | awk -v t="$t0" '{print $1 - t}')" \
        "$(awk -v a="$b0" -v b="$(cpu_s "${PID[$sys]}")" 'BEGIN{print b - a}')" "$c1" >> "$OUT/cpu.tsv"
    fi
    delete_topics "${PORT[$sys]}"
  done
}

# ---------------------------------------------------------------- fsync never
NULL_SYSTEM=Null; [ "${SKIP_NULL:-0}" = 1 ] && NULL_SYSTEM=""
phase_start never Spate ${SPATE_UNPINNED:+Spate-unpinned} ${SPATE_TUNED:+Spate-tuned} Kafka $NULL_SYSTEM
sb never "produce 1 KiB x8p acks=1" 0 p8 8 --producers 1 --acks 1 "${COMMON[@]}"
sb never "consume backlog x8p" 0 p8 0 --producers 0 --consumers 1 --consume-from earliest --duration "$DURATION"
sb never "consume backlog x8p, 8 consumers" 2 p8 0 --producers 0 --consumers 8 --consume-from earliest --duration "$DURATION"
sb never "produce 1 KiB x8p acks=all" 1 pall 8 --producers 1 --acks -1 "${COMMON[@]}"
sb never "produce 1 KiB x8p acks=1 keyed" 1 pkey 8 --producers 1 --acks 1 --key-distribution random "${COMMON[@]}"
SB_MSG=100 sb never "produce 100 B x8p acks=1 keyed, 16 KiB batches" 1 psmall 8 --producers 1 --acks 1 \
  --key-distribution random --batch-bytes 16384 --linger-ms 1 --in-flight 5 --warmup "$WARMUP" --duration "$DURATION"
sb never "produce 1 KiB x1000p acks=1" 1 p1000 1000 --producers 1 --acks 1 "${COMMON[@]}"
sb never "produce 1 KiB x8p acks=1, 200 producers" 1 p200 8 --producers 200 --acks 1 \
  --batch-bytes 16384 --linger-ms 5 --in-flight 5 --warmup "$WARMUP" --duration "$DURATION"
if [ -n "${RDKAFKA_PERF:-}" ]; then for r in $(seq "$ROUNDS"); do run_rdkafka never "$r"; done; fi
if [ -z "${SKIP_JAVA:-}" ]; then for r in $(seq "$ROUNDS"); do run_java never "$r"; done; fi

if [ -z "${SKIP_LONG:-}" ]; then
  # Half of the slower system's acks=1 maximum (the median over rounds), unless RATE is set.
  HALF=${RATE:-}
  [ -n "$HALF" ] || HALF=$("$PY" - "$RESULTS" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
m = {s: statistics.median(float(r[6]) for r in rows if r[0] == s and r[2] == "produce 1 KiB x8p acks=1")
     for s in ("Spate", "Kafka")}
print(int(min(m.values()) / 2))
PY
)
  for sys in $(order 1 Spate ${SPATE_UNPINNED:+Spate-unpinned} ${SPATE_TUNED:+Spate-tuned} Kafka); do
    j="${DIR[$sys]}/latency.json"
    log "$sys latency at $HALF msg/s for $LONG s"
    create_topic "${PORT[$sys]}" lat 8
    "$SPATE_BENCH_BIN" --bootstrap "127.0.0.1:${PORT[$sys]}" --message-size $MSG --topic lat \
      --producers 1 --consumers 1 --acks 1 --rate "$HALF" --warmup 5 --duration "$LONG" --bucket-secs "$BUCKET" \
      --batch-bytes 131072 --linger-ms 1 --in-flight 5 --label "$sys @ $HALF msg/s" --json "$j" \
      --plot "$OUT/latency-$sys.svg" > "${j%.json}.txt" 2> "${j%.json}.err" || log "$sys latency failed: $(tail -2 "${j%.json}.err")"
    if [ -s "$j" ]; then
      bench_row "$sys" never "publish @${HALF}/s x8p, ${LONG} s" 1 "$j"
      bench_row "$sys" never "e2e @${HALF}/s x8p, ${LONG} s" 1 "$j"
      cp "$j" "$OUT/latency-$sys.json"
    fi
    delete_topics "${PORT[$sys]}"
  done
fi
phase_stop

# ---------------------------------------------------------------- fsync on every batch
if [ -z "${SKIP_FSYNC:-}" ]; then
  phase_start always Spate ${SPATE_TUNED:+Spate-tuned} Kafka
  sb always "produce 1 KiB x8p acks=1" 1 p8 8 --producers 1 --acks 1 "${COMMON[@]}"
  if [ -n "${RDKAFKA_PERF:-}" ]; then for r in $(seq "$ROUNDS"); do run_rdkafka always "$r"; done; fi
  if [ -z "${SKIP_JAVA:-}" ]; then for r in $(seq "$ROUNDS"); do run_java always "$r"; done; fi
  phase_stop
fi

# ---------------------------------------------------------------- table
"$PY" - "$RESULTS" "$OUT" "$BUCKET" <<'PY'
import json, os, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
out_dir, bucket = sys.argv[2], sys.argv[3]
keys = []
for r in rows:
    k = (r[1], r[2], r[3])
    if k not in keys:
        keys.append(k)
num = lambda v: None if v in ("-", "") else float(v)
def med(system, k, col):
    vals = [num(r[col]) for r in rows if r[0] == system and (r[1], r[2], r[3]) == k and num(r[col]) is not None]
    return (statistics.median(vals), vals) if vals else (None, [])
lines = ["| fsync | workload | tool | Spate MB/s | Kafka MB/s | Spate/Kafka | null broker MB/s | Spate/null | Spate p99 ms | Kafka p99 ms | Spate p99.9 | Kafka p99.9 | Spate p99.99 | Kafka p99.99 | runs (MB/s) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
fmt = lambda v: "-" if v is None else f"{v:.1f}" if v >= 10 else f"{v:.2f}"
for k in keys:
    s, sv = med("Spate", k, 5); kf, kv = med("Kafka", k, 5); nl, nv = med("Null", k, 5)
    ratio = f"{s/kf:.2f}x" if s and kf else "-"
    nratio = f"{s/nl:.2f}" if s and nl else "-"
    lat = [med(sysn, k, c)[0] for c in (8, 9, 10) for sysn in ("Spate", "Kafka")]
    runs = "S " + "/".join(f"{v:.0f}" for v in sv) + ", K " + "/".join(f"{v:.0f}" for v in kv)
    if nv:
        runs += ", N " + "/".join(f"{v:.0f}" for v in nv)
    lines.append("| " + " | ".join([k[0], k[1], k[2], fmt(s), fmt(kf), ratio, fmt(nl), nratio] + [fmt(v) for v in lat] + [runs]) + " |")
variants = {"Spate-unpinned": "--pin-shards false", "Spate-tuned": os.environ.get("SPATE_TUNED", "")}
for variant, flags in variants.items():
    if not any(r[0] == variant for r in rows):
        continue
    lines += ["", f"Spate with {flags} ({variant}), against the same Kafka runs:", "",
              f"| fsync | workload | tool | {variant} MB/s | {variant}/Kafka | p99 ms | p99.9 | p99.99 | runs (MB/s) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for k in keys:
        u, uv = med(variant, k, 5)
        if not uv:
            continue
        kf = med("Kafka", k, 5)[0]
        lines.append("| " + " | ".join([k[0], k[1], k[2], fmt(u), f"{u/kf:.2f}x" if u and kf else "-"]
                     + [fmt(med(variant, k, c)[0]) for c in (8, 9, 10)]
                     + ["/".join(f"{v:.0f}" for v in uv)]) + " |")
for system in ("Spate", "Spate-unpinned", "Spate-tuned", "Kafka"):
    p = os.path.join(out_dir, f"latency-{system}.json")
    if not os.path.exists(p):
        continue
    d = json.load(open(p))
    lines += ["", f"{system}: latency per {bucket} s bucket (ms; the first holds the warm-up)", "",
              "| until s | publish p50 | p99 | p99.9 | max | e2e p50 | p99 | p99.9 | max |", "|---|---|---|---|---|---|---|---|---|"]
    for b in d.get("buckets", []):
        pb, eb = b["publish"], b["end_to_end"]
        lines.append("| " + " | ".join([f"{b['end_secs']:.0f}"] + [f"{x[c]:.2f}" for x in (pb, eb)
                     for c in ("p50_ms", "p99_ms", "p999_ms", "max_ms")]) + " |")
text = "\n".join(lines) + "\n"
open(os.path.join(out_dir, "table.md"), "w").write(text)
print(text)
PY
if [ -s "$OUT/cost.tsv" ]; then
  { echo; echo "Broker CPU per GB taken in (or served, for consume), medians over rounds (cost.tsv; bench/cost.py):"; echo
    python3 "$ROOT/bench/cost.py" table "$OUT/cost.tsv"; } | tee -a "$OUT/table.md"
fi
log "results in $OUT (results.tsv, table.md, per-run JSON, latency-*.svg, broker logs)"
