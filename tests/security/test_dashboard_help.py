"""Probe N28: `miles dashboard --help` said "Reads the run, never writes it." while its Diagnose button
writes a bundle into RUN_DIR/diagnose/. The help (and the guide) now say what it writes."""
from __future__ import annotations

from pathlib import Path

import pytest

from miles.dashboard.cli import parse_args

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "user-guide" / "dashboard.md"


def test_the_help_says_what_the_dashboard_writes(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "never writes it" not in text
    assert "only the Diagnose button writes, a bundle into RUN_DIR/diagnose/" in text
    guide = " ".join(GUIDE.read_text().split())
    assert "it writes the bundle into `RUN_DIR/diagnose/`" in guide
