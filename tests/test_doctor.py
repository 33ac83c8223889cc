"""`spate doctor`: the host checks of tuning.md, run as the real binary.

The doctor reads /proc and /sys and getrlimit, changes nothing, and always exits 0
(a check it cannot read is "unknown", never a failure of the command). These tests
change what it can see (the process's own rlimits, the file system the data dir is
on) and read the host's files themselves, then assert that each verdict and finding
follows the host, not a fixed answer:

- every check of tuning.md is reported, in JSON and in text, with the same verdicts,
  and the text's "N warning(s)" counts the WARN lines;
- the open-files and memlock checks report the limits the process really has (lowered
  below the threshold: WARN with the limit and the advice);
- the data dir's file system is found from the mount table (tmpfs: WARN, "XFS or
  ext4"; the test's own disk: the verdict its fstype and noatime call for);
- swappiness, transparent hugepages, the clock source and a virtio balloon's free
  page reporting follow the host's files.
"""

import json
import os
import resource
import subprocess
from pathlib import Path

from helpers.broker import SPATE_BIN

SPATE = str(SPATE_BIN)

CHECKS = ["cpu governor", "io_uring", "memlock ulimit", "open files ulimit", "data dir file system",
          "disk scheduler", "clocksource", "transparent hugepages", "vm.swappiness", "irq affinity",
          "free page reporting"]
OPEN_FILES_MIN = 100_000
MEMLOCK_BYTES_MIN = 64 << 20


def doctor(data_dir, *args, nofile=None, memlock=None):
    """Run `spate doctor`; `nofile` / `memlock` lower the child's soft rlimits first."""
    def limits():
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        if memlock is not None:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (memlock, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]))
    return subprocess.run([SPATE, "doctor", "--data-dir", str(data_dir), *args], capture_output=True,
                          timeout=60, preexec_fn=limits)


def doctor_json(data_dir, **limits):
    r = doctor(data_dir, "--json", **limits)
    assert r.returncode == 0, r
    checks = json.loads(r.stdout)
    assert [c["check"] for c in checks] == CHECKS, checks
    assert all(c["verdict"] in ("ok", "warn", "unknown") for c in checks), checks
    return {c["check"]: c for c in checks}


def mount_of(path):
    """(fstype, options) of the longest mount point above `path`, from /proc/self/mounts."""
    path = os.path.realpath(path)
    best = None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        dev, mp, fstype, opts = line.split()[:4]
        mp = mp.replace("\\040", " ")
        inside = path == mp or path.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best[0])):
            best = (mp, fstype, opts)
    return best[1], best[2].split(",")


def test_text_and_json_agree_and_count_the_warnings(tmp_path):
    checks = doctor_json(tmp_path)
    r = doctor(tmp_path)
    assert r.returncode == 0, r
    text = r.stdout.decode()
    lines = {}
    for line in text.splitlines():
        for name in CHECKS:
            if line[7:].startswith(name + " ") or line[7:] == name:
                lines[name] = line
    assert sorted(lines) == sorted(CHECKS), text
    tag = {"ok": "[ok  ]", "warn": "[WARN]", "unknown": "[??  ]"}
    for name, c in checks.items():
        assert lines[name].startswith(tag[c["verdict"]]), (name, c, lines[name])
    warns = sum(c["verdict"] == "warn" for c in checks.values())
    assert f"\n{warns} warning(s); see tuning.md" in text, text
    # Every warning says what to change, on the line after it.
    for name, c in checks.items():
        if c["verdict"] == "warn":
            assert c["advice"], c
            after = text.split(lines[name] + "\n", 1)[1].splitlines()[0]
            assert after.strip().startswith("-> ") and c["advice"] in after, (lines[name], after)


def test_rlimits_are_the_process_own(tmp_path):
    hard_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low = min(1000, hard_nofile)
    c = doctor_json(tmp_path, nofile=low)["open files ulimit"]
    assert c["verdict"] == "warn" and c["found"] == str(low) and f"ulimit -n {OPEN_FILES_MIN}" in c["advice"], c
    c = doctor_json(tmp_path, nofile=low - 1)["open files ulimit"]
    assert c["found"] == str(low - 1), c
    # At or above the threshold (only where the hard limit allows it): ok, and still a
    # count of files (it once said "97 KiB" for 100000).
    if hard_nofile == resource.RLIM_INFINITY or hard_nofile >= OPEN_FILES_MIN:
        c = doctor_json(tmp_path, nofile=hard_nofile)["open files ulimit"]
        want = "unlimited" if hard_nofile == resource.RLIM_INFINITY else str(hard_nofile)
        assert c["verdict"] == "ok" and c["found"] == want, c

    c = doctor_json(tmp_path, memlock=1 << 20)["memlock ulimit"]
    assert c["verdict"] == "warn" and c["found"] == "1 MiB" and "ulimit -l unlimited" in c["advice"], c
    c = doctor_json(tmp_path, memlock=512 << 10)["memlock ulimit"]
    assert c["verdict"] == "warn" and c["found"] == "512 KiB", c
    hard_memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if hard_memlock == resource.RLIM_INFINITY or hard_memlock >= MEMLOCK_BYTES_MIN:
        assert doctor_json(tmp_path, memlock=hard_memlock)["memlock ulimit"]["verdict"] == "ok"


def test_the_data_dir_file_system_comes_from_the_mount_table(tmp_path):
    shm = Path("/dev/shm")
    assert mount_of(shm)[0] == "tmpfs", "this test needs /dev/shm on tmpfs"
    c = doctor_json(shm / "spate-doctor-no-such-dir")["data dir file system"]
    assert c["verdict"] == "warn" and c["found"].startswith("tmpfs on /dev/shm "), c
    assert "put the data dir on XFS or ext4 (tmpfs is untested)" in c["advice"], c

    fstype, opts = mount_of(tmp_path)
    c = doctor_json(tmp_path)["data dir file system"]
    assert c["found"].startswith(f"{fstype} on "), (fstype, c)
    want = []
    if fstype not in ("xfs", "ext4"):
        want.append("XFS or ext4")
    if "noatime" not in opts:
        want.append("mount with noatime")
    assert c["verdict"] == ("warn" if want else "ok"), (fstype, opts, c)
    assert all(w in c["advice"] for w in want), (want, c)


def test_kernel_settings_follow_the_host(tmp_path):
    checks = doctor_json(tmp_path)
    swappiness = int(Path("/proc/sys/vm/swappiness").read_text())
    c = checks["vm.swappiness"]
    assert c["found"] == str(swappiness) and c["verdict"] == ("ok" if swappiness <= 10 else "warn"), c

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    c = checks["transparent hugepages"]
    if thp.exists():
        active = next(w for w in thp.read_text().split() if w.startswith("["))
        assert c["found"] == active and c["verdict"] == ("warn" if active == "[always]" else "ok"), c
    else:
        assert c["verdict"] == "unknown", c

    cs = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    c = checks["clocksource"]
    if cs.exists():
        source = cs.read_text().strip()
        assert c["found"] == source and c["verdict"] == ("ok" if source in ("tsc", "arch_sys_counter") else "warn"), c
    else:
        assert c["verdict"] == "unknown", c

    # Free page reporting: a virtio balloon (device 0x0005) with feature bit 5.
    reporting = any((d / "device").read_text().strip() == "0x0005"
                    and (d / "features").read_text().strip()[5:6] == "1"
                    for d in Path("/sys/bus/virtio/devices").glob("*")
                    if (d / "device").exists() and (d / "features").exists())
    c = checks["free page reporting"]
    assert c["verdict"] == ("warn" if reporting else "ok"), c
    assert ("--drop-behind-bytes" in c["advice"]) == reporting, c

    # The broker runs on io_uring; where it starts, the probe must work.
    c = checks["io_uring"]
    assert c["verdict"] == "ok" and c["found"].startswith("io_uring_setup works"), c
