"""Where a run and its baselines share an eval set: the prompts whose pass rate changed most.

Prompts are matched by eval set and prompt text, at the last eval step after training that every run
recorded per-prompt results for (`samples/eval/`); the baselines' pass rate of a prompt is their mean. The
base eval (step 0) is never diffed: the runs start from the same weights, so its differences are sampling
noise alone (first-hour N3).
"""
from __future__ import annotations

from dataclasses import dataclass

from miles.compare.curves import RunCurves


@dataclass(frozen=True)
class PromptChange:
    eval_set: str
    prompt: str
    label: object
    run: float  # the run's pass rate
    baselines: float  # the baselines' mean pass rate
    delta: float

    def as_json(self) -> dict:
        return {"eval_set": self.eval_set, "prompt": self.prompt, "label": self.label, "run": self.run,
                "baselines": self.baselines, "delta": self.delta}


@dataclass(frozen=True)
class PromptDiff:
    eval_step: int | None  # None: the runs share no per-prompt eval
    shared: int  # prompts every run evaluated at that step
    changes: list[PromptChange]  # largest |delta| first, at most `top`
    note: str = ""

    def as_json(self) -> dict:
        return {"eval_step": self.eval_step, "shared": self.shared, "note": self.note,
                "changes": [c.as_json() for c in self.changes]}


def _rates(rows: list[dict]) -> dict[tuple[str, str], tuple[float, object]]:
    return {(r["eval_set"], r["prompt"]): (float(r["pass_rate"]), r.get("label")) for r in rows}


def prompt_diff(run: RunCurves, baselines: list[RunCurves], top: int = 10) -> PromptDiff:
    runs = [run, *baselines]
    common = set(run.prompts)
    for b in baselines:
        common &= set(b.prompts)
    if not baselines or not common:
        missing = [r.name for r in runs if not r.prompts]
        note = (f"no per-prompt eval results in {', '.join(missing)}" if missing
                else "no eval step with per-prompt results in every run")
        return PromptDiff(None, 0, [], note if baselines else "no baselines")
    trained = {s for s in common if s > 0}
    if not trained:
        return PromptDiff(None, 0, [], "no shared eval step after training (the base evals differ by sampling "
                                       "alone: not diffed)")
    step = max(trained)
    mine = _rates(run.prompts[step])
    theirs = [_rates(b.prompts[step]) for b in baselines]
    shared = set(mine).intersection(*theirs)
    if not shared:
        return PromptDiff(step, 0, [], f"the runs share no eval prompt at eval step {step}")
    changes = []
    for key in shared:
        rate, label = mine[key]
        base = sum(t[key][0] for t in theirs) / len(theirs)
        changes.append(PromptChange(key[0], key[1], label, rate, base, rate - base))
    changes.sort(key=lambda c: (-abs(c.delta), c.eval_set, c.prompt))
    return PromptDiff(step, len(shared), changes[:top])
