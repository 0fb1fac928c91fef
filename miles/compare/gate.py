"""The history gate of `miles doctor RUN_DIR --history DIR`: a finished run against the trusted runs in DIR.

Corridors need trusted runs: with fewer than `min_runs` (cold start) they are inactive and the gate
says so, judging only what needs no history (finite values, absolute bounds). Shadow mode reports and
never fails; enforce mode fails (exit 1) on a regression.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from miles.compare.comparison import Comparison, compare, format_table
from miles.compare.curves import read_run
from miles.compare.trusted import history_rules, read_trusted

SHADOW, ENFORCE = "shadow", "enforce"
MODES = (SHADOW, ENFORCE)
DEFAULT_MIN_RUNS = 2


@dataclass(frozen=True)
class GateResult:
    history: str
    mode: str
    trusted: int
    min_runs: int
    comparison: Comparison

    @property
    def cold(self) -> bool:
        return self.trusted < self.min_runs

    @property
    def passed(self) -> bool:
        return not self.comparison.failed

    @property
    def fails(self) -> bool:
        """Whether the gate fails the command (only in enforce mode)."""
        return self.mode == ENFORCE and not self.passed

    def headline(self) -> str:
        state = (f"cold start: {self.trusted} of {self.min_runs} trusted runs, corridors inactive (finite values "
                 f"and absolute bounds only)" if self.cold else f"{self.trusted} trusted runs")
        if self.passed:
            verdict = "passed"
        else:
            verdict = "FAILED" if self.mode == ENFORCE else "would fail (shadow mode: reported only)"
        return f"history gate ({self.mode}) against {self.history}: {state}: {verdict}"

    def as_json(self) -> dict:
        return {"history": self.history, "mode": self.mode, "trusted": self.trusted, "min_runs": self.min_runs,
                "cold_start": self.cold, "passed": self.passed, **self.comparison.as_json()}


def run_gate(run_dir: Path, directory: Path, mode: str, min_runs: int = DEFAULT_MIN_RUNS) -> GateResult:
    rules = history_rules(directory)
    trusted = read_trusted(directory)
    run = read_run(run_dir, rules)
    cold = len(trusted) < min_runs
    comparison = compare(run, [] if cold else trusted, rules, finished=True, top_prompts=0)
    return GateResult(str(directory), mode, len(trusted), min_runs, comparison)


def format_gate(result: GateResult) -> str:
    return format_table(result.comparison, title=result.headline(), prompts=False)
