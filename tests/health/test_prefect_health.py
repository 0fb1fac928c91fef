"""The health watch's Prefect side on a real server: the red-flag event is stored with its labels, payload
and flow run, and the project's automation cancels the flow run it came from."""
from __future__ import annotations

import time

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.runtime import flow_run

from flows.automations import RED_FLAG_AUTOMATION, STALL_AUTOMATION, ensure_automations
from miles.health import RED, HealthReport, Verdict
from miles.run.scorecard import red_flag_lines, red_flags_markdown
from tasks.health import ITERATION_EVENT, RED_FLAG_EVENT, emit_health
from tests.support.prefect import read_events

VERDICT = Verdict(7, "grad_norm", RED, "at or above clip_grad=1 in 100% of the last 20 rollouts",
                  {"train/grad_norm": 3.5, "clip_share": 1.0})


@pytest.fixture
def automations(prefect_api):
    """The project's automations, removed afterwards: the session's server runs other tests' flows."""
    yield
    with get_client(sync_client=True) as client:
        for name in (RED_FLAG_AUTOMATION, STALL_AUTOMATION):
            for automation in client.read_automations_by_name(name):
                client.delete_automation(automation.id)


def test_red_flag_event_is_stored_and_the_automation_cancels_the_run(automations):
    assert ensure_automations(stall_seconds=3600) == [RED_FLAG_AUTOMATION, STALL_AUTOMATION]
    assert ensure_automations(stall_seconds=3600)  # again: replaced, not doubled
    with get_client(sync_client=True) as client:
        assert len(client.read_automations_by_name(RED_FLAG_AUTOMATION)) == 1
    seen: dict = {}

    @task
    def train_one_rollout() -> None:  # as the training task does after an iteration
        emit_health("health-run", 7, 10, HealthReport(7, [VERDICT], [VERDICT], {"health/grad_norm": 1.0}),
                    {"train/loss": 0.25, "rollout/raw_reward": 0.5, "eval/arithmetic-pass_at_1": 0.75, "eval/step": 7.0,
                     "rollout/response_len": 9.0})

    @flow
    def watched_run() -> None:
        seen["id"] = flow_run.get_id()
        train_one_rollout()
        deadline = time.monotonic() + 120
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline:  # the automation, not this flow, changes the state
                state = client.read_flow_run(seen["id"]).state
                if state.type in (StateType.CANCELLING, StateType.CANCELLED):
                    seen["state"] = state.type
                    return
                time.sleep(0.5)

    watched_run(return_state=True)
    assert seen.get("state") in (StateType.CANCELLING, StateType.CANCELLED)

    [event] = read_events(RED_FLAG_EVENT, "health-run")
    assert event["resource"]["miles.signal"] == "grad_norm" and event["resource"]["miles.severity"] == "red"
    assert event["payload"]["values"] == {"train/grad_norm": 3.5, "clip_share": 1.0}
    assert event["payload"]["rollout_id"] == 7
    related = {r["prefect.resource.id"] for r in event["related"]}
    assert f"prefect.flow-run.{seen['id']}" in related
    iterations = read_events(ITERATION_EVENT, "health-run")
    # the headline figures ride along, so an automation can react to reward or loss (first-hour N18)
    assert iterations and iterations[0]["payload"] == {
        "rollout_id": 7, "num_rollout": 10, "red_flags": ["grad_norm"],
        "metrics": {"eval/arithmetic-pass_at_1": 0.75, "rollout/raw_reward": 0.5, "train/loss": 0.25}}


def test_health_artifact_lists_the_real_flags():
    flags = red_flag_lines([VERDICT, Verdict(8, "grad_norm", RED, "again", {}), Verdict(8, "pg_clipfrac", "warning", "x")])
    assert flags == ["`grad_norm` from rollout 7 (2 rollouts): at or above clip_grad=1 in 100% of the last 20 "
                     "rollouts (train/grad_norm=3.5, clip_share=1)"]
    text = red_flags_markdown(flags, ["pg_clipfrac"])
    assert "red flags" in text and "`pg_clipfrac`" in text
    assert red_flags_markdown([]) == "## Health\n\nNo red flags."
