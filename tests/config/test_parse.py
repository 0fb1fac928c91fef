"""Flags and YAML fill the typed config; every bad input names its flag."""
from __future__ import annotations

import pytest

from miles.config import ConfigError, MilesConfig, parse_config, redacted_flat_dict


def test_no_flags_gives_the_tiny_defaults():
    config = parse_config([])
    assert config == MilesConfig()
    # 32 prompts x 8 samples, one optimizer step per rollout
    assert config.global_batch_size == config.rollout.rollout_batch_size * config.rollout.n_samples_per_prompt
    assert config.world_size == 1


def test_flags_fill_their_sections():
    config = parse_config(["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--lr=1e-5",
                           "--use-wandb", "--no-normalize-advantages-std", "--eval-interval", "none"])
    assert config.rollout.rollout_batch_size == 4
    assert config.rollout.n_samples_per_prompt == 2
    assert config.train.lr == 1e-5
    assert config.tracking.use_wandb is True
    assert config.train.normalize_advantages_std is False
    assert config.rollout.eval_interval is None
    assert config.as_namespace().rollout_batch_size == 4


def test_yaml_then_flag_wins(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout-batch-size: 16\nlr: 0.01\nuse_wandb: true\n")
    config = parse_config(["--config", str(path), "--lr", "0.5"])
    assert config.rollout.rollout_batch_size == 16
    assert config.train.lr == 0.5  # the flag beats the file
    assert config.tracking.use_wandb is True


@pytest.mark.parametrize("argv, flag, words", [
    (["--rollout-batch-sise", "3"], "--rollout-batch-sise", "did you mean --rollout-batch-size"),
    (["--lr", "fast"], "--lr", "expected a number"),
    (["--rollout-batch-size", "2.5"], "--rollout-batch-size", "expected an integer"),
    (["--use-wandb", "maybe"], "--use-wandb", "true or false"),
    (["--hf-checkpoint", "/no/such/dir"], "--hf-checkpoint", "does not exist"),
    (["--train-backend", "jax"], "--train-backend", "fsdp, megatron"),
    (["--global-batch-size", "100"], "--global-batch-size", "must divide"),
    (["--micro-batch-size", "3"], "--micro-batch-size", "must divide"),
    (["--rollout-top-p", "1.5"], "--rollout-top-p", "<= 1.0"),
    (["--use-kl-loss"], "--kl-loss-coef", "> 0"),
    (["--n-samples-per-prompt", "1"], "--n-samples-per-prompt", "at least 2"),
    (["--eval-prompt-data", "only-a-name"], "--eval-prompt-data", "NAME PATH pairs"),
])
def test_bad_input_names_the_flag(argv, flag, words):
    with pytest.raises(ConfigError) as err:
        parse_config(argv)
    assert err.value.flag == flag
    assert words in str(err.value)


def test_bad_yaml_is_reported(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_config(["--config", str(bad)])
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("rollout-batch-sise: 4\n")
    with pytest.raises(ConfigError, match="rollout-batch-sise.*did you mean --rollout-batch-size"):
        parse_config(["--config", str(unknown)])
    with pytest.raises(ConfigError, match="does not exist"):
        parse_config(["--config", str(tmp_path / "missing.yaml")])


def test_secrets_are_redacted():
    config = parse_config(["--wandb-key", "s3cr3t-value", "--router-admin-token", "t0ken-value"])
    flat = redacted_flat_dict(config)
    assert "s3cr3t-value" not in repr(flat) and "t0ken-value" not in repr(flat)
    assert flat["wandb_key"] == "***"
    assert config.tracking.wandb_key == "s3cr3t-value"  # still usable by the code that needs it


def test_help_never_shows_a_secret_default(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    assert "--rollout-batch-size" in capsys.readouterr().out
