"""One training rollout from its prompts: the samples (through the router, or a custom generate
function), their rewards and the GRPO group advantages (steps 2 and 3 of the iteration)."""
from __future__ import annotations

from typing import Any

from miles.rollout.advantages import compute_advantages
from miles.rollout.generate import Admit, RolloutSampling, generate_groups
from miles.rollout.rewards import RewardModel
from miles.rollout.sample import Sample


class RolloutMaker:
    """Makes rollout `rollout_id` of `prompts` with the run's sampling flags; each sample's
    advantage is also kept in its metadata (the sample table shows it)."""

    def __init__(self, config, url: str, generate_fn, reward: RewardModel, args: Any):
        r = config.rollout
        self.config, self.url, self.generate_fn = config, url, generate_fn
        self.reward, self.args = reward, args
        self.params = RolloutSampling(r.rollout_temperature, r.rollout_top_p, r.rollout_top_k,
                                      r.rollout_max_response_len)

    def __call__(self, rollout_id: int, prompts, tokenizer, admit: Admit | None = None
                 ) -> tuple[list[Sample], list[float]]:
        """`admit`: awaited before each request starts (async training's admission control)."""
        r, t = self.config.rollout, self.config.train
        samples = generate_groups(self.url, prompts, r.n_samples_per_prompt, tokenizer, self.params,
                                  seed=t.seed, stream="train", rollout_id=rollout_id,
                                  concurrency=r.sglang_server_concurrency,
                                  apply_chat_template=r.apply_chat_template,
                                  generate_fn=self.generate_fn, args=self.args, admit=admit)
        self.reward.score(samples)
        advantages = compute_advantages(samples, t.advantage_estimator, t.normalize_advantages_std)
        for sample, advantage in zip(samples, advantages):
            sample.metadata["advantage"] = advantage
        return samples, advantages
