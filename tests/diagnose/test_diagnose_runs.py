"""Real runs made to hang (a reward that sleeps, an engine stopped with SIGSTOP) and to die: the bundle
holds the stacks of the right processes, the verdict names the phase and the process, the live stall
flag fires once, --on-red-flag stop ends a hung run, and no secret is anywhere in a bundle."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.diagnose.hang_rewards import HANG_REWARD
from tests.diagnose.hanging_runs import ROOT, SECRET_ENV_VALUE, SECRET_TOKEN, START_S
from tests.support.runs import bundles, extract, rollouts_done
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow
WARM = 3  # rollouts ended before the hang: the median of a phase needs 3


def diagnose_cli(run_dir, *extra) -> dict:
    done = subprocess.run([sys.executable, "-m", "flows.cli", "diagnose", str(run_dir), "--json", *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def assert_no_secret(root):
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET_TOKEN.encode() not in data and SECRET_ENV_VALUE.encode() not in data, path


def test_a_reward_that_hangs_is_flagged_live_once_with_one_bundle(hang_run, tmp_path):
    run = hang_run
    run.wait_for(lambda: rollouts_done(run.run_dir) >= WARM, START_S, f"{WARM} rollouts")
    run.hang_file.touch()  # the next rollout's reward waits while it exists
    (bundle,) = run.wait_for(lambda: bundles(run.run_dir), 120, "the stall bundle")
    hung = json.loads((run.run_dir / "health.jsonl").read_text().splitlines()[-1])
    assert hung["signal"] == "stall" and hung["live"] is True and "rollout" in hung["message"]

    run.hang_file.unlink()  # the run goes on; the watch does not fire a second time
    run.wait_for(lambda: rollouts_done(run.run_dir) >= hung["rollout_id"] + 3, 180, "rollouts after the hang")
    assert bundles(run.run_dir) == [bundle]
    live = [json.loads(ln) for ln in (run.run_dir / "health.jsonl").read_text().splitlines() if '"live"' in ln]
    assert len(live) == 1

    root = extract(bundle, tmp_path / "x")
    verdict = json.loads((root / "verdict.json").read_text())
    assert verdict["status"] == "stalled" and verdict["phase"]["name"] == "rollout"
    pid = run.processes()["trainer"]
    assert f"stalled in `rollout` of rollout {hung['rollout_id']}" in verdict["headline"]
    assert re.search(rf"trainer \(pid {pid}\) (waits|busy) in reward_waits_while_file_exists", verdict["headline"])
    assert (root / "VERDICT.txt").read_text().startswith("VERDICT (stalled): stalled in `rollout`")
    names = {p.name.rsplit("-", 1)[0] for p in (root / "stacks").glob("*.txt")}
    assert {"trainer", "rank0", "engine0", "router"} <= names
    assert "reward_waits_while_file_exists" in (root / "stacks" / f"trainer-{pid}.txt").read_text()
    assert (root / "ray" / "status.txt").read_text().strip() and (root / "ray" / "actors.json").exists()
    for name in ("timeline.jsonl", "timeline-open.jsonl", "health.jsonl", "tracking/config.yaml"):
        assert (root / "run" / name).is_file(), name
    assert_no_secret(root)
    assert f"[health] diagnose bundle {bundle}" in run.output()
    # held again, alive mid-rollout, until the dead-run test kills it: unheld, its 40 rollouts ended before that
    # test on a busy machine, and a run that closed cleanly is "finished", not dead
    run.hang_file.touch()


def test_diagnose_from_an_ordinary_shell_reads_the_live_runs_ray_state(hang_run, tmp_path):
    """First-hour N4 / probe N23: a live plain run's local Ray uses token auth. From a shell with no Ray
    setting, diagnose printed ~20 lines of Ray's "InvalidAuthToken" and packed no Ray state; it now finds
    the run's token and keeps Ray's output out of the terminal. (The hang run of the first test, held live
    in its reward as that test left it, before the dead-run test kills it.)"""
    run = hang_run
    run.wait_for(lambda: rollouts_done(run.run_dir) >= 2, START_S, "2 rollouts")
    waiting = run.hang_file.with_name(run.hang_file.name + ".waiting")
    # held live in its reward while diagnose looks (the first test left the file, so the run may be held
    # already: `.waiting` exists exactly while a reward waits). Letting it go and holding it anew raced: a
    # reward already waiting polls every 0.2 s and missed a file removed and made again at once, so its
    # `.waiting`, removed by the test, never came back (a fast run reached its reward first).
    run.hang_file.touch()
    run.wait_for(waiting.exists, 120, "the rollout held")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    done = subprocess.run([sys.executable, "-m", "flows.cli", "diagnose", str(run.run_dir), "--json", "--out",
                           str(tmp_path / "live.tar.gz")], cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gcs_client" not in done.stdout + done.stderr and "InvalidAuthToken" not in done.stdout + done.stderr
    verdict = json.loads(done.stdout.splitlines()[-1])["verdict"]
    assert verdict["status"] in ("running", "stalled")
    notes = "\n".join(verdict["details"])
    assert "Ray state" not in notes and "cannot connect" not in notes and "not reachable" not in notes, notes
    root = extract(tmp_path / "live.tar.gz", tmp_path / "x")
    actors = json.loads((root / "ray" / "actors.json").read_text())
    assert isinstance(actors, list) and actors, actors  # the run's rank (and service) actors
    assert "Unauthenticated" not in (root / "ray" / "status.txt").read_text()


def test_a_stopped_engine_is_named_and_on_red_flag_stop_ends_the_hung_run(start_run, tmp_path):
    run = start_run("--on-red-flag", "stop")
    run.wait_for(lambda: rollouts_done(run.run_dir) >= WARM, START_S, f"{WARM} rollouts")
    engine = run.processes()["engine0"]
    run.sigstop(engine)
    code = wait_for(lambda: run.proc.poll() is not None and str(run.proc.returncode), 180, "the run to stop")
    assert code == "1", run.output()[-3000:]
    assert "stopped by --on-red-flag stop: stall" in run.output()
    (bundle,) = bundles(run.run_dir)
    root = extract(bundle, tmp_path / "x")
    verdict = json.loads((root / "verdict.json").read_text())
    assert verdict["phase"]["name"] in ("rollout", "update_weights"), verdict
    assert f"engine0 (pid {engine}) is stopped (SIGSTOP)" in verdict["headline"]
    assert "engine 0" in verdict["headline"] and "not answering /health" in verdict["headline"]
    engine_stack = (root / "stacks" / f"engine0-{engine}.txt").read_text()
    assert "Thread" in engine_stack  # read without pausing it: py-spy --nonblocking


def test_a_dead_run_gets_a_verdict_and_a_bundle(hang_run, tmp_path):
    # the hang run of the first test (it went on after its hang), killed here: one run for both tests
    run = hang_run
    run.hang_file.touch()  # held (the first test left it so): killed mid-rollout, never after its last
    run.wait_for(lambda: rollouts_done(run.run_dir) >= 2, START_S, "2 rollouts")
    trainer = run.processes()["trainer"]
    os.killpg(run.proc.pid, signal.SIGKILL)
    run.proc.wait()
    wait_for(lambda: not os.path.exists(f"/proc/{trainer}"), 30, "the trainer to be gone")
    answer = diagnose_cli(run.run_dir, "--out", str(tmp_path / "dead.tar.gz"))
    verdict = answer["verdict"]
    assert verdict["status"] == "dead" and answer["bundle"] == str(tmp_path / "dead.tar.gz")
    assert "the trainer died after rollout" in verdict["headline"] and "without closing" in verdict["headline"]
    root = extract(tmp_path / "dead.tar.gz", tmp_path / "x")
    assert (root / "VERDICT.txt").read_text().startswith("VERDICT (dead): the trainer died after rollout")
    assert any(p["name"] == "trainer" and p["state"] == "gone" for p in verdict["processes"])


def test_a_rank_stopped_in_training_leaves_the_other_blocked_in_a_collective(start_run, tmp_path):
    run = start_run("--actor-num-gpus-per-node", "2", "--custom-rm-path", HANG_REWARD)
    run.wait_for(lambda: rollouts_done(run.run_dir) >= WARM, 2 * START_S, f"{WARM} rollouts")  # two ranks start slower
    rank1 = run.processes()["rank1"]
    # stop rank 1 while both ranks are idle (the rollout is held in its reward for a moment, far shorter
    # than the stall threshold): the next train phase starts on rank 0 alone, which waits in its first
    # collective for rank 1. Stopped at a random moment, rank 0 may instead be idle between two calls.
    waiting = run.hang_file.with_name(run.hang_file.name + ".waiting")
    run.hang_file.touch()
    run.wait_for(waiting.exists, 120, "the rollout held in its reward")
    run.sigstop(rank1)
    run.hang_file.unlink()
    (bundle,) = run.wait_for(lambda: bundles(run.run_dir), 180, "the stall bundle")
    root = extract(bundle, tmp_path / "x")
    verdict = json.loads((root / "verdict.json").read_text())
    assert verdict["status"] == "stalled" and verdict["phase"]["name"] in ("train", "update_weights"), verdict
    assert f"rank1 (pid {rank1}) is stopped (SIGSTOP)" in verdict["headline"]
    rank0 = run.processes()["rank0"]
    stack = (root / "stacks" / f"rank0-{rank0}.txt").read_text()
    assert "torch/distributed/" in stack, stack[:3000]  # blocked in a collective of the process group
    assert re.search(rf"rank0 \(pid {rank0}\) (waits|busy) in \w*(all_reduce|reduce_scatter|all_gather|broadcast|barrier)",
                     verdict["headline"]), verdict["headline"]
    # issue 54: the ranks' records (RUN_DIR/collectives) name the rank rank 0 waits for
    assert any("rank 1 (node0/dp1/pp0/tp0)" in line for line in verdict["ranks"]), verdict["ranks"]
