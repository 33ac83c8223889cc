"""quixstreams' default Application against the broker (issue 12): its producer asks
librdkafka for enable.idempotence=true, so this needs InitProducerId and idempotent
produce. tests/quix/pipeline.py runs in its own virtualenv (.venv-quix, made by
scripts/install-deps: quixstreams pins confluent-kafka below the version the rest of the
suite uses), produces COUNT records with the Application's producer and runs a stateless
dataframe (input -> apply -> output). Checked here: every produced record went through
the dataframe once, the output topic holds each transformed record exactly once (read
with this suite's confluent-kafka), and the partitions of both topics keep the state of
an idempotent producer (DescribeProducers).

A second test runs a stateful Application (tests/quix/stateful.py: a count per key in
its RocksDB state store), whose changelog topic quixstreams creates itself with
cleanup.policy=compact: a first run counts 50 records per key; the local state directory
is then deleted and a second run, on 50 more records per key, must restore its store
from the changelog topic to count on from 50 to 100. Checked: the changelog topic is
compacted (DescribeConfigs), every key's counts 1..100 are in the output topic exactly
once, and the second run started at 51."""

import json
import subprocess

import pytest

from helpers.broker import REPO_ROOT
from helpers.clients import cf_consume

QUIX_PYTHON = REPO_ROOT / ".venv-quix" / "bin" / "python"
PIPELINE = REPO_ROOT / "tests" / "quix" / "pipeline.py"
STATEFUL = REPO_ROOT / "tests" / "quix" / "stateful.py"
COUNT = 500
PIPELINE_TIMEOUT_S = 150


def run_quix(script, *args):
    """Run a tests/quix script with .venv-quix's python; its last stdout line, as JSON."""
    assert QUIX_PYTHON.exists(), "the quixstreams virtualenv is missing: run scripts/install-deps"
    try:
        r = subprocess.run([str(QUIX_PYTHON), str(script), *map(str, args)],
                           cwd=str(REPO_ROOT), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=PIPELINE_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        err = (e.stderr or b"").decode(errors="replace")
        pytest.fail(f"{script.name} did not finish within {PIPELINE_TIMEOUT_S}s; stderr:\n{err[-6000:]}")
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, err[-6000:]
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(PIPELINE_TIMEOUT_S + 60)
def test_quixstreams_default_application(broker, tmp_path):
    out = run_quix(PIPELINE, broker.bootstrap, "quix-in", "quix-out", COUNT, tmp_path / "quix-state")
    assert out["quixstreams"].startswith("3."), out["quixstreams"]
    # quixstreams' own default, not set by the test.
    assert out["producer_config"].get("enable.idempotence") is True, out["producer_config"]
    assert out["sent"] == list(range(COUNT))
    assert out["seen"] == list(range(COUNT)), "the dataframe saw a record twice or missed one"

    # quixstreams created both topics (one partition each, its default).
    got = cf_consume(broker.bootstrap, "quix-out", 1, count=COUNT, timeout=30)
    values = [json.loads(rec.value) for rec in got[0]]
    assert sorted(v["n"] for v in values) == list(range(COUNT)), "the output topic is not every record once"
    assert all(v["square"] == v["n"] * v["n"] for v in values)
    got_in = cf_consume(broker.bootstrap, "quix-in", 1, count=COUNT, timeout=30)
    assert [json.loads(rec.value)["n"] for rec in got_in[0]] == list(range(COUNT)), "input not once, in order"

    # Both topics were written by idempotent producers: the partitions keep their state.
    from kafka import TopicPartition as KTP
    from kafka.admin import KafkaAdminClient
    a = KafkaAdminClient(bootstrap_servers=[broker.bootstrap], request_timeout_ms=15000)
    try:
        states = a.describe_producers([KTP("quix-in", 0), KTP("quix-out", 0)])
    finally:
        a.close()
    for name in ("quix-in", "quix-out"):
        active = states[KTP(name, 0)].active_producers
        assert len(active) == 1, (name, active)
        (st,) = active
        assert st.producer_id >= 0 and st.producer_epoch == 0, (name, st)
        assert st.last_sequence == COUNT - 1, (name, st)


STATE_KEYS = 7
PER_KEY = 50


@pytest.mark.slow
@pytest.mark.timeout(2 * PIPELINE_TIMEOUT_S + 60)
def test_quixstreams_stateful_application_restores_from_its_changelog(broker, tmp_path):
    import shutil

    from confluent_kafka.admin import ConfigResource

    from helpers.clients import admin

    state_dir = tmp_path / "quix-state"
    n = STATE_KEYS * PER_KEY
    first = run_quix(STATEFUL, broker.bootstrap, "counted-in", "counted-out", n, state_dir, 0)
    assert sorted(r["n"] for r in first["seen"]) == list(range(n))
    assert max(r["count"] for r in first["seen"]) == PER_KEY

    a = admin(broker.bootstrap)
    changelogs = [t for t in a.list_topics(timeout=10).topics if t.startswith("changelog__")]
    assert len(changelogs) == 1, changelogs
    (res,) = a.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, changelogs[0])]).values()
    assert res.result(15)["cleanup.policy"].value == "compact"

    # Without its local store, the second run restores the counts from the changelog.
    shutil.rmtree(state_dir)
    second = run_quix(STATEFUL, broker.bootstrap, "counted-in", "counted-out", n, state_dir, n)
    assert sorted(r["n"] for r in second["seen"]) == list(range(n, 2 * n))
    assert sorted(r["count"] for r in second["seen"]) == sorted(list(range(PER_KEY + 1, 2 * PER_KEY + 1)) * STATE_KEYS)

    got = cf_consume(broker.bootstrap, "counted-out", 1, count=2 * n, timeout=30)[0]
    per_key = {}
    for rec in got:
        v = json.loads(rec.value)
        assert int(rec.key.decode()[1:]) == v["n"] % STATE_KEYS
        per_key.setdefault(rec.key, []).append(v["count"])
    assert len(per_key) == STATE_KEYS
    for k, counts in per_key.items():
        assert counts == list(range(1, 2 * PER_KEY + 1)), (k, counts[:5], len(counts))
