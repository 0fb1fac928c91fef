"""Evaluation: sample each eval prompt `--n-samples-per-eval-prompt` times; mean reward, pass@k."""
from __future__ import annotations

from dataclasses import dataclass

from miles.rollout.data import Prompt, read_prompts
from miles.rollout.generate import RolloutSampling, generate_groups
from miles.rollout.metrics import pass_rates
from miles.rollout.rewards import RewardModel



@dataclass(frozen=True)
class EvalSet:
    name: str
    prompts: list[Prompt]


@dataclass
class EvalResult:
    metrics: dict[str, float]  # eval/<name>, eval/<name>-pass@k, ...
    data: dict[str, dict]  # Miles' eval data: name -> {"rewards", "truncated", "samples"}


def load_eval_sets(rollout_config) -> list[EvalSet]:
    """The NAME PATH pairs of --eval-prompt-data (`resolve` adds the arithmetic eval set to the default task)."""
    pairs = list(zip(rollout_config.eval_prompt_data[0::2], rollout_config.eval_prompt_data[1::2]))
    sets = []
    for name, path in pairs:
        prompts = read_prompts(path, rollout_config.input_key, rollout_config.label_key, "--eval-prompt-data")
        sets.append(EvalSet(name, prompts[: rollout_config.eval_max_prompts]))
    return sets


def evaluate(url: str, eval_sets: list[EvalSet], tokenizer, reward: RewardModel, rollout_config, *, seed: int,
             step: int, generate_fn=None, args=None) -> EvalResult:
    """Eval metrics of the weights the engines serve now. Seeds do not depend on `step`, so
    evals at different steps differ only by the policy, not by the draw."""
    cfg = rollout_config
    params = RolloutSampling(cfg.eval_temperature, cfg.rollout_top_p, cfg.rollout_top_k, cfg.rollout_max_response_len)
    metrics, kept = {}, {}
    for eval_set in eval_sets:
        samples = generate_groups(url, eval_set.prompts, cfg.n_samples_per_eval_prompt, tokenizer, params,
                                  seed=seed, stream=f"eval-{eval_set.name}", rollout_id=0,
                                  concurrency=cfg.sglang_server_concurrency,
                                  apply_chat_template=cfg.apply_chat_template, generate_fn=generate_fn, args=args)
        reward.score(samples)
        n, name = len(samples), eval_set.name
        metrics[f"eval/{name}"] = sum(s.reward for s in samples) / n
        metrics[f"eval/{name}-truncated_ratio"] = sum(s.truncated for s in samples) / n
        metrics[f"eval/{name}/response_len/mean"] = sum(s.response_length for s in samples) / n
        for key, value in pass_rates(samples, cfg.n_samples_per_eval_prompt).items():
            metrics[f"eval/{name}-{key}"] = value
        kept[name] = {"rewards": [s.reward for s in samples], "truncated": [s.truncated for s in samples],
                      "samples": samples}
    metrics["eval/step"] = float(step)
    return EvalResult(metrics, kept)
