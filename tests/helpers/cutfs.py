"""cutfs (tests/cutfs): a FUSE file system that loses power on command.

A test mounts one per machine it simulates; the broker's data dir lives on it, and
`cut(pid)` kills the broker and drops everything it had not made durable (unsynced file
data, directory entries not covered by an fsync of their directory)."""

import os
import socket
import subprocess
import time
from pathlib import Path

from helpers.broker import REPO_ROOT, SPATE_BIN


def cutfs_bin():
    """`CUTFS_BIN`, else the cutfs built beside the broker binary."""
    if os.environ.get("CUTFS_BIN"):
        return Path(os.environ["CUTFS_BIN"])
    beside = Path(SPATE_BIN).parent / "cutfs"
    return beside if beside.exists() else REPO_ROOT / "target" / "ci" / "cutfs"


def usable():
    """Why cutfs cannot run here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if os.geteuid() != 0:
        return "cutfs mounts with mount(2): needs root"
    if not cutfs_bin().exists():
        return f"{cutfs_bin()} not built (cargo build --profile ci -p cutfs)"
    return None


class CutFs:
    def __init__(self, workdir):
        self.workdir = Path(workdir)
        self.mnt = self.workdir / "mnt"
        self.backing = self.workdir / "backing"
        self.control = self.workdir / "control.sock"
        self.log_path = self.workdir / "cutfs.log"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([str(cutfs_bin()), str(self.backing), str(self.mnt), str(self.control)],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 10
        while not (self.control.exists() and os.path.ismount(self.mnt)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"cutfs did not mount: {self.log_path.read_text()}")
            time.sleep(0.02)

    def call(self, command):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(60)
            s.connect(str(self.control))
            s.sendall((command + "\n").encode())
            line = s.makefile().readline().strip()
        status, _, rest = line.partition(" ")
        if status != "ok":
            raise RuntimeError(f"cutfs {command!r}: {line}")
        return dict(w.split("=", 1) for w in rest.split() if "=" in w)

    def cut(self, pid, tear="none", seed=0, block=4096):
        """The power goes: `pid` is killed, and the disk holds only what was made durable.
        Returns cutfs's counts (files rolled back, bytes dropped, ...)."""
        return self.call(f"cut pid={pid} tear={tear} seed={seed} block={block}")

    def fail(self, op, kind, path=None, count=1):
        """The next `count` `op`s (fsync or write) whose path contains `path` fail with
        `kind` (eio, enospc, or short: half the bytes written)."""
        return self.call(f"fail {op} {kind} count={count}" + (f" path={path}" if path else ""))

    def stats(self):
        return self.call("stats")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("quit")
                self.proc.wait(10)
            except (OSError, RuntimeError, subprocess.TimeoutExpired):
                self.proc.kill()
        # A mount whose cutfs is gone answers ENOTCONN (and ismount says False): unmount
        # whatever is left, lazily.
        subprocess.run(["umount", "-l", str(self.mnt)], check=False, capture_output=True)
        self.log.close()
