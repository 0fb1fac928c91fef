"""The sink protocol every tracker backend implements, and the factory.

A sink knows how to put journal lines into one tracker; it does not know about cursors,
retries or spooling (the delivery loop owns those). A `SinkSpec` is plain JSON, so `miles
replay-spool` rebuilds the same sink from `RUN_DIR/tracking/delivery.json`.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from miles.record.journal import JournalLine


@dataclass(frozen=True)
class Delivery:
    """Consecutive journal lines, the first being line `first` of the journal; `samples`
    maps a line's position in `lines` to its rollout's sample table (on the rollout's first line)."""

    lines: list[JournalLine]
    samples: dict[int, Path] = field(default_factory=dict)
    first: int = 0


@dataclass(frozen=True)
class SinkSpec:
    kind: str  # "wandb" | "mlflow" | "tensorboard"
    options: dict[str, Any]  # JSON-safe, secret-free constructor options (run ids included once known)


class Sink(Protocol):
    name: str

    def prepare(self) -> None:
        """What needs no run yet (imports, creating a local store), done while the trainer starts."""

    def open(self) -> None:
        """Start the tracker run, or reattach the one named in the spec."""

    def spec(self) -> SinkSpec:
        """How to rebuild this sink (after `open`, with its run id)."""

    def durable_cursor(self, recorded: int) -> int:
        """How many journal lines the tracker really holds, given the `recorded` cursor."""

    def deliver(self, delivery: Delivery) -> None:
        """Write the lines, idempotently (a line delivered again is not a second point); raise on failure."""

    def upload(self, files: list[Path]) -> None:
        """Store run artifacts (files or directories)."""

    def close(self) -> None:
        """Finish the tracker run."""


# kind -> "module:Class"; imported only when used, so a run without MLflow never imports it
SINK_CLASSES = {
    "wandb": "miles.tracking.sinks.wandb_sink:WandbSink",
    "mlflow": "miles.tracking.sinks.mlflow_sink:MlflowSink",
    "tensorboard": "miles.tracking.sinks.tensorboard_sink:TensorBoardSink",
}


# the JSON types a spec option may hold, by the annotation of its constructor parameter
OPTION_TYPES = {"str": (str,), "str | None": (str, type(None)), "bool": (bool,),
                "dict[str, str] | None": (dict, type(None))}


def spec_problem(spec: SinkSpec) -> str | None:
    """Why `build_sink` cannot build `spec` from its options (a name its sink does not take, one it
    needs and lacks, a value of the wrong JSON type); None when it can. The kind must be known."""
    module, cls = SINK_CLASSES[spec.kind].split(":")
    wanted = {n: p for n, p in inspect.signature(getattr(importlib.import_module(module), cls)).parameters.items()
              if n != "params"}
    unknown = [n for n in spec.options if n not in wanted]
    if unknown:
        return f"option {unknown[0]!r:.80} is not one a {spec.kind} tracker takes ({', '.join(wanted)})"
    missing = [n for n, p in wanted.items() if p.default is p.empty and n not in spec.options]
    if missing:
        return f"option {missing[0]!r} is missing"
    for name, value in spec.options.items():
        types = OPTION_TYPES.get(str(wanted[name].annotation))
        if types is not None and not isinstance(value, types):
            return f"option {name!r} must be {wanted[name].annotation}, got {value!r:.80}"
    return None


def build_sink(spec: SinkSpec, params: dict[str, Any]) -> Sink:
    """The sink a spec describes; `params` is the public (redacted) flat config."""
    if spec.kind not in SINK_CLASSES:
        raise ValueError(f"unknown tracker kind {spec.kind!r}; known: {', '.join(SINK_CLASSES)}")
    module, cls = SINK_CLASSES[spec.kind].split(":")
    return getattr(importlib.import_module(module), cls)(params=params, **spec.options)
