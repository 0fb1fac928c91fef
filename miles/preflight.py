"""`preflight(config)`: everything checkable before Ray, engines or ranks start, in both drivers."""
from __future__ import annotations


def preflight(config) -> None:
    """Backend, an existing Ray cluster's address and token, reward, generate and logger hooks, prompt and
    eval files, the --inject-fault spec; each failure is a ConfigError naming its flag. `config` must be
    resolved (`miles.config.resolve`)."""
    from miles.backends import check_backend
    from miles.run.faults import parse_faults
    from miles.cluster.connect import check_cluster
    from miles.rollout.generate_hook import load_generate_function
    from miles.rollout.data import read_prompts
    from miles.rollout.evaluation import load_eval_sets
    from miles.rollout.rewards import RewardModel
    from miles.tracking.hooks import load_hooks
    from miles.compare.run_end import check_baselines

    check_backend(config.train.train_backend)
    check_cluster(config.orchestration.ray_address)
    r = config.rollout
    RewardModel(r.rm_type, r.custom_rm_path, config.as_namespace())
    load_generate_function(config.generate)
    load_hooks(config.tracking)
    read_prompts(r.prompt_data, r.input_key, r.label_key)
    if r.eval_interval is not None:
        load_eval_sets(r)
    parse_faults(config.orchestration.inject_fault)
    check_baselines(config.tracking.baseline_run_dirs, config.train.run_dir)
    _check_load(config)


def _check_load(config) -> None:
    from pathlib import Path

    from miles.config import ConfigError
    from miles.run.checkpoint import check_load

    reason = check_load(Path(config.train.save), Path(config.train.load))
    if reason is not None:
        raise ConfigError("--load", reason)


def check_context(config) -> None:
    """The longest training prompt plus --rollout-max-response-len fits the engines' context (the model's,
    or --context-length): else the first rollout's requests would be refused after every service started.
    Needs the model's files (a no-op while they are not made yet, or for a Hub id: the engine checks)."""
    from pathlib import Path

    from transformers import AutoConfig, AutoTokenizer

    from miles.config import ConfigError
    from miles.engines.model_runner import model_context_length
    from miles.rollout.data import read_prompts
    from miles.rollout.generate import encode_prompt

    r, model = config.rollout, config.rollout.hf_checkpoint
    if not model or not (Path(model) / "config.json").is_file():
        return
    tokenizer = AutoTokenizer.from_pretrained(model)
    given = config.engine.context_length
    context = given or model_context_length(AutoConfig.from_pretrained(model), tokenizer)
    longest = max(len(encode_prompt(tokenizer, p.prompt, r.apply_chat_template))
                  for p in read_prompts(r.prompt_data, r.input_key, r.label_key))
    where = f"the context length {context}" + (" (--context-length)" if given else " (the model's)")
    if longest + r.rollout_max_response_len > context:
        flag = "--context-length" if given else "--rollout-max-response-len"
        raise ConfigError(flag, f"the longest prompt of --prompt-data ({longest} tokens) plus "
                                f"--rollout-max-response-len {r.rollout_max_response_len} exceeds {where}")
