"""The default tiny config learns: `python -m miles.train`'s loop with engines, router and two FSDP ranks."""
import json

import pytest

from miles.config import parse_config
from miles.prepare import prepare_config
from miles.train import train

# Measured on 2 cores: the default run (100 rollouts, 1.5 min in the flow) lifts sampled eval pass@1
# from 0.275 to 0.918 (+0.643) at world size 1. The bar is +0.20 absolute.
MIN_GAIN = 0.20


@pytest.mark.slow
def test_default_config_raises_eval_pass_at_1(tmp_path, ray_cluster):
    config = parse_config(["--run-dir", str(tmp_path / "run"), "--actor-num-gpus-per-node", "2"])
    summary = train(prepare_config(config))
    base, final = summary.base_eval["eval/arithmetic"], summary.last_metrics["eval/arithmetic"]
    assert final >= base + MIN_GAIN, f"eval pass@1 {base:.3f} -> {final:.3f}"
    assert summary.checkpoint is not None and (summary.checkpoint / "manifest.json").exists()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the eval before training is a line of its own at eval/step 0, then one line per iteration
    assert rows[0]["rollout_id"] == -1 and rows[0]["eval/step"] == 0
    assert rows[0]["eval/arithmetic"] == pytest.approx(base)
    assert [r["rollout_id"] for r in rows[1:]] == list(range(config.rollout.num_rollout))
    # the health watch's defaults are calibrated so that the default run raises nothing
    assert not (tmp_path / "run" / "health.jsonl").exists()
    assert all("health/loss" in row for row in rows[1:])
    assert all(v == 0.0 for row in rows for k, v in row.items() if k.startswith("health/"))
    check_timeline(tmp_path / "run", config.rollout.num_rollout)


def check_timeline(run_dir, num_rollout):
    """Every process wrote its lane: the trainer, both ranks, the engine (its decoding batches) and the router
    (its bursts of requests, written as it stopped at the latest)."""
    from miles.record.timeline import read_spans

    spans = read_spans(run_dir / "timeline.jsonl")
    lanes = {s.lane for s in spans}
    assert {"trainer", "rank0", "rank1", "router"} <= lanes
    assert any(lane.startswith("engine 127.0.0.1:") for lane in lanes)
    assert any(s.lane == "router" and s.name == "proxy" and s.args["requests"] >= 1 for s in spans)
    assert {s.rollout_id for s in spans if s.lane == "trainer" and s.name == "rollout"} == set(range(num_rollout))
