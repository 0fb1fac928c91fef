"""Probe P5: the engine stored any weight_version: a 1 MiB one was served in every /metrics scrape
(1,063,004 bytes) and answer, while the router refuses more than 256 characters (N7); and its numeric
twin `miles_engine_weight_version_number` read `nan`, `inf`, `-1e999` and `1_0` as NaN, +Inf, -Inf, 10.
Now the router's bound holds on the engine too (400, weights and version kept), and only a plain decimal
is a number (else -1, as a tag)."""
from __future__ import annotations

import httpx
import pytest

from .probes import AUTH


def version(url: str) -> str:
    return httpx.get(url + "/get_weight_version", timeout=30).json()["weight_version"]


def version_number(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("miles_engine_weight_version_number "):
            return float(line.split()[1])
    raise AssertionError("no miles_engine_weight_version_number")


def load(engine, model: str, weight_version: str) -> httpx.Response:
    return httpx.post(engine.url + "/update_weights_from_disk", headers=AUTH, timeout=120,
                      json={"model_path": model, "weight_version": weight_version})


@pytest.mark.parametrize("length", [257, 2**20])
def test_a_long_weight_version_is_refused_and_the_version_kept(engine, untrained_model, length):
    before = version(engine.url)
    r = load(engine, str(untrained_model), "v" * length)
    assert r.status_code == 400 and f"is {length} characters long; at most 256" in r.json()["message"], r.text[:300]
    # in a query (a 1 MiB one is past any URL limit, and past the header limit as a header: 431)
    t = httpx.post(engine.url + "/update_weights_from_tensor", params={"weight_version": "v" * 257},
                   content=b"x", headers={**AUTH, "content-type": "application/octet-stream"}, timeout=120)
    assert t.status_code == 400 and "at most 256" in t.json()["message"], t.text[:300]
    assert version(engine.url) == before
    assert len(httpx.get(engine.url + "/metrics", timeout=30).content) < 200_000


def test_only_a_plain_decimal_version_is_a_number(engine, untrained_model):
    before = version(engine.url)
    try:
        for text, number in (("nan", -1.0), ("inf", -1.0), ("-1e999", -1.0), ("1_0", -1.0), ("\u202eevil", -1.0),
                             ("12", 12.0), ("3.5", 3.5)):
            assert load(engine, str(untrained_model), text).status_code == 200
            assert version_number(engine.url) == number, text
    finally:
        load(engine, str(untrained_model), before)
