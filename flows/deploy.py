"""`make deploy` (`python -m flows.deploy`): create the process work pool, apply prefect.yaml and create
the health automations (flows/automations.py).

Uses `PREFECT_API_URL` when set (a shared server), else the local server `miles train` uses.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.automations import DEFAULT_STALL_SECONDS, ensure_automations
from flows.prefect_server import ensure_server

PROJECT_DIR = Path(__file__).resolve().parent.parent
POOL = "miles-process"


def ensure_pool(name: str = POOL) -> bool:
    """Create the process work pool; False if it already existed."""
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process",
                                                   description="runs miles flows as local processes"))
        except ObjectAlreadyExists:
            return False
    return True


def apply_deployments(api_url: str, prefect_file: Path = PROJECT_DIR / "prefect.yaml") -> None:
    env = dict(os.environ, PREFECT_API_URL=api_url, MILES_PROJECT_DIR=str(PROJECT_DIR))
    prefect_bin = Path(sys.executable).with_name("prefect")
    subprocess.run([str(prefect_bin), "--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file)],
                   cwd=PROJECT_DIR, env=env, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.deploy", description=__doc__)
    parser.add_argument("--prefect-file", type=Path, default=PROJECT_DIR / "prefect.yaml")
    parser.add_argument("--stall-seconds", type=int, default=DEFAULT_STALL_SECONDS,
                        help="the stall automation cancels a run with no training iteration for this long")
    args = parser.parse_args(argv)
    if args.stall_seconds < 1:
        parser.error(f"--stall-seconds: must be >= 1, got {args.stall_seconds}")
    server = ensure_server()
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        created = ensure_pool()
        automations = ensure_automations(args.stall_seconds)
    print(f"work pool {POOL}: {'created' if created else 'exists'} on {server.api_url}")
    print(f"automations: {', '.join(automations)}")
    apply_deployments(server.api_url, args.prefect_file)
    print(f"\nRun the tiny deployment:  PREFECT_API_URL={server.api_url} prefect deployment run 'grpo/tiny-cpu'\n"
          f"Start a worker for it:    PREFECT_API_URL={server.api_url} prefect worker start --pool {POOL}\n"
          f"Prefect UI:               {server.ui_url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
