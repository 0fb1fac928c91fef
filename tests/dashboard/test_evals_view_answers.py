"""Review N31: the Evals view listed which held-out prompts fail, not what the model answered. The
rows carry their answers (`samples/eval/`, `responses`), /api/evals passes them, and the view shows
them beside the rewards (under node: the cell's function from app.js, with a stand-in for the DOM).
Also under node: the run summary's model path wraps at its slashes (N34)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from miles.dashboard.app import build_app

EVAL_RUN = Path(__file__).parents[1] / "compare" / "recorded" / "default-1"
APP_JS = Path(__file__).parents[2] / "miles" / "dashboard" / "static" / "app.js"


def test_the_api_passes_each_prompts_answers(tmp_path):
    run = shutil.copytree(EVAL_RUN, tmp_path / "run")
    path = run / "samples" / "eval" / "rollout_000007.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        row["responses"] = [f" answer {i}" for i in range(len(row["rewards"]))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = TestClient(build_app(run)).get("/api/evals").json()
    assert data["step"] == 7
    assert all(r["responses"][0] == " answer 0" and len(r["responses"]) == len(r["rewards"])
               for r in data["prompts"])


NODE = r"""
const fs = require("fs");
const src = fs.readFileSync(process.argv[1], "utf8");
const asText = (v) => (v === null || v === undefined) ? "" :
  (typeof v === "string" ? v : JSON.stringify(v));
const el = (tag, attrs, ...children) => ({tag, attrs, text: children.join("")});
const start = src.indexOf("function answersCell");
const body = src.slice(start, src.indexOf("\n}\n", start) + 2);
eval(body);
console.log(JSON.stringify([answersCell({responses: [" 12", "x".repeat(60)]}),
                            answersCell({rewards: [1]})]));
"""


def node(script: str) -> str:
    """What `script` prints under node, given app.js's path as its first argument."""
    return subprocess.run(["node", "-e", script, str(APP_JS)], capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.skipif(shutil.which("node") is None, reason="no node")
def test_the_answers_cell():
    out = node(NODE)
    answered, old = json.loads(out)
    assert answered["text"] == "12 · " + "x" * 40
    assert answered["attrs"]["title"] == "12\n" + "x" * 60
    assert old["text"] == "–"  # a run recorded before answers were kept


PATHS = r"""
const fs = require("fs");
const src = fs.readFileSync(process.argv[1], "utf8");
globalThis.Node = class {};
const el = (tag, attrs, ...children) => children.length ? {tag, text: children.join("")} : {tag};
const start = src.indexOf("function pathBreaks");
eval(src.slice(start, src.indexOf("\n}\n", start) + 2));
console.log(JSON.stringify(pathBreaks("runs/20261207-030252/checkpoints/iter_0000099")));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="no node")
def test_the_summarys_model_path_wraps_at_its_slashes():
    """Review N34: the run summary's model path broke mid-name; it wraps after a slash now."""
    wbr = {"tag": "wbr"}
    part = lambda text: {"tag": "span", "text": text}  # noqa: E731 (one unbreakable span a part)
    assert json.loads(node(PATHS)) == [part("runs/"), wbr, part("20261207-030252/"), wbr,
                                       part("checkpoints/"), wbr, part("iter_0000099")]


VERDICT = r"""
const fs = require("fs");
const src = fs.readFileSync(process.argv[1], "utf8");
const start = src.indexOf("function verdictLine");
eval(src.slice(start, src.indexOf("\n}\n", start) + 2));
const finished = {status: "finished", headline: "finished: all 12 rollouts (0..11)"};
console.log(JSON.stringify([verdictLine(finished),
                            verdictLine({status: "dead", headline: "the trainer died"})]));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="no node")
def test_the_diagnosis_line_says_its_status_once():
    """Review N34: the dashboard's Diagnose read "finished: finished: all 12 rollouts ..."."""
    assert json.loads(node(VERDICT)) == ["finished: all 12 rollouts (0..11)",
                                         "dead: the trainer died"]
