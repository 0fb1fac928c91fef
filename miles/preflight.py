"""`preflight(config)`: everything checkable before Ray, engines or ranks start, in both drivers."""
from __future__ import annotations


def preflight(config) -> None:
    """Backend, an existing Ray cluster's address and token, reward, generate and logger hooks, prompt and
    eval files, the --inject-fault spec; each failure is a ConfigError naming its flag. `config` must be
    resolved (`miles.config.resolve`)."""
    from miles.backends import check_backend
    from miles.run.faults import parse_fault
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
    parse_fault(config.orchestration.inject_fault)
    check_baselines(config.tracking.baseline_run_dirs, config.train.run_dir)
