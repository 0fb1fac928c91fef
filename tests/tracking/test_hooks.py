"""Custom rollout/eval loggers by dotted path: True replaces the default logging, False keeps it;
a bad path or signature fails at start-up, before any tracker or journal exists."""
from __future__ import annotations

import sys
import textwrap

import pytest
from synthetic import make_samples
from tests.support.hook_calls import CALLS

from miles.config import ConfigError, parse_config
from miles.record.journal import read_journal
from miles.rollout.metrics import rollout_metrics
from miles.tracking import open_tracking, validate_tracking_config

@pytest.fixture
def hook_module(tmp_path, monkeypatch):
    (tmp_path / "my_hooks.py").write_text(textwrap.dedent("""
        from tests.support.hook_calls import CALLS

        def replace_all(rollout_id, args, samples, extra, rollout_time):
            CALLS.append(("rollout", rollout_id, len(samples), rollout_time, args.num_rollout))
            return True

        def keep_default(rollout_id, args, samples, extra, rollout_time):
            CALLS.append(("rollout", rollout_id, len(samples), rollout_time, args.num_rollout))
            return False

        def eval_replace(rollout_id, args, data, extra_metrics):
            CALLS.append(("eval", rollout_id, sorted(data)))
            return True

        def two_args(rollout_id, args):
            return True

        def raising(rollout_id, args, samples, extra, rollout_time):
            raise RuntimeError("logger broke at rollout %d" % rollout_id)

        def eval_raising(rollout_id, args, data, extra_metrics):
            raise KeyError("arith")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    CALLS.clear()
    yield "my_hooks"
    sys.modules.pop("my_hooks", None)


def run_one(run_dir, *flags):
    config = parse_config(["--num-rollout", "2", *flags])
    tracker = open_tracking(config, run_dir)
    tracker.open({})
    samples = make_samples(0)
    computed = rollout_metrics(samples, [0.0] * len(samples), group_size=4, binary_reward=True)
    tracker.log_rollout(0, config.as_namespace(), samples, {**computed, "rollout/extra_note": 2.0}, 1.25)
    tracker.log_eval(0, config.as_namespace(), {"arith": {"rewards": [1, 0]}}, {"eval/arith": 0.5})
    tracker.record(0, {"train/loss": 0.5, "perf/rollout_time": 1.25, "rollout/step": 0.0, "train/step": 0.0})
    tracker.close()
    (line,) = read_journal(run_dir / "metrics.jsonl")
    return line.metrics


def test_logger_returning_true_replaces_default_rollout_logging(run_dir, hook_module):
    metrics = run_one(run_dir, "--custom-rollout-log-function-path", f"{hook_module}.replace_all")
    assert CALLS == [("rollout", 0, 8, 1.25, 2)]
    assert not [k for k in metrics if k.startswith(("rollout/response_len", "rollout/zero_std", "passrate/"))]
    assert "rollout/extra_note" not in metrics
    # what the loop records itself stays: training, perf and the eval the default eval logging kept
    assert metrics["eval/arith"] == 0.5 and metrics["train/loss"] == 0.5 and metrics["perf/rollout_time"] == 1.25


def test_logger_returning_false_keeps_default_rollout_logging(run_dir, hook_module):
    metrics = run_one(run_dir, "--custom-rollout-log-function-path", f"{hook_module}.keep_default",
                      "--custom-eval-rollout-log-function-path", f"{hook_module}.eval_replace")
    assert CALLS == [("rollout", 0, 8, 1.25, 2), ("eval", 0, ["arith"])]
    # make_samples(0): 8 samples of 3 tokens; group 0 all correct (zero std), one truncated of 8
    assert metrics["rollout/response_len/mean"] == 3.0 and metrics["perf/rollout_time"] == 1.25
    assert metrics["rollout/truncated_ratio"] == 1 / 8 and metrics["rollout/zero_std/count_1.0"] == 1.0
    assert metrics["rollout/extra_note"] == 2.0
    assert "eval/arith" not in metrics  # the eval logger returned True


@pytest.mark.parametrize("flag, path, message", [
    ("--custom-rollout-log-function-path", "no_such_pkg.fn", "cannot import module"),
    ("--custom-rollout-log-function-path", "my_hooks.missing", "has no function"),
    ("--custom-rollout-log-function-path", "my_hooks.two_args", "must accept 5 positional arguments"),
    ("--custom-eval-rollout-log-function-path", "my_hooks.keep_default", "must accept 4 positional arguments"),
])
def test_bad_logger_fails_at_start_up(run_dir, hook_module, flag, path, message):
    config = parse_config([flag, path])
    with pytest.raises(ConfigError, match=message) as err:
        validate_tracking_config(config)
    assert err.value.flag == flag and path.split(".")[0] in str(err.value)
    with pytest.raises(ConfigError):
        open_tracking(config, run_dir / "never")
    assert not (run_dir / "never").exists()


@pytest.mark.parametrize("replace", [False, True])
def test_base_eval_is_its_own_line_at_eval_step_0_unless_the_eval_logger_replaces_it(run_dir, hook_module, replace):
    flags = ["--custom-eval-rollout-log-function-path", f"{hook_module}.eval_replace"] if replace else []
    config = parse_config(["--num-rollout", "2", *flags])
    tracker = open_tracking(config, run_dir)
    tracker.open({})
    tracker.log_base_eval(config.as_namespace(), {"arith": {"rewards": [1, 0]}}, {"eval/arith": 0.5, "eval/step": 0.0})
    tracker.record(0, {"train/loss": 0.5, "rollout/step": 0.0, "train/step": 0.0})
    tracker.close()
    lines = read_journal(run_dir / "metrics.jsonl")
    if replace:
        assert CALLS == [("eval", 0, ["arith"])] and [ln.rollout_id for ln in lines] == [0]
    else:
        assert [ln.rollout_id for ln in lines] == [-1, 0]
        assert lines[0].metrics == {"eval/arith": 0.5, "eval/step": 0.0}
        assert "eval/step" not in lines[1].metrics  # no eval with rollout 0: no eval step on its line


def test_a_raising_logger_is_a_warning_naming_its_flag_and_the_default_logging_takes_over(run_dir, hook_module,
                                                                                           caplog):
    """Probe C7: a custom logger that raised ended the run with a traceback (no checkpoint); it is the
    user's logging failing, so the run goes on and that rollout's metrics reach the journal as if the
    logger had returned False."""
    with caplog.at_level("WARNING", logger="miles.tracking"):
        metrics = run_one(run_dir, "--custom-rollout-log-function-path", f"{hook_module}.raising",
                          "--custom-eval-rollout-log-function-path", f"{hook_module}.eval_raising")
    assert metrics["rollout/response_len/mean"] == 3.0 and metrics["rollout/extra_note"] == 2.0
    assert metrics["eval/arith"] == 0.5
    warnings = [r.getMessage() for r in caplog.records if "raised at rollout" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "--custom-rollout-log-function-path" in warnings[0] and "logger broke at rollout 0" in warnings[0]
    assert f"{hook_module}.raising" in warnings[0]
    assert "--custom-eval-rollout-log-function-path" in warnings[1] and "KeyError" in warnings[1]
