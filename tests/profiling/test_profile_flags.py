"""Bad profiling flags fail at parse time (before Ray or any service) with a message naming the flag."""
import os

import pytest

from miles.config import ConfigError, parse_config
from miles.config.profiling import PYSPY_ENV

ON = ["--use-pytorch-profiler", "--num-rollout", "20"]


@pytest.mark.parametrize("argv, flag", [
    ([*ON, "--profile-step-start", "5", "--profile-step-end", "5"], "--profile-step-end"),
    ([*ON, "--profile-step-start", "10", "--profile-step-end", "25"], "--profile-step-end"),  # beyond --num-rollout
    ([*ON, "--profile-target", "train_everything"], "--profile-target"),
    ([*ON, "--profile-ranks", "1"], "--profile-ranks"),  # one training rank: only rank 0
    ([*ON, "--record-memory-history"], "--record-memory-history"),  # without a path
    ([*ON, "--memory-snapshot-path", "m.pickle"], "--memory-snapshot-path"),  # a path nothing writes
    (["--record-memory-history", "--memory-snapshot-path", "m.pickle"], "--record-memory-history"),  # no window
    (["--profile-rollout"], "--profile-rollout"),
])
def test_bad_profiling_flags_name_the_flag(argv, flag):
    with pytest.raises(ConfigError) as err:
        parse_config(argv)
    assert err.value.flag == flag


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into read-only directories")
def test_unwritable_directories_are_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ConfigError) as err:
        parse_config([*ON, "--tensorboard-dir", str(locked / "tb")])
    assert err.value.flag == "--tensorboard-dir"


def test_a_file_in_the_way_is_not_a_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for flag, value in (("--tensorboard-dir", blocker / "tb"), ("--run-dir", blocker)):
        with pytest.raises(ConfigError) as err:
            parse_config([*ON, flag, str(value)])
        assert err.value.flag == flag
    with pytest.raises(ConfigError) as err:
        parse_config([*ON, "--record-memory-history", "--memory-snapshot-path", str(blocker / "m.pickle")])
    assert err.value.flag == "--memory-snapshot-path"


def test_good_window_and_miles_pyspy_env(monkeypatch):
    config = parse_config([*ON, "--profile-step-start", "18", "--profile-step-end", "20",
                           "--profile-target", "train_actor", "train_log_probs"])
    assert config.profiling.profile_target == ["train_actor", "train_log_probs"]
    monkeypatch.setenv(PYSPY_ENV, "2.5")
    assert parse_config([]).profiling.py_spy_interval == 2.5
    assert parse_config(["--py-spy-interval", "7"]).profiling.py_spy_interval == 7.0
    monkeypatch.setenv(PYSPY_ENV, "soon")
    with pytest.raises(ConfigError) as err:
        parse_config([])
    assert err.value.flag == "--py-spy-interval"


def test_traces_go_to_run_dir_profiler_unless_a_tensorboard_dir_is_given(tmp_path):
    from miles.profiling.window import trace_root

    run = tmp_path / "run"
    # a resolved config always carries RUN_DIR/tensorboard for the scalars: that is not a choice of trace dir
    default = parse_config([*ON, "--tensorboard-dir", str(run / "tensorboard")])
    assert trace_root(default, run) == run / "profiler"
    assert trace_root(parse_config(ON), run) == run / "profiler"
    given = parse_config([*ON, "--tensorboard-dir", str(tmp_path / "tb")])
    assert trace_root(given, run) == tmp_path / "tb"
