"""The default run's result is measured once and quoted the same everywhere (issue 55, review A2 and
N10: the README said 0.292 -> 0.910, getting-started 0.275 -> 0.918 "same code, same curve",
run-output.md's scorecard 0.229 -> 0.796, while a clean clone gave 0.294 -> 0.926).
docs/developer/default-run.json is the one source; benchmarks/default_run.py writes every quote of
it between markers."""
from __future__ import annotations

import json
import re
import sys

from tests.docs.pages import ROOT, doc_pages

sys.path.insert(0, str(ROOT))
from benchmarks.default_run import (MARKER, SCREENSHOT, SHOT_KEY, load,  # noqa: E402
                                    png_text, render, shown, stale_pages)

# the pages a newcomer reads first describe the default run only: a pass@1 pair there is its result
FIRST_PAGES = ["README.md", "docs/getting-started.md", "docs/user-guide/run-output.md"]
PAIR = re.compile(r"\b0\.\d{3}\)? *(?:\(base\) *)?(?:->|→|to) *0\.\d{3}\b")


def test_every_quote_is_the_measured_figure():
    stale = stale_pages(load())
    assert not stale, \
        f"pages quoting another default-run figure: {stale} (benchmarks/default_run.py --write)"


def test_the_pages_that_describe_the_default_run_quote_it():
    wanted = {"README.md": "headline", "docs/getting-started.md": "headline",
              "docs/developer/benchmarks.md": "headline",
              "docs/user-guide/run-output.md": "scorecard"}
    for page, name in wanted.items():
        assert f"<!-- default-run:{name} -->" in (ROOT / page).read_text(), \
            f"{page} lacks the {name} figure"


def test_no_unmarked_result_on_the_first_pages():
    for page in FIRST_PAGES:
        paragraphs = MARKER.sub("", (ROOT / page).read_text()).split("\n\n")
        # a paragraph about another run (the pretrained SmolLM2 one) names its own config
        pairs = [pair for para in paragraphs if not re.search(r"configs/(?!tiny-cpu)", para)
                 for pair in PAIR.findall(para)]
        assert not pairs, f"{page} quotes a default-run result outside the markers: {pairs}"


def test_a_changed_figure_rewrites_every_quote():
    figures = {**load(), "base": 0.111, "final": 0.999}
    for page in doc_pages():
        text = page.read_text()
        if "<!-- default-run:headline -->" in text:
            assert "from 0.111 to 0.999" in render(text, figures)


def test_the_metrics_screenshot_is_of_the_measured_run():
    # first-hour A2: docs/dashboard/metrics.png showed a 4-rollout run whose reward fell, beside
    # pages quoting the default run; `default_run.py --screenshot` puts the figures shown in the PNG
    written = png_text(SCREENSHOT).get(SHOT_KEY)
    assert written is not None, \
        f"{SCREENSHOT.name} was not made by benchmarks/default_run.py --screenshot"
    assert json.loads(written) == shown(load()), \
        f"{SCREENSHOT.name} shows another run than default-run.json (default_run.py --screenshot)"
