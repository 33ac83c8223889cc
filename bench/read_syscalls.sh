#!/bin/bash
# System calls of a consume, counted with strace -c on the broker.
# Usage: bench/read_syscalls.sh LABEL SPATE_BIN  (one shard, fsync never; spate-bench
# produces 6 s of 1 KiB records into one partition, then kcat reads them all back)
set -u
D=/tmp/readsys-$1; rm -rf $D; mkdir -p $D
$2 serve --data-dir $D/data --listen 127.0.0.1:39401 --cores 1 --fsync never > $D/broker.log 2>&1 &
PID=$!
for _ in $(seq 1 50); do (echo > /dev/tcp/127.0.0.1/39401) 2>/dev/null && break; sleep 0.1; done
$(dirname "$0")/../target/release/spate-bench --bootstrap 127.0.0.1:39401 --topic r --partitions 1 --create-topic --producers 1 --acks 1 --duration 6 --message-size 1024 --batch-bytes 131072 --linger-ms 5 > $D/prod.txt 2>&1
BYTES=$(du -sb $D/data | cut -f1)
sleep 1
strace -f -c -p $PID -o $D/strace.txt &
ST=$!
sleep 1
start=$(date +%s.%N)
kcat -b 127.0.0.1:39401 -C -t r -o beginning -e -q -X fetch.max.bytes=52428800 > /dev/null 2>$D/kcat.err
end=$(date +%s.%N)
kill -INT $ST; wait $ST 2>/dev/null
kill $PID; wait $PID 2>/dev/null
MB=$(echo "$BYTES/1048576" | bc)
echo "$1: data ${MB} MB, consume $(echo "$end-$start" | bc) s"
grep -E 'pread64|sendfile|total' $D/strace.txt | awk -v mb=$MB '{print "   ", $0, "  per MB:", ($4/mb)}'
