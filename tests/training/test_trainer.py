"""RLTrainer end to end on the real engine, router and Ray: on-policy first step, metric names,
weight sync versions, eval, exact resume past a corrupt checkpoint."""
import json
import math
from pathlib import Path

import httpx
import pytest

from miles.cluster.names import RunNames
from miles.prepare import prepare_config
from miles.record.timeline import read_spans
from miles.trainer import RLTrainer
from tests.support.wait import wait_for
from tests.support.metrics import check_histogram, histogram, is_engine_float, scrape, value

TRAIN_KEYS = ["loss", "pg_loss", "entropy_loss", "pg_clipfrac", "ppo_kl", "train_rollout_logprob_abs_diff",
              "grad_norm", "lr"]
ROLLOUT_KEYS = ["raw_reward", "rewards", "advantages", "log_probs", "rollout_log_probs", "response_lengths",
                "truncated", "entropy", "response_len/mean", "response_len/median", "response_len/max",
                "response_len/min", "zero_std/count_0.0", "zero_std/count_1.0", "truncated_ratio"]
PERF_KEYS = ["rollout_time", "train_time", "actor_train_time", "log_probs_time", "update_weights_time",
             "step_time", "wait_time_ratio", "actor_train_tok_per_s", "tokens_per_gpu_per_sec", "mfu", "tflops",
             "rank_0_mfu", "rank_0_tflops", "update_weights_rank_0_time", "update_weights_engine_0_time"]


def test_first_iteration_is_on_policy_and_reports_miles_metrics(small_config, ray_cluster, engine, tmp_path):
    from miles.router import start_router

    config = small_config("--use-kl-loss", "--kl-loss-coef", "0.01", "--entropy-coef", "0.001")
    # the router writes its lane into the run's timeline, as the router a run launches does
    router = start_router(config.router, worker_urls=[engine.url], timeline_path=tmp_path / "run" / "timeline.jsonl")
    trainer = RLTrainer.start(prepare_config(config), router.url, [engine.url])
    try:
        assert trainer.resume() == 0
        engine_before = scrape(engine.url)
        first = trainer.run_iteration(0)
        m = first.metrics
        check_scraped_metrics(router.url, engine.url, engine_before, m, len(first.samples))
        # same fp32 weights on both sides: Miles' CI allows 0.03, we require 1e-3
        assert m["train/train_rollout_logprob_abs_diff"] <= 1e-3
        assert abs(m["train/ppo_kl"]) < 1e-6 and m["train/pg_clipfrac"] == 0.0
        assert abs(m["rollout/log_probs"] - m["rollout/ref_log_probs"]) < 1e-6  # policy == reference at step 0
        missing = [k for k in [f"train/{k}" for k in TRAIN_KEYS + ["kl_loss"]] + [f"rollout/{k}" for k in
                   ROLLOUT_KEYS + ["ref_log_probs"]] + [f"perf/{k}" for k in PERF_KEYS] + ["passrate/pass@1",
                   "passrate/pass@4", "train/step", "rollout/step"] if k not in m]
        assert missing == []
        assert "eval/step" not in m  # only lines that carry eval metrics have it
        assert all(math.isfinite(v) for v in m.values())
        # the rank's own phases reach the metrics line (one rank: never slower than itself)
        assert m["straggler/forward/slowdown"] == 1.0 and m["straggler/optimizer/slowest_dp"] == 0.0
        # what the rank holds reaches the line too (AdamW: two moments per weight, more than it)
        assert m["perf/rank_0_param_bytes"] == m["perf/max_rank_param_bytes"] > 0
        assert m["perf/rank_0_optimizer_bytes"] > 2 * m["perf/rank_0_param_bytes"]
        assert {s.weight_version for s in first.samples} == {"0"}
        assert len(first.samples) == 16 and all(s.reward in (0.0, 1.0) for s in first.samples)
        # the router's snapshot of the iteration: 16 samples went through it (as batched /generate calls)
        assert m["rollout/router_requests"] >= 1 and m["rollout/router_errors"] == 0
        assert m["rollout/router_healthy_workers"] == 1

        second = trainer.run_iteration(1)  # eval is due after rollout 1 (--eval-interval 2)
        assert {s.weight_version for s in second.samples} == {"1"}
        assert second.metrics["train/train_rollout_logprob_abs_diff"] <= 1e-3  # the sync carried the weights
        assert 0.0 <= second.metrics["eval/arithmetic"] <= 1.0
        assert second.metrics["eval/arithmetic-pass@2"] >= second.metrics["eval/arithmetic-pass@1"]
        assert "eval/arithmetic" not in m  # not due after rollout 0
        assert httpx.get(f"{router.url}/router_health").json()["weight_version"] == "2"
        rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [r["rollout/step"] for r in rows] == [0, 1]
        assert "eval/step" not in rows[0] and rows[1]["eval/step"] == 1 and "eval/arithmetic" in rows[1]
        check_dashboard_files(tmp_path / "run", first.samples)
    finally:
        trainer.close()
        router.stop()


def test_a_rollouts_router_window_leaves_out_the_evals_requests(small_config, ray_cluster, engine, tmp_path):
    from miles.router import start_router

    config = small_config()  # 4 prompts x 4 samples per rollout, an eval (8 prompts x 2) after rollout 1
    router = start_router(config.router, worker_urls=[engine.url])
    trainer = RLTrainer.start(prepare_config(config), router.url, [engine.url])
    try:
        assert trainer.resume() == 0
        trainer.evaluate_base()  # its 16 requests go through the router before rollout 0
        results = [trainer.run_iteration(r) for r in range(3)]
        assert "eval/arithmetic" in results[1].metrics
        # each rollout's window holds its own requests (one batched request per prompt): neither the base
        # eval's 8 (before rollout 0) nor the 8 of the eval after rollout 1 (once counted in rollout 2)
        prompts = config.rollout.rollout_batch_size
        assert [r.metrics["rollout/router_requests"] for r in results] == [prompts] * 3
        assert all(r.metrics["rollout/router_errors"] == 0 for r in results)
    finally:
        trainer.close()
        router.stop()


def check_dashboard_files(run_dir: Path, samples) -> None:
    """The phase timeline of both iterations, and the per-token file of the logged one only
    (--log-samples-interval 10 logs rollout 0)."""
    spans = [json.loads(line) for line in (run_dir / "timeline.jsonl").read_text().splitlines()]
    phases = {(s["lane"], s["name"], s["rollout_id"]) for s in spans}
    for r in (0, 1):
        assert {("trainer", "rollout", r), ("trainer", "train", r), ("trainer", "update_weights", r),
                ("rank0", "log_probs", r), ("rank0", "forward", r), ("rank0", "backward", r),
                ("rank0", "optimizer", r)} <= phases  # one rank: no wait spans
        assert ("rank0", "actor_train", r) not in phases  # the rank's own spans replace the coarse one
    assert ("trainer", "eval", 1) in phases and ("trainer", "eval", 0) not in phases
    assert all(s["start"] <= s["end"] for s in spans)
    check_router_lane(run_dir)
    rows = [json.loads(line) for line in (run_dir / "tokens" / "rollout_000000.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [s.index for s in samples]
    for row, sample in zip(rows, samples):
        assert row["ids"] == sample.response_ids and len(row["log_probs"]) == len(row["entropy"]) == len(row["ids"])
        # the ranks scored the weights that sampled: per token, train and rollout log-probs agree
        assert max(abs(a - b) for a, b in zip(row["log_probs"], row["rollout_log_probs"])) <= 1e-3
    assert not (run_dir / "tokens" / "rollout_000001.jsonl").exists()


def check_router_lane(run_dir: Path) -> None:
    """The router's lane: a burst of proxied requests inside each rollout, and the weight versions it was
    told (the router writes on a timer, so its latest spans may take a moment)."""
    def router_lane():
        spans = read_spans(run_dir / "timeline.jsonl")
        versions = [s.args["weight_version"] for s in spans if s.name == "update_weight_version"]
        rollouts = [s for s in spans if s.lane == "trainer" and s.name == "rollout"]
        bursts = [s for s in spans if s.lane == "router" and s.name == "proxy"]
        inside = [any(rollout.start <= b.start <= b.end <= rollout.end and b.args["requests"] >= 1 for b in bursts)
                  for rollout in rollouts]
        return versions == ["0", "1", "2"] and inside == [True, True]
    wait_for(router_lane, 10, "the router's spans of both iterations")


def run(config, run_dir, engine, rollout_ids, save_at=(), last=False):
    # Named ranks kept between runs (as Prefect chunks keep them): a resume must overwrite all their state.
    trainer = RLTrainer.start(prepare_config(config.replace(run_dir=str(run_dir))), engine.url, [engine.url],
                             RunNames("t-resume"))
    try:
        start = trainer.resume()
        rows = {}
        for r in rollout_ids:
            rows[r] = trainer.run_iteration(r).metrics
            if r in save_at:
                trainer.save_checkpoint(r)
        digest = trainer.group.call("weights_digest")
        return start, rows, digest
    finally:
        if last:
            trainer.group.stop()
        trainer.close()


def comparable(metrics):
    return {k: v for k, v in metrics.items()  # timings (perf/, straggler/) differ from run to run
            if not k.startswith(("perf/", "straggler/")) and not is_engine_float(k)}


def test_resume_is_exact_even_past_a_corrupt_checkpoint(small_config, ray_cluster, engine, tmp_path, capsys):
    config = small_config("--actor-num-gpus-per-node", "2")
    _, straight, straight_digest = run(config, tmp_path / "a", engine, range(4))

    _, part1, _ = run(config, tmp_path / "b", engine, range(3), save_at=(0, 1, 2))
    newest = tmp_path / "b" / "checkpoints" / "iter_0000002"
    (newest / "model.safetensors").write_bytes(b"torn write")  # the newest checkpoint is damaged
    assert sorted(p.name for p in newest.parent.iterdir()) == ["iter_0000001", "iter_0000002"]  # keep=2
    start, part2, resumed_digest = run(config, tmp_path / "b", engine, range(2, 4), last=True)

    assert start == 2  # fell back to iter_0000001
    assert "skipping checkpoint" in capsys.readouterr().out
    assert resumed_digest[0] == resumed_digest[1]  # both ranks gather the same full weights
    assert resumed_digest == straight_digest  # identical final weights
    for r in range(4):
        got = part1[r] if r < 2 else part2[r]
        assert comparable(got) == comparable(straight[r]), f"rollout {r} differs"
        assert {k for k in got if is_engine_float(k)} == {k for k in straight[r] if is_engine_float(k)}
        for key in (k for k in straight[r] if is_engine_float(k)):
            assert got[key] == pytest.approx(straight[r][key], rel=1e-5, abs=2e-6), key
    journal = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [row["rollout/step"] for row in journal] == [0, 1, 2, 3]  # the redone rollout 2 is not doubled
    # the trainer that continued wrote where it took over: the dashboard marks it (first-hour N15)
    resumes = [s for s in read_spans(tmp_path / "b" / "timeline.jsonl") if s.name == "resume"]
    assert [(s.lane, s.rollout_id) for s in resumes] == [("trainer", 2)]
    assert resumes[0].args["checkpoint"].endswith("iter_0000001") and resumes[0].end >= resumes[0].start


def test_attach_to_named_actors_and_restart_from_base(small_config, ray_cluster, engine, tmp_path):
    config = small_config()
    first = RLTrainer.start(prepare_config(config), engine.url, [engine.url], RunNames("t-attach"))
    first.resume()
    first.run_iteration(0)
    trained = first.group.call("weights_digest")
    # a retried task: a new trainer finds the same actors instead of starting twins
    second = RLTrainer.start(prepare_config(config), engine.url, [engine.url], RunNames("t-attach"))
    try:
        assert second.group.attached and second.group.call("weights_digest") == trained
        assert second.resume() == 0  # no checkpoint: the actors go back to the base weights
        assert second.group.call("weights_digest") != trained
        assert second.run_iteration(0).metrics["train/train_rollout_logprob_abs_diff"] <= 1e-3
    finally:
        second.group.stop()
        second.close()


def check_scraped_metrics(router_url: str, engine_url: str, engine_before: dict, m: dict, samples: int) -> None:
    """The iteration's journal line and the router's and engine's /metrics, read by prometheus_client's
    parser, count the same requests; the per-rank and per-engine weight-sync times fit in the phase."""
    routed = scrape(router_url)
    buckets, count, _ = histogram(routed, "miles_router_request_duration_seconds")
    check_histogram(buckets, count)
    # the router was started for this run: every request it served is in rollout 0's window
    assert count == m["rollout/router_requests"] == value(routed, "miles_router_requests_total")
    served = scrape(engine_url)
    label = {"model_name": next(dict(k)["model_name"] for n, k in served if n == "sglang:num_requests_total")}
    done = value(served, "sglang:e2e_request_latency_seconds_count", **label) - \
        value(engine_before, "sglang:e2e_request_latency_seconds_count", **label)
    assert done == samples  # one engine request per sample (a batched /generate carries several)
    assert value(served, "miles_engine_weight_version_info", weight_version="1") == 1  # the sync's new version
    assert m["perf/update_weights_rank_0_time"] <= m["perf/update_weights_time"]
    assert m["perf/update_weights_engine_0_time"] <= m["perf/update_weights_time"]
    assert 0 < m["perf/mfu"] and m["perf/tflops"] > 0
