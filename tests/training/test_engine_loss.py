"""A run whose engines are gone ends at once with one line, exit 1 and a checkpoint of what it trained
(`miles.run.engine_loss`): supervised, once the supervisor gave up (N39); unsupervised, once an engine of
two died (F2). Real engines, router and Ray, through `python -m miles.train`'s `main`."""
from __future__ import annotations

import time

import pytest

from miles.record.journal import read_journal
from miles.run import checkpoint
from tests.support.flags import SMALL

NUM_ROLLOUT = 3


def run_main(tmp_path, capsys, *flags):
    from miles.train import main

    run_dir = tmp_path / "run"
    began = time.monotonic()
    rc = main([*SMALL, "--num-rollout", str(NUM_ROLLOUT), "--eval-interval", "100", "--save-interval", "100",
               "--run-dir", str(run_dir), *flags])
    out = capsys.readouterr()
    return rc, out, run_dir, time.monotonic() - began


def trained_rollouts(run_dir) -> list[int]:
    return [ln.rollout_id for ln in read_journal(run_dir / "metrics.jsonl") if ln.rollout_id >= 0]


def test_a_silent_engine_is_named_with_the_rollout_and_the_flag():
    import socket

    from miles.run.engine_loss import silent_engines, unsupervised_loss, when

    with socket.socket() as closed:  # a port nothing listens on: a dead engine refuses the connection
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    assert silent_engines([url], timeout=1.0) == [0]
    line = unsupervised_loss([url], [0], when("update_weights", 2), ConnectionRefusedError("[Errno 111] refused"))
    assert line == (f"engine 0 ({url}) does not answer: lost in the weight push after rollout 2 "
                    "(ConnectionRefusedError: [Errno 111] refused); without --use-fault-tolerance a dead engine "
                    "ends the run; with it the engine is relaunched and the run goes on")
    assert when("rollout", 3) == "during rollout 3" and when("eval", None) == "in the eval before training"


@pytest.mark.slow
def test_a_supervised_run_whose_supervisor_gave_up_stops_at_once_with_a_checkpoint(tmp_path, capsys, ray_cluster):
    # the only engine, no restart allowed: killed as rollout 1 starts, it is left down at once
    rc, out, run_dir, seconds = run_main(
        tmp_path, capsys, "--use-fault-tolerance", "--engine-max-restarts", "0", "--engine-health-interval", "0.5",
        "--engine-wait-timeout", "600", "--inject-fault", "kill-engine@1")
    assert rc == 1 and "Traceback" not in out.err + out.out
    errors = [line for line in out.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "engine supervisor gave up during rollout 1" in errors[0], out.err
    assert "engine 0 used its 0 restarts (--engine-max-restarts)" in errors[0]
    assert seconds < 600  # the run did not wait out --engine-wait-timeout
    assert trained_rollouts(run_dir) == [0]
    scan = checkpoint.latest_good(run_dir / "checkpoints")
    assert scan.path is not None and scan.state.rollout_id == 0  # rollout 0 trained and kept; 1 never trained
    # the data cursor is after rollout 0's 4 prompts, not rollout 1's: a resume redoes rollout 1 with its prompts
    assert scan.state.data_cursor == {"epoch": 0, "offset": 4}


@pytest.mark.slow
def test_a_plain_run_that_loses_one_of_two_engines_names_it_and_the_flag(tmp_path, capsys, ray_cluster):
    rc, out, run_dir, _ = run_main(tmp_path, capsys, "--rollout-num-engines", "2",
                                   "--inject-fault", "kill-engine:1@1")
    assert rc == 1 and "Traceback" not in out.err + out.out
    errors = [line for line in out.err.splitlines() if "error:" in line]
    assert len(errors) == 1, out.err
    assert "engine 1 (http://127.0.0.1:" in errors[0] and "rollout 1" in errors[0]
    assert "--use-fault-tolerance" in errors[0]
    # the router failed rollout 1 over to engine 0; the weight push then met the dead engine: rollout 1 was
    # trained but never journaled, so no checkpoint holds it (checkpoints and journal agree)
    scan = checkpoint.latest_good(run_dir / "checkpoints")
    assert 0 in trained_rollouts(run_dir) and 1 not in trained_rollouts(run_dir)
    assert scan.path is None or scan.state.rollout_id == 0
