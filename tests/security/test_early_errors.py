"""C11/C3b: flag values and prompt files that used to pass the parse, start every service and then end in a
traceback are one-line errors naming the flag before anything starts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from miles.config import ConfigError
from miles.prepare import prepare

ROOT = Path(__file__).resolve().parents[2]


def checked(argv: list[str]):
    """`prepare` with every check and without making the tiny model: the checks read its shape, not its weights
    (on a machine without it, each test here waited minutes for the warm start that another test was making)."""
    return prepare(argv, make_model=False)


@pytest.mark.parametrize("flags, flag, message", [
    (["--rollout-top-k", "-5"], "--rollout-top-k", "must be -1 .off. or >= 1"),
    (["--rollout-top-k", "0"], "--rollout-top-k", "must be -1"),
    (["--seed", "99999999999999999999999"], "--seed", "must be <="),
    (["--seed", "-1"], "--seed", "must be >= 0"),
    (["--rollout-max-response-len", "100000"], "--rollout-max-response-len", "exceeds the context length 256"),
    (["--context-length", "10"], "--context-length", "exceeds the context length 10"),
    # C11: one prompt's samples are one batched request to one engine; past its queue they were a 503 mid-run
    (["--n-samples-per-prompt", "100000"], "--n-samples-per-prompt",
     "100000 is more than one engine queues .--engine-max-queued-requests 4096."),
    (["--n-samples-per-prompt", "8", "--engine-max-queued-requests", "4"], "--n-samples-per-prompt",
     "8 is more than one engine queues .--engine-max-queued-requests 4."),
    (["--n-samples-per-eval-prompt", "5000"], "--n-samples-per-eval-prompt", "more than one engine queues"),
    (["--sglang-server-concurrency", "5000"], "--sglang-server-concurrency", "more than one engine queues"),
])
def test_flag_values_that_fail_after_start_up(tmp_path, flags, flag, message):
    with pytest.raises(ConfigError, match=message) as raised:
        checked(["--run-dir", str(tmp_path / "run"), *flags])
    assert str(raised.value).startswith(flag)


def test_a_context_error_comes_before_the_tiny_model_is_made(tmp_path, monkeypatch):
    """On a machine without the tiny models, a response length past their context fails at once: their shape
    is known before a warm start makes the weights (before, the error came after that wait of minutes)."""
    import miles.prepare

    def made(config):
        raise AssertionError("the model was made before the flags were checked")

    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(miles.prepare, "make_base_model", made)
    for task in ([], ["--config", str(ROOT / "configs" / "tiny-multi-turn.yaml")]):  # addition, calculator
        with pytest.raises(ConfigError, match=r"100000 exceeds the context length 256 \(the model's\)") as raised:
            prepare(["--run-dir", str(tmp_path / "run"), *task, "--rollout-max-response-len", "100000"])
        assert str(raised.value).startswith("--rollout-max-response-len")
    assert not list((tmp_path / "cache").glob("tiny-*base*"))


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "", "label": "2"}', "'prompt' is empty"),
    ('{"prompt": "   ", "label": "2"}', "'prompt' is empty"),
    ('{"prompt": "\\ud800", "label": "2"}', "lone surrogate"),
    ('{"prompt": 5, "label": "2"}', "not text"),
    ('{"prompt": NaN, "label": "2"}', "not text"),
    ('{"prompt": null, "label": "2"}', "not text"),
    ('{"prompt": "1+1=", "label": ["2"]}', "'label' is a JSON list"),
])
def test_prompt_files_that_fail_after_start_up(tmp_path, line, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "1+1=", "label": "2"}\n' + line + "\n")
    with pytest.raises(ConfigError, match=message) as raised:
        checked(["--run-dir", str(tmp_path / "run"), "--prompt-data", str(path)])
    assert str(raised.value).startswith("--prompt-data") and f"{path}:2" in str(raised.value)


def test_the_largest_group_the_engine_queue_holds_is_accepted(tmp_path):
    config = checked(["--run-dir", str(tmp_path / "run"), "--n-samples-per-prompt", "8",
                      "--engine-max-queued-requests", "8", "--sglang-server-concurrency", "8",
                      "--n-samples-per-eval-prompt", "8"])
    assert config.rollout.n_samples_per_prompt == 8


def test_a_null_label_is_still_allowed(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "1+1=", "label": null}\n')
    checked(["--run-dir", str(tmp_path / "run"), "--prompt-data", str(path), "--custom-rm-path",
             "tests.health.broken_rewards.always_one"])


def test_the_cli_exits_2_with_one_line_before_any_service(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "miles.train", "--run-dir", str(run_dir), "--rollout-top-k", "-5"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("--rollout-top-k: must be -1 (off) or >= 1, got -5")
    assert not (run_dir / "logs").exists()


@pytest.mark.parametrize("case, message", [
    ("/etc", "has no config.json"),
    ("/dev/null", "is not a directory"),
    ("truncated", "cannot load .*: SafetensorError"),
    # N6: weights that are NaN, or past float32's range (the CPU engine serves float32), are refused at start
    ("nan", "cannot load .*: WeightUpdateError: .* tensor '.*' holds NaN or infinite values once loaded as float32"),
    ("float64-1e300", "holds NaN or infinite values once loaded as float32"),
])
def test_engine_model_errors_are_one_line(tmp_path, untrained_model, case, message):
    import re
    import shutil

    model = case
    if case == "truncated":
        model = str(tmp_path / "trunc")
        shutil.copytree(untrained_model, model)
        weights = Path(model) / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif case in ("nan", "float64-1e300"):
        import torch
        from safetensors.torch import load_file, save_file

        model = str(tmp_path / case)
        shutil.copytree(untrained_model, model)
        weights = Path(model) / "model.safetensors"
        tensors = load_file(weights)
        if case == "nan":
            name = sorted(tensors)[-1]
            tensors[name] = tensors[name].clone()
            tensors[name].view(-1)[0] = float("nan")  # one element is enough
        else:
            tensors = {k: torch.full(v.shape, 1e300, dtype=torch.float64) for k, v in tensors.items()}
        save_file(tensors, weights)
    done = subprocess.run([sys.executable, "-m", "miles.engines.cli", "--model", model, "--port", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert last.startswith("miles engine: error: --model: ") and re.search(message, last), last


REFUSED_BEFORE_TORCH = """
import sys
from miles.config import ConfigError
from miles.engines.cli import main
try:
    main(["--model", sys.argv[1], "--port", "1"])
except ConfigError as refused:
    print(refused)
print("torch loaded" if "torch" in sys.modules else "torch not loaded")
"""


@pytest.mark.parametrize("model", ["/etc", "/dev/null"])
def test_a_path_that_is_no_checkpoint_is_refused_before_torch_loads(model):
    """Seconds of torch and transformers imports (more on a busy machine) are not spent on a wrong --model."""
    done = subprocess.run([sys.executable, "-c", REFUSED_BEFORE_TORCH, model], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    assert lines[-2].startswith(f"--model: {model} ") and lines[-1] == "torch not loaded", done.stdout + done.stderr
