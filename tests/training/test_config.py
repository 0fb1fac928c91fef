"""The training config: tiny-cpu.yaml mirrors the defaults, bad values fail early with the flag named."""
import dataclasses
from pathlib import Path

import pytest
import yaml

from miles.config import ConfigError, RolloutConfig, TrainConfig, parse_config

YAML = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


def defaults(section) -> dict:
    return {f.name: getattr(section(), f.name) for f in dataclasses.fields(section)}


def test_tiny_cpu_yaml_equals_the_dataclass_defaults():
    data = {k.replace("-", "_"): v for k, v in yaml.safe_load(YAML.read_text()).items()}
    expected = {**defaults(RolloutConfig), **defaults(TrainConfig)}
    assert data == expected
    assert parse_config(["--config", str(YAML)]) == parse_config([])


def test_a_default_rollout_is_in_flight_and_decoded_at_once():
    """The whole default rollout reaches the engine together and fits one batch: with 64 samples in flight its
    256 samples trickled in over the whole rollout (8-15 prefills of 3-56 rows), 1.9-2.2x the in-process
    generate; with all of them in flight it is 2 prefills and 1.3-1.5x (docs/developer/benchmarks.md)."""
    from miles.config.engine import EngineConfig

    rollout = RolloutConfig()
    samples = rollout.rollout_batch_size * rollout.n_samples_per_prompt
    assert rollout.sglang_server_concurrency >= samples
    assert EngineConfig().engine_max_batch_size >= samples


@pytest.mark.parametrize("argv,flag,fragment", [
    (["--train-backend", "jax"], "--train-backend", "not allowed"),
    (["--eps-clip", "0.3", "--eps-clip-high", "0.2"], "--eps-clip-high", "must be >= --eps-clip"),
    (["--kl-loss-type", "k9"], "--kl-loss-type", "not allowed"),
    (["--advantage-estimator", "ppo"], "--advantage-estimator", "not allowed"),
    (["--use-kl-loss"], "--kl-loss-coef", "must be > 0"),
    (["--num-steps-per-rollout", "3"], "--num-steps-per-rollout", "must divide"),
    (["--actor-num-gpus-per-node", "3"], "--global-batch-size", "divisible by the data parallel size"),
    (["--n-samples-per-prompt", "1"], "--n-samples-per-prompt", "groups of at least 2"),
    (["--lr", "-1"], "--lr", ">= 0"),
    (["--lr", "1e-5", "--min-lr", "1e-4"], "--min-lr", "must be <= --lr"),
    (["--prompt-data", "/no/such.jsonl"], "--prompt-data", "does not exist"),
])
def test_bad_training_flags(argv, flag, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(argv)
    assert err.value.flag == flag and fragment in str(err.value)


def test_the_lr_floor_follows_lr_unless_set():
    """The default floor is a tenth of --lr, so `--lr` alone is always valid (a fixed default floor would
    refuse any --lr below it); an explicit --min-lr is kept, 0 included."""
    assert parse_config([]).train.floor_lr == pytest.approx(1e-4)
    assert parse_config(["--lr", "1e-5"]).train.floor_lr == pytest.approx(1e-6)
    assert parse_config(["--lr", "1e-5", "--min-lr", "0"]).train.floor_lr == 0.0


def test_the_default_schedule_decays_by_cosine_to_the_floor():
    import torch

    from miles.backends.ppo import build_optimizer, build_scheduler

    config = parse_config(["--num-rollout", "10"])
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(1))], config.train)
    scheduler = build_scheduler(optimizer, config)
    lrs = []
    for _ in range(11):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(1e-3) and lrs[10] == pytest.approx(1e-4)
    assert lrs[5] == pytest.approx(1e-4 + (1e-3 - 1e-4) * 0.5)  # cosine: halfway at the middle step
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_megatron_backend_is_accepted():
    from miles.backends import actor_class, check_backend

    config = parse_config(["--train-backend", "megatron"])
    assert config.train.train_backend == "megatron"
    check_backend("megatron")  # megatron-core is installed
    assert actor_class("megatron").__name__ == "MegatronTrainActor"


def test_custom_rm_path_is_checked_before_anything_starts(tmp_path):
    from miles.prepare import prepare

    def check(*flags):
        return prepare([*flags, "--run-dir", str(tmp_path)], make_model=False)

    with pytest.raises(ConfigError, match="cannot import module 'nowhere_at_all'"):
        check("--custom-rm-path", "nowhere_at_all.reward")
    (tmp_path / "p.jsonl").write_text('{"question": "1+1="}\n')
    with pytest.raises(ConfigError, match="has no key 'prompt'"):
        check("--prompt-data", str(tmp_path / "p.jsonl"))
    with pytest.raises(ConfigError, match="--custom-rollout-log-function-path"):
        check("--custom-rollout-log-function-path", "os.nope")
    with pytest.raises(ConfigError, match="--inject-fault"):
        check("--inject-fault", "explode@3")
