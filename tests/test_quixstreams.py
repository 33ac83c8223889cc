"""quixstreams' default Application against the broker (issue 12): its producer asks
librdkafka for enable.idempotence=true, so this needs InitProducerId and idempotent
produce. tests/quix/pipeline.py runs in its own virtualenv (.venv-quix, made by
scripts/install-deps: quixstreams pins confluent-kafka below the version the rest of the
suite uses), produces COUNT records with the Application's producer and runs a stateless
dataframe (input -> apply -> output). Checked here: every produced record went through
the dataframe once, the output topic holds each transformed record exactly once (read
with this suite's confluent-kafka), and the partitions of both topics keep the state of
an idempotent producer (DescribeProducers).

Stateless on purpose: a stateful step (`apply(..., stateful=True)`) makes quixstreams
create its changelog topic `changelog__<group>--<topic>--default` with cleanup.policy=
compact, retention.ms=604800000 and retention.bytes=-1, which the broker refuses until
log compaction exists (issue 14), and quixstreams raises at that `apply`."""

import json
import subprocess

import pytest

from helpers.broker import REPO_ROOT
from helpers.clients import cf_consume

QUIX_PYTHON = REPO_ROOT / ".venv-quix" / "bin" / "python"
PIPELINE = REPO_ROOT / "tests" / "quix" / "pipeline.py"
COUNT = 500
PIPELINE_TIMEOUT_S = 150


@pytest.mark.slow
@pytest.mark.timeout(PIPELINE_TIMEOUT_S + 60)
def test_quixstreams_default_application(broker, tmp_path):
    assert QUIX_PYTHON.exists(), "the quixstreams virtualenv is missing: run scripts/install-deps"
    try:
        r = subprocess.run([str(QUIX_PYTHON), str(PIPELINE), broker.bootstrap, "quix-in", "quix-out", str(COUNT),
                            str(tmp_path / "quix-state")],
                           cwd=str(REPO_ROOT), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=PIPELINE_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        err = (e.stderr or b"").decode(errors="replace")
        pytest.fail(f"pipeline.py did not finish within {PIPELINE_TIMEOUT_S}s; stderr:\n{err[-6000:]}")
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, err[-6000:]
    out = json.loads(r.stdout.decode().strip().splitlines()[-1])
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
