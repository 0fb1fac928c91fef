"""Engines (and the router) a run starts get a per-run admin token automatically: random unless
--router-admin-token gives one, handed to them in the environment (never argv), and sent by the run's own
callers (weight sync, router registration and stats, profiler), so no admin route of a run is open on loopback."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from miles.config import parse_config
from miles.config.secrets import RUN_TOKEN_ENV, ensure_run_token, run_token
from tests.support.sessions import PLAIN_RUN_TIMEOUT_S

def without_run_token(monkeypatch) -> None:
    """No run token in this process for the test, and none left after it: set first, so monkeypatch records
    the variable's state before the test (a bare delenv of an unset name records nothing, and its later
    delenvs would restore the token the test made, leaking it into every later test's router)."""
    monkeypatch.setenv(RUN_TOKEN_ENV, "unset-me")
    monkeypatch.delenv(RUN_TOKEN_ENV)


def test_a_run_token_is_made_once_and_kept(monkeypatch):
    without_run_token(monkeypatch)
    config = parse_config([])
    made = ensure_run_token(config)
    assert len(made) >= 32 and ensure_run_token(config) == made  # the same for every launcher of the run
    monkeypatch.delenv(RUN_TOKEN_ENV)
    assert ensure_run_token(config) != made  # random per run
    assert ensure_run_token(parse_config(["--router-admin-token", "given-token"])) == "given-token"
    monkeypatch.delenv(RUN_TOKEN_ENV)
    with run_token(config) as token:  # a run's token lasts for the run only: the next run gets its own
        assert os.environ[RUN_TOKEN_ENV] == token
    assert RUN_TOKEN_ENV not in os.environ


@pytest.mark.slow
def test_a_plain_runs_engine_and_router_need_its_token(tmp_path, monkeypatch):
    from miles.backends.sync import push_disk
    from miles.cluster.local import start_inference
    from miles.engines.weights import WeightPushError
    from miles.prepare import prepare_config

    without_run_token(monkeypatch)
    config = prepare_config(parse_config(["--run-dir", str(tmp_path / "run")]))
    token = ensure_run_token(config)
    services = start_inference(config)
    try:
        engine, router = services.engines[0], services.router
        auth = {"Authorization": f"Bearer {token}"}
        for url in (engine.url, router.url):  # an engine admin route, directly and through the router
            assert httpx.post(url + "/pause_generation").status_code == 401
            assert httpx.post(url + "/pause_generation", headers=auth).status_code == 200
            assert httpx.post(url + "/continue_generation", headers=auth).status_code == 200
        assert httpx.post(router.url + "/add_worker", params={"url": "http://127.0.0.1:31999"}).status_code == 401
        for pid in (engine.pid, router.pid):
            assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()  # never in argv
        assert token.encode() in Path(f"/proc/{engine.pid}/environ").read_bytes()
        # the weight sync sends it; without it the engine refuses
        push_disk(services.engine_urls, Path(config.rollout.hf_checkpoint), 1, token)
        with pytest.raises(WeightPushError, match="HTTP 401"):
            push_disk(services.engine_urls, Path(config.rollout.hf_checkpoint), 2)
    finally:
        services.stop()


@pytest.mark.slow
@pytest.mark.timeout(PLAIN_RUN_TIMEOUT_S)
def test_a_whole_plain_run_passes_its_own_token(plain_run):
    """Weight sync, router stats and version updates of a real run, with no token given (the session's plain
    run, tests/support/sessions.py): it trained and every engine took every push of the weights."""
    from miles.record.journal import read_journal

    summary = plain_run.summary
    assert summary.resumed_at == 0 and summary.last_rollout_id == 1 and summary.checkpoint is not None
    # each rollout's weights reached the engines (a push without the run's token is refused: HTTP 401, above)
    lines = [ln for ln in read_journal(plain_run.run_dir / "metrics.jsonl") if ln.rollout_id >= 0]
    assert [ln.rollout_id for ln in lines] == [0, 1]
    assert all(ln.metrics["perf/update_weights_time"] > 0 for ln in lines)
