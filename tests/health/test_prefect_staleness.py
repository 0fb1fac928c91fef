"""--staleness-guard in the Prefect flow: an iteration whose guard tightened the bound emits a
`miles.staleness.tightened` event (the new bound, the signals that crossed) from the training task,
related to its flow run; an iteration that did not tighten emits none."""
from __future__ import annotations

from prefect import flow, task
from prefect.runtime import flow_run

from miles.config import parse_config
from miles.health import HealthReport
from miles.run.observer import IterationResult
from tasks.health import STALENESS_EVENT
from tasks.training import HealthEvents
from tests.support.prefect import read_events

RUN = "staleness-guard-run"
TIGHTENED = {"rollout/staleness_guard/tightened": 1.0, "rollout/max_weight_staleness": 1.0,
             "rollout/staleness_guard/reason_mismatch_kl": 1.0, "train/mismatch_kl": 0.3}
CALM = {"rollout/staleness_guard/tightened": 0.0, "rollout/max_weight_staleness": 1.0, "train/mismatch_kl": 0.01}


def test_a_tightened_bound_is_a_prefect_event(prefect_api, tmp_path):
    config = parse_config(["--max-weight-staleness", "2", "--use-tis", "--staleness-guard", "--num-rollout", "10",
                           "--run-dir", str(tmp_path / RUN)])
    seen = {}

    @task
    def iterations() -> None:  # as the training task's loop observer sees two iterations
        events = HealthEvents(config)
        events.after_iteration(IterationResult(3, CALM, [], HealthReport(3, [], [], {})))
        events.after_iteration(IterationResult(4, TIGHTENED, [], HealthReport(4, [], [], {})))

    @flow
    def guarded_run() -> None:
        seen["id"] = flow_run.get_id()
        iterations()

    guarded_run()
    [event] = read_events(STALENESS_EVENT, RUN)
    assert event["payload"] == {"rollout_id": 4, "max_weight_staleness": 1, "reasons": ["mismatch_kl"],
                                "train/mismatch_kl": 0.3}
    assert f"prefect.flow-run.{seen['id']}" in {r["prefect.resource.id"] for r in event["related"]}
