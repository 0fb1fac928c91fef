"""Shared by the compare tests: copies of a recorded real run, with values changed on purpose."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

RECORDED = Path(__file__).parents[1] / "dashboard" / "recorded_run"


def copy_run(target: Path, source: Path = RECORDED) -> Path:
    shutil.copytree(source, target)
    return target


def edit_journal(run_dir: Path, change) -> None:
    """Rewrite the journal with `change(row)` applied to every line (rows are dicts, edited in place)."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        change(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def miles(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def compare_json(*args: str) -> tuple[int, dict]:
    done = miles("compare", *args, "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def signal(report: dict, key: str) -> dict:
    return next(s for s in report["signals"] if s["key"] == key)


def serve(run_dir: Path, *flags: str):
    """`miles dashboard RUN_DIR --port 0 ...` as the dashboard tests start it."""
    from tests.support.dashboard import serve as serve_dashboard

    return serve_dashboard(run_dir, *flags)
