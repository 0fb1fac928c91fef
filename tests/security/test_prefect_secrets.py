"""Probe S4: `miles train --wandb-key ... --router-admin-token ...` stores neither secret in Prefect."""
from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.sessions import FLOW_RUN_TIMEOUT_S, SessionFlow

WANDB_KEY, ROUTER_TOKEN = SessionFlow.WANDB_KEY, SessionFlow.ROUTER_TOKEN


def all_flow_run_parameters() -> str:
    from prefect.client.orchestration import get_client

    async def read():
        async with get_client() as client:
            return [run.parameters for run in await client.read_flow_runs()]

    return json.dumps(asyncio.run(read()), default=str)


def test_secret_flags_are_removed_from_the_stored_argv():
    from miles.config import parse_config
    from miles.config.secrets import strip_secret_flags

    argv = ["--wandb-key", WANDB_KEY, f"--router-admin-token={ROUTER_TOKEN}", "--num-rollout", "1"]
    parse_config(argv)  # both forms are real flags
    assert strip_secret_flags(argv) == ["--num-rollout", "1"]


@pytest.mark.slow
@pytest.mark.timeout(FLOW_RUN_TIMEOUT_S)
def test_miles_train_keeps_secrets_out_of_prefect(flow_run):
    # the session's flow ran `miles train` (flows.train_command.main) with --wandb-key and --router-admin-token
    assert "--wandb-key" in flow_run.argv and "--router-admin-token" in flow_run.argv
    assert flow_run.code == 0  # the router ran with the token: the trainer's admin calls carried it
    stored = all_flow_run_parameters()
    assert '"flags"' in stored and '"config"' in stored  # both flows' parameters were read back
    assert WANDB_KEY not in stored and ROUTER_TOKEN not in stored
