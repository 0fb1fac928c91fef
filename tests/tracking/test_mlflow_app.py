"""MLflow's real UI in a fresh headless Chromium opens a recorded run in its model-training view, not GenAI:
every page and click under `mlflow ui --app-name miles`, and the run link miles prints under a plain
`mlflow ui` (as on a tracking server). Screenshots go to `runs/screenshots/` (or MILES_SCREENSHOT_DIR)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tracking_helpers import run_synthetic
from webdriver import Browser, missing_browser

from miles.mlflow_ui.app import with_default_view
from miles.mlflow_ui.launch import page_url, start_ui
from miles.serving.process import free_port, wait_healthy
from miles.tracking.state import DeliveryState

SHOTS = Path(os.environ.get("MILES_SCREENSHOT_DIR", Path(__file__).parents[2] / "runs" / "screenshots"))
# side-navigation links only one of MLflow 3.17's two views has
MODEL_TRAINING_ONLY = {"Model registry", "Runs"}
GENAI_ONLY = {"Evaluation runs", "Judges", "Sessions"}


def test_the_default_view_script_goes_first_and_keeps_a_choice_already_made():
    page = '<!doctype html><html><head><meta charset="utf-8"/><script defer src="main.js"></script></head></html>'
    served = with_default_view(page)
    assert served.startswith('<!doctype html><html><head><script>try{if(localStorage.getItem("mlflow.workflowType_v1")'
                             '===null)localStorage.setItem("mlflow.workflowType_v1","\\"machine_learning\\"")}')
    assert served.index("mlflow.workflowType_v1") < served.index("main.js")
    with pytest.raises(ValueError, match="no <head>"):
        with_default_view("<html></html>")


def test_links_name_the_view_and_the_ui_needs_the_installed_app(monkeypatch):
    assert page_url("http://127.0.0.1:5000/", "3", "abc") == \
        "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    assert page_url("http://mlflow:5000", "3") == "http://mlflow:5000/#/experiments/3?workflowType=machine_learning"
    import mlflow.utils.plugins

    monkeypatch.setattr(mlflow.utils.plugins, "get_entry_points", lambda group: [])  # miles not pip-installed
    with pytest.raises(RuntimeError, match=r"does not know the `miles` app .*`pip install -e \.`"):
        start_ui("sqlite:///unused.db", Path("unused"))


def links(browser: Browser) -> set[str]:
    return set(browser.script("return [...document.querySelectorAll('a')].map(a => a.textContent.trim())"))


def wait_for_a_view(browser: Browser) -> set[str]:
    """The page's links once the side navigation of one view or the other has been drawn."""
    names = sorted(MODEL_TRAINING_ONLY | GENAI_ONLY)
    browser.wait_true(f"[...document.querySelectorAll('a')].some(a => {names!r}.includes(a.textContent.trim()))",
                      timeout=60)
    return links(browser)


def wait_for_the_run_page(browser: Browser) -> None:
    """Until the run's own page (its tabs and breadcrumb) is drawn, which comes after the side navigation."""
    browser.wait_true("[...document.querySelectorAll('[role=tab]')].some(t => t.textContent.trim() === 'Model metrics')"
                      " && [...document.querySelectorAll('a')].some(a => /[/](runs|evaluation-runs)$/.test("
                      "a.getAttribute('href') || ''))", timeout=60)


def assert_model_training_view(browser: Browser, run_page: bool = False) -> None:
    found = wait_for_a_view(browser)
    if run_page:
        wait_for_the_run_page(browser)
        found = links(browser)
        assert "Evaluations" not in found, found  # GenAI's breadcrumb over a run; model training's says "Runs"
    assert MODEL_TRAINING_ONLY <= found and not found & GENAI_ONLY, (browser.script("return location.href"), found)


def plain_mlflow_ui(store: str, log: Path) -> tuple[subprocess.Popen, str]:
    """`mlflow ui` as anyone starts it, without miles' app."""
    port = free_port()
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store, "--host",
                                    "127.0.0.1", "--port", str(port), "--workers", "1"], stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return process, f"http://127.0.0.1:{port}"


@pytest.mark.slow
@pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))
def test_mlflow_ui_opens_the_run_in_the_model_training_view(tmp_path):
    run_dir = tmp_path / "grpo-arith"
    run_dir.mkdir()
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_synthetic(run_dir, "--rollouts", "1", "--use-mlflow", "--mlflow-tracking-uri", store,
                  "--no-mlflow-system-metrics")
    spec = DeliveryState.load(run_dir).sinks["mlflow"].spec.options
    from mlflow.tracking import MlflowClient

    experiment_id = MlflowClient(tracking_uri=store).get_run(spec["run_id"]).info.experiment_id

    plain, plain_url = plain_mlflow_ui(store, tmp_path / "plain-ui.log")  # starts while ours starts
    ui = start_ui(store, tmp_path)
    browser = None
    try:
        browser = Browser()  # a fresh profile: nothing chosen in localStorage
        # our app: the experiment page as typed, with no view in the URL, and a click on the run
        browser.get(f"{ui.url}/#/experiments/{experiment_id}")
        assert_model_training_view(browser)
        browser.wait_true("[...document.querySelectorAll('a')].some(a => a.textContent.trim() === 'grpo-arith')")
        browser.screenshot(SHOTS / "mlflow-experiment.png")
        browser.script("[...document.querySelectorAll('a')].find(a => a.textContent.trim() === 'grpo-arith').click()")
        browser.wait_true(f"location.hash.includes('/runs/{spec['run_id']}')")
        assert_model_training_view(browser, run_page=True)
        browser.screenshot(SHOTS / "mlflow-run.png")

        # a plain `mlflow ui` (another origin: nothing stored): the link miles prints opens the run in the same view
        wait_healthy(plain_url, 120, process=plain, path="/health")
        browser.get(page_url(plain_url, experiment_id, spec["run_id"]))
        assert_model_training_view(browser, run_page=True)
        browser.screenshot(SHOTS / "mlflow-run-plain-ui.png")
    finally:
        if browser is not None:
            browser.close()
        for pid in (ui.pid, plain.pid):
            os.killpg(pid, signal.SIGTERM)  # each in its own session: the server and its workers
        plain.wait(30)
