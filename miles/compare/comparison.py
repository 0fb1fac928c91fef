"""A comparison as one object: the verdict per signal, the prompt diff, the terminal table and the JSON."""
from __future__ import annotations

from dataclasses import dataclass, field

from miles.compare.corridor import ERROR, OUTSIDE, WITHIN, SignalResult, judge
from miles.compare.curves import RunCurves
from miles.compare.prompts import PromptDiff, prompt_diff
from miles.compare.rules import Rule

EXIT_WITHIN, EXIT_REGRESSION, EXIT_USAGE, EXIT_UNREADABLE = 0, 1, 2, 3
REGRESSION = "regression"


@dataclass(frozen=True)
class Comparison:
    run: RunCurves
    baselines: list[RunCurves]
    signals: list[SignalResult]
    prompts: PromptDiff
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[SignalResult]:
        return [s for s in self.signals if s.verdict in (OUTSIDE, ERROR)]

    @property
    def verdict(self) -> str:
        return REGRESSION if self.failed else WITHIN

    def tags(self) -> dict[str, str]:
        """What a tracker run is tagged with: the baselines, the verdict, and each failed signal's first step."""
        tags = {"miles.compare": self.verdict, "miles.compare.baselines": ",".join(b.name for b in self.baselines)}
        for s in self.failed:
            tags[f"miles.compare.{s.key}"] = f"{s.verdict} at {s.axis} {s.first.step}" if s.first else s.verdict
        return tags

    def as_json(self) -> dict:
        return {"run": {"name": self.run.name, "path": self.run.source, "reached": self.run.reached},
                "baselines": [{"name": b.name, "path": b.source, "reached": b.reached} for b in self.baselines],
                "verdict": self.verdict, "failed": [s.key for s in self.failed], "notes": self.notes,
                "signals": [s.as_json() for s in self.signals], "prompts": self.prompts.as_json()}


def compare(run: RunCurves, baselines: list[RunCurves], rules: tuple[Rule, ...], *, finished: bool = False,
            top_prompts: int = 10) -> Comparison:
    notes = []
    if not run.reached:  # not a single journal line: nothing is "still going", every value is missing
        finished = True
        notes.append(f"{run.name} has no journal lines")
    for axis, step in sorted(run.reached.items()):
        theirs = max((b.reached.get(axis, -1) for b in baselines), default=-1)
        if not finished and theirs > step:
            notes.append(f"{run.name} reached {axis} {step}, the baselines {theirs}: later steps not judged")
    return Comparison(run, baselines, judge(run, baselines, rules, finished=finished),
                      prompt_diff(run, baselines, top_prompts), notes)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def format_table(c: Comparison, title: str | None = None, prompts: bool = True) -> str:
    names = ", ".join(b.name for b in c.baselines)
    lines = [title or f"compare {c.run.source} with {len(c.baselines)} baseline(s): {names}"]
    lines += [f"note: {n}" for n in c.notes]
    width = max([len(s.key) for s in c.signals] + [6])
    lines.append(f"{'signal':<{width}}  {'verdict':<11}  {'step':>5}  {'value':>9}  {'mean':>9}  {'bound':>9}  "
                 f"{'outside':>7}  why")
    for s in c.signals:
        p = s.first
        label = s.verdict.upper() if s.verdict in (OUTSIDE, ERROR) else s.verdict
        shown = p or (s.points[-1] if s.points else None)  # within: the last step judged
        lines.append(f"{s.key:<{width}}  {label:<11}  {shown.step if shown else '-':>5}  "
                     f"{_num(shown.value if shown else None):>9}  {_num(shown.mean if shown else None):>9}  "
                     f"{_num(shown.bound if shown else None):>9}  "
                     f"{sum(q.verdict == OUTSIDE for q in s.points):>3}/{len(s.points):<3}  {p.why if p else ''}")
    if prompts:
        lines += format_prompts(c.prompts)
    failed = [s.key for s in c.failed]
    lines.append(f"regressions: {', '.join(failed)}" if failed else "regressions: none (every signal within)")
    return "\n".join(lines)


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
    lines += ["", "| signal | verdict | step | value | baselines' mean | bound | why |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in c.signals:
        p = s.first or (s.points[-1] if s.points else None)
        lines.append(f"| `{s.key}` | {s.verdict} | {p.step if p else '-'} | {_num(p.value if p else None)} | "
                     f"{_num(p.mean if p else None)} | {_num(p.bound if p else None)} | {s.first.why if s.first else ''} |")
    if c.prompts.changes:
        lines += ["", f"Eval prompts whose pass rate changed most (eval step {c.prompts.eval_step}):", "",
                  "| set | prompt | run | baselines | delta |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {ch.eval_set} | `{str(ch.prompt)[:60].replace('|', '/')}` | {ch.run:.2f} | {ch.baselines:.2f} | {ch.delta:+.2f} |"
                  for ch in c.prompts.changes]
    return "\n".join(lines)
