"""A comparison as one object: the verdict per signal, the prompt diff, the terminal table and the JSON.

The verdict (and the exit code) is about learning: the timing signals (`perf/*_time`) are judged and shown
apart, and fail the comparison only with `gate_timing` (`--gate-timing`), since a slower or busier machine
is not a broken run (issue 38).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from miles.compare.corridor import ERROR, OUTSIDE, WITHIN, SignalResult, judge
from miles.compare.curves import RunCurves
from miles.compare.prompts import PromptDiff, prompt_diff
from miles.compare.rules import Rule
from miles.compare.text import terminal_safe

EXIT_WITHIN, EXIT_REGRESSION, EXIT_USAGE, EXIT_UNREADABLE = 0, 1, 2, 3
REGRESSION = "regression"


@dataclass(frozen=True)
class Comparison:
    run: RunCurves
    baselines: list[RunCurves]
    signals: list[SignalResult]
    prompts: PromptDiff
    notes: list[str] = field(default_factory=list)
    gate_timing: bool = False

    @property
    def failed(self) -> list[SignalResult]:
        """The signals that fail the comparison: learning ones outside or in error, and timing ones only
        when they are gated."""
        return [s for s in self.signals if s.verdict in (OUTSIDE, ERROR) and (self.gate_timing or not s.timing)]

    @property
    def slower(self) -> list[SignalResult]:
        """Timing signals outside or in error (reported; failing only with gate_timing)."""
        return [s for s in self.signals if s.timing and s.verdict in (OUTSIDE, ERROR)]

    @property
    def verdict(self) -> str:
        return REGRESSION if self.failed else WITHIN

    def tags(self) -> dict[str, str]:
        """What a tracker run is tagged with: the baselines, the verdict, and each failed signal's first step."""
        tags = {"miles.compare": self.verdict, "miles.compare.baselines": ",".join(b.name for b in self.baselines)}
        for s in self.failed + [s for s in self.slower if s not in self.failed]:
            tags[f"miles.compare.{s.key}"] = f"{s.verdict} at {s.axis} {s.first.step}" if s.first else s.verdict
        return tags

    def as_json(self) -> dict:
        """Strict JSON (no NaN or Infinity anywhere: a non-finite figure is null, its point's `why` names it)."""
        return {"run": {"name": self.run.name, "path": self.run.source, "reached": self.run.reached},
                "baselines": [{"name": b.name, "path": b.source, "reached": b.reached} for b in self.baselines],
                "verdict": self.verdict, "failed": [s.key for s in self.failed],
                "slower": [s.key for s in self.slower], "gate_timing": self.gate_timing, "notes": self.notes,
                "signals": [s.as_json() for s in self.signals], "prompts": self.prompts.as_json()}


def compare(run: RunCurves, baselines: list[RunCurves], rules: tuple[Rule, ...], *, finished: bool = False,
            top_prompts: int = 10, gate_timing: bool = False) -> Comparison:
    notes = []
    if not run.reached:  # not a single journal line: nothing is "still going", every value is missing
        finished = True
        notes.append(f"{run.name} has no journal lines")
    for axis, step in sorted(run.reached.items()):
        theirs = max((b.reached.get(axis, -1) for b in baselines), default=-1)
        if not finished and theirs > step:
            notes.append(f"{run.name} reached {axis} {step}, the baselines {theirs}: later steps not judged")
        elif 0 <= theirs < step:
            notes.append(f"the baselines reached {axis} {theirs}, {run.name} {step}: its later steps have no "
                         f"baseline (not judged)")
    stale = [r.name for r in (run, *baselines) if r.stale]
    if stale and len(stale) <= len(baselines):  # async against sync (or the other way round)
        notes.append(f"{', '.join(stale)} trained on stale rollouts (async, "
                     f"--max-weight-staleness), the others did not: "
                     f"train/train_rollout_logprob_abs_diff is judged on fresh rollouts only")
    if len(baselines) == 1:
        notes.append("1 baseline: no spread between runs to measure; each corridor is the rule's tolerance "
                     "widened by the baseline's own step-to-step jitter (add baselines for a better noise estimate)")
    return Comparison(run, baselines, judge(run, baselines, rules, finished=finished),
                      prompt_diff(run, baselines, top_prompts), notes, gate_timing)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _rows(signals: list[SignalResult], width: int) -> list[str]:
    lines = []
    for s in signals:
        p = s.first
        label = s.verdict.upper() if s.verdict in (OUTSIDE, ERROR) else s.verdict
        judged = s.judged()
        shown = p or (judged[-1] if judged else (s.points[-1] if s.points else None))  # within: the last judged
        why = p.why if p else s.note
        if p and s.note:
            why += f" ({s.note})"
        lines.append(f"{s.key:<{width}}  {label:<11}  {shown.step if shown else '-':>5}  "
                     f"{_num(shown.value if shown else None):>9}  {_num(shown.mean if shown else None):>9}  "
                     f"{_num(shown.bound if shown else None):>9}  "
                     f"{sum(q.verdict == OUTSIDE for q in s.points):>3}/{len(s.points):<3}  {why}")
    return lines


def format_table(c: Comparison, title: str | None = None, prompts: bool = True) -> str:
    """The terminal table. Keys, run names and paths come from files anyone may have written: control
    characters in them are shown escaped, never sent to the terminal (probe N33)."""
    names = ", ".join(b.name for b in c.baselines)
    lines = [title or f"compare {c.run.source} with {len(c.baselines)} baseline(s): {names}"]
    lines += [f"note: {n}" for n in c.notes]
    width = max([len(s.key) for s in c.signals] + [6])
    header = (f"{'signal':<{width}}  {'verdict':<11}  {'step':>5}  {'value':>9}  {'mean':>9}  {'bound':>9}  "
              f"{'outside':>7}  why")
    learning = [s for s in c.signals if not s.timing]
    timing = [s for s in c.signals if s.timing]
    lines += [header, *_rows(learning, width)]
    if timing:
        gated = "gated: --gate-timing" if c.gate_timing else "not gated: a busier machine is not a broken run; " \
                                                              "--gate-timing fails on them"
        lines += [f"timing ({gated}):", *_rows(timing, width)]
    if prompts:
        lines += format_prompts(c.prompts)
    if c.slower and not c.gate_timing:
        lines.append(f"slower (not gated): {', '.join(s.key for s in c.slower)}")
    failed = [s.key for s in c.failed]
    lines.append(f"regressions: {', '.join(failed)}" if failed else "regressions: none (every learning signal within)")
    return "\n".join(terminal_safe(line) for line in lines)


def format_prompts(diff: PromptDiff) -> list[str]:
    if diff.eval_step is None or not diff.changes:
        return [f"eval prompts: {diff.note or 'no change'}"]
    out = [f"eval prompts whose pass rate changed most (eval step {diff.eval_step}, {diff.shared} shared):",
           f"  {'set':<12} {'run':>5} {'base':>5} {'delta':>6}  prompt"]
    for ch in diff.changes:
        out.append(f"  {ch.eval_set:<12} {ch.run:>5.2f} {ch.baselines:>5.2f} {ch.delta:>+6.2f}  {ch.prompt!r:.60}")
    return out


def format_markdown(c: Comparison) -> str:
    """The comparison as a Markdown artifact (the flow's `grpo-compare`)."""
    lines = [f"**{c.run.name}** vs {', '.join(b.name for b in c.baselines)}: **{c.verdict}**", ""]
    lines += [f"- {n}" for n in c.notes]
    if c.slower:
        lines.append(f"- slower{'' if c.gate_timing else ' (not gated)'}: {', '.join(s.key for s in c.slower)}")
    lines += ["", "| signal | verdict | step | value | baselines' mean | bound | why |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in c.signals:
        p = s.first or (s.points[-1] if s.points else None)
        lines.append(f"| `{s.key}` | {s.verdict} | {p.step if p else '-'} | {_num(p.value if p else None)} | "
                     f"{_num(p.mean if p else None)} | {_num(p.bound if p else None)} | "
                     f"{s.first.why if s.first else s.note} |")
    if c.prompts.changes:
        lines += ["", f"Eval prompts whose pass rate changed most (eval step {c.prompts.eval_step}):", "",
                  "| set | prompt | run | baselines | delta |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {ch.eval_set} | `{str(ch.prompt)[:60].replace('|', '/')}` | {ch.run:.2f} | {ch.baselines:.2f} | {ch.delta:+.2f} |"
                  for ch in c.prompts.changes]
    return "\n".join(terminal_safe(line) for line in lines)
