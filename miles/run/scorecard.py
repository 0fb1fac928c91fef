"""The scorecard a finished run prints (and the flow publishes, and MLflow shows as the run's description):
held-out eval base -> final, reward first -> last, rollouts and wall time, red flags, the final checkpoint,
and where to look next.

Every number is read back from the run's own files (the journal, base_eval.json, health.jsonl, the
checkpoint folder), so the card says what the run left behind, whichever driver ran it and whether it
was resumed; what a file does not hold is said to be missing, never filled in.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from miles.health import RED, Verdict, read_health_log
from miles.health.signals import PREFIX
from miles.record.journal import JournalLine, read_journal
from miles.record.layout import RunLayout
from miles.record.names import STEP_KEYS, map_metrics
from miles.run.checkpoint import candidates

REWARD_KEY = "rollout/raw_reward"


@dataclass
class RedFlags:
    """The health watch's record: `watched` is False when the journal holds no health/* key (no watch ran)."""

    watched: bool
    checked: list[str] = field(default_factory=list)  # the signals the watch judged
    red: dict[str, list[int]] = field(default_factory=dict)  # signal -> rollouts it was red at
    warnings: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # one per red-flagged signal (`red_flag_lines`)

    def summary(self) -> str:
        if not self.watched:
            return "not watched (no health/* in the journal)"
        warned = f"; warnings on {', '.join(self.warnings)}" if self.warnings else ""
        if not self.red:
            return f"none ({len(self.checked)} signals checked){warned}"
        parts = [f"{signal} at rollout {', '.join(map(str, ids[:3]))}{', ...' if len(ids) > 3 else ''}"
                 for signal, ids in self.red.items()]
        count = sum(len(ids) for ids in self.red.values())
        return f"{count} on {len(self.red)} signal{'s' * (len(self.red) > 1)}: " + "; ".join(parts) + warned


@dataclass
class Scorecard:
    run_dir: Path
    rollouts: list[int]  # the trained rollout ids in the journal (the base eval's -1 is not one)
    eval_key: str | None = None
    base_eval: float | None = None
    final_eval: float | None = None
    final_eval_rollout: int | None = None
    reward_first: tuple[int, float] | None = None  # (rollout id, value)
    reward_last: tuple[int, float] | None = None
    seconds: float | None = None  # wall time of the run, as its driver measured it
    journal_seconds: float | None = None  # first to last journal line
    flags: RedFlags = field(default_factory=lambda: RedFlags(False))
    checkpoint: Path | None = None
    next_steps: list[tuple[str, str]] = field(default_factory=list)
    final_metrics: dict[str, float] = field(default_factory=dict)  # the journal's last line
    final_rollout: int | None = None  # that line's rollout id (-1: the base eval's only)
    base_metrics: dict[str, float] = field(default_factory=dict)  # the eval of the starting weights
    links: dict[str, str] = field(default_factory=dict)  # what the run left elsewhere (name -> URL)

    @property
    def iterations(self) -> int:
        return len(self.rollouts)

    # ---- what is printed --------------------------------------------------------------------
    def rows(self) -> list[tuple[str, str]]:
        rows = [("held-out eval", self._eval_text()), ("reward", self._reward_text()),
                ("rollouts", self._rollouts_text()), ("red flags", self.flags.summary()),
                ("model", str(self.checkpoint) if self.checkpoint else "no checkpoint saved")]
        return rows + self.next_steps

    def text(self, title: str = "scorecard") -> str:
        rows = self.rows()
        width = max(len(name) for name, _ in rows)
        return "\n".join([f"{title} of {self.run_dir}"] + [f"  {name:<{width}}  {value}" for name, value in rows])

    def markdown(self) -> str:
        lines = [f"## Scorecard of `{self.run_dir.name}`", "", "| | |", "|---|---|"]
        lines += [f"| {name} | {value.replace('|', '/')} |" for name, value in self.rows()]
        return "\n".join(lines)

    def _eval_text(self) -> str:
        if self.eval_key is None:
            return "no eval in the journal"
        base = "base not evaluated" if self.base_eval is None else f"{self.base_eval:.3f} (base)"
        if self.final_eval is None:
            return f"{self.eval_key}: {base}, no eval after training"
        delta = "" if self.base_eval is None else f", {self.final_eval - self.base_eval:+.3f}"
        return f"{self.eval_key}: {base} -> {self.final_eval:.3f} (after rollout {self.final_eval_rollout}){delta}"

    def _reward_text(self) -> str:
        if self.reward_first is None:
            return f"no {REWARD_KEY} in the journal"
        (r0, v0), (r1, v1) = self.reward_first, self.reward_last
        return f"{REWARD_KEY}: {v0:.3f} (rollout {r0}) -> {v1:.3f} (rollout {r1})"

    def _rollouts_text(self) -> str:
        if not self.rollouts:
            return "none trained"
        span = f"{len(self.rollouts)} ({self.rollouts[0]}..{self.rollouts[-1]})"
        if self.seconds is not None:
            training = f" (training {duration(self.journal_seconds)})" if self.journal_seconds is not None else ""
            return f"{span} in {duration(self.seconds)} wall time{training}"
        if self.journal_seconds is not None:
            return f"{span}; {duration(self.journal_seconds)} from the first to the last journal line"
        return span


# The one definition of a run's duration, everywhere the scorecard is (terminal, Prefect `grpo-scorecard`, the
# MLflow run's description): from the start of the command (`miles train`, `python -m miles.train`) to the
# scorecard, with the time from the first to the last journal line beside it as "training".
WALL_TIME = "from the start of the command to the scorecard"


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def eval_key_of(keys) -> str | None:
    """The headline eval metric: the first held-out set's pass@1 (else its score) in the journal."""
    evals = sorted(k for k in keys if k.startswith("eval/") and k != "eval/step")
    return next((k for k in evals if k.endswith("-pass_at_1")), None) or \
        next((k for k in evals if k.count("/") == 1 and "-" not in k), None)


def red_flags_of(journal: list[JournalLine], run_dir: Path) -> RedFlags:
    """The run's red flags and warnings from its health log, for every reader of a run's end (the scorecard,
    the flow's `grpo-health` artifact and its run report)."""
    checked = sorted({k[len(PREFIX):] for ln in journal for k in ln.metrics if k.startswith(PREFIX)})
    verdicts = read_health_log(run_dir)
    red: dict[str, list[int]] = {}
    for v in verdicts:
        if v.severity == RED:
            red.setdefault(v.signal, []).append(v.rollout_id)
    warnings = sorted({v.signal for v in verdicts if v.severity != RED})
    return RedFlags(bool(checked) or bool(verdicts), checked, red, warnings, red_flag_lines(verdicts))


def red_flag_lines(verdicts: list[Verdict]) -> list[str]:
    """One line per red-flagged signal: first rollout, how often, the first flag's message and values."""
    out = []
    for signal in dict.fromkeys(v.signal for v in verdicts if v.severity == RED):
        mine = [v for v in verdicts if v.signal == signal and v.severity == RED]
        first = mine[0]
        values = ", ".join(f"{k}={x:.4g}" for k, x in first.values.items())
        out.append(f"`{signal}` from rollout {first.rollout_id} ({len(mine)} rollouts): {first.message} ({values})")
    return out


def base_metrics(run_dir: Path, journal: list[JournalLine]) -> dict[str, float]:
    """The base eval's metrics: base_eval.json, and the journal's base-eval line (rollout -1) over it."""
    return {**read_base_eval(run_dir), **next((ln.metrics for ln in journal if ln.rollout_id < 0), {})}


def read_base_eval(run_dir: Path) -> dict[str, float]:
    try:
        raw = json.loads(RunLayout(run_dir).base_eval.read_text())
        return map_metrics({k: v for k, v in raw.items() if isinstance(v, (int, float))})
    except (OSError, ValueError, AttributeError):
        return {}


def scorecard(run_dir: str | Path, save_dir: str | Path | None = None, seconds: float | None = None,
              next_steps: list[tuple[str, str]] = ()) -> Scorecard:
    """The scorecard of `run_dir` (its checkpoints in `save_dir`, default RUN_DIR/checkpoints); `seconds`:
    the wall time its driver measured; `next_steps`: (label, command) rows of where to look next.
    The one reader of a run's end: the journal and the health log are read here once, for every view
    of it (the terminal, the flow's artifacts, MLflow's description, the dashboard)."""
    run_dir = Path(run_dir)
    journal = read_journal(RunLayout(run_dir).journal)
    trained = [ln for ln in journal if ln.rollout_id >= 0]
    base = base_metrics(run_dir, journal)
    card = Scorecard(run_dir, sorted({ln.rollout_id for ln in trained}), seconds=seconds,
                     next_steps=list(next_steps), base_metrics=base)
    if journal:
        card.final_metrics, card.final_rollout = dict(journal[-1].metrics), journal[-1].rollout_id
    if len(journal) > 1:
        card.journal_seconds = journal[-1].time - journal[0].time
    card.eval_key = eval_key_of({k for ln in journal for k in ln.metrics} | set(base))
    if card.eval_key is not None:
        card.base_eval = base.get(card.eval_key)
        after = [ln for ln in trained if card.eval_key in ln.metrics]
        if after:
            card.final_eval, card.final_eval_rollout = after[-1].metrics[card.eval_key], after[-1].rollout_id
    rewards = [(ln.rollout_id, ln.metrics[REWARD_KEY]) for ln in trained if REWARD_KEY in ln.metrics]
    if rewards:
        card.reward_first, card.reward_last = rewards[0], rewards[-1]
    card.flags = red_flags_of(journal, run_dir)
    saved = candidates(Path(save_dir) if save_dir else RunLayout(run_dir).checkpoints)
    card.checkpoint = saved[0] if saved else None
    return card


# ---- the scorecard's parts as the flow publishes them (Prefect artifacts) ------------------------
# the final-metrics table's namespaces in this order, then the rest, health/* last
FINAL_ORDER = ("eval", "rollout", "passrate", "train", "multi_turn", "perf")


def _rounded(value: float) -> float | str:
    """Four significant digits (a table of 0.908854166666667 reads badly); not finite: its name."""
    return float(f"{value:.4g}") if math.isfinite(value) else str(value)


def final_metrics_table(final: dict[str, float],
                        base: dict[str, float]) -> list[dict[str, float | str]]:
    """The `grpo-final-metrics` rows: the headline namespaces first (eval, reward, pass rates,
    train), perf and the health watch's per-signal values last, each value rounded; an eval key
    measured on the starting weights too has that `base` value beside it. The step axes are left
    out (the description names the rollout)."""
    def order(key: str) -> tuple[int, str]:
        namespace = key.split("/", 1)[0]
        rank = FINAL_ORDER.index(namespace) if namespace in FINAL_ORDER else \
            len(FINAL_ORDER) + (namespace == "health")
        return rank, key

    return [{"metric": key, "final": _rounded(final[key]),
             "base": _rounded(base[key]) if key in base else ""}
            for key in sorted((k for k in final if k not in STEP_KEYS), key=order)]


def red_flags_markdown(flags: list[str], warnings: list[str] = ()) -> str:
    text = "## Health: red flags\n\n" + "\n".join(f"- {flag}" for flag in flags) if flags else \
        "## Health\n\nNo red flags."
    if warnings:
        text += "\n\nWarnings: " + ", ".join(f"`{w}`" for w in warnings)
    return text
