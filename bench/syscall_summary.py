#!/usr/bin/env python3
"""Summarise a `perf trace -s` file of one broker over one spate-bench run (issue 20):
system calls per request and per MB moved, the most frequent calls, and which threads
made them.

  syscall_summary.py TRACE BENCH_JSON LABEL [REQUESTS API]

REQUESTS/API: the requests the broker served in the traced window (from its metrics);
without them, the produce requests spate-bench counted are used (any broker). Threads
the broker starts after the trace attached are not traced (null-broker starts one per
connection: its counts are not valid).
"""
import json
import re
import sys


def main(trace, bench, label, requests=None, api="Produce"):
    j = json.load(open(bench))
    moved = j["produce"]["bytes"] + j["consume"]["bytes"]
    if requests is None:
        requests = j.get("produce_requests", 0)
    requests = int(requests)
    counts, threads, thread = {}, {}, None
    for line in open(trace):
        t = re.match(r"\s+(.+?) \(\d+\), \d+ events", line)
        if t:
            thread = re.sub(r"\d+$", "N", t.group(1))  # threads of one kind together
            continue
        m = re.match(r"\s+(\w+)\s+(\d+)\s+\d+\s+[\d.]+", line)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + int(m.group(2))
            threads[thread] = threads.get(thread, 0) + int(m.group(2))
    total = sum(counts.values())
    per = lambda c: c / max(requests, 1)  # noqa: E731
    mb = max(moved / 1e6, 1e-9)
    rate = j["produce"]["mb_per_sec"] + j["consume"]["mb_per_sec"]
    if requests == 0:  # a consume run through vs_kafka.sh: no request count, per MB only
        per = lambda c: float("nan")  # noqa: E731
    print(f"== {label}: {rate:.1f} MB/s while traced, {requests} {api} requests, {total} syscalls: "
          f"{per(total):.2f} per request, {total / mb:.1f} per MB")
    for call, c in sorted(counts.items(), key=lambda kv: -kv[1])[:10]:
        print(f"   {call:24} {c:9}  {per(c):8.3f} per request  {c / mb:8.2f} per MB")
    top = sorted(threads.items(), key=lambda kv: -kv[1])[:6]
    print("   by thread (per MB): " + ", ".join(f"{t} {c / mb:.2f}" for t, c in top))


if __name__ == "__main__":
    main(*sys.argv[1:])
