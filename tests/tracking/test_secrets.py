"""Secrets planted in the environment and in flags appear nowhere: not in stdout/stderr, the
journal, the wandb files and config, the MLflow store (params, tags), TensorBoard or any artifact."""
from __future__ import annotations

from pathlib import Path

from tracking_helpers import ALL_TRACKERS, run_synthetic, subprocess_env

SECRETS = {
    "WANDB_API_KEY": "wandbkey-4f1c2a9e7b3d",
    "MILES_ROUTER_ADMIN_TOKEN": "admintok-88d0e1f2a3b4",
    "WAREHOUSE_DB_PASSWORD": "dbpass-5e6f7a8b9c0d",
    "INTERNAL_SERVICE_SECRET": "svcsecret-1a2b3c4d5e6f",
}
FLAG_SECRETS = {"--wandb-key": "flagkey-0badc0ffee11", "--router-admin-token": "flagtok-feedface2222"}


def every_file(root: Path):
    return [p for p in root.rglob("*") if p.is_file()]


def test_no_secret_leaves(run_dir):
    flags = [x for pair in FLAG_SECRETS.items() for x in pair]
    proc = run_synthetic(run_dir, "--rollouts", "4", "--log-samples-interval", "2", *ALL_TRACKERS,
                         "--wandb-mode", "offline", *flags, env=subprocess_env(**SECRETS))
    planted = [*SECRETS.values(), *FLAG_SECRETS.values()]
    files = every_file(run_dir.parent)  # the run dir and the MLflow store beside it (shared by the runs there)
    # the outputs exist, so the search below is over something real
    names = {p.name for p in files}
    assert {"metrics.jsonl", "mlflow.db", "report.png", "trainer.json", "delivery.json", "config.yaml"} <= names
    assert any(p.suffix == ".wandb" for p in files) and any("tfevents" in p.name for p in files)
    outputs = {"stdout": proc.stdout.encode(), "stderr": proc.stderr.encode(),
               **{str(p): p.read_bytes() for p in files}}
    for where, data in outputs.items():
        for secret in planted:
            assert secret.encode() not in data, f"secret {secret[:8]}... found in {where}"
    config = (run_dir / "tracking" / "config.yaml").read_text()
    assert "wandb_key: '***'" in config and "router_admin_token: '***'" in config
