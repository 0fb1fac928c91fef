"""`miles train [flags]`: the command that runs the `grpo` flow (same flags as `python -m miles.train`).

It prepares the run once (`miles.prepare`: parse, resolve, check; a bad flag, hook or data path fails
before any server starts), starts or finds the Prefect server, says where to watch, runs the flow in
this process with the prepared config handed over, and prints the scorecard's summary at the end.
The flows themselves are in `flows/grpo.py`.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.flow_args import flow_parameters
from flows.flow_run import STARTED_AT_ENV, handing_over
from flows.grpo import grpo
from flows.prefect_server import ensure_server
from flows.where import print_finished, print_where_to_look
from miles.backends.base import NonFiniteError
from miles.config.secrets import secrets_to_env
from miles.health import RedFlagStop
from miles.mlflow_ui.launch import mlflow_link, start_ui
from miles.prepare import prepare
from miles.run.faults import require_healable
from miles.run.scorecard import scorecard


def main(argv: list[str] | None = None) -> int:
    """`miles train`: prepare the run, start or find the Prefect server, run the flow, say where to look."""
    started_at = time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    config = prepare(argv, make_model=False)  # the flow makes the model itself
    require_healable(config.orchestration.inject_fault, config.orchestration.use_fault_tolerance)
    if "--run-dir" not in argv and not any(a.startswith("--run-dir=") for a in argv):
        argv += ["--run-dir", config.train.run_dir]  # one run dir for the flow and for what is printed here
    argv = secrets_to_env(config, argv)  # the flow's `flags` parameter is stored by Prefect: no secrets in it
    server = ensure_server()
    ui = start_ui(config.tracking.mlflow_tracking_uri, Path(config.train.run_dir)) if config.tracking.mlflow_ui else None
    print_where_to_look(config, server, ui)
    stopped = False
    os.environ[STARTED_AT_ENV] = repr(started_at)  # the flow's scorecard counts from the command's start too
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        try:
            with handing_over(config, argv):  # the flow takes this config: the flags are parsed once
                card = grpo(**flow_parameters(argv))  # finish_run's scorecard, with its links
        except (RedFlagStop, NonFiniteError) as exc:  # a red-flag stop (checkpointed) or a non-finite step
            # (refused before the optimizer): the flow run Failed with this message
            print(f"miles train: stopped: {str(exc).strip().splitlines()[-1]}", file=sys.stderr, flush=True)
            # the scorecard all the same, read now: what was trained, the red flag, its checkpoint
            seconds = time.time() - started_at
            stopped, card = True, scorecard(config.train.run_dir, config.train.save, seconds)
        finally:
            os.environ.pop(STARTED_AT_ENV, None)  # a later flow in this process counts from its own start
    # the UI's own address (finish_run linked `mlflow ui`'s default), or a stopped run's
    if ui is not None or stopped:
        if link := mlflow_link(config, card.run_dir, ui.url if ui else None):
            card.links["mlflow-run"] = link
    print_finished(card, server, config, ui)
    return 1 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
