"""Review N28: `perf/eval_time` exists only where a run evaluated; a run that evaluated at other
rollouts than its baseline was judged `ERROR ... missing` at the baseline's eval steps and listed as
"slower". It lies on the eval axis now: each of the run's own evals against the baselines' curves
there."""
from __future__ import annotations

from miles.compare.comparison import compare
from miles.compare.corridor import ERROR, WITHIN
from miles.compare.curves import RunCurves, curves_of, stale_steps
from miles.compare.rules import DEFAULT_RULES
from miles.record.journal import JournalLine


def run(name: str, eval_at: set[int], eval_time: float = 0.5) -> RunCurves:
    lines = [JournalLine(-1, 0.0, {"eval/step": 0.0, "eval/arithmetic-pass_at_1": 0.3})]
    for r in range(12):
        metrics = {"rollout/step": float(r), "rollout/raw_reward": 0.3 + 0.02 * r,
                   "perf/step_time": 1.0}
        if r in eval_at:
            metrics |= {"eval/step": float(r), "eval/arithmetic-pass_at_1": 0.3 + 0.02 * r,
                        "perf/eval_time": eval_time}
        lines.append(JournalLine(r, 1.0 + r, metrics))
    curves, reached = curves_of(lines)
    return RunCurves(name, name, curves, reached, {}, stale_steps(lines))


def eval_time(result) -> object:
    return next(s for s in result.signals if s.key == "perf/eval_time")


def test_evals_at_other_rollouts_are_not_missing_eval_times():
    result = compare(run("main", {5, 11}), [run("seed2", {3, 11})], DEFAULT_RULES, finished=True)
    signal = eval_time(result)
    assert signal.verdict != ERROR, [(p.step, p.why) for p in signal.points]
    assert signal.axis == "eval/step"
    assert "perf/eval_time" not in [s.key for s in result.slower]


def test_an_eval_time_far_slower_at_a_shared_eval_step_is_still_slower():
    result = compare(run("main", {5, 11}, eval_time=9.0), [run("seed2", {5, 11})], DEFAULT_RULES,
                     finished=True)
    assert "perf/eval_time" in [s.key for s in result.slower]
    assert eval_time(compare(run("main", {5, 11}), [run("seed2", {5, 11})], DEFAULT_RULES,
                             finished=True)).verdict == WITHIN
