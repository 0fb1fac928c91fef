"""The suite's time is quoted beside the host's speed (issue 55: 1,546 s at 42.7 ms a warm-start
step and 731 s at 22.1 ms are the same ~35,000 steps): testing.md gives the gauge's command, and
every suite time in its table has the gauge and the quotient beside it, computed right."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.docs.pages import ROOT

PAGE = ROOT / "docs/developer/testing.md"
COMMAND = ".venv/bin/python benchmarks/warm_start_step.py"


def gauge_rows() -> list[list[str]]:
    section = PAGE.read_text().split("### The suite's time, beside the host's speed", 1)[1]
    section = section.split("\n### ", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("| ---")]
    return rows[1:]  # below the header


def number(text: str) -> float:
    return float(re.search(r"[\d,]+(?:\.\d+)?", text)[0].replace(",", ""))


def test_testing_md_gives_the_gauges_command():
    assert f"```bash\n{COMMAND}\n```" in PAGE.read_text()
    assert (ROOT / COMMAND.split()[1]).is_file()


def test_every_suite_time_has_the_gauge_and_its_quotient():
    rows = gauge_rows()
    assert len(rows) >= 2
    for run, seconds, gauge, quotient in rows:
        assert seconds.endswith(" s") and gauge.endswith(" ms"), run
        steps = number(seconds) / (number(gauge) / 1000)
        assert abs(steps - number(quotient)) <= 100, \
            f"{run}: {seconds} / {gauge} is {steps:.0f}, not {quotient}"


def test_the_gauge_prints_its_milliseconds():
    command = [sys.executable, str(ROOT / "benchmarks/warm_start_step.py"), "--steps", "2",
               "--repeats", "1"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["threads"] == 1 and result["ms_per_warm_start_step"] > 0
