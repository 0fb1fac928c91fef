"""What the Prometheus metrics cost the rollout phase: the default rollout through a router and engine that
keep their metrics vs the same pair with them turned into no-ops, side by side; plus what one scrape costs.

    .venv/bin/python benchmarks/metrics_overhead.py [--reps 7]

Two stacks start as a run starts them (an engine with the default `EngineConfig` on CPU, a router in front):
"on" is the code as shipped; "off" is the same processes started through this script, which first turns the
engine's prometheus_client metrics (every counter, gauge and histogram the scheduler updates) and the
router's Prometheus-only histograms (client latency, first chunk, per-worker latency) into no-ops. The
rollout is the default config's (32 prompts x 8 samples, at most 8 new tokens, T=1, 64 in flight), sent by
the trainer's own `generate_groups`; the two stacks take turns (interleaved, so a noisy neighbour hits both
alike). Each figure is the median of --reps rollouts. Also timed: GET /metrics on each server (median of
20). Prints a table, then one JSON line with the figures and the overhead ratio (goal: <= 1%).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WITHOUT = "--serve-without-metrics"


# ---- the "off" side: the servers with their metrics as no-ops ---------------------------------------------
class _NullValue:
    @staticmethod
    def get() -> float:
        return 0.0


class _NullMetric:
    """Takes every prometheus_client child call and does nothing."""

    _value = _NullValue()

    def inc(self, *args, **kwargs) -> None:
        return None

    set = observe = info = dec = inc

    def labels(self, *args, **kwargs) -> "_NullMetric":
        return self


def _engine_without_metrics() -> None:
    from miles.engines import metrics

    real_init = metrics.EngineMetrics.__init__

    def init(self, model_name: str) -> None:
        real_init(self, model_name)
        for name, value in list(vars(self).items()):
            if type(value).__module__.startswith("prometheus_client.metrics"):
                setattr(self, name, _NullMetric())

    metrics.EngineMetrics.__init__ = init


def _router_without_metrics() -> None:
    from miles.router import stats, workers

    stats.FixedHistogram.observe = lambda self, seconds: None
    stats.RouterStats.record_first_chunk = lambda self, seconds: None

    def observe(self, seconds: float, failed: bool) -> None:  # the counts /workers shows stay; the histogram goes
        self.requests += 1
        if failed:
            self.errors += 1

    workers.Worker.observe = observe


def serve_without_metrics(kind: str, argv: list[str]) -> int:
    if kind == "engine":
        _engine_without_metrics()
        from miles.engines.cli import main
    else:
        _router_without_metrics()
        from miles.router.cli import main
    return main(argv)


# ---- the measurement -----------------------------------------------------------------------------------------
def start_pair(model_dir, with_metrics: bool):
    from miles.config import EngineConfig, RouterConfig
    from miles.engines.launch import DEFAULT_START_TIMEOUT_S, EngineStartError, engine_command
    from miles.router.launch import router_command
    from miles.serving.process import ServiceStartError, free_port, start_service

    logs = Path(tempfile.mkdtemp(prefix="miles-metrics-bench-"))
    host = "127.0.0.1"

    def command(argv: list[str], kind: str) -> list[str]:
        # argv is [python, -m, module, ...]: the same flags, through this script's no-op metrics when "off"
        return argv if with_metrics else [sys.executable, __file__, WITHOUT, kind, *argv[3:]]

    port = free_port(host)
    engine = start_service(command(engine_command(model_dir, host, port, EngineConfig(engine_device="cpu")), "engine"),
                           host, port, logs / "engine.log", health_path="/health_generate",
                           timeout=DEFAULT_START_TIMEOUT_S, error=EngineStartError)
    port = free_port(host)
    router = start_service(command(router_command(RouterConfig(), host, port, [engine.url]), "router"),
                           host, port, logs / "router.log", health_path="/router_health", timeout=60,
                           error=ServiceStartError)
    return engine, router


def rollout_seconds(url: str, prompts, tokenizer, rollout, rollout_id: int) -> float:
    from miles.rollout.generate import RolloutSampling, generate_groups

    params = RolloutSampling(rollout.rollout_temperature, rollout.rollout_top_p, rollout.rollout_top_k,
                             rollout.rollout_max_response_len)
    start = time.perf_counter()
    generate_groups(url, prompts, rollout.n_samples_per_prompt, tokenizer, params, seed=1234, stream="train",
                    rollout_id=rollout_id, concurrency=rollout.sglang_server_concurrency)
    return time.perf_counter() - start


def counted(engine_url: str, router_url: str) -> tuple[float, float]:
    """(requests the engine's histogram counted, requests the router's counted), read by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    def total(url: str, name: str) -> float:
        return sum(s.value for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
                   for s in f.samples if s.name == name)
    return (total(engine_url, "sglang:e2e_request_latency_seconds_count"),
            total(router_url, "miles_router_request_duration_seconds_count"))


def per_call_seconds(n: int = 200_000) -> dict[str, float]:
    """Seconds per update of each kind the engine and the router make, each the best of 3 timings of `n`
    calls in this process: the engine's histogram observe, gauge set and counter inc (prometheus_client),
    the router's FixedHistogram observe."""
    from miles.engines.metrics import EngineMetrics
    from miles.router.stats import FixedHistogram

    def best(fn) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            for i in range(n):
                fn(0.001 * (i % 997))
            times.append((time.perf_counter() - start) / n)
        return min(times)
    metrics, hist = EngineMetrics("bench"), FixedHistogram()
    return {"histogram": best(metrics.e2e_request_latency.observe), "gauge": best(metrics.num_queue_reqs.set),
            "counter": best(metrics.generation_tokens.inc), "router": best(hist.observe)}


def engine_counts(url: str) -> tuple[float, float]:
    """(requests finished, decode steps) as the engine's own histograms counted them."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {s.name: s.value for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
               for s in f.samples if not s.labels.get("le")}
    return samples["sglang:e2e_request_latency_seconds_count"], samples["sglang:batch_size_count"]


def scrape_ms(url: str, n: int = 20) -> tuple[float, int]:
    times, size = [], 0
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            start = time.perf_counter()
            size = len(client.get(url + "/metrics").content)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="rollouts per side; the median is reported")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from miles.config import RolloutConfig
    from miles.rollout.data import read_prompts
    from miles.tiny.warmstart import default_task_data, ensure_base_model

    rollout = RolloutConfig()
    model_dir = ensure_base_model(progress=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = read_prompts(default_task_data()[0], "prompt", "label")[:rollout.rollout_batch_size]
    on_engine, on_router = start_pair(model_dir, with_metrics=True)
    off_engine, off_router = start_pair(model_dir, with_metrics=False)
    try:
        # the "off" servers really have no metrics: their histograms never count
        rollout_seconds(on_router.url, prompts, tokenizer, rollout, 0)  # warm-up both
        rollout_seconds(off_router.url, prompts, tokenizer, rollout, 0)
        assert counted(off_engine.url, off_router.url) == (0.0, 0.0), "the off side still records metrics"
        on, off = [], []
        for rep in range(args.reps):
            first, second = ((on_router, on), (off_router, off)) if rep % 2 == 0 else ((off_router, off), (on_router, on))
            for router, times in (first, second):
                times.append(rollout_seconds(router.url, prompts, tokenizer, rollout, rep + 1))
        on_counts = counted(on_engine.url, on_router.url)
        requests, steps = (x / (args.reps + 1) for x in engine_counts(on_engine.url))  # per rollout (+ warm-up)
        engine_scrape, engine_bytes = scrape_ms(on_engine.url)
        router_scrape, router_bytes = scrape_ms(on_router.url)
    finally:
        for service in (on_router, off_router, on_engine, off_engine):
            service.stop()
    assert min(on_counts) > 0, "the on side recorded nothing"

    on_s, off_s = statistics.median(on), statistics.median(off)
    overhead = on_s / off_s - 1.0
    # accounted, each update at its own measured price: per request, the queued gauge at submit, the
    # first-token histogram, and the finish's counter and two histograms (latency, time per output token),
    # and 3 router histogram observes; per scheduler step, the queue and running gauges (4 sets), the
    # batch-size histogram, the throughput gauge and two token counters
    price = per_call_seconds()
    per_request = 3 * price["histogram"] + price["counter"] + price["gauge"]
    per_step = price["histogram"] + 5 * price["gauge"] + 2 * price["counter"]
    engine_call, router_call = price["histogram"], price["router"]
    accounted_s = requests * per_request + steps * per_step + 3 * requests * router_call
    accounted = accounted_s / off_s
    samples = rollout.rollout_batch_size * rollout.n_samples_per_prompt
    print(f"rollout of {samples} samples ({rollout.rollout_batch_size} x {rollout.n_samples_per_prompt}, "
          f"<= {rollout.rollout_max_response_len} tokens), median of {args.reps} each, interleaved")
    print(f"{'':28}{'median s':>10}{'min s':>10}{'max s':>10}")
    print(f"{'metrics on (as shipped)':28}{on_s:10.3f}{min(on):10.3f}{max(on):10.3f}")
    print(f"{'metrics off (no-ops)':28}{off_s:10.3f}{min(off):10.3f}{max(off):10.3f}")
    print(f"overhead of the metrics on the rollout: {overhead:+.2%} (goal <= 1%)")
    print(f"accounted: {requests:.0f} requests and {steps:.0f} decode steps per rollout x "
          f"(engine: {engine_call * 1e6:.2f} us per histogram observe, {price['gauge'] * 1e6:.2f} per gauge set, "
          f"{price['counter'] * 1e6:.2f} per counter inc; router: {router_call * 1e6:.2f} us per observe) = "
          f"{accounted_s * 1e3:.2f} ms per rollout, {accounted:.3%} of it")
    print(f"GET /metrics: engine {engine_scrape:.2f} ms ({engine_bytes} bytes), "
          f"router {router_scrape:.2f} ms ({router_bytes} bytes)")
    print(json.dumps({"rollout_s_metrics_on": round(on_s, 4), "rollout_s_metrics_off": round(off_s, 4),
                      "overhead_ratio": round(overhead, 4), "reps": args.reps,
                      "accounted_ms_per_rollout": round(accounted_s * 1e3, 3), "accounted_ratio": round(accounted, 5),
                      "engine_scrape_ms": round(engine_scrape, 3), "router_scrape_ms": round(router_scrape, 3),
                      "price_us": {kind: round(seconds * 1e6, 3) for kind, seconds in price.items()}}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == WITHOUT:
        sys.exit(serve_without_metrics(sys.argv[2], sys.argv[3:]))
    sys.exit(main())
