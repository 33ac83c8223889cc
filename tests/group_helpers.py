"""Helpers for the consumer-group tests: a group member in its own process
(helpers/group_member.py) and the checks on what members printed."""

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

MEMBER_SCRIPT = Path(__file__).resolve().parent / "helpers" / "group_member.py"


def wait_until(pred, timeout, desc, interval=0.05, diag=None):
    """Poll `pred` until it returns something truthy; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            extra = f"\n{diag()}" if diag else ""
            raise AssertionError(f"timed out after {timeout}s waiting for: {desc}{extra}")
        time.sleep(interval)


class Member:
    """A group member process.  `events` holds the JSON lines it printed."""

    def __init__(self, name, workdir, bootstrap, group, topic, client="confluent",
                 assignor=None, instance_id=None, session_timeout_ms=4000,
                 heartbeat_interval_ms=500, delay_ms=0.0, commit_every=1, extra=()):
        self.name = name
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = self.workdir / f"member-{name}.stderr"
        cmd = [sys.executable, str(MEMBER_SCRIPT), "--client", client, "--bootstrap", bootstrap,
               "--group", group, "--topic", topic,
               "--session-timeout-ms", str(session_timeout_ms),
               "--heartbeat-interval-ms", str(heartbeat_interval_ms),
               "--delay-ms", str(delay_ms), "--commit-every", str(commit_every),
               "--client-id", f"{group}-{name}", *extra]
        if assignor:
            cmd += ["--assignor", assignor]
        if instance_id:
            cmd += ["--instance-id", instance_id]
        self.cmd = cmd
        self.events = []
        self._lock = threading.Lock()
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            try:
                ev = json.loads(raw)
            except ValueError:
                ev = {"ev": "garbage", "line": raw.decode(errors="replace"), "t": time.time()}
            with self._lock:
                self.events.append(ev)

    # -- queries ------------------------------------------------------------------
    def evs(self, kind=None):
        with self._lock:
            return [e for e in self.events if kind is None or e["ev"] == kind]

    @property
    def assignment(self):
        a = self.evs("assignment")
        return tuple(a[-1]["parts"]) if a else None

    def consumed(self):
        return [(e["p"], e["o"], e["t"]) for e in self.evs("consumed")]

    def commits(self):
        return [(e["p"], e["o"], e["t"]) for e in self.evs("committed")]

    def callbacks(self):
        """assign / revoke / lost callback events, in order."""
        return [e for e in self.evs() if e["ev"] in ("assign", "revoke", "lost")]

    def alive(self):
        return self.proc.poll() is None

    def describe(self):
        evs = self.evs()
        counts = collections.Counter(e["ev"] for e in evs)
        interesting = [e for e in evs if e["ev"] not in ("consumed", "committed")][-20:]
        try:
            err = self.stderr_path.read_text(errors="replace")[-3000:]
        except OSError:
            err = ""
        return (f"member {self.name} (pid {self.proc.pid}, rc {self.proc.poll()}): "
                f"assignment={self.assignment} counts={dict(counts)}\n  last events: "
                f"{interesting}\n  stderr tail: {err}")

    # -- lifecycle ----------------------------------------------------------------
    def kill(self):
        """SIGKILL: no LeaveGroup, no final commit."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(5)

    def close(self, timeout=30):
        """Ask it to close its consumer (consumer.close()) and exit."""
        if self.alive():
            try:
                self.proc.stdin.write(b"close\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"member {self.name} did not close within {timeout}s")
        self._reader.join(5)

    def cleanup(self):
        if self.alive():
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self._stderr.close()


# ---------------------------------------------------------------- checks

def check_balanced(assignments, partitions):
    """The members' assignments are disjoint, cover 0..partitions-1, and differ in size
    by at most one."""
    seen = collections.Counter(p for a in assignments for p in a)
    assert sorted(seen) == list(range(partitions)) and all(v == 1 for v in seen.values()), \
        f"assignments {assignments} are not a partition of 0..{partitions - 1}"
    sizes = [len(a) for a in assignments]
    assert max(sizes) - min(sizes) <= 1, f"unbalanced assignments {assignments}"


def check_delivery(members, produced):
    """At least once, and duplicates only from the uncommitted window.

    `produced`: {partition: set(offsets)}.  Every produced offset was consumed by some
    member.  A commit of offset c on partition p (logged after the commit returned)
    means offsets < c are done: no member may consume an offset < c of p after that.
    Returns (duplicates, per-partition stats) for the report."""
    consumed = collections.defaultdict(list)  # p -> [(t, o, member)]
    commits = collections.defaultdict(list)   # p -> [(t, c, member)]
    for m in members:
        for p, o, t in m.consumed():
            consumed[p].append((t, o, m.name))
        for p, c, t in m.commits():
            commits[p].append((t, c, m.name))
    missing = {p: sorted(offs - {o for _, o, _ in consumed[p]}) for p, offs in produced.items()}
    missing = {p: v for p, v in missing.items() if v}
    assert not missing, (f"messages never consumed (partition: offsets): "
                         f"{ {p: (v[:10], len(v)) for p, v in missing.items()} }")
    dups = {}
    for p, evs in consumed.items():
        cnt = collections.Counter(o for _, o, _ in evs)
        d = sorted(o for o, n in cnt.items() if n > 1)
        if d:
            dups[p] = d
        for tc, c, who in commits[p]:
            bad = [(o, m2, round(t - tc, 3)) for t, o, m2 in evs if t > tc and o < c]
            assert not bad, (f"partition {p}: offset(s) below {c}, committed by {who} at "
                             f"{tc:.3f}, consumed again afterwards (offset, member, seconds "
                             f"after the commit): {bad[:10]}")
    return dups


def dump_events(members, path):
    """All members' events, merged by time, one JSON line each (for diagnosis)."""
    evs = sorted(({**e, "member": m.name} for m in members for e in m.evs()), key=lambda e: e["t"])
    with open(path, "w") as f:
        for e in evs:
            f.write(json.dumps(e, sort_keys=True) + "\n")


def check_uncommitted_window(members, victim, dups):
    """The issue's criterion: with synchronous commits after every message, the only
    messages read twice are the killed member's uncommitted ones: each duplicate offset
    is on a partition the victim consumed, at or after the last offset it (logged that
    it) committed there.  Survivors hand partitions over fully committed (eager members
    commit before they rejoin, cooperative ones keep what they own), so on a correct
    broker they cause no duplicates."""
    floor = {}
    for p, c, _ in victim.commits():
        floor[p] = max(c, floor.get(p, c))
    victim_parts = {p for p, _, _ in victim.consumed()}
    bad = {}
    for p, offs in dups.items():
        if p not in victim_parts:
            bad[p] = (offs, "partition never consumed by the killed member")
            continue
        below = [o for o in offs if o < floor.get(p, 0)]
        if below:
            bad[p] = (below, f"below the killed member's last commit {floor.get(p)}")
    if bad:
        failed = [(m.name, e["p"], e["o"], e["err"]) for m in members for e in m.evs("commit_failed")]
        raise AssertionError(
            f"duplicates outside the killed member ({victim.name})'s uncommitted window: {bad};"
            f" all duplicates: {dups}; failed commits (member, partition, offset, error):"
            f" {failed[:20]}{' ...' if len(failed) > 20 else ''}")
