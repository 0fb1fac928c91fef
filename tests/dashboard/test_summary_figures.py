"""The run summary as the default-run screenshot showed it: a reward of 0.3125 (80 of 256 samples)
read 0.313 there and 0.312 in the terminal's scorecard (toFixed rounds an exact tie up, Python to
even), and the model path still broke mid-name at the "-" of `20261207-120215`."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.support.dashboard import serve
from webdriver import Browser, missing_browser

APP_JS = Path(__file__).parents[2] / "miles" / "dashboard" / "static" / "app.js"
FIGURES = r"""
const fs = require("fs");
const src = fs.readFileSync(process.argv[1], "utf8");
const start = src.indexOf("function scoreFigure");
eval(src.slice(start, src.indexOf("\n}\n", start) + 2));
const values = JSON.parse(process.argv[2]);
console.log(JSON.stringify(values.map(v => scoreFigure(v))));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="no node")
def test_summary_figures_are_the_scorecards():
    # every mean of 0/1 rewards over 256 or 1024 samples (the exact ties), and a few that are no tie
    values = [k / 256 for k in range(257)] + [-k / 1024 for k in range(1025)]
    values += [0.2965, 0.9258, 1 / 3]
    out = subprocess.run(["node", "-e", FIGURES, str(APP_JS), json.dumps(values)],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [f"{v:.3f}" for v in values]


@pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))
def test_the_model_path_breaks_only_at_its_slashes(run_copy):
    renamed = run_copy.parent / "20261207-120215-a-long-run-name"
    run = run_copy.rename(renamed)
    checkpoint = run / "checkpoints" / "iter_0000003"
    checkpoint.mkdir(parents=True)  # the recorded run kept none; the summary names the newest
    served, browser = serve(run), Browser()
    try:
        browser.open(served.url + "/#metrics")
        browser.script("document.querySelector('[data-key=model] .summary-value')"
                       ".style.width = '400px'")
        parts = browser.script(
            "const v = document.querySelector('[data-key=model] .summary-value');"
            "const line = parseFloat(getComputedStyle(v).lineHeight) || 20;"
            "return [v.textContent, [...v.querySelectorAll('.path-part')].map(p => "
            "[p.textContent, p.getBoundingClientRect().height <= 1.5 * line])]")
    finally:
        browser.close()
        served.stop()
    text, heights = parts
    assert checkpoint.name in text and renamed.name in text
    *dirs, last = text.split("/")
    assert [p for p, _ in heights] == [d + "/" for d in dirs] + [last]
    assert all(one_line for _, one_line in heights), heights  # no part broke over two lines
