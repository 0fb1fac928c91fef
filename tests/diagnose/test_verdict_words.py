"""The verdict's words for a run that ended (review N34): its status said once, and no router line for a
run that closed cleanly (its router went down with it; "not probed (run dead)" read as a fault)."""
from __future__ import annotations

from miles.config.health import HealthConfig
from miles.diagnose.run_state import RunState
from miles.diagnose.verdict import Findings, compose, verdict_text

NOT_PROBED = {"error": "not probed (run dead)"}  # what the bundle records when no run process is alive


def ended(last: int, closed: dict | None) -> dict:
    return compose(Findings(False, [], [], [], dict(NOT_PROBED), RunState(False, last, 6, closed)), HealthConfig())


def test_a_finished_run_says_finished_once_and_no_router_line():
    text = verdict_text(ended(5, {"final": True}))
    assert text.splitlines()[0] == "VERDICT (finished): all 6 rollouts (0..5), closed cleanly"
    assert "router" not in text


def test_a_stopped_run_has_no_router_line_and_a_dead_one_keeps_it():
    assert "router" not in verdict_text(ended(3, {"final": True}))
    dead = verdict_text(ended(3, None))
    assert dead.startswith("VERDICT (dead): the trainer died after rollout 3")
    assert "- router: not probed (run dead)" in dead.splitlines()
