"""The Prefect automations `make deploy` creates: react to the health watch's events.

- `miles-red-flag-cancel`: a red (not warning) `miles.health.red-flag` cancels its flow run.
- `miles-stalled-run`: no `miles.training.iteration` within `stall_seconds` after the previous
  one (and no `miles.training.finished`) cancels that flow run: it hangs.
"""
from __future__ import annotations

from datetime import timedelta

from prefect.events.actions import CancelFlowRun
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

from tasks.health import FINISHED_EVENT, ITERATION_EVENT, RED_FLAG_EVENT

RED_FLAG_AUTOMATION = "miles-red-flag-cancel"
STALL_AUTOMATION = "miles-stalled-run"
DEFAULT_STALL_SECONDS = 1800


def red_flag_automation() -> AutomationCore:
    return AutomationCore(
        name=RED_FLAG_AUTOMATION,
        description="Cancel a GRPO flow run when its health watch raises a red flag",
        trigger=EventTrigger(expect={RED_FLAG_EVENT}, match=ResourceSpecification({"miles.severity": "red"}),
                             posture=Posture.Reactive, threshold=1, within=timedelta(0)),
        actions=[CancelFlowRun()],
    )


def stall_automation(stall_seconds: int = DEFAULT_STALL_SECONDS) -> AutomationCore:
    return AutomationCore(
        name=STALL_AUTOMATION,
        description=f"Cancel a GRPO flow run with no training iteration for {stall_seconds} s",
        trigger=EventTrigger(after={ITERATION_EVENT}, expect={ITERATION_EVENT, FINISHED_EVENT},
                             match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
                             for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
                             within=timedelta(seconds=stall_seconds)),
        actions=[CancelFlowRun()],
    )


def ensure_automations(stall_seconds: int = DEFAULT_STALL_SECONDS) -> list[str]:
    """Create both automations, replacing any of the same name (a changed definition takes effect)."""
    from prefect.client.orchestration import get_client

    made = []
    with get_client(sync_client=True) as client:
        for automation in (red_flag_automation(), stall_automation(stall_seconds)):
            for existing in client.read_automations_by_name(automation.name):
                client.delete_automation(existing.id)
            client.create_automation(automation)
            made.append(automation.name)
    return made
