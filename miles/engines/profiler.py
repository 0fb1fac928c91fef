"""The engine's side of SGLang's `/start_profile` and `/stop_profile`: a torch profiler around the
scheduler thread's batches, one Chrome trace per engine (`<output_dir>/[<prefix>-]<profile_id>-TP-0.trace.json.gz`,
SGLang's naming for tensor-parallel rank 0)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from miles.engines.sglang_request import RequestError

ACTIVITIES = ("CPU", "GPU", "MEM")  # SGLang's names; CUDA_PROFILER and RPD need tools this engine lacks
DEFAULT_DIR_ENV = "SGLANG_TORCH_PROFILER_DIR"


@dataclass(frozen=True)
class ProfileRequest:
    """SGLang's ProfileReqInput fields that this engine honours."""

    output_dir: str
    profile_id: str
    profile_prefix: str | None
    activities: tuple[str, ...]
    with_stack: bool
    record_shapes: bool

    @property
    def trace_path(self) -> Path:
        name = f"{self.profile_prefix}-{self.profile_id}" if self.profile_prefix else self.profile_id
        return Path(self.output_dir) / f"{name}-TP-0.trace.json.gz"


def parse_profile_request(body: dict | None) -> ProfileRequest:
    """Validate a /start_profile body (empty or missing: SGLang's defaults)."""
    body = body or {}
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    for unsupported in ("num_steps", "start_step"):
        if body.get(unsupported) is not None:
            raise RequestError(f"{unsupported} is not supported by the embedded engine: "
                               f"stop the profile with /stop_profile", param=unsupported)
    if body.get("profile_by_stage"):
        raise RequestError("profile_by_stage is not supported by the embedded engine (no separate prefill "
                           "and decode stages)", param="profile_by_stage")
    activities = body.get("activities") or ["CPU", "GPU"]
    if not isinstance(activities, list) or any(a not in ACTIVITIES for a in activities):
        raise RequestError(f"activities must be a list of {', '.join(ACTIVITIES)}, got {activities!r}",
                           param="activities")
    output_dir = body.get("output_dir") or os.environ.get(DEFAULT_DIR_ENV, "/tmp")
    if not isinstance(output_dir, str):
        raise RequestError("output_dir must be a string", param="output_dir")
    return ProfileRequest(output_dir=output_dir, profile_id=str(body.get("profile_id") or time.time()),
                          profile_prefix=body.get("profile_prefix"), activities=tuple(activities),
                          with_stack=bool(body.get("with_stack") or False),
                          record_shapes=bool(body.get("record_shapes") or False))


class EngineProfiler:
    """At most one running profile; `start` and `stop` run on the scheduler thread (between batches),
    the thread whose model calls the profiler records."""

    def __init__(self) -> None:
        self.request: ProfileRequest | None = None
        self.prof: profile | None = None

    def start(self, request: ProfileRequest) -> None:
        if self.prof is not None:
            raise RequestError("Profiling is already in progress. Call /stop_profile first.")
        Path(request.output_dir).mkdir(parents=True, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if "GPU" in request.activities and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.prof = profile(activities=activities, record_shapes=request.record_shapes,
                            profile_memory="MEM" in request.activities, with_stack=request.with_stack)
        self.prof.start()
        self.request = request

    def stop(self) -> Path:
        if self.prof is None:
            raise RequestError("Profiling is not in progress. Call /start_profile first.")
        prof, request = self.prof, self.request
        self.prof = self.request = None
        prof.stop()
        path = request.trace_path
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        return path
