"""The default tiny config learns: `python -m miles.train`'s loop with engines, router and two FSDP
ranks. The same run is CI's gate of the project's own learning curve: its first 8 rollouts stay
inside the corridors of the trusted runs in tests/compare/history/default-short
(tests/compare/test_ci_gate.py checks the history itself)."""
import json

import pytest

from miles.config import parse_config
from miles.prepare import prepare_config
from miles.train import train
from tests.support.flags import DEFAULT_GATED
from tests.support.history_gate import gate

# Measured on 2 cores: the default run (100 rollouts, 1.5 min in the flow) lifts sampled eval pass@1
# from 0.275 to 0.918 (+0.643) at world size 1, on all 256 eval prompts. The bar is +0.20 absolute
# (the run here evaluates 64 of them, on two ranks).
MIN_GAIN = 0.20


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, ray_cluster):
    """The default config (100 rollouts) on two ranks, evaluated as the gate's trusted runs were."""
    run_dir = tmp_path_factory.mktemp("learning") / "run"
    config = parse_config(["--run-dir", str(run_dir), *DEFAULT_GATED])
    return config, train(prepare_config(config)), run_dir


@pytest.mark.slow
def test_default_config_raises_eval_pass_at_1(default_run):
    config, summary, run_dir = default_run
    base, final = summary.base_eval["eval/arithmetic"], summary.last_metrics["eval/arithmetic"]
    assert final >= base + MIN_GAIN, f"eval pass@1 {base:.3f} -> {final:.3f}"
    assert summary.checkpoint is not None and (summary.checkpoint / "manifest.json").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # the eval before training is a line of its own at eval/step 0, then one line per iteration
    assert rows[0]["rollout_id"] == -1 and rows[0]["eval/step"] == 0
    assert rows[0]["eval/arithmetic"] == pytest.approx(base)
    assert [r["rollout_id"] for r in rows[1:]] == list(range(config.rollout.num_rollout))
    # the health watch's defaults are calibrated so that the default run raises nothing
    assert not (run_dir / "health.jsonl").exists()
    assert all("health/loss" in row for row in rows[1:])
    assert all(v == 0.0 for row in rows for k, v in row.items() if k.startswith("health/"))
    check_timeline(run_dir, config.rollout.num_rollout)


@pytest.mark.slow
def test_a_default_run_of_this_code_passes_the_gate(default_run):
    """Gated in enforce mode against the committed history: its 8 rollouts and evals at 0, 3 and 7
    are judged, the 92 rollouts past them have no baseline."""
    _, _, run_dir = default_run
    code, report = gate(run_dir)
    assert code == 0 and "3 trusted runs: passed" in report, report


def check_timeline(run_dir, num_rollout):
    """Every process wrote its lane: the trainer, both ranks, the engine (its decoding batches) and
    the router (its bursts of requests, written as it stopped at the latest)."""
    from miles.record.timeline import read_spans

    spans = read_spans(run_dir / "timeline.jsonl")
    lanes = {s.lane for s in spans}
    assert {"trainer", "rank0", "rank1", "router"} <= lanes
    assert any(lane.startswith("engine 127.0.0.1:") for lane in lanes)
    assert any(s.lane == "router" and s.name == "proxy" and s.args["requests"] >= 1 for s in spans)
    trained = {s.rollout_id for s in spans if s.lane == "trainer" and s.name == "rollout"}
    assert trained == set(range(num_rollout))
