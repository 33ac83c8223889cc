"""kafkajs 2.x (Node.js) against the broker: tests/js/smoke.js does admin (create /
describe / delete topics, configs, groups, offsets), a non-idempotent producer (plain
and gzip batches, keys, headers) and a two-member consumer group, checking everything it
reads back.  Skipped only when `node` is not installed; scripts/install-deps installs
kafkajs into tests/js/node_modules."""

import os
import shutil
import subprocess

import pytest

from helpers.broker import REPO_ROOT

JS_DIR = REPO_ROOT / "tests" / "js"
SMOKE = JS_DIR / "smoke.js"
SMOKE_TIMEOUT_S = 150


@pytest.mark.slow
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
def test_kafkajs_smoke(broker_factory):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    assert (JS_DIR / "node_modules" / "kafkajs").is_dir(), (
        "kafkajs is not installed in tests/js/node_modules: run scripts/install-deps"
        " (npm ci --prefix tests/js)")

    b = broker_factory("--group-initial-rebalance-delay-ms", "300",
                       "--group-min-session-timeout-ms", "1000")
    try:
        r = subprocess.run([node, str(SMOKE), b.bootstrap], cwd=str(REPO_ROOT),
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=SMOKE_TIMEOUT_S,
                           env={**os.environ,
                                "SMOKE_TIMEOUT_MS": str((SMOKE_TIMEOUT_S - 20) * 1000)})
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
        pytest.fail(f"node smoke.js did not finish within {SMOKE_TIMEOUT_S}s; output:\n{out}")
    out = r.stdout.decode(errors="replace")
    print(out)
    assert r.returncode == 0, f"node smoke.js exited with {r.returncode}; output:\n{out}"
    assert "PASS: kafkajs smoke test" in out, out
