"""The dashboard's "diagnose" button: POST /api/diagnose behind the token and the JSON content type,
answering the verdict and the bundle's path; and in a real headless Chromium, the click shows them."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.support.dashboard import serve
from fastapi.testclient import TestClient
from webdriver import Browser, missing_browser

from miles.dashboard.app import build_app

SHOTS = Path(os.environ.get("MILES_SCREENSHOT_DIR", Path(__file__).parents[2] / "runs" / "screenshots"))
JSON = {"Content-Type": "application/json"}


def test_diagnose_endpoint_wants_the_token_and_json(run_copy):
    client = TestClient(build_app(run_copy, token="s3cret"))
    assert client.post("/api/diagnose", json={}).status_code == 401
    auth = {"Authorization": "Bearer s3cret"}
    assert client.post("/api/diagnose", content="{}", headers={**auth, "Content-Type": "text/plain"}).status_code == 415
    answer = client.post("/api/diagnose", content="{}", headers={**auth, **JSON})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    bundle = Path(body["bundle"])
    assert bundle.parent == run_copy / "diagnose" and bundle.is_file()
    assert body["verdict"]["status"] == "dead" and body["verdict"]["headline"].startswith("the trainer died")


@pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))
def test_the_diagnose_button_shows_the_verdict_and_the_bundle(run_copy):
    served = serve(run_copy)
    browser = Browser()
    try:
        browser.open(served.url + "/#metrics")
        browser.click("#diagnose-button")
        browser.wait_for("#diagnosis-headline", timeout=180)
        assert browser.text("#diagnosis-headline").startswith("dead: the trainer died")
        bundle = Path(browser.text("#diagnosis-bundle"))
        assert bundle.parent == run_copy / "diagnose" and bundle.is_file()
        assert len(browser.find_all(".diagnosis-details li")) >= 1
        browser.screenshot(SHOTS / "diagnose.png")
    finally:
        browser.close()
        served.stop()
