"""The router's admin token is resolved in one place (`miles.config.secrets.resolve_admin_token`), so the
trainer and the launchers read it without importing the router's server (FastAPI)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from miles.config import RouterConfig
from miles.config.secrets import RUN_TOKEN_ENV, ensure_run_token, resolve_admin_token

ROOT = Path(__file__).resolve().parents[2]


def test_the_flag_wins_then_the_environment(monkeypatch):
    monkeypatch.setenv(RUN_TOKEN_ENV, "from-env")
    assert resolve_admin_token(RouterConfig(router_admin_token="from-flag")) == "from-flag"
    assert resolve_admin_token(RouterConfig()) == "from-env"
    monkeypatch.setenv(RUN_TOKEN_ENV, "")
    assert resolve_admin_token(RouterConfig()) is None


def test_the_run_token_is_what_the_router_resolves(monkeypatch):
    monkeypatch.setenv(RUN_TOKEN_ENV, "")  # recorded, so the token ensure_run_token puts there is undone
    monkeypatch.delenv(RUN_TOKEN_ENV)

    class Config:
        router = RouterConfig()
    token = ensure_run_token(Config())
    assert resolve_admin_token(RouterConfig()) == token


def test_the_trainer_does_not_load_the_router_server():
    code = "import sys, miles.trainer; print(sorted(m for m in ('fastapi', 'miles.router.app') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
