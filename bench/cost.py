#!/usr/bin/env python3
"""A broker's cost per GB over one benchmark run, from /proc (issue 52).

  cost.py snap PID > BEFORE.json
      the process's CPU time (user, system: all its threads, /proc/PID/stat), page
      faults (minor, major) and context switches (voluntary, involuntary: the sum over
      /proc/PID/task/*/status, so threads that ended are not counted)
  cost.py row SYSTEM FSYNC WORKLOAD ROUND BEFORE.json PID RUN.json CLIENT.time >> cost.tsv
      the difference since BEFORE, per GB the run took in (spate-bench's JSON:
      total_produced_bytes, else total_consumed_bytes, warm-up included, as the CPU is);
      CLIENT.time holds the client's user and system seconds (/usr/bin/time -f "%U %S")
  cost.py table cost.tsv
      a Markdown table: per workload, the median over rounds for each broker, and
      Spate's CPU per GB over Kafka's

cost.tsv columns: system, fsync, workload, round, GB, user s/GB, system s/GB, total
s/GB, minor faults/GB, major faults/GB, voluntary switches/GB, involuntary
switches/GB, produce requests (spate-bench's count; 0 for consume runs), machine s/GB
less the client's, the client's s/GB.

The last column is the whole machine's busy CPU (/proc/stat: all but idle, iowait and
steal) over the run, less the client's own: the broker and the kernel's work on its
behalf that runs outside its threads and so is not in its /proc times (the flusher
kworkers' writeback of dirty pages, softirqs deferred to ksoftirqd, kswapd), plus
whatever else ran (the other broker, idle). A broker that writes back on its own
threads (Spate's write-behind) or handles loopback softirqs in its own system calls
pays in its system time what another broker's kernel threads pay. Over loopback the
kernel's TCP work moves between the broker and the client too (a send runs the
receiver's softirq when it can), so for consume the fair figure is the machine's
whole CPU per GB, client included: the table gives it.
"""
import glob
import json
import os
import statistics
import sys

TICK = os.sysconf("SC_CLK_TCK")


def snap(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    # After the ")": state is field 3 of stat(5), so field N is fields[N - 3].
    out = {"user_s": int(fields[11]) / TICK, "system_s": int(fields[12]) / TICK,
           "minflt": int(fields[7]), "majflt": int(fields[9]), "vcs": 0, "ivcs": 0, "machine_s": machine_busy_s()}
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            for line in open(status):
                if line.startswith("voluntary_ctxt_switches:"):
                    out["vcs"] += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    out["ivcs"] += int(line.split()[1])
        except OSError:
            pass  # the thread ended meanwhile
    return out


def machine_busy_s():
    """All CPUs' busy time since boot: user, nice, system, irq, softirq (guest time is
    inside user), not idle, iowait or steal."""
    f = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / TICK


def row(system, fsync, workload, rnd, before_path, pid, run_path, client_path):
    before, after = json.load(open(before_path)), snap(pid)
    client_s = sum(float(v) for v in open(client_path).read().split()[-2:])
    run = json.load(open(run_path))
    gb = (run.get("total_produced_bytes") or run.get("total_consumed_bytes") or 0) / 1e9
    if gb == 0:
        return None
    d = {k: after[k] - before[k] for k in after}
    cells = [system, fsync, workload, rnd, f"{gb:.3f}", f"{d['user_s'] / gb:.3f}", f"{d['system_s'] / gb:.3f}",
             f"{(d['user_s'] + d['system_s']) / gb:.3f}", f"{d['minflt'] / gb:.0f}", f"{d['majflt'] / gb:.0f}",
             f"{d['vcs'] / gb:.0f}", f"{d['ivcs'] / gb:.0f}", str(run.get("produce_requests", 0)),
             f"{(d['machine_s'] - client_s) / gb:.3f}", f"{client_s / gb:.3f}"]
    return "\t".join(cells)


def table(path):
    rows = [line.rstrip("\n").split("\t") for line in open(path) if line.strip()]
    keys = []
    for r in rows:
        if (r[1], r[2]) not in keys:
            keys.append((r[1], r[2]))

    def med(system, key, col):
        vals = [float(r[col]) for r in rows if r[0] == system and (r[1], r[2]) == key and len(r) > col]
        return statistics.median(vals) if vals else None

    def med_sum(system, key, a, b):
        vals = [float(r[a]) + float(r[b]) for r in rows if r[0] == system and (r[1], r[2]) == key and len(r) > b]
        return statistics.median(vals) if vals else None

    fmt = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"
    lines = ["| fsync | workload | CPU s/GB Spate (user + system) | Kafka (user + system) | Spate/Kafka | "
             "user Spate/Kafka | system Spate/Kafka | machine less client, s/GB S / K | Spate/Kafka | "
             "whole machine s/GB S / K | Spate/Kafka | "
             "minor faults/GB S / K | switches/GB S / K (voluntary + involuntary) | rounds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in keys:
        s = [med("Spate", key, c) for c in (5, 6, 7, 8, 10, 11, 13)]
        k = [med("Kafka", key, c) for c in (5, 6, 7, 8, 10, 11, 13)]
        whole = lambda system: med_sum(system, key, 13, 14)
        s.append(whole("Spate"))
        k.append(whole("Kafka"))
        ratio = lambda a, b: f"{a / b:.2f}x" if a is not None and b else "-"
        n = sum(1 for r in rows if r[0] == "Spate" and (r[1], r[2]) == key)
        sw = lambda v: "-" if v[4] is None else f"{v[4] + v[5]:.0f} ({v[4]:.0f} + {v[5]:.0f})"
        lines.append("| " + " | ".join([
            key[0], key[1],
            "-" if s[2] is None else f"**{s[2]:.2f}** ({fmt(s[0])} + {fmt(s[1])})",
            "-" if k[2] is None else f"**{k[2]:.2f}** ({fmt(k[0])} + {fmt(k[1])})",
            ratio(s[2], k[2]), ratio(s[0], k[0]), ratio(s[1], k[1]),
            f"{fmt(s[6])} / {fmt(k[6])}", ratio(s[6], k[6]),
            f"{fmt(s[7])} / {fmt(k[7])}", ratio(s[7], k[7]),
            f"{fmt(s[3], 0)} / {fmt(k[3], 0)}", f"{sw(s)} / {sw(k)}", str(n)]) + " |")
    return "\n".join(lines) + "\n"


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "snap" and len(sys.argv) == 3:
        print(json.dumps(snap(int(sys.argv[2]))))
    elif cmd == "row" and len(sys.argv) == 10:
        line = row(*sys.argv[2:7], int(sys.argv[7]), sys.argv[8], sys.argv[9])
        if line:
            print(line)
    elif cmd == "table" and len(sys.argv) == 3:
        print(table(sys.argv[2]), end="")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
