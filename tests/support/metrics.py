"""Reading a live service's /metrics (an engine's or the router's) with prometheus_client's own
parser, and the journal keys whose values come from an engine's float arithmetic."""
from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

# The engine's log-probs come from whatever batch a request joined; they may differ in the last bits
# (fp32 log-probs of magnitude ~1-5 carry ~5e-7 of rounding, so these compare within 2e-6).
ENGINE_FLOAT_KEYS = {"rollout/rollout_log_probs", "train/train_rollout_logprob_abs_diff"}
# the train-vs-rollout mismatch figures (miles.backends.mismatch) are made of the same differences
ENGINE_FLOAT_PREFIX = "train/mismatch_"


def is_engine_float(key: str) -> bool:
    """A journal key compared within float tolerance between two runs, not bit for bit."""
    return key in ENGINE_FLOAT_KEYS or key.startswith(ENGINE_FLOAT_PREFIX)


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of `url`/metrics keyed by (sample name, labels)."""
    r = httpx.get(url + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def histogram(samples, name: str, **labels) -> tuple[list[tuple[float, float]], float, float]:
    """(buckets as (le, cumulative count), count, sum) of one histogram series."""
    buckets = sorted((float(dict(key)["le"]), v) for (n, key), v in samples.items()
                     if n == name + "_bucket" and {k: v for k, v in key if k != "le"} == labels)
    return (buckets, value(samples, name + "_count", **labels),
            value(samples, name + "_sum", **labels))


def check_histogram(buckets, count: float) -> None:
    """A well-formed cumulative histogram: counts never fall and +Inf holds every observation."""
    counts = [c for _, c in buckets]
    assert counts == sorted(counts) and buckets[-1][0] == float("inf") and buckets[-1][1] == count
