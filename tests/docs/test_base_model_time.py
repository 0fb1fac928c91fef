"""How long making the tiny base model takes is said one way everywhere a user reads it (the first-hour
review found "about 2 minutes (110-134 s)", "about 1.5 minutes" twice and "1-3 min" for a measured 82 s)."""
from __future__ import annotations

from pathlib import Path

from miles.tiny.defaults import MAKING_TAKES

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/getting-started.md", "docs/user-guide/run-output.md"]


def test_the_docs_give_the_figure_the_code_prints():
    figure = MAKING_TAKES.split(" on ")[0]  # "about 75 s"
    for page in PAGES:
        text = " ".join((ROOT / page).read_text().split())
        assert figure in text, f"{page} does not say {figure!r}"
        for stale in ("1-3 min", "1.5 min", "about 2 minutes"):
            assert stale not in text, f"{page} still says {stale!r}"


def test_doctor_env_and_the_commands_print_it(tmp_path, monkeypatch):
    from miles.health.cli import check_base_model

    monkeypatch.setenv("MILES_CACHE_DIR", str(tmp_path))
    assert MAKING_TAKES in check_base_model().detail
    for module in ("miles/tiny/cli.py", "miles/tiny/defaults.py"):
        assert "MAKING_TAKES" in (ROOT / module).read_text().split("def ", 1)[1]
