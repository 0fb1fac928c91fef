"""The `grpo` flow run around the training: what `miles train` hands it (its start time, the config
it prepared), its name, tags and description in the Prefect UI, and the Prefect API its Ray workers
report to. The flows themselves are in `flows/grpo.py`."""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL

from flows.flow_args import build_argv, config_source, flag_value, flow_parameters
from miles.config import ConfigError, MilesConfig
from miles.config.parse import load_yaml
from miles.config.run_info import describe, run_name, task_name
from miles.prepare import prepare

# ---- what `miles train` hands the flow it runs in its own process --------------------------------
STARTED_AT_ENV = "MILES_COMMAND_STARTED_AT"  # when `miles train` started, for its in-process flow


def command_started_at() -> float:
    """When `miles train` started (its STARTED_AT_ENV), so that the scorecard's wall time is the
    command's in the terminal, the Prefect artifact and MLflow alike; now, for a flow run started
    otherwise (a deployment, `prefect` itself)."""
    try:
        started = float(os.environ.get(STARTED_AT_ENV, ""))
    except ValueError:
        return time.time()
    return started if 0 < started <= time.time() else time.time()


@dataclass(frozen=True)
class HandedOver:
    """A config `miles train` prepared, and the flow argv (`build_argv`) of its flags."""

    argv: list[str]
    config: MilesConfig


_handed_over: list[HandedOver] = []  # innermost last, while `handing_over` runs a flow here


@contextmanager
def handing_over(config: MilesConfig, argv: list[str]) -> Iterator[None]:
    """Inside the block, the `grpo` flow called with `argv` (as `flow_parameters` splits it) takes
    `config`, which `miles train` prepared from those flags, instead of parsing, resolving and
    checking them again."""
    _handed_over.append(HandedOver(build_argv(**flow_parameters(argv)), config))
    try:
        yield
    finally:
        _handed_over.pop()


def flow_config(config_file: str | None, flags: list[str] | None) -> MilesConfig:
    """The flow's config: the one `miles train` handed over for these very parameters, else
    prepared now (a deployment, a direct call of the flow)."""
    argv = build_argv(config_file, flags)
    if _handed_over and _handed_over[-1].argv == argv:
        return _handed_over[-1].config
    return prepare(argv, make_model=False)  # the flow makes the model in a task of its own


# ---- the flow run's name, tags and description ---------------------------------------------------
def flow_run_name_from_run_dir() -> str:
    """The `grpo` flow run's name from its first log line on: its run dir's name when the flags (or
    their YAML) give one; otherwise Prefect's usual random name, until `describe_flow_run` renames
    the run after the run dir `prepare` picks."""
    from prefect.context import FlowRunContext
    from prefect.utilities.names import generate_slug

    context = FlowRunContext.get()
    parameters = (context.parameters if context else None) or {}
    run_dir = given_run_dir(parameters.get("config_file"), parameters.get("flags"))
    return run_name(run_dir) if run_dir else generate_slug(2)


def given_run_dir(config_file: str | None, flags: list[str] | None) -> str | None:
    """The run dir the flags name (`miles train` always adds --run-dir), else their YAML; None:
    neither (`prepare` picks one). Read off the flags, not parsed: a bad flag is for the flow's
    prepare to report."""
    given = flag_value(list(flags or []), "--run-dir")
    source = config_source(config_file, flags)
    if given or source is None:
        return given
    try:
        from_yaml = load_yaml(source).get("run_dir")
    except (ConfigError, OSError):  # a missing, unreadable or bad YAML: the flow's prepare says so
        return None
    return str(from_yaml) if from_yaml else None


def run_tags_of(config: MilesConfig, flow_run) -> list[str]:
    """The flow run's tags with the run's backend and task, on the parent and on the subflow that
    trains."""
    backend, task = f"backend:{config.train.train_backend}", f"task:{task_name(config)}"
    return sorted({*flow_run.tags, backend, task})


def describe_flow_run(config: MilesConfig, config_file: str | None, flags: list[str] | None) -> str:
    """Names this flow run after its run dir, tags it with backend and task, and describes it (which
    config, which flags) in the `grpo-run` artifact, since Prefect flow runs have no description
    field. Returns the flow run's UI link, which the Ray workers put on their tracker runs."""
    from prefect.context import get_run_context
    from prefect.utilities.urls import url_for

    flow_run, run_dir = get_run_context().flow_run, config.train.run_dir
    source, name = config_source(config_file, flags), run_name(run_dir)
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=name, tags=run_tags_of(config, flow_run))
    body = [f"## {name}", "", describe(config, run_dir), "",
            f"- config: `{source}`" if source else "- config: flags only (no YAML)",
            f"- flags: `{' '.join(flags or []) or '(none)'}`", f"- run dir: `{run_dir}`"]
    # the description is the artifact list's one-line caption: it names what the body holds
    create_markdown_artifact(key="grpo-run", description=f"config, flags and run dir of {name}",
                             markdown="\n".join(body))
    return url_for(flow_run) or ""


def tag_training_run(config: MilesConfig) -> list[str]:
    """Tag this (the training) flow run as its parent is tagged: filtering by `backend:fsdp` or
    `task:...` in the Prefect UI found only the parent, which trains nothing (first-hour N18).
    Returns the tags."""
    from prefect.context import get_run_context

    flow_run = get_run_context().flow_run
    tags = run_tags_of(config, flow_run)
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, tags=tags)
    return tags


def announce_training_run() -> str:
    """Say which flow run trains: the link Prefect prints first is the parent's (cluster bring-up
    only), while the chunks, their logs and most artifacts are on this one."""
    from prefect.context import get_run_context
    from prefect.utilities.urls import url_for

    flow_run = get_run_context().flow_run
    url = url_for(flow_run) or ""
    if url:
        where = "the chunks, their logs, the artifacts"
        get_run_logger().info(f"training in flow run {flow_run.name!r} ({where}): {url}")
    return url


# ---- the Prefect API the flow's Ray workers report to --------------------------------------------
def api_url() -> str:
    url = PREFECT_API_URL.value()
    if not url:
        raise ConfigError("PREFECT_API_URL",
                          "the flow needs a real Prefect server that its Ray workers can reach; "
                          "run it with `miles train` (starts one) or set PREFECT_API_URL")
    return url
