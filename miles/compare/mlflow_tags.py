"""Tag an MLflow run with its comparison: `miles.compare` (within | regression), `miles.compare.baselines`,
and `miles.compare.<metric>` for each failed signal (its verdict and first step)."""
from __future__ import annotations

MAX_TAG_VALUE = 5000  # MLflow's limit on a tag value


def find_run_id(client, experiment: str, run_name: str) -> str | None:
    """The newest run of that name in the experiment (the run name is the run dir's name by default)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id], filter_string=f"attributes.run_name = '{run_name}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def tag_mlflow_run(tracking_uri: str, tags: dict[str, str], *, run_id: str | None = None,
                   experiment: str = "miles", run_name: str | None = None) -> str:
    """Set the tags on the run (by id, or by experiment and run name); LookupError when there is none.
    Tags of signals no longer failing are removed, so a rerun comparison leaves no stale verdict."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    if run_id is None:
        run_id = find_run_id(client, experiment, run_name or "")
        if run_id is None:
            raise LookupError(f"no MLflow run named {run_name!r} in experiment {experiment!r} at {tracking_uri}")
    old = client.get_run(run_id).data.tags
    for key in old:
        if key.startswith("miles.compare.") and key not in tags and key != "miles.compare.baselines":
            client.delete_tag(run_id, key)
    for key, value in tags.items():
        client.set_tag(run_id, key, value[:MAX_TAG_VALUE])
    return run_id
