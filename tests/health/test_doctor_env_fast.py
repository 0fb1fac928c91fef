"""Review N30: `miles doctor --env` took 15 s, most of it importing torch (to ask a CPU build for
GPUs) and the tiny model's trainer (to name the base model's folder); and its MLflow line named a
store in the run dir, which moved beside the run dirs (runs/mlflow.db)."""
from __future__ import annotations

import json
import subprocess
import sys

from miles.health.cli import cpu_only_torch, run_checks

PROBE = """
import json, sys
from miles.health.cli import run_checks
run_checks(None)
print(json.dumps({m: m in sys.modules for m in ("torch", "miles.tiny.warmstart")}))
"""


def test_the_env_checks_import_neither_torch_on_a_cpu_build_nor_the_trainer(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env={"PATH": "", "MILES_CACHE_DIR": str(tmp_path)}).stdout
    imported = json.loads(out.strip().splitlines()[-1])
    assert not imported["miles.tiny.warmstart"]
    if cpu_only_torch():
        assert not imported["torch"]


def test_the_mlflow_line_names_the_store_the_next_run_uses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    mlflow = store_line()
    assert f"sqlite:///{tmp_path}/runs/mlflow.db" in mlflow.detail
    assert "made by the first run" in mlflow.detail
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mlflow.db").write_bytes(b"")
    assert "exists" in store_line().detail


def store_line():
    """The service line named mlflow (the package line of the same name comes first)."""
    return [c for c in run_checks(None) if c.name == "mlflow"][-1]
