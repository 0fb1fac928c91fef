"""The engine's Prometheus metrics, named as SGLang names them, in a registry owned by one server.

A per-server registry (not the process-global one) lets several engines live in one
process (tests) without their counters adding up.
"""
from __future__ import annotations

import math
import re
from pathlib import PurePath

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

NUMBER = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,15})?")  # a weight version that is a plain decimal
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TOKEN_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# where an engine's weights come from (server.py's update routes): each labels updates and refusals
WEIGHT_UPDATE_SOURCES = ("disk", "tensor", "distributed")
# a weight update on the tiny model takes milliseconds; a 7B checkpoint from disk, tens of seconds
WEIGHT_UPDATE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def model_label(model: str) -> str:
    """The `model_name` label of a model given as a path: its folder's name. A full path would put
    the user's home in every series and Grafana legend and change with the cache dir; a hub id
    (`org/name`) stays."""
    path = PurePath(model)
    local = path.is_absolute() or model.startswith(("./", "../", "~"))
    return (path.name or model) if local else model


class EngineMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        model_name = model_label(model_name)

        def gauge(name: str, text: str) -> Gauge:
            return Gauge(name, text, labels, registry=self.registry).labels(model_name)

        def counter(name: str, text: str) -> Counter:
            # prometheus_client appends `_total` to counter names when exposing them.
            return Counter(name, text, labels, registry=self.registry).labels(model_name)

        def histogram(name: str, text: str, buckets) -> Histogram:
            return Histogram(name, text, labels, buckets=buckets, registry=self.registry).labels(model_name)

        self.num_running_reqs = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s) of the last batch.")
        self.prompt_tokens = counter("sglang:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("sglang:generation_tokens", "Number of generation tokens processed.")
        self.num_requests = counter("sglang:num_requests", "Number of requests processed.")
        self.num_aborted_requests = counter("sglang:num_aborted_requests", "Number of requests aborted.")
        self.e2e_request_latency = histogram("sglang:e2e_request_latency_seconds",
                                             "Histogram of End-to-end request latency in seconds", LATENCY_BUCKETS)
        self.time_to_first_token = histogram("sglang:time_to_first_token_seconds",
                                             "Histogram of time to first token in seconds.", LATENCY_BUCKETS)
        self.time_per_output_token = histogram("sglang:time_per_output_token_seconds",
                                               "Histogram of time per output token in seconds.",
                                               TOKEN_LATENCY_BUCKETS)
        # Not an SGLang metric: how many requests each batch decoded together (the batching evidence).
        self.batch_size = histogram("sglang:batch_size", "Requests decoded together per batch (embedded engine).",
                                    BATCH_BUCKETS)
        # Miles' own: which weights serve, and what swapping them in cost (the engine's side of the weight sync).
        self.weight_version = Info("miles_engine_weight_version", "The weight version this engine serves.",
                                   registry=self.registry)
        self.weight_version_number = Gauge("miles_engine_weight_version_number",
                                           "The served weight version as a number (-1 when it is not one).",
                                           registry=self.registry)
        self.weight_update_seconds = Histogram("miles_engine_weight_update_seconds",
                                               "Time to read, check and swap in one weight update, in seconds.",
                                               ["source"], buckets=WEIGHT_UPDATE_BUCKETS, registry=self.registry)
        self.weight_update_failures = Counter("miles_engine_weight_update_failures",
                                              "Weight updates refused (bad path, tensors or values).", ["source"],
                                              registry=self.registry)
        # a series at 0 from the start: the dashboard's "refused" is a line, not "No data"
        for source in WEIGHT_UPDATE_SOURCES:
            self.weight_update_failures.labels(source)

    def record_finish(self, request, finish_type: str, latency: float) -> None:
        self.num_requests.inc()
        if finish_type == "abort":
            self.num_aborted_requests.inc()
        self.e2e_request_latency.observe(latency)
        n = len(request.output_ids)
        if n > 1 and request.first_token_at is not None:
            decode_time = latency - (request.first_token_at - request.created)
            self.time_per_output_token.observe(decode_time / (n - 1))

    def set_weight_version(self, version: str) -> None:
        """Called at scrape time (not per request): the version label and its numeric twin for graphs."""
        self.weight_version.info({"weight_version": str(version)})
        text = str(version)
        # a plain decimal only: float() also reads "nan", "inf", "1e999" and "1_0" (P5: NaN, +Inf, 10.0)
        number = float(text) if NUMBER.fullmatch(text) else -1.0
        self.weight_version_number.set(number if math.isfinite(number) else -1.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
