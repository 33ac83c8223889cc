"""The suite's own rules (tests/README.md): under CI=true a skip fails the run, however it
was asked for; without CI it stays a skip; deselection (-k) and xfail are untouched.

Runs pytest on a scratch test file with tests/conftest.py loaded as a plugin."""

import os
import subprocess
import sys
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent

SCRATCH = '''
import pytest


@pytest.fixture
def needs_tool():
    pytest.skip("tool missing (fixture)")


def test_skip_in_call():
    pytest.skip("tool missing (call)")


@pytest.mark.skipif(True, reason="tool missing (marker)")
def test_skip_marker():
    pass


def test_skip_in_fixture(needs_tool):
    pass


@pytest.mark.xfail(reason="known", strict=False)
def test_xfail():
    assert False


def test_runs():
    pass
'''


SCRATCH_MODULE_SKIP = '''
import pytest

pytest.importorskip("no_such_module_spate_needs")


def test_never_collected():
    pass
'''


def run_scratch(tmp_path, ci, *args, source=SCRATCH):
    (tmp_path / "test_scratch.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(TESTS_DIR)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rA",
                        "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_scratch.py"), *args],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_skips_fail_under_ci(tmp_path):
    rc, out = run_scratch(tmp_path, "true")
    assert rc == 1, out
    for reason in ("tool missing (call)", "tool missing (marker)", "tool missing (fixture)"):
        assert f"skipped under CI=true, which must run every test: Skipped: {reason}" in out, out
    assert "1 failed, 1 passed, 1 xfailed, 2 errors" in out, out


def test_skips_stay_skips_without_ci(tmp_path):
    rc, out = run_scratch(tmp_path, None)
    assert rc == 0, out
    assert "1 passed, 3 skipped, 1 xfailed" in out, out


def test_deselection_is_not_a_skip_under_ci(tmp_path):
    rc, out = run_scratch(tmp_path, "true", "-k", "runs or xfail")
    assert rc == 0, out
    assert "1 passed, 3 deselected, 1 xfailed" in out, out


def test_collection_skip_fails_under_ci(tmp_path):
    rc, out = run_scratch(tmp_path, "true", source=SCRATCH_MODULE_SKIP)
    assert rc != 0, out
    assert "skipped under CI=true, which must run every test: Skipped: could not import" in out, out
    rc, out = run_scratch(tmp_path, None, source=SCRATCH_MODULE_SKIP)
    assert rc == 5 and "1 skipped" in out, out  # 5: no test ran, nothing failed
