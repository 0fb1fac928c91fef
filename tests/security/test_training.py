"""Probes C3, C8-C11, D3, D4: garbage never trains or gets saved, and a run dir has one trainer."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from miles.backends.base import NonFiniteError
from miles.backends.ppo import PPORank, load_state_file, rng_state
from miles.config import ConfigError, parse_config
from miles.rollout.data import read_prompts
from miles.rollout.rewards import RewardModel
from miles.rollout.sample import Sample
from miles.run.lock import RunDirLock

ROOT = Path(__file__).resolve().parents[2]


def tiny_rank(tmp_path) -> PPORank:
    """A CPU rank over a one-layer model, enough for the optimizer step and the checkpoint files."""
    rank = PPORank(parse_config(["--run-dir", str(tmp_path)]), rank=0, world_size=1)
    rank.model = torch.nn.Linear(4, 4)
    rank.start_optimizer()
    return rank


@pytest.mark.parametrize("flag", ["--lr", "--rollout-temperature", "--eps-clip", "--clip-grad", "--kl-loss-coef",
                                  "--router-request-timeout", "--rollout-health-check-interval"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_flags_are_refused(flag, value):
    with pytest.raises(ConfigError, match=f"{flag}: expected a finite number"):
        parse_config([f"{flag}={value}"])


def test_top_p_zero_is_refused():
    with pytest.raises(ConfigError, match="--rollout-top-p: must be > 0"):
        parse_config(["--rollout-top-p", "0"])


@pytest.mark.parametrize("hook, message", [("rm_nan", "finite number"), ("rm_text", "must be a number")])
def test_a_bad_custom_reward_stops_the_run_naming_the_flag(hook, message):
    config = parse_config(["--custom-rm-path", f"tests.security.hooks.{hook}"])
    model = RewardModel("exact_match", config.rollout.custom_rm_path, config.as_namespace())
    with pytest.raises(ConfigError, match=f"--custom-rm-path: tests.security.hooks.{hook} returned .*{message}"):
        model.score([Sample(index=0, group_index=0, prompt="1+1=", response="2", label="2")])


def test_a_non_finite_gradient_never_reaches_the_weights(tmp_path):
    rank = tiny_rank(tmp_path)
    before = {k: v.clone() for k, v in rank.model.state_dict().items()}
    rank.model(torch.full((1, 4), float("nan"))).sum().backward()
    with pytest.raises(NonFiniteError, match="non-finite gradient norm"):
        rank.clip_and_step()
    assert rank.optimizer_steps == 0
    for name, tensor in rank.model.state_dict().items():
        assert torch.equal(tensor, before[name]) and torch.isfinite(tensor).all()
    rank.model(torch.ones(1, 4)).sum().backward()  # a finite step afterwards works
    assert rank.clip_and_step() > 0 and rank.optimizer_steps == 1


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['PWNED_MARK']}",))


def test_a_pickle_in_a_checkpoint_is_refused_and_never_runs(tmp_path, monkeypatch):
    rank = tiny_rank(tmp_path)
    good = tmp_path / "good"
    good.mkdir()
    torch.save({"scheduler": rank.scheduler.state_dict(), "optimizer_steps": 3, "weight_version": 2},
               good / "scheduler.pt")
    torch.save(rng_state(), good / "rng_rank0.pt")
    torch.save(rank.optimizer.state_dict(), good / "optimizer.pt")
    rank.load_schedule_and_rng(good)  # what miles writes loads with weights_only
    assert (rank.optimizer_steps, rank.weight_version) == (3, 2)
    assert load_state_file(good / "optimizer.pt").keys() == rank.optimizer.state_dict().keys()

    mark = tmp_path / "PWNED"
    monkeypatch.setenv("PWNED_MARK", str(mark))
    torch.save({"scheduler": Evil(), "optimizer_steps": 0, "weight_version": 0}, good / "scheduler.pt")
    with pytest.raises(ValueError, match="weights_only"):
        rank.load_schedule_and_rng(good)
    assert not mark.exists()


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe\x00binary", "not UTF-8"),
    (b'"my prompt is here"\n', "is a JSON str"),
    (b"5\n", "is a JSON int"),
])
def test_odd_prompt_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        read_prompts(path, "prompt", "label")


def test_a_second_trainer_on_a_run_dir_fails_naming_the_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from miles.run.lock import RunDirLock; "
                               f"lock = RunDirLock({str(tmp_path)!r}); print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"in use by another trainer \\(pid {holder.pid} "):
            RunDirLock(tmp_path)
        cache = tmp_path / "empty-cache"  # no tiny model: a trainer that went on would make one (a minute)
        done = subprocess.run([sys.executable, "-m", "miles.train", "--run-dir", str(tmp_path), "--num-rollout", "1"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT,
                              env={**os.environ, "MILES_CACHE_DIR": str(cache)})
        assert done.returncode == 2 and f"pid {holder.pid}" in done.stderr and "Traceback" not in done.stderr
        assert not (tmp_path / "logs").exists()  # refused before any service started
        assert not any(cache.glob("tiny-base-*"))  # ... and before the model was made
    finally:
        holder.kill()  # SIGKILL: the kernel drops its lock, so the next trainer takes it over
        holder.wait()
    with RunDirLock(tmp_path) as lock:
        assert f"pid {os.getpid()} " in lock.path.read_text()
