"""`miles doctor` passes here and fails clearly on an unreachable Prefect API."""
from __future__ import annotations

import socket

from miles.health.cli import main


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


def test_doctor_passes_on_this_machine(capsys, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert main([]) == 0
    assert "all required checks passed" in capsys.readouterr().out


def test_doctor_reports_unreachable_prefect(capsys, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{_closed_port()}/api")
    assert main([]) == 1
    out = capsys.readouterr().out
    assert "FAIL  prefect api" in out and "unreachable" in out
