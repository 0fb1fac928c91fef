"""The health watch in Prefect: an event per iteration (so a stall can be caught) and one per red flag.

Emitted from inside the training task, so Prefect relates them to the task and flow run; the
automations in `flows/automations.py` react to them.
"""
from __future__ import annotations

from pathlib import Path

from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.events import emit_event
from prefect.runtime import flow_run

from miles.health import HealthReport, Verdict

ITERATION_EVENT = "miles.training.iteration"
FINISHED_EVENT = "miles.training.finished"
RED_FLAG_EVENT = "miles.health.red-flag"
STALENESS_EVENT = "miles.staleness.tightened"  # --staleness-guard lowered --max-weight-staleness
ENGINE_EVENT = "miles.engines."  # + the supervisor's state change: engine_down, engine_restart, router_down, ...


def run_resource(run_name: str) -> dict[str, str]:
    """The flow run is the resource of the iteration events: a stall automation acts on it."""
    return {"prefect.resource.id": f"prefect.flow-run.{flow_run.get_id()}", "prefect.resource.name": run_name}


# What an automation may react to besides the red flags: the row's headline figures, and any held-out eval.
EVENT_METRICS = ("train/loss", "rollout/raw_reward", "train/grad_norm", "perf/step_time")


def event_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The iteration's headline metrics (EVENT_METRICS and every eval/ figure but the step) present in `metrics`."""
    return {k: float(v) for k, v in sorted(metrics.items())
            if (k in EVENT_METRICS or (k.startswith("eval/") and k != "eval/step")) and isinstance(v, (int, float))}


def emit_iteration(run_name: str, rollout_id: int, num_rollout: int, report: HealthReport,
                   metrics: dict[str, float] | None = None) -> None:
    payload = {"rollout_id": rollout_id, "num_rollout": num_rollout, "red_flags": sorted({v.signal for v in report.red})}
    if metrics:  # an automation can react to reward or loss (first-hour N18), not only to red flags
        payload["metrics"] = event_metrics(metrics)
    emit_event(ITERATION_EVENT, resource=run_resource(run_name), payload=payload)


def emit_finished(run_name: str, rollout_id: int) -> None:
    """Closes the stall watch's window: no iteration event is expected after this."""
    emit_event(FINISHED_EVENT, resource=run_resource(run_name), payload={"rollout_id": rollout_id})


def emit_red_flag(run_name: str, verdict: Verdict) -> None:
    """`miles.health.red-flag`: the signal and severity as resource labels, the values in the payload."""
    emit_event(RED_FLAG_EVENT,
               resource={"prefect.resource.id": f"miles.run.{run_name}", "prefect.resource.name": run_name,
                         "miles.signal": verdict.signal, "miles.severity": verdict.severity},
               payload=verdict.as_json())


def emit_engine_state(run_name: str, change: str, fields: dict) -> None:
    """One engine or router state change of the supervisor (--use-fault-tolerance), e.g.
    `miles.engines.engine_down` with the engine's index as a resource label and the reason in the payload."""
    resource = {"prefect.resource.id": f"miles.run.{run_name}", "prefect.resource.name": run_name}
    if "engine" in fields:
        resource["miles.engine"] = str(fields["engine"])
    emit_event(ENGINE_EVENT + change, resource=resource, payload={k: v for k, v in fields.items()})


def emit_staleness_tightened(run_name: str, rollout_id: int, metrics: dict[str, float]) -> None:
    """`miles.staleness.tightened`: the guard's new bound and the signals that crossed theirs."""
    reasons = sorted(k.rsplit("reason_", 1)[1] for k in metrics if k.startswith("rollout/staleness_guard/reason_"))
    emit_event(STALENESS_EVENT, resource={"prefect.resource.id": f"miles.run.{run_name}",
                                          "prefect.resource.name": run_name},
               payload={"rollout_id": rollout_id, "max_weight_staleness": int(metrics["rollout/max_weight_staleness"]),
                        "reasons": reasons, **{f"train/{r}": metrics.get(f"train/{r}") for r in reasons}})


def emit_health(run_name: str, rollout_id: int, num_rollout: int, report: HealthReport,
                metrics: dict[str, float] | None = None) -> None:
    """The flags that start at this rollout, then the iteration event (with the headline `metrics`)."""
    for verdict in report.started:
        emit_red_flag(run_name, verdict)
    emit_iteration(run_name, rollout_id, num_rollout, report, metrics)


def diagnose_artifacts(run_dir: str, verdict: Verdict, diagnosis) -> None:
    """The diagnose bundle of a live red flag as Prefect artifacts: a link to the bundle, and its verdict."""
    if diagnosis is None:
        return
    bundle = Path(diagnosis.path)
    create_link_artifact(key="grpo-diagnose-bundle", link=bundle.resolve().as_uri(), link_text=bundle.name,
                         description=f"`miles diagnose` bundle of {run_dir}, written for the live red flag "
                                     f"{verdict.signal} at rollout {verdict.rollout_id}")
    lines = diagnosis.text.splitlines()
    create_markdown_artifact(key="grpo-diagnose", description=f"why {run_dir} is stuck: the diagnose verdict",
                             markdown="\n".join([f"**{lines[0]}**", "", *lines[2:], "", f"Bundle: `{bundle}`"]))
