"""The health watch's stall, abort-storm and degenerate-groups alarms fire on a real iteration (engine, router,
Ray ranks, the trainer's own watch): `--inject-fault abort-engine@0` makes the engine abort every request of
the rollout (every sample aborted, every group without reward variance); a paused engine holds a rollout."""
from __future__ import annotations

import json

from miles.config.health import HealthConfig
from miles.engines.abort_storm import AbortStorm
from miles.health import RED
from miles.prepare import prepare_config
from miles.run.faults import FaultInjector
from miles.trainer import RLTrainer
from tests.support.metrics import scrape, value


class SessionEngine:
    """The fault's target: the session's engine (no run token)."""

    def __init__(self, url: str):
        self.url = url

    def abort_engine(self, index: int, count: int) -> AbortStorm:
        assert index == 0
        return AbortStorm(self.url, count)


def test_an_abort_storm_fires_abort_storm_and_degenerate_groups(small_config, ray_cluster, engine, tmp_path):
    from miles.router import start_router

    config = small_config("--inject-fault", "abort-engine@0", "--health-degenerate-groups-window", "1",
                          "--eval-interval", "none")
    requests = config.rollout.rollout_batch_size * config.rollout.n_samples_per_prompt
    assert config.health.health_abort_storm_share == HealthConfig().health_abort_storm_share  # the default
    router = start_router(config.router, worker_urls=[engine.url])
    trainer = RLTrainer.start(prepare_config(config), router.url, [engine.url])
    fault = FaultInjector(config.orchestration.inject_fault, config.train.run_dir, targets=SessionEngine(engine.url),
                          rollout_requests=requests)
    try:
        assert trainer.resume() == 0
        before = scrape(engine.url)
        fault.before_iteration(0)
        result = trainer.run_iteration(0)
        fault.after_iteration(result)
        m = result.metrics
        assert m["rollout/aborted_ratio"] == 1.0 and m["rollout/degenerate_group_ratio"] == 1.0
        reds = {v.signal for v in result.health.verdicts if v.severity == RED}
        assert {"abort_storm", "degenerate_groups"} <= reds, result.health.verdicts
        line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
        assert line["health/abort_storm"] == 1.0 and line["health/degenerate_groups"] == 1.0
        after = scrape(engine.url)
        label = {"model_name": next(dict(k)["model_name"] for n, k in after if n == "sglang:num_requests_total")}
        aborted = value(after, "sglang:num_aborted_requests_total", **label) - \
            value(before, "sglang:num_aborted_requests_total", **label)
        assert aborted == requests  # the engine's own counter agrees with the journal's share

        healthy = trainer.run_iteration(1)  # the storm lasted one rollout: the engine serves again
        assert healthy.metrics["rollout/aborted_ratio"] == 0.0
        assert "abort_storm" not in {v.signal for v in healthy.health.verdicts}
    finally:
        fault.end(None)
        trainer.close()
        router.stop()


def test_a_held_rollout_fires_the_stall_alarm(small_config, ray_cluster, engine, tmp_path):
    """Rollout 3 held by a paused engine for ten times the median rollout so far: `stall` is red on it."""
    import threading

    import httpx

    from miles.router import start_router

    config = small_config("--eval-interval", "none", "--health-stall-factor", "3", "--health-stall-min-s", "1",
                          "--health-stall-check-interval", "0")
    router = start_router(config.router, worker_urls=[engine.url])
    trainer = RLTrainer.start(prepare_config(config), router.url, [engine.url])
    timer = None
    try:
        assert trainer.resume() == 0
        times = [trainer.run_iteration(i).metrics["perf/rollout_time"] for i in range(3)]
        hold = max(10 * sorted(times)[1], 5.0)
        httpx.post(engine.url + "/pause_generation").raise_for_status()
        timer = threading.Timer(hold, lambda: httpx.post(engine.url + "/continue_generation"))
        timer.start()
        held = trainer.run_iteration(3)
        assert held.metrics["perf/rollout_time"] >= 0.9 * hold  # the pause began just before the rollout
        stall = [v for v in held.health.verdicts if v.signal == "stall"]
        assert stall and stall[0].severity == RED and stall[0].rollout_id == 3, held.health.verdicts
    finally:
        if timer is not None:
            timer.join()
        httpx.post(engine.url + "/continue_generation")
        trainer.close()
        router.stop()
