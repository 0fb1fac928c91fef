"""Every launch path of docs/user-guide/orchestration.md against one real two-node cluster (`ray start --head`
and a second `ray start`, 1 CPU each, token auth): `ray job submit` of both entry points through the head's job
server (rows in `ray job logs`), with and without `--working-dir`, `--ray-address` of both with the token where
Ray keeps it, a wrong token named as such, and a job's working dir left in place under its driver."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.orchestration.ray_head import REPO, RayHead, start_head

# The recipes of docs/user-guide/orchestration.md, verbatim; the tests swap in their own ports and add tiny sizes and a run dir.
README_JOB_SUBMIT = [
    "ray job submit --address=http://127.0.0.1:8265 -- python -m miles.train --num-rollout 3",
    "ray job submit --address=http://127.0.0.1:8265 -- miles train --num-rollout 3",
]
README_MULTI_NODE = [
    "ray start --head --dashboard-host=127.0.0.1 --port=6379",
    "ray start --address=127.0.0.1:6379",
    "miles train --ray-address 127.0.0.1:6379 --num-rollout 3",
    "python -m miles.train --ray-address 127.0.0.1:6379 --num-rollout 3",
    "ray job submit --address=http://127.0.0.1:8265 --working-dir . -- python -m miles.train --num-rollout 3 --use-mlflow",
]
TINY = ["--num-rollout", "1", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--eval-interval", "none"]
RUN_TIMEOUT_S = 480
PROBE_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def head():
    """The multi-node recipe's cluster, shared by the module's tests: a 1-CPU head and a 1-CPU second node
    sharing its temp dir (as two `ray start` with Ray's default /tmp/ray do), token auth on."""
    head = start_head(num_cpus=1)
    try:
        head.join_node(num_cpus=1, share_temp_dir=True)
        yield head
    finally:
        head.stop()


def with_ports(command: str, head: RayHead) -> list[str]:
    return command.replace("8265", str(head.dashboard_port)).replace("6379", str(head.port)).split()


def run(argv: list[str], env: dict[str, str], timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def journal_rollouts(run_dir: Path) -> list[int]:
    return [json.loads(line)["rollout_id"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_docs_show_the_recipes_these_tests_run():
    page = (REPO / "docs" / "user-guide" / "orchestration.md").read_text()
    for command in README_JOB_SUBMIT + README_MULTI_NODE:
        assert command in page, command


@pytest.mark.slow
def test_the_working_dir_is_not_replaced_under_a_job_after_connect(head):
    """Two nodes started as the docs show (`ray start --head`, then `ray start --address`, one temp dir) share
    one copy of a job's `--working-dir`, and each node's runtime-env agent deletes and unpacks that copy again
    the first time a worker there needs it (Ray's working_dir plugin unpacks with overwrite=True). The first
    task placed on the second node then replaced the tree the driver and its services were importing from:
    the first-hour review's "ModuleNotFoundError: No module named 'miles.serving.parent_watch'". `connect` now
    has every node unpack the copy before it returns. First of the module's jobs: no node holds the copy yet."""
    assert head.alive_nodes() == 2
    env = {**head.cli_env(), "PYTHONPATH": ""}  # only the uploaded copy, as on a clean clone's nodes
    proc = run(["ray", "job", "submit", f"--address={head.dashboard}", "--working-dir", ".", "--",
                "python", "-m", "tests.orchestration.working_dir_probe"], env, timeout=PROBE_TIMEOUT_S)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    probe = json.loads(lines[-1].removeprefix("PROBE "))
    assert probe["other_nodes"] == 1 and probe["placed"]
    assert not probe["replaced_after_connect"], probe
    assert probe["cwd_live"], probe
    assert probe["child_import"], probe


@pytest.mark.slow
def test_ray_job_submit_runs_the_flow_entry_point_and_ray_job_logs_has_the_row(head, prefect_api, tmp_path):
    """`miles train` (the flow) as a job, from the head's environment; `python -m miles.train` (the plain
    driver) as a job is the working-dir recipe's job below, which runs the same command with `--working-dir .`
    and `--use-mlflow` added and checks `ray job logs` the same way (one run fewer on two 1-CPU nodes)."""
    run_dir, job_id = tmp_path / "run", f"miles-test-{tmp_path.name}-flow"
    submit = with_ports(README_JOB_SUBMIT[1], head)
    cut = submit.index("--")
    # the job reports to the session's Prefect server instead of starting one in ~/.cache
    runtime_env = json.dumps({"env_vars": {"PREFECT_API_URL": prefect_api.api_url}})
    proc = run([*submit[:cut], "--submission-id", job_id, "--runtime-env-json", runtime_env, *submit[cut:],
                *TINY, "--run-dir", str(run_dir)], head.cli_env())
    assert proc.returncode == 0 and "succeeded" in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_job_logs_have_the_row(head, job_id)
    assert journal_rollouts(run_dir) == [0]


def assert_job_logs_have_the_row(head: RayHead, job_id: str) -> None:
    logs = run(["ray", "job", "logs", job_id, f"--address={head.dashboard}"], head.cli_env(), timeout=60)
    assert "[trainer] iter 0 (1/1) | loss=" in logs.stdout, logs.stdout[-3000:] + logs.stderr[-2000:]


@pytest.mark.slow
def test_ray_address_with_token_auth_and_a_second_node(head, prefect_api, tmp_path):
    assert head.alive_nodes() == 2
    env = head.driver_env(PREFECT_API_URL=prefect_api.api_url)  # no RAY_AUTH_MODE: found from the token
    flow = run([*with_ports(README_MULTI_NODE[2], head), *TINY, "--run-dir", str(tmp_path / "flow"),
                "--use-mlflow"], env)
    assert proc_ok(flow)
    assert "connected to the Ray cluster" in flow.stdout + flow.stderr and "2 node(s)" in flow.stdout + flow.stderr
    assert journal_rollouts(tmp_path / "flow") == [0]
    # the tracker run, opened in a Ray worker, names the run and links the flow run that drove it
    tags = mlflow_tags(tmp_path / "flow")
    assert tags["mlflow.runName"] == "flow"
    assert tags["prefect.flow_run_url"].startswith(f"{prefect_api.ui_url}/runs/flow-run/")
    assert (f"mlflow ui --backend-store-uri sqlite:///{tmp_path / 'mlflow.db'} --host 127.0.0.1 --port 5000 "
            f"--workers 1 --app-name miles") in flow.stdout
    plain = run([*with_ports(README_MULTI_NODE[3], head), *TINY, "--run-dir", str(tmp_path / "plain")], env)
    assert proc_ok(plain) and "[trainer] iter 0 (1/1) | loss=" in plain.stdout
    assert journal_rollouts(tmp_path / "plain") == [0]


def mlflow_tags(run_dir: Path) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    from miles.tracking.state import DeliveryState

    spec = DeliveryState.load(run_dir).sinks["mlflow"].spec.options
    return MlflowClient(tracking_uri=spec["tracking_uri"]).get_run(spec["run_id"]).data.tags


@pytest.mark.slow
def test_a_wrong_token_is_named_as_an_authentication_error(head, tmp_path):
    env = {k: v for k, v in head.driver_env(RAY_AUTH_TOKEN="0" * 32).items() if k != "RAY_AUTH_TOKEN_PATH"}
    proc = run(["python", "-m", "miles.train", "--ray-address", head.address, *TINY,
                "--run-dir", str(tmp_path / "run")], env, timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (f"--ray-address: the Ray cluster at {head.address} refused the connection: Ray token authentication "
            f"rejected this driver's token (wrong or missing)") in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def proc_ok(proc: subprocess.CompletedProcess) -> bool:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return True


@pytest.mark.slow
def test_ray_job_submit_with_the_working_dir_on_two_one_cpu_nodes(head, tmp_path):
    """The multi-node recipe as a job (the first-hour review's failing case): a 1-CPU head and a 1-CPU
    second node with token auth, the checkout uploaded with --working-dir (the job's driver imports the
    uploaded copy first), MLflow on; the run finishes, the engine loads torch and `ray job logs` has the row.
    Also the job-submit recipe's `python -m miles.train` (the same command without the two options)."""
    assert README_MULTI_NODE[4].replace(" --working-dir .", "").removesuffix(" --use-mlflow") == README_JOB_SUBMIT[0]
    assert head.alive_nodes() == 2
    env = {**head.cli_env(), "PYTHONPATH": ""}
    run_dir, job_id = tmp_path / "run", f"miles-test-{tmp_path.name}-wd"
    submit = with_ports(README_MULTI_NODE[4], head)
    cut = submit.index("--")
    proc = run([*submit[:cut], "--submission-id", job_id, *submit[cut:], *TINY, "--run-dir", str(run_dir)], env)
    assert proc.returncode == 0 and "succeeded" in proc.stdout + proc.stderr, \
        proc.stdout[-3000:] + proc.stderr[-3000:] + engine_log(run_dir)
    assert_job_logs_have_the_row(head, job_id)
    assert journal_rollouts(run_dir) == [0]
    assert "Ignoring upload" in proc.stderr or "Uploading package" in proc.stderr  # the working dir went up
    assert "Cannot load" not in engine_log(run_dir)
    assert (run_dir.parent / "mlflow.db").exists()  # the store of the runs beside it


def engine_log(run_dir: Path) -> str:
    log = run_dir / "logs" / "engine-0.log"
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no engine log)"
