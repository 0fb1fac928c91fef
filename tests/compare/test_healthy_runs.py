"""Issue 38 and first-hour N1-N3: `miles compare` must not call healthy runs regressions.

- False alarms over seeds: real short runs of the same config and different seeds (`recorded/seeds/`, the
  CI gate's flags, seeds 1-4, and `recorded/default-1`, seed 1234) compared pairwise (one baseline) and each
  against the others: no learning regression, while the two broken learners recorded with the same flags
  still fail against every single healthy seed. Before, 6 of 6 pairs of three of these runs failed
  (grad_norm 1.155 above 0.849 at one step, n=1; the issue's case).
- Eval steps that do not line up are compared on the baselines' interpolated eval curve, not "missing".
- Steps no baseline covers are "no baseline", said in the row, not "within".
- The prompt diff never diffs the base evals (sampling noise alone).
"""
from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
from compare_helpers import compare_json, miles, signal

from miles.compare.comparison import compare
from miles.compare.curves import read_run
from miles.compare.rules import DEFAULT_RULES

RECORDED = Path(__file__).parent / "recorded"
HEALTHY = sorted((RECORDED / "seeds").iterdir()) + [RECORDED / "default-1"]
BROKEN = [RECORDED / "lr-zero", RECORDED / "sign-flip"]


def learning_failures(run: Path, baselines: list[Path]) -> list[tuple[str, int, str]]:
    result = compare(read_run(run), [read_run(b) for b in baselines], DEFAULT_RULES)
    return [(s.key, s.first.step, s.first.why) for s in result.failed]


def test_the_recorded_seeds_are_different_runs():
    """Else the test below would prove nothing: the seeds' curves differ step by step."""
    assert len(HEALTHY) >= 5
    rewards = [tuple(sorted(read_run(r).curves["rollout/raw_reward"].items())) for r in HEALTHY]
    assert len(set(rewards)) == len(HEALTHY)


@pytest.mark.parametrize("run,baseline", list(itertools.permutations(HEALTHY, 2)),
                         ids=[f"{a.name}-vs-{b.name}" for a, b in itertools.permutations(HEALTHY, 2)])
def test_no_false_alarm_between_two_healthy_seeds(run, baseline):
    assert learning_failures(run, [baseline]) == []


@pytest.mark.parametrize("run", HEALTHY, ids=[r.name for r in HEALTHY])
def test_no_false_alarm_against_the_other_healthy_seeds(run):
    assert learning_failures(run, [b for b in HEALTHY if b != run]) == []


@pytest.mark.parametrize("broken", BROKEN, ids=[b.name for b in BROKEN])
@pytest.mark.parametrize("baseline", HEALTHY, ids=[b.name for b in HEALTHY])
def test_a_broken_learner_still_fails_against_each_healthy_seed(broken, baseline):
    failed = {key for key, _, _ in learning_failures(broken, [baseline])}
    assert {"rollout/raw_reward", "eval/arithmetic-pass_at_1"} & failed, failed


def test_a_single_step_excursion_is_noted_not_failed():
    """seed 2 against seed 1: grad_norm leaves the one-baseline corridor at one step only (the issue's case);
    the verdict is within, the row says why, and the note names the n=1 corridor."""
    seed1, seed2 = RECORDED / "seeds" / "seed-1", RECORDED / "seeds" / "seed-2"
    code, report = compare_json(seed2, seed1)
    assert code == 0 and report["failed"] == []
    grad = signal(report, "train/grad_norm")
    assert grad["verdict"] == "within" and grad["steps_outside"] >= 1 and grad["sustain"] == 3
    assert "never 3 of 5 steps nor past 3 times the tolerance: noise" in grad["note"]
    assert any(n.startswith("1 baseline: no spread between runs") for n in report["notes"])
    table = miles("compare", seed2, seed1).stdout
    row = next(line for line in table.splitlines() if line.startswith("train/grad_norm "))
    assert row.split()[1] == "within" and "noise" in row


def shift_evals(run: Path, moves: dict[int, int]) -> None:
    """Move the eval of rollout a to rollout b (its eval/step with it), as a run with another --eval-interval."""
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    by_id = {r["rollout_id"]: r for r in rows}
    for a, b in moves.items():
        evals = {k: v for k, v in by_id[a].items() if k.startswith("eval/")}
        for k in evals:
            del by_id[a][k]
        by_id[b].update({**evals, "eval/step": float(b)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_eval_steps_that_do_not_line_up_are_interpolated_not_missing(tmp_path):
    """N1: a run with evals at 3 and 7 against a baseline with evals at 2 and 6 was an ERROR "missing" at 2
    and 6. Now the run's eval at 3 is judged against the baseline's curve between 2 and 6; 7 lies past the
    baseline's last eval (no extrapolation): no baseline."""
    base = shutil.copytree(RECORDED / "default-1", tmp_path / "base")
    shift_evals(base, {3: 2, 7: 6})
    code, report = compare_json(RECORDED / "default-1", base)
    assert code == 0, report["failed"]
    ev = signal(report, "eval/arithmetic-pass_at_1")
    points = {p["step"]: p for p in ev["points"]}
    assert sorted(points) == [0, 3, 7] and ev["verdict"] == "within"
    rows = {r["rollout_id"]: r for r in map(json.loads, (base / "metrics.jsonl").read_text().splitlines())}
    b2, b6 = rows[2]["eval/arithmetic-pass_at_1"], rows[6]["eval/arithmetic-pass_at_1"]  # the moved evals
    assert points[3]["mean"] == pytest.approx(b2 + (b6 - b2) / 4) and points[3]["verdict"] == "within"
    assert points[7]["verdict"] == "no baseline" and points[7]["mean"] is None


def test_steps_no_baseline_covers_are_said(tmp_path):
    """N2: a run longer than its baseline showed "within" at its last step, where no baseline was."""
    base = shutil.copytree(RECORDED / "default-1", tmp_path / "base")
    lines = (base / "metrics.jsonl").read_text().splitlines(keepends=True)
    (base / "metrics.jsonl").write_text("".join(lines[:5]))  # the base eval and rollouts 0-3
    code, report = compare_json(RECORDED / "default-1", base)
    reward = signal(report, "rollout/raw_reward")
    assert [p["verdict"] for p in reward["points"][4:]] == ["no baseline"] * 4
    assert reward["note"] == "steps 0-3 judged; 4 with no baseline (4-7)" and reward["steps_judged"] == 4
    assert any("its later steps have no baseline" in n for n in report["notes"])
    table = miles("compare", RECORDED / "default-1", base).stdout
    row = next(line for line in table.splitlines() if line.startswith("rollout/raw_reward "))
    assert row.split()[1:3] == ["within", "3"] and "4 with no baseline (4-7)" in row


def test_the_prompt_diff_skips_the_base_eval(tmp_path):
    """N3: two runs sharing only the base eval were diffed there: sampling noise shown as changes."""
    runs = []
    for name in ("a", "b"):
        run = shutil.copytree(RECORDED / "default-1", tmp_path / name)
        for f in (run / "samples" / "eval").glob("rollout_*.jsonl"):
            f.unlink()
        runs.append(run)
    code, report = compare_json(*runs)
    assert report["prompts"]["eval_step"] is None and report["prompts"]["changes"] == []
    assert report["prompts"]["note"].startswith("no shared eval step after training")
