"""The GRPO training flow: `miles train [flags]` (same flags as `python -m miles.train`).

Reads top to bottom: parse the flags and resolve every default once, check everything that can
be checked (a bad flag, hook or data path fails here, before anything starts), bring up the
Ray cluster, then on Ray (`flows.on_ray`) start the router, engines and ranks, train chunk by
chunk with the driver loop, finish; Ray is shut down if we started it.
"""
from __future__ import annotations

import sys
from pathlib import Path

from prefect import flow
from prefect.settings import PREFECT_API_URL

from flows.on_ray import train_on_ray
from miles.config import ConfigError, MilesConfig, parse_config
from miles.config.resolve import default_run_dir, resolve
from miles.config.secrets import export_secrets, secrets_to_env
from miles.health import RedFlagStop
from miles.preflight import preflight
from miles.rollout.generate_hook import load_generate_function
from miles.record.run_info import describe, run_name, task_name
from miles.run.lock import RunDirLock
from tasks.cluster import bring_up_cluster, shut_down_cluster
from tasks.finish import RunReport
from tasks.options import with_run_retries


def build_argv(config_file: str | None, flags: list[str] | None) -> list[str]:
    return ([f"--config={config_file}"] if config_file else []) + list(flags or [])


def api_url() -> str:
    url = PREFECT_API_URL.value()
    if not url:
        raise ConfigError("PREFECT_API_URL", "the flow needs a real Prefect server that its Ray workers can reach; "
                                             "run it with `miles train` (starts one) or set PREFECT_API_URL")
    return url


def config_source(config_file: str | None, flags: list[str] | None) -> str | None:
    """The YAML the run's flags come from (`config_file`, or a --config among the flags); None: flags only."""
    if config_file:
        return config_file
    flags = list(flags or [])
    for i, flag in enumerate(flags):
        if flag.startswith("--config="):
            return flag.split("=", 1)[1]
        if flag == "--config" and i + 1 < len(flags):
            return flags[i + 1]
    return None


def describe_flow_run(config: MilesConfig, config_file: str | None, flags: list[str] | None) -> str:
    """Names this flow run after its run dir, tags it with backend and task, and describes it (which
    config, which flags) in the `grpo-run` artifact, since Prefect flow runs have no description field.
    Returns the flow run's UI link, which the Ray workers put on their tracker runs."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.client.orchestration import get_client
    from prefect.context import get_run_context
    from prefect.utilities.urls import url_for

    flow_run = get_run_context().flow_run
    tags = sorted({*flow_run.tags, f"backend:{config.train.train_backend}", f"task:{task_name(config)}"})
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=run_name(config.train.run_dir), tags=tags)
    source = config_source(config_file, flags)
    create_markdown_artifact(key="grpo-run", description=describe(config, config.train.run_dir), markdown="\n".join([
        f"## {run_name(config.train.run_dir)}", "", describe(config, config.train.run_dir), "",
        f"- config: `{source}`" if source else "- config: flags only (no YAML)",
        f"- flags: `{' '.join(flags or []) or '(none)'}`", f"- run dir: `{config.train.run_dir}`"]))
    return url_for(flow_run) or ""


@flow(name="grpo", log_prints=True)
def grpo(config_file: str | None = None, flags: list[str] | None = None) -> RunReport:
    """GRPO post-training on Ray. `config_file`: a YAML of flags; `flags`: Miles-style flags."""
    # a secret in the YAML goes to the environment, so the subflow's `config` parameter holds none
    config = export_secrets(resolve(parse_config(build_argv(config_file, flags))))
    preflight(config)  # a bad hook, data path or Ray address fails here, before the cluster starts
    with RunDirLock(config.train.run_dir):  # one trainer per run dir; the next one fails here naming this one
        flow_run_url = describe_flow_run(config, config_file, flags)  # travels to the Ray workers' tracker runs
        with_run_retries(bring_up_cluster, config.orchestration)(config.orchestration, api_url(), flow_run_url)
        try:
            return train_on_ray.with_options(flow_run_name=f"{run_name(config.train.run_dir)}-on-ray")(config)
        finally:
            shut_down_cluster()


def main(argv: list[str] | None = None) -> int:
    """`miles train`: check the flags, start or find the Prefect server, run the flow, say where to look."""
    from prefect.settings import temporary_settings

    from flows.prefect_server import ensure_server
    from flows.where import print_finished, print_where_to_look
    from miles.mlflow_ui.launch import start_ui
    from tasks.finish import mlflow_link

    argv = list(sys.argv[1:] if argv is None else argv)
    config = parse_config(argv)  # a bad flag is reported before any server or cluster starts
    load_generate_function(config.generate)  # ... and so is a bad generate hook or tool flag
    if config.train.run_dir is None:  # one run dir for the flow and for what is printed here
        argv += ["--run-dir", str(default_run_dir().resolve())]
    config = resolve(parse_config(argv))
    preflight(config)
    argv = secrets_to_env(config, argv)  # the flow's `flags` parameter is stored by Prefect: no secrets in it
    server = ensure_server()
    ui = start_ui(config.tracking.mlflow_tracking_uri, Path(config.train.run_dir)) if config.tracking.mlflow_ui else None
    print_where_to_look(config, server, ui)
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        try:
            report = grpo(flags=argv)
        except RedFlagStop as exc:  # --on-red-flag stop: checkpointed, the flow run Failed with this message
            print(f"miles train: stopped: {exc}", file=sys.stderr, flush=True)
            return 1
    if ui is not None and (link := mlflow_link(config, Path(report.run_dir), ui.url)):
        report.links["mlflow-run"] = link
    print_finished(report, server, config, ui)
    return 0


if __name__ == "__main__":
    sys.exit(main())
