"""Maven modules under tests/ (the Java client's programs, Apache Kafka's tools): built
and resolved offline, once per change of their sources."""

import fcntl
import shutil
import subprocess

import pytest

BUILD_TIMEOUT_S = 300


def maven_classpath(module_dir, digest, goals=(), fresh_also=lambda: True):
    """Runs `mvn -o <goals> dependency:build-classpath` in `module_dir` unless `digest`
    (of its sources) is what the last run stamped; returns the dependency classpath.
    Skips (a failure under CI=true) when Java or Maven is missing."""
    java, mvn = shutil.which("java"), shutil.which("mvn")
    if java is None or mvn is None:
        pytest.skip(f"Java and Maven are needed (java: {java}, mvn: {mvn}): run scripts/install-deps")
    target = module_dir / "target"
    classpath_file = target / "classpath.txt"
    stamp = target / ".spate-build-stamp"
    target.mkdir(exist_ok=True)
    with open(target / ".spate-build-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = stamp.exists() and stamp.read_text() == digest and classpath_file.exists() and fresh_also()
        if not fresh:
            stamp.unlink(missing_ok=True)
            r = subprocess.run([mvn, "-o", "-q", "-B", *goals, "dependency:build-classpath",
                                f"-Dmdep.outputFile={classpath_file}"],
                               cwd=module_dir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S)
            out = r.stdout.decode(errors="replace")
            assert r.returncode == 0, (
                f"mvn {' '.join(goals) or 'dependency:build-classpath'} in {module_dir} failed ({r.returncode});"
                f" offline: have the dependencies been resolved by scripts/install-deps?\n{out}")
            stamp.write_text(digest)
    return classpath_file.read_text().strip()
