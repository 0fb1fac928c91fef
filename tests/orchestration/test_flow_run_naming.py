"""A `grpo` flow run is named after its run dir, tagged with backend and task, and described by its
`grpo-run` artifact; read back through the Prefect API."""
from __future__ import annotations

import asyncio

from prefect import flow

from flows.flow_args import config_source
from flows.flow_run import describe_flow_run, flow_run_name_from_run_dir
from flows.grpo import grpo
from miles.prepare import resolve_run
from miles.config import parse_config


@flow(name="grpo-naming-probe")
def naming_probe(flags: list[str]) -> str:
    """The grpo flow's first step (resolve the config, name and describe the run), without training."""
    config = resolve_run(parse_config(flags))
    return describe_flow_run(config, None, flags)


@flow(name="grpo-start-name-probe", flow_run_name=flow_run_name_from_run_dir)
def start_name_probe(config_file: str | None = None, flags: list[str] | None = None) -> str:
    """The name the run has as it starts, before describe_flow_run renames anything."""
    from prefect.context import get_run_context

    return get_run_context().flow_run.name


def test_the_grpo_flow_run_starts_under_its_run_dirs_name(prefect_api, tmp_path):
    # "Beginning flow run ..." and the first "View at" link name the run dir, not a random slug
    assert grpo.flow_run_name is flow_run_name_from_run_dir
    assert start_name_probe(flags=["--run-dir", str(tmp_path / "lr-sweep-3"), "--lr", "1e-5"]) == "lr-sweep-3"
    assert start_name_probe(flags=[f"--run-dir={tmp_path / 'b'}"]) == "b"
    yaml = tmp_path / "run.yaml"
    yaml.write_text(f"run-dir: {tmp_path / 'from-yaml'}\n")
    assert start_name_probe(config_file=str(yaml)) == "from-yaml"
    # no run dir given (prepare picks one later and describe_flow_run renames the run): Prefect's own name
    assert start_name_probe(flags=["--lr", "1e-5"])


def read_back(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async def read():
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
            artifacts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
            return run, artifacts

    return asyncio.run(read())


def test_flow_run_name_tags_and_description(prefect_api, tmp_path):
    flags = ["--run-dir", str(tmp_path / "grpo-megatron-7"), "--train-backend", "megatron", "--num-rollout", "5"]
    state = naming_probe(flags, return_state=True)
    assert state.is_completed(), state.message
    url = state.result()
    flow_run_id = state.state_details.flow_run_id
    run, artifacts = read_back(flow_run_id)
    assert run.name == "grpo-megatron-7"
    assert {"backend:megatron", "task:arithmetic"} <= set(run.tags)
    assert url.endswith(str(flow_run_id)) and url.startswith(prefect_api.ui_url)
    described = next(a for a in artifacts if a.key == "grpo-run")
    assert "GRPO (megatron)" in described.data and "5 rollouts" in described.data
    assert described.description == "config, flags and run dir of grpo-megatron-7"  # not the body again
    assert "flags only" in described.data and "--train-backend megatron" in described.data


def test_config_source_is_the_yaml_however_it_was_given():
    assert config_source("configs/tiny-cpu.yaml", []) == "configs/tiny-cpu.yaml"
    assert config_source(None, ["--config=a.yaml", "--lr", "1"]) == "a.yaml"
    assert config_source(None, ["--lr", "1", "--config", "b.yaml"]) == "b.yaml"
    assert config_source(None, ["--lr", "1"]) is None


@flow(name="grpo-on-ray-tag-probe")
def training_tag_probe(flags: list[str]) -> str:
    """The training subflow's first steps: its tags, as train_on_ray sets them."""
    from prefect.context import get_run_context

    from flows.flow_run import tag_training_run

    tag_training_run(resolve_run(parse_config(flags)))
    return str(get_run_context().flow_run.id)


def test_the_training_subflow_is_tagged_like_its_parent(prefect_api, tmp_path):
    """First-hour N18: filtering by backend or task in the Prefect UI hid the flow run that trains."""
    from prefect.client.orchestration import get_client

    flow_run_id = training_tag_probe(["--run-dir", str(tmp_path / "r")])

    async def tags():
        async with get_client() as client:
            return (await client.read_flow_run(flow_run_id)).tags

    assert {"backend:fsdp", "task:arithmetic"} <= set(asyncio.run(tags()))
