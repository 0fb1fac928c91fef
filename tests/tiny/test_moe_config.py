"""How a run picks the tiny mixture-of-experts policy: --tiny-policy moe (configs/tiny-moe-cpu.yaml)
falls back on its own cached base model, and a bad value or combination fails naming the flag."""
from pathlib import Path

import pytest
import yaml

from miles.config import ConfigError, parse_config
from miles.prepare import resolve_run
from miles.tiny.recipes import base_model_dir, moe_base_model_dir

YAML = Path(__file__).resolve().parents[2] / "configs" / "tiny-moe-cpu.yaml"


def test_the_moe_yaml_is_the_defaults_on_the_moe_policy():
    data = yaml.safe_load(YAML.read_text())
    assert data["tiny-policy"] == "moe"
    flags = [x for k, v in data.items() for x in (f"--{k}", str(v))]
    assert parse_config(["--config", str(YAML)]) == parse_config(flags)
    config = parse_config(["--config", str(YAML)])
    assert config.rollout.hf_checkpoint is None and config.rollout.prompt_data is None
    # the run: megatron-core's MoE layer, the experts split over 2 ranks
    t = config.train
    assert (t.train_backend, t.actor_num_gpus_per_node, t.expert_model_parallel_size) == \
        ("megatron", 2, 2)


def test_the_policy_picks_the_fallback_model():
    moe = resolve_run(parse_config(["--config", str(YAML)])).rollout.hf_checkpoint
    dense = resolve_run(parse_config([])).rollout.hf_checkpoint
    assert (Path(moe), Path(dense)) == (moe_base_model_dir(), base_model_dir())
    assert moe_base_model_dir() != base_model_dir()


@pytest.mark.parametrize("argv,fragment", [
    (["--tiny-policy", "sparse"], "not allowed"),
    (["--tiny-policy", "moe", "--hf-checkpoint", "smollm2-135m-instruct"], "give one of them"),
    (["--tiny-policy", "moe", "--custom-generate-function-path",
      "miles.rollout.multi_turn.generate"], "dense tiny model only"),
])
def test_bad_policy_values_name_the_flag(argv, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config(argv)
    assert err.value.flag == "--tiny-policy" and fragment in str(err.value)


def test_the_tiny_moe_shape_is_checked_before_it_is_made(tmp_path, monkeypatch):
    """The preflight's context check reads the MoE model's shape in memory while it is not made."""
    from miles import preflight
    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path))  # an empty cache: the model is not made
    config = resolve_run(parse_config(["--config", str(YAML)]))
    tokenizer, model = preflight._model_shape(config)
    assert model.model_type == "qwen3_moe" and model.num_experts == 4


def test_base_model_moe_makes_and_prints_the_moe_checkpoint(tmp_path, monkeypatch, capsys):
    """`miles base-model --moe` warm-starts the MoE policy (a fake warm start here) into its own
    cached directory, says so before it starts, and prints the report and the path; cached after."""
    from miles.tiny import cli, recipes, warmstart

    monkeypatch.setattr(warmstart, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(recipes, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(warmstart, "default_task_data", lambda: None)
    asked = []

    def make(out_dir, progress=True, moe=False):
        asked.append(moe)
        out_dir.mkdir(parents=True)
        return dict(recipe=recipes.ADDITION_MOE, steps=2750, eval_greedy_accuracy=0.957,
                    eval_pass_at_1=0.258, seconds=1.0)

    monkeypatch.setattr(warmstart, "warm_start", make)
    assert cli.main(["--moe", "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("making the mixture-of-experts tiny base model")
    assert out[-2].startswith("MoE base model (made in 1.0s): 2750 SFT steps")
    assert out[-1] == str(tmp_path / recipes.moe_base_model_dir().name) and asked == [True]
    assert cli.main(["--moe", "--quiet"]) == 0 and asked == [True]  # cached
    with pytest.raises(SystemExit):
        cli.main(["--moe", "--multi-turn"])
    assert "--moe" in capsys.readouterr().err


def test_a_run_on_the_moe_policy_makes_it_when_missing(tmp_path, monkeypatch, capsys):
    """The run's prepare step finds the MoE base missing and makes that one (not the dense)."""
    from miles.tiny import defaults, warmstart

    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path))
    config = resolve_run(parse_config(["--tiny-policy", "moe"]))
    assert defaults.tiny_model_missing(config) == moe_base_model_dir()
    made = []

    def ensure(progress=True):
        made.append("moe")
        (moe_base_model_dir() / "warmstart.json").parent.mkdir(parents=True)
        (moe_base_model_dir() / "warmstart.json").write_text('{"steps": 2750}')
        return moe_base_model_dir()

    monkeypatch.setattr(warmstart, "ensure_moe_base_model", ensure)
    monkeypatch.setattr(warmstart, "ensure_base_model", lambda progress=True: made.append("dense"))
    assert defaults.make_tiny_model(config, progress=False) == moe_base_model_dir()
    assert made == ["moe"] and defaults.tiny_model_missing(config) is None
    assert "(2750 supervised steps)" in capsys.readouterr().out
