"""--on-red-flag profile: a red flag that starts asks the run's profiler for a window on the next rollouts."""
from __future__ import annotations

from miles.config import parse_config
from miles.health import RED, WARNING, HealthReport, Verdict
from miles.run.observer import IterationResult
from miles.run.red_flags import RedFlagProfiler


class RecordingProfiler:
    """Stands in for `RunProfiler` (its windows need training ranks): records the windows asked for."""

    def __init__(self):
        self.windows = []

    def request_window(self, start, end):
        from miles.profiling.window import window_from_config

        self.windows.append((start, end))
        return window_from_config(parse_config([]), "/tmp", start, end)


def result(rollout_id, started):
    return IterationResult(rollout_id, {}, [], HealthReport(rollout_id, started, started, {}))


def test_a_starting_red_flag_opens_a_window_on_the_next_rollouts(capsys):
    profiler = RecordingProfiler()
    observer = RedFlagProfiler(parse_config(["--on-red-flag", "profile", "--health-profile-rollouts", "3"]), profiler)
    observer.after_iteration(result(4, [Verdict(4, "pg_clipfrac", WARNING, "w")]))  # a warning: no window
    observer.after_iteration(result(5, [Verdict(5, "grad_norm", RED, "r")]))
    observer.after_iteration(result(6, []))  # still red, but not starting: no second window
    assert profiler.windows == [(6, 9)]
    assert "[health] profiling rollouts 6..8" in capsys.readouterr().out


def test_warn_and_stop_never_profile():
    profiler = RecordingProfiler()
    for mode in ("warn", "stop"):
        RedFlagProfiler(parse_config(["--on-red-flag", mode]), profiler).after_iteration(
            result(5, [Verdict(5, "grad_norm", RED, "r")]))
    assert profiler.windows == []
