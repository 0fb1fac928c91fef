"""Settings of data, rollout, rewards and evaluation (Miles' flag names)."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.checkpoints import CATALOG
from miles.config.fields import ConfigError, flag

DEFAULT_EVAL_NAME = "arithmetic"  # the name of the tiny task's eval set when no --eval-prompt-data is given


@dataclass(frozen=True)
class RolloutConfig:
    """Data, sampling, rewards and evaluation."""

    hf_checkpoint: str | None = flag(None, "HF checkpoint to train: a directory, or a catalog name "
                                     f"({', '.join(CATALOG)}: made once into the miles cache) (default: the tiny "
                                     "base model, made if missing)", existing_path=True, or_names=tuple(CATALOG))
    tiny_policy: str = flag("dense", "the tiny base model a run trains when --hf-checkpoint is "
                                     "not given: dense (Qwen3) or moe (Qwen3-MoE, 4 experts, "
                                     "top-2; `miles base-model --moe` makes it)",
                            choices=("dense", "moe"))
    prompt_data: str | None = flag(None, "JSONL training prompts (default: the generated arithmetic set)",
                                   existing_path=True)
    input_key: str = flag("prompt", "JSONL key of the prompt")
    label_key: str = flag("label", "JSONL key of the reference answer")
    apply_chat_template: bool = flag(False, "wrap prompts in the tokenizer's chat template")
    rm_type: str = flag("exact_match", "reward function", choices=("exact_match", "math"))
    custom_rm_path: str | None = flag(None, "dotted path of a custom reward fn(args, sample) -> float")
    num_rollout: int = flag(100, "rollout iterations to run", minimum=1)
    rollout_batch_size: int = flag(32, "prompts per rollout", minimum=1)
    n_samples_per_prompt: int = flag(8, "samples per prompt (the GRPO group)", minimum=1)
    rollout_max_response_len: int = flag(8, "most tokens generated per sample", minimum=1)
    rollout_temperature: float = flag(1.0, "sampling temperature", minimum=0.0)
    rollout_top_p: float = flag(1.0, "nucleus sampling", minimum=0.0, maximum=1.0)
    rollout_top_k: int = flag(-1, "top-k sampling (-1: off)")
    rollout_num_engines: int = flag(1, "inference engines to launch", minimum=1)
    rollout_num_gpus_per_engine: int = flag(1, "GPUs per SGLang engine", minimum=1)
    sglang_server_concurrency: int = flag(512, "most samples in flight to the engines at once (a request of a "
                                                 "prompt's n samples counts n)", minimum=1)
    eval_interval: int | None = flag(20, "evaluate every N rollouts (none: never)", minimum=1)
    eval_prompt_data: list[str] = flag([], "eval sets as NAME PATH pairs (default: the generated arithmetic eval set)")
    n_samples_per_eval_prompt: int = flag(4, "samples per eval prompt (pass@k uses k up to this)", minimum=1)
    eval_temperature: float = flag(1.0, "sampling temperature at eval", minimum=0.0)
    eval_max_prompts: int | None = flag(None, "use at most this many prompts of each eval set", minimum=1)

    def validate(self) -> None:
        if self.tiny_policy != "dense" and self.hf_checkpoint is not None:
            raise ConfigError("--tiny-policy",
                              f"{self.tiny_policy} picks the tiny base model used when "
                              f"--hf-checkpoint is not given; --hf-checkpoint "
                              f"{self.hf_checkpoint} names the model: give one of them")
        if self.rollout_top_p <= 0.0:  # the engines sample from (0, 1]: 0 would fail at the first rollout
            raise ConfigError("--rollout-top-p", f"must be > 0 (nucleus mass in (0, 1]), got {self.rollout_top_p}")
        if self.rollout_top_k == 0 or self.rollout_top_k < -1:  # the engines' rule: refused at the first rollout
            raise ConfigError("--rollout-top-k", f"must be -1 (off) or >= 1, got {self.rollout_top_k}")
        if len(self.eval_prompt_data) % 2:
            raise ConfigError("--eval-prompt-data", "expects NAME PATH pairs, got an odd number of values")
        for path in self.eval_prompt_data[1::2]:
            from pathlib import Path

            if not Path(path).exists():
                raise ConfigError("--eval-prompt-data", f"path does not exist: {path}")
