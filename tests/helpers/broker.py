"""Start / stop / kill / restart a real broker process for the integration tests."""

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def default_bin():
    """`SPATE_BIN`, else the newer of the `ci` profile's build (what `scripts/test`
    builds) and the release build."""
    if os.environ.get("SPATE_BIN"):
        return Path(os.environ["SPATE_BIN"])
    built = [p for p in (REPO_ROOT / "target" / "ci" / "spate", REPO_ROOT / "target" / "release" / "spate")
             if p.exists()]
    return max(built, key=lambda p: p.stat().st_mtime) if built else REPO_ROOT / "target" / "release" / "spate"


# The broker binary every test runs.
SPATE_BIN = default_bin()

READY_TIMEOUT = float(os.environ.get("SPATE_READY_TIMEOUT", "30"))


# Ports for test brokers, below the kernel's ephemeral range (32768-60999 by default),
# where no client's connect() ever picks one: each pytest-xdist worker (PYTEST_XDIST_WORKER
# gw0, gw1, ...) and the serial run draws from its own slice, so a port one worker has
# just found free is not handed to another's broker before it binds.
PORT_BASE = 20000
PORT_SLICE = 1000
PORT_SLICES = 12
_next_port = None


def _port_slice():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    return PORT_BASE + (index % PORT_SLICES) * PORT_SLICE


def _bindable(port):
    """Nothing holds `port` on any address (a lingering socket of a killed broker included)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def free_port():
    """A TCP port that was free a moment ago on every address: the next one in this
    process's slice (see PORT_BASE) that binds. A second pytest run on the same machine
    starts at another place in the slice and skips what the first one holds."""
    global _next_port
    base = _port_slice()
    if _next_port is None:
        _next_port = random.randrange(PORT_SLICE)
    for _ in range(PORT_SLICE):
        port = base + _next_port
        _next_port = (_next_port + 1) % PORT_SLICE
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {base}..{base + PORT_SLICE}")


def port_open(host, port, timeout=0.5):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def threads_stopped(pid):
    """Whether every thread of `pid` is stopped (state T): SIGSTOP reaches each thread on
    its next trip through the kernel, not when kill() returns."""
    tasks = os.listdir(f"/proc/{pid}/task")
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state not in ("T", "t"):
            return False
    return True


class BrokerDied(RuntimeError):
    pass


class Broker:
    """One broker process.  Its data dir and port survive restart()."""

    def __init__(self, name, workdir, extra_args=(), cores=None, data_dir=None, port=None, host="127.0.0.1",
                 wrap=()):
        self.name = name
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = Path(data_dir) if data_dir else self.workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / "broker.log"
        self.host = host
        # A command prefix (e.g. `ip netns exec NS`) the broker runs under.
        self.wrap = list(wrap)
        self.port = port or free_port()
        self.extra_args = list(extra_args)
        self.cores = cores
        self.proc = None
        self.starts = 0
        self.tansu = os.environ.get("SPATE_TEST_TANSU")

    # -- properties -------------------------------------------------------------
    @property
    def bootstrap(self):
        return f"{self.host}:{self.port}"

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    # -- command line -----------------------------------------------------------
    def command(self):
        if self.tansu:
            url = f"tcp://{self.bootstrap}"
            return [self.tansu, "broker", "--listener-url", url,
                    "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
        binary = str(SPATE_BIN)
        cmd = [binary, "serve", "--data-dir", str(self.data_dir),
               "--listen", self.bootstrap, "--advertise", self.bootstrap]
        if self.cores is not None:
            cmd += ["--cores", str(self.cores)]
        if not any(a.startswith("--disk-free-min-percent") for a in self.extra_args):
            # The produce floor is the default --disk-free-min-bytes (1 GiB) on every
            # machine, not 1% of whatever disk the suite runs on (2.5 GB of a 252 GB
            # CI disk); tests of the floor (test_disk_full.py) set their own.
            cmd += ["--disk-free-min-percent", "0"]
        cmd += self.extra_args
        return self.wrap + cmd

    # -- lifecycle --------------------------------------------------------------
    def start(self, timeout=READY_TIMEOUT):
        assert not self.alive(), "broker already running"
        binary = self.command()[len(self.wrap)]
        if not os.path.exists(binary):
            raise FileNotFoundError(f"broker binary {binary} not found (cargo build --release?)")
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        env.setdefault("RUST_BACKTRACE", "1")
        env.setdefault("NO_COLOR", "1")  # plain log text in the report
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=env, cwd=str(self.workdir), start_new_session=True)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout=READY_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerDied(
                    f"broker {self.name} exited with {self.proc.returncode} before it was ready;"
                    f" log:\n{self.log_tail()}")
            if port_open(self.host, self.port):
                # The port may be someone else's (free ports can be taken between our
                # choice and the bind): ready only if our process still runs after a
                # moment, since a broker that finds its port taken exits at once.
                time.sleep(0.2)
                if self.proc.poll() is None:
                    return
                continue
            time.sleep(0.05)
        raise TimeoutError(f"broker {self.name} (pid {self.proc.pid}) did not accept connections"
                           f" on {self.bootstrap} within {timeout}s; log:\n{self.log_tail()}\n"
                           f"{self.thread_dump()}")

    def stop(self, sig=signal.SIGTERM, timeout=20):
        """Send `sig`, wait for exit; returns the exit status (negative = killed by signal).
        Raises TimeoutError (after SIGKILLing it) if it does not exit in time."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"broker {self.name} did not exit within {timeout}s of {sig!r}")

    def kill(self):
        """SIGKILL (kill -9) and reap."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def restart(self, timeout=READY_TIMEOUT, new_port=False):
        """Start again on the same data dir (after stop() or kill()), on the same port
        unless new_port (then the advertised address changes too)."""
        if self.alive():
            self.stop()
        if new_port:
            self.port = free_port()
            return self.start(timeout)
        deadline = time.monotonic() + timeout
        # The port can linger for a moment after the old process died.
        while port_open(self.host, self.port, timeout=0.2) and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.start(timeout)

    # -- diagnostics ------------------------------------------------------------
    def rss_bytes(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except (OSError, AttributeError):
            pass
        return None

    def thread_dump(self):
        """Per-thread state / kernel wait channel, plus gdb backtraces when gdb exists:
        what a hung broker was doing."""
        if not self.alive():
            return ""
        pid = self.proc.pid
        out = [f"threads of pid {pid}:"]
        try:
            for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                base = f"/proc/{pid}/task/{tid}"
                def rd(name):
                    try:
                        with open(f"{base}/{name}") as f:
                            return f.read().strip()
                    except OSError:
                        return "?"
                stat = rd("stat")
                state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
                out.append(f"  tid {tid} {rd('comm')!r} state {state} wchan {rd('wchan')}")
        except OSError as e:
            out.append(f"  ({e})")
        if shutil.which("gdb"):
            try:
                r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx",
                                    "-ex", "thread apply all bt 30"],
                                   capture_output=True, timeout=60)
                out.append(r.stdout.decode(errors="replace")[-30000:])
            except (subprocess.TimeoutExpired, OSError) as e:
                out.append(f"(gdb failed: {e})")
        return "\n".join(out)

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, max_chars=40000, max_lines=400):
        text = self.log_text()
        lines = text.splitlines()[-max_lines:]
        text = "\n".join(lines)
        return text[-max_chars:]

    def __repr__(self):
        return f"Broker({self.name}, {self.bootstrap}, pid={self.pid})"
