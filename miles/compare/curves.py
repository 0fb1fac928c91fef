"""A run's compared metrics as step-aligned curves, read from RUN_DIR with the journal's own reader
(`miles.record.journal.read_journal`: the lines `miles doctor` and the dashboard read, skipped alike).

Each metric lies on its own step axis (`train/` on train/step, `eval/` on eval/step, the rest on
rollout/step; `miles.record.names`), as every tracker plots it, so runs of the same config align.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from miles.compare.rules import DEFAULT_RULES, Rule, rule_for
from miles.config import ConfigError
from miles.record.eval_prompts import read_eval_prompts
from miles.record.journal import JOURNAL_NAME, JournalLine, UnreadableRun, read_journal
from miles.record.names import STEP_KEYS, step_key


EVAL_AXIS = "eval/step"
# perf/ keys that exist only where the run evaluated: on the eval axis, so a run that evaluated at
# other steps than its baselines is not "missing" them (review N28: `perf/eval_time ERROR ...
# missing`, listed as slower)
EVAL_ONLY = frozenset({"perf/eval_time"})
STALE_KEY = "rollout/staleness/max"  # > 0: generated ahead, on older weights (async)


def axis_of(key: str) -> str:
    """The step axis a compared key is aligned on: its tracker axis; the eval axis for an eval's
    own timing."""
    return EVAL_AXIS if key in EVAL_ONLY else step_key(key)


def _int(value: float) -> int:
    return int(value) if value == value and abs(value) < 2**53 else -1  # a NaN or huge counter: no step


@dataclass(frozen=True)
class RunCurves:
    name: str
    source: str
    curves: dict[str, dict[int, float]]  # metric key -> step -> value (NaN and Infinity kept: an error)
    reached: dict[str, int]  # step axis -> the last step the run recorded on it
    prompts: dict[int, list[dict]] = field(default_factory=dict)  # eval step -> per-prompt rows
    stale: frozenset[int] = frozenset()  # train steps of rollouts with stale tokens (stale_steps)

    def axis(self, key: str) -> str:
        return axis_of(key)

    def eval_steps(self) -> set[int]:
        """The eval steps the run recorded (of any compared eval metric)."""
        return {s for key, points in self.curves.items() if axis_of(key) == EVAL_AXIS
                for s in points}


def require_judged(run: RunCurves, what: str = "baseline") -> RunCurves:
    """A baseline must hold something to compare against: one with no journal line holding a compared
    metric (empty, binary, `garbage`, lines without metrics) would make every signal "no baseline" and pass
    any run (probe N30). UnreadableRun naming it: exit 3, as a journal that cannot be read."""
    if not any(run.curves.values()):
        raise UnreadableRun(f"the {what} {run.source} has no journal line with a compared metric: nothing to "
                            f"compare against")
    return run


def curves_of(lines: list[JournalLine], rules: tuple[Rule, ...] = DEFAULT_RULES) -> tuple[dict, dict]:
    """The compared keys' points, and the last step reached per axis, of journal lines in order (a later
    line at the same step wins: an eval at rollout 0 over the base eval's step 0)."""
    curves: dict[str, dict[int, float]] = {}
    reached: dict[str, int] = {}
    for line in lines:
        for axis in STEP_KEYS:
            # an iteration is on the train and rollout axes; the eval axis only where it evaluated
            if axis in line.metrics or (axis != EVAL_AXIS and line.rollout_id >= 0):
                step = _int(line.metrics.get(axis, line.rollout_id))
                reached[axis] = max(reached.get(axis, step), step)
        # the journal keeps only finite values and names the others under non_finite: those are NaN here,
        # so a not-finite value is judged as one (an error), not as missing
        points = {**line.metrics, **{key: math.nan for key in line.non_finite}}
        for key, value in points.items():
            if key in STEP_KEYS or rule_for(key, rules) is None:
                continue
            step = _int(line.metrics.get(axis_of(key), line.rollout_id))
            curves.setdefault(key, {})[step] = float(value)
    return curves, reached


def stale_steps(lines: list[JournalLine]) -> frozenset[int]:
    """The train steps of the rollouts that trained on tokens of older weights (async GRPO)."""
    return frozenset(_int(line.metrics.get("train/step", line.rollout_id)) for line in lines
                     if line.metrics.get(STALE_KEY, 0.0) > 0)


def read_run(run_dir: Path, rules: tuple[Rule, ...] = DEFAULT_RULES, flag: str = "RUN_DIR") -> RunCurves:
    """A run directory's curves and per-prompt evals: ConfigError when it is not a run directory at all
    (a usage error), UnreadableRun naming the file when its files cannot be read."""
    run_dir = Path(run_dir)
    journal = run_dir / JOURNAL_NAME
    if not run_dir.is_dir():
        raise ConfigError(flag, f"{run_dir} is not a directory")
    if not journal.exists():
        raise ConfigError(flag, f"{run_dir} has no {JOURNAL_NAME} (not a run directory?)")
    try:
        lines = read_journal(journal)  # refuses a FIFO or a directory before opening it
        prompts = read_eval_prompts(run_dir)
    except (OSError, ValueError) as exc:
        raise UnreadableRun(f"cannot read {run_dir}: {exc}") from None
    curves, reached = curves_of(lines, rules)
    return RunCurves(run_dir.name or str(run_dir), str(run_dir), curves, reached, prompts,
                     stale_steps(lines))
