"""An `RLTrainer` on fakes, for the iteration's rules in seconds: no engine, no Ray, no weights.

The rollout comes from `generate` (loaded as `--custom-generate-function-path`, so the trainer's own
rollout path runs: prompts, per-sample seeds, reward, advantages); the ranks (`FakeGroup`) return
metrics computed from their batches, and the weight sync (`FakeSync`) only counts versions. The
tracker, health watch, data source, reward and timeline are the real ones.
"""
from __future__ import annotations

import time
from pathlib import Path

from miles.backends.base import ActorInfo, RankTrainResult
from miles.health import HealthWatch
from miles.rollout.sample import Status
from miles.tracking import open_tracking

GENERATE = "tests.support.fake_training.generate"
FAKE_URL = "http://127.0.0.1:9"  # nothing listens: a request that reaches it fails the test
SERVED = {"version": 0}  # what FakeSync pushed last: the version the fake engine's samples carry


async def generate(args):
    """A sample made from its seed alone: 1 to 4 response tokens, the right answer for odd seeds."""
    sample, seed = args.sample, args.sampling_params["seed"]
    length = 1 + seed % 4
    ids = [(seed >> (3 * i)) % 50 + 10 for i in range(length)]
    sample.tokens = sample.tokens + ids
    sample.response_length = length
    sample.rollout_log_probs = [-((seed >> i) % 7) / 8 - 0.125 for i in range(length)]
    sample.response = str(sample.label) if seed % 2 else "no"
    sample.weight_version = str(SERVED["version"])
    sample.status = Status.COMPLETED
    return sample


class FakeGroup:
    """The ranks: each batch's metrics from its own numbers, fixed times, phases on the timeline."""

    attached, actors, names = False, [], None

    def __init__(self, world_size: int):
        self.world_size, self.version = world_size, 0

    def train(self, batches) -> list[RankTrainResult]:
        return [self._train(b) for b in batches]

    def _train(self, batch) -> RankTrainResult:
        now = time.time()
        mean_lp = [sum(lp) / max(len(lp), 1) for lp in batch.rollout_log_probs]
        sums = {"train/loss": sum(a * a / 2 for a in batch.advantages),
                "train/pg_loss": sum(map(abs, batch.advantages)),
                "rollout/log_probs": sum(mean_lp), "rollout/rollout_log_probs": sum(mean_lp)}
        stats = {}
        if batch.return_token_stats:
            stats = {i: {"log_probs": [-0.5] * n, "entropy": [1.0] * n}
                     for i, n in zip(batch.sample_indices, batch.response_lengths)}
        steps = len(batch.step_sizes)
        return RankTrainResult(sums, {"train/grad_norm": [1.5] * steps, "train/lr": [1e-3] * steps},
                               len(batch.tokens), sum(map(len, batch.tokens)), 0.01, 0.0, 0.02,
                               phases=[("log_probs", now, now), ("actor_train", now, now)],
                               token_stats=stats)

    def call(self, method: str, *args):
        if method == "info":
            return [ActorInfo(rank, self.world_size, self.version, 0, {"peak_flops": 1e12})
                    for rank in range(self.world_size)]
        if method == "set_weight_version":
            self.version = args[0]
        return [None] * self.world_size


class FakeSync:
    """The weight push: records each version and pause mode; the fake engine serves it at once."""

    router = supervisor = admin_token = None

    def __init__(self):
        self.pushes: list[tuple[int, str | None]] = []
        self.last_times: dict[str, float] = {}

    def push(self, version: int, pause_mode: str | None = None) -> None:
        self.pushes.append((version, pause_mode))
        SERVED["version"] = version
        self.last_times = {"perf/update_weights_rank_0_time": 0.0}


class FakeProfiler:
    def close(self) -> None:
        pass


def fake_trainer(config):
    """An `RLTrainer` for the prepared `config` (with `--custom-generate-function-path GENERATE`) on
    fakes, its tracker and health watch opened as a fresh run's `resume` opens them."""
    from miles.trainer import RLTrainer

    SERVED["version"] = 0
    run_dir = Path(config.train.run_dir)
    trainer = RLTrainer(config, FAKE_URL, [FAKE_URL], tracker=open_tracking(config, run_dir),
                        health=HealthWatch(config, run_dir), group=FakeGroup(config.world_size),
                        sync=FakeSync(), profiler=FakeProfiler())
    trainer.tracker.open({})
    trainer.health.resume([])
    return trainer
