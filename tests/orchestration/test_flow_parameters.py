"""`miles train` hands its arguments to the grpo flow as the parameters the Prefect UI shows."""
from __future__ import annotations


def test_miles_train_passes_its_config_file_as_the_flows_parameter():
    """The Prefect UI's parameters show the YAML a run was started with, not `config_file: null` beside
    flags that name it (G3 of the first-hour review); the flags rebuilt from them parse the same."""
    from flows.flow_args import build_argv, flow_parameters
    from miles.config import parse_config

    argv = ["--num-rollout", "3", "--config", "configs/tiny-cpu.yaml", "--lr", "1e-3"]
    params = flow_parameters(argv)
    assert params == {"config_file": "configs/tiny-cpu.yaml", "flags": ["--num-rollout", "3", "--lr", "1e-3"]}
    assert parse_config(build_argv(**params)) == parse_config(argv)
    assert flow_parameters(["--config=a.yaml", "--seed", "3"]) == {"config_file": "a.yaml", "flags": ["--seed", "3"]}
    assert flow_parameters(["--seed", "3"]) == {"config_file": None, "flags": ["--seed", "3"]}
