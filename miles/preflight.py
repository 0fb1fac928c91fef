"""`preflight(config)`: everything checkable before Ray, engines or ranks start, in both drivers."""
from __future__ import annotations


def preflight(config) -> None:
    """Backend, an existing Ray cluster's address and token, reward, generate and logger hooks, prompt and
    eval files, the --inject-fault spec; each failure is a ConfigError naming its flag. `config` must be
    resolved (`miles.config.resolve`)."""
    from miles.backends import check_backend
    from miles.run.faults import check_faults
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
    check_faults(config.orchestration.inject_fault, config.world_size,
                 engines=r.rollout_num_engines, embedded=config.engine.engine == "embedded")
    check_baselines(config.tracking.baseline_run_dirs, config.train.run_dir)
    _check_load(config)


def _check_load(config) -> None:
    from pathlib import Path

    from miles.config import ConfigError
    from miles.run.checkpoint import check_load

    reason = check_load(Path(config.train.save), Path(config.train.load))
    if reason is not None:
        raise ConfigError("--load", reason)


def _model_shape(config):
    """(tokenizer, model config) of the run's model: from its files, or the tiny model's own in memory while
    it is not made yet; None when neither is at hand."""
    from pathlib import Path

    from miles.tiny.defaults import tiny_model_missing, uses_moe, uses_tool_task

    model = config.rollout.hf_checkpoint
    if model and (Path(model) / "config.json").is_file():
        from transformers import AutoConfig, AutoTokenizer

        return AutoTokenizer.from_pretrained(model), AutoConfig.from_pretrained(model)
    if tiny_model_missing(config) is not None and uses_moe(config):
        from miles.tiny.moe_model import tiny_moe_shape

        return tiny_moe_shape()
    if tiny_model_missing(config) is not None:
        from miles.tiny.model import tiny_shape

        return tiny_shape(tool_markers=uses_tool_task(config))
    return None


def check_context(config) -> None:
    """The longest training prompt plus --rollout-max-response-len fits the engines' context (the model's,
    or --context-length): else the first rollout's requests would be refused after every service started.
    Needs the model's files, or the tiny model's shape before it is made (a no-op for a catalog checkpoint
    not made yet, checked again once it is, or for a Hub id: the engine checks)."""
    from miles.config import ConfigError
    from miles.engines.model_runner import model_context_length
    from miles.rollout.data import read_prompts
    from miles.rollout.generate import encode_prompt

    r, shape = config.rollout, _model_shape(config)
    if shape is None:
        return
    tokenizer, model_config = shape
    given = config.engine.context_length
    context = given or model_context_length(model_config, tokenizer)
    longest = max(len(encode_prompt(tokenizer, p.prompt, r.apply_chat_template))
                  for p in read_prompts(r.prompt_data, r.input_key, r.label_key))
    where = f"the context length {context}" + (" (--context-length)" if given else " (the model's)")
    if longest + r.rollout_max_response_len > context:
        flag = "--context-length" if given else "--rollout-max-response-len"
        raise ConfigError(flag, f"the longest prompt of --prompt-data ({longest} tokens) plus "
                                f"--rollout-max-response-len {r.rollout_max_response_len} exceeds {where}")


def check_parallel_layout(config) -> None:
    """The model divides as --tensor-model-parallel-size, --pipeline-model-parallel-size and
    --expert-model-parallel-size split it (heads, KV heads and the MLP by TP, layers by PP,
    experts by EP): else every rank fails building its shard.
    Needs the model's files or the tiny model's shape, like `check_context`."""
    from miles.config.parallel import check_model_divides, check_model_experts, rank_layout

    layout, shape = rank_layout(config.train), _model_shape(config)
    ep = config.train.expert_model_parallel_size
    if shape is None or (layout.tp == 1 and layout.pp == 1 and ep == 1):
        return
    model = shape[1]
    experts = int(getattr(model, "num_experts", 0) or 0)
    check_model_experts(ep, experts, layout.tp, config.train.sequence_parallel)
    # an MoE model's MLPs are its experts, split over TP as a dense MLP is
    ffn = model.moe_intermediate_size if experts else model.intermediate_size
    check_model_divides(layout, model.num_attention_heads, model.num_key_value_heads, ffn,
                        model.num_hidden_layers)
