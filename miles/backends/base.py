"""The interface every training backend's per-rank actor offers, and the data it exchanges.

The trainer (driver) knows only this: it hands each rank a `RankBatch`, gets back a
`RankTrainResult` of metric *sums*, and asks the ranks to save, load and export weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class NonFiniteError(RuntimeError):
    """A loss or gradient norm that is NaN or infinite: the step is refused before the optimizer
    sees it, so neither the weights nor a checkpoint ever hold it; the run stops with this message."""


@dataclass
class RankBatch:
    """One rank's share of a rollout, already split into optimizer steps."""

    tokens: list[list[int]]  # prompt + response ids per sample
    response_lengths: list[int]
    advantages: list[float]  # one per sample, broadcast to its response tokens
    rollout_log_probs: list[list[float]]  # engine log-prob per response token
    step_sizes: list[int]  # this rank's samples in each optimizer step (sum = len(tokens))
    global_step_sizes: list[int]  # all ranks' samples in each step: the loss normaliser
    rollout_id: int = 0
    # per sample, 1/0 per response token (0: an observation the model did not write); None: all 1
    loss_masks: list[list[int] | None] | None = None
    sample_indices: list[int] = field(default_factory=list)  # each row's index in the rollout
    return_token_stats: bool = False  # a logged rollout: send back per-token log-probs and entropy
    # per sample, the engine's routed experts (tokens read, MoE layers, top_k) ints (an MoE policy's
    # rollout with --record-routed-experts); None: not recorded
    routed_experts: list[Any] | None = None


@dataclass
class RankTrainResult:
    """Sums over this rank's samples; the driver adds ranks up and divides by sample counts."""

    sums: dict[str, float]  # e.g. "train/pg_loss" summed over samples (each a per-sample token mean)
    step_values: dict[str, list[float]]  # per optimizer step, identical on all ranks: grad_norm, lr
    num_samples: int
    num_tokens: int  # prompt + response tokens trained on (per optimizer pass)
    log_probs_time: float
    ref_log_probs_time: float
    actor_train_time: float
    # (phase, unix start, unix end) of this rank's log_probs and actor_train, for the run's timeline
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    # sample index -> {"log_probs": [...], "entropy": [...]} per response token (logged rollouts only)
    token_stats: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    maxes: dict[str, float] = field(default_factory=dict)  # e.g. "train/is_weight_max": the driver takes the max
    # this rank's own phase spans and waits with its coordinates (miles.backends.rank_phases.RankSpans)
    rank_spans: Any = None
    # this rank's parameter, gradient, optimizer and peak bytes (miles.backends.rank_memory.KINDS)
    memory: dict[str, float] = field(default_factory=dict)
    # an MoE policy's routing sums of this rank's training passes, per layer
    # (miles.moe.routing_stats.LayerRouting: counts, added up by the driver); {} on a dense model
    routing: dict[int, Any] = field(default_factory=dict)
    # token sums of the train-vs-rollout mismatch (miles.backends.mismatch.MismatchSums); None: none
    mismatch: Any = None


@dataclass
class ActorInfo:
    rank: int
    world_size: int
    weight_version: int
    optimizer_steps: int
    extra: dict[str, Any] = field(default_factory=dict)


class TrainActor(Protocol):
    """One training rank. All methods except `info` are collective: call them on every rank."""

    def open_store(self, master_addr: str) -> int:
        """Rank 0 only, before `init`: open the rendezvous store on a port the OS picks; that port."""
        ...

    def init(self, model_path: str, master_addr: str, master_port: int) -> ActorInfo: ...

    def train(self, batch: RankBatch) -> RankTrainResult: ...

    def set_weight_version(self, version: int) -> None: ...

    def save(self, directory: str) -> list[str]:
        """Write model (HF layout), optimizer, scheduler and this rank's RNG; return files written."""

    def load(self, directory: str) -> ActorInfo: ...

    def load_base(self, model_path: str) -> ActorInfo: ...

    def export_weights(self, directory: str | None) -> dict | None:
        """Full weights: written as an HF checkpoint into `directory` by rank 0, or returned
        (rank 0 only) when `directory` is None."""

    def weights_digest(self) -> str: ...

    def info(self) -> ActorInfo: ...

    def shutdown(self) -> None: ...
