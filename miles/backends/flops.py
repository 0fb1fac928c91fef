"""Model FLOPs utilisation: the FLOPs of a training pass counted from the model's HF config, and the peak
FLOP/s of the device it ran on (a table of GPUs' dense bf16 peaks, or a matmul measured once on CPU).

Counted, not estimated from parameters alone: every matmul of a decoder layer (attention projections with
grouped KV heads, the gated MLP; in a mixture of experts the router and the k experts each token goes to),
the LM head, and causal attention's score and value products over each
sequence's own length. A training pass is three forward passes (forward, and backward's two products),
the convention of the MFU papers (PaLM, Megatron); recomputation is not counted (it is not useful work).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendors' data sheets; matched by substring
# of torch.cuda.get_device_name(), most specific first.
GPU_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0), ("B200", 2250.0), ("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0),
    ("H800", 989.0), ("H20", 148.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0),
    ("L4", 121.0), ("A10G", 125.0), ("A10", 125.0), ("RTX 4090", 165.2), ("RTX 3090", 71.0), ("V100", 125.0),
    ("T4", 65.0), ("MI300X", 1307.0), ("MI250X", 383.0),
)


MAX_DIM = 2**24  # a size past any model's (vocabularies ~10**5, hidden and MLP sizes ~10**4-10**5)


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs from a decoder-only HF config."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    gated_mlp: bool = True  # SwiGLU (Qwen, Llama): three ffn matmuls; a plain MLP has two
    experts: int = 0  # a mixture of experts' router width (its ffn: the k chosen experts' together)

    @classmethod
    def from_config(cls, config: dict) -> "ModelShape":
        try:
            hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
            shape = cls(layers=int(config["num_hidden_layers"]), hidden=hidden, heads=heads,
                        kv_heads=int(config.get("num_key_value_heads") or heads),
                        head_dim=int(config.get("head_dim") or hidden // heads),
                        ffn=_active_ffn(config), vocab=int(config["vocab_size"]),
                        gated_mlp=config.get("hidden_act", "silu") in ("silu", "swiglu", "gelu_pytorch_tanh"),
                        experts=_experts(config))
        except (KeyError, TypeError, ValueError, OverflowError, ZeroDivisionError) as exc:
            raise ValueError(f"the model config lacks what a FLOP count needs ({exc})") from None
        shape.check()
        return shape

    def check(self) -> None:
        """ValueError for a shape no model has (MF2: -3 layers, 10**6 KV heads of 4 query heads, a vocabulary
        of 10**30 gave an MFU of -0.02, 629 and 4.9e24): every size from 1 to MAX_DIM, no more KV heads than
        query heads."""
        sizes = {"num_hidden_layers": self.layers, "hidden_size": self.hidden, "num_attention_heads": self.heads,
                 "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                 "intermediate_size": self.ffn, "vocab_size": self.vocab}
        for name, value in sizes.items():
            if not 1 <= value <= MAX_DIM:
                raise ValueError(f"the model config's {name} is {value}, not a size from 1 to {MAX_DIM}")
        if self.kv_heads > self.heads:
            raise ValueError(f"the model config has {self.kv_heads} KV heads for {self.heads} attention heads")

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> "ModelShape":
        return cls.from_config(json.loads((Path(path) / "config.json").read_text()))

    def layer_params(self) -> int:
        """Weights every token multiplies by in one decoder layer: attention projections, the MLP
        (the chosen experts') and a router."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)  # q, o; k, v
        return attention + (3 if self.gated_mlp else 2) * self.hidden * self.ffn + \
            self.hidden * self.experts

    def matmul_params(self) -> int:
        """Weights every token multiplies by: the layers' projections and MLP, and the LM head."""
        return self.layers * self.layer_params() + self.hidden * self.vocab

    def forward_flops(self, seq_lens: list[int], causal: bool = True,
                      share: "RankShare | None" = None) -> float:
        """FLOPs of one forward pass over sequences of these lengths (causal attention: token i sees i+1;
        `causal=False`: every pair, what a masked dense attention kernel computes); with `share`,
        the part one model-parallel rank computes."""
        share = share or WHOLE_MODEL
        layers = share.layers(self.layers)
        head = self.hidden * self.vocab if share.last_stage else 0
        tokens = sum(seq_lens)
        pairs = sum(s * (s + 1) // 2 if causal else s * s for s in seq_lens)
        matmuls = 2.0 * (layers * self.layer_params() + head) * tokens
        return (matmuls + 4.0 * layers * self.heads * self.head_dim * pairs) / share.tp

    def train_flops(self, seq_lens: list[int], share: "RankShare | None" = None) -> float:
        return 3.0 * self.forward_flops(seq_lens, share=share)


def _experts(config: dict) -> int:
    """Routed experts per layer (0: dense); transformers 5 writes Qwen3-MoE's `num_experts` as
    `num_local_experts`."""
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


def _active_ffn(config: dict) -> int:
    """The MLP width a token passes through: the dense MLP's, or (Qwen3-MoE: every layer sparse)
    its k experts' together."""
    if _experts(config):
        return int(config["moe_intermediate_size"]) * int(config["num_experts_per_tok"])
    return int(config["intermediate_size"])


@dataclass(frozen=True)
class RankShare:
    """The part of each sequence's FLOPs one rank computes in a TP x PP layout: its pipeline stage's
    layers (an even split, as Megatron's layout requires) and, on the last stage, the LM head; of
    those, 1/TP (heads, MLP columns and the vocabulary are split over the tensor-parallel ranks).
    The embedding on the first stage is a lookup: no FLOPs. TP x PP ranks of a replica add up to the
    whole model."""

    tp: int = 1
    pp: int = 1
    pp_rank: int = 0

    @classmethod
    def of(cls, parallel: dict | None) -> "RankShare":
        """From a rank's `ActorInfo.extra["parallel"]` (Megatron); None (FSDP): the whole model."""
        if not parallel:
            return WHOLE_MODEL
        return cls(int(parallel.get("tp_size", 1)), int(parallel.get("pp_size", 1)),
                   int(parallel.get("pp_rank", 0)))

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    def layers(self, total: int) -> float:
        return total / self.pp


WHOLE_MODEL = RankShare()


def gpu_peak_flops(device_name: str) -> float | None:
    for key, tflops in GPU_PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops * 1e12
    return None


@lru_cache(maxsize=None)
def measured_peak_flops(device: str = "cpu", threads: int = 1, size: int = 512, repeats: int = 8) -> float:
    """The best matmul FLOP/s on `device` (float32 with `threads` threads on CPU, bf16 on a GPU), measured
    once per process: a CPU has no data-sheet number that holds across machines."""
    import torch

    cuda = device.startswith("cuda")
    previous = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(max(1, threads))
    try:
        size = 4096 if cuda else size
        dtype = torch.bfloat16 if cuda else torch.float32
        a, b = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
        torch.mm(a, b)  # warm-up: the first call pays for thread-pool (or kernel) start-up
        best = float("inf")
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            torch.mm(a, b)
            if cuda:
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return 2.0 * size ** 3 / max(best, 1e-9)


def rank_peak_flops(device) -> tuple[float, str]:
    """(peak FLOP/s of a rank's torch device, where the number comes from), asked on the rank itself: a
    GPU by its name in the table (one it lacks: a bf16 matmul measured once); a CPU measured with the
    rank's own threads."""
    import torch

    if device is not None and getattr(device, "type", "cpu") == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak_flops(name)
        if peak is not None:
            return peak, f"table:{name}"
        return measured_peak_flops(str(device)), f"measured:{name}-bf16-matmul"
    return measured_peak_flops("cpu", torch.get_num_threads()), "measured:cpu-fp32-matmul"


def rank_perf(shape: ModelShape, seq_lens: list[int], seconds: float, peak: float,
              share: RankShare | None = None) -> tuple[float, float]:
    """(TFLOP/s, MFU) of one rank that trained on sequences of `seq_lens` in `seconds` (its `share`
    of the model in a TP x PP layout)."""
    achieved = shape.train_flops(seq_lens, share) / max(seconds, 1e-9)
    return achieved / 1e12, achieved / peak if peak > 0 else 0.0


def mfu_metrics(shape: ModelShape, rank_seq_lens: list[list[int]], rank_seconds: list[float],
                rank_peaks: list[float], shares: list[RankShare] | None = None) -> dict[str, float]:
    """`perf/rank_<r>_tflops` and `perf/rank_<r>_mfu` of each rank's actor_train, `perf/tflops` (all ranks)
    and `perf/mfu` (their achieved FLOP/s over their summed peaks). `shares`: each rank's part of
    the model (Megatron TP x PP: each rank of a replica trains its sequences, on its part)."""
    out: dict[str, float] = {}
    achieved_total = achieved_measured = peak_total = 0.0
    shares = shares or [WHOLE_MODEL] * len(rank_seq_lens)
    for rank, (lens, seconds, peak) in enumerate(zip(rank_seq_lens, rank_seconds, rank_peaks)):
        if not lens or not (math.isfinite(seconds) and seconds > 0):
            continue  # a rank with no samples did no useful work (or no time of it): no point for it
        tflops, mfu = rank_perf(shape, lens, seconds, peak, shares[rank])
        out[f"perf/rank_{rank}_tflops"] = tflops
        achieved_total += tflops * 1e12
        if math.isfinite(peak) and peak > 0:  # MF3: a peak of 0 or NaN made a false 0.0 (no measure: no point)
            out[f"perf/rank_{rank}_mfu"] = mfu
            achieved_measured += tflops * 1e12
            peak_total += peak
    if peak_total > 0:
        out["perf/tflops"] = achieved_total / 1e12
        out["perf/mfu"] = achieved_measured / peak_total
    return out


class IterationFlops:
    """Each rank's TFLOP/s and MFU in actor_train, per iteration: FLOPs counted from the model's
    config, the ranks' peaks and TP x PP shares asked of them once (a GPU from the table, a CPU
    measured on the rank)."""

    def __init__(self, checkpoint: Path, group):
        self.checkpoint, self.group = checkpoint, group
        self._known: tuple | None = None  # (ModelShape or False, rank peaks, rank shares)

    def _ask(self) -> tuple:
        try:
            shape = ModelShape.from_checkpoint(self.checkpoint)
        except (OSError, ValueError) as exc:
            print(f"[trainer] no perf/mfu: {exc}", flush=True)
            shape = False
        infos = self.group.call("info")
        peaks = [float(info.extra.get("peak_flops") or 0.0) for info in infos]
        shares = [RankShare.of(info.extra.get("parallel")) for info in infos]
        if shape:
            print("[trainer] perf/mfu divides by each rank's peak: " + ", ".join(
                f"rank {r} {p / 1e12:.4g} TFLOP/s ({peak_source_words(info.extra.get('peak_source'))})"
                for r, (p, info) in enumerate(zip(peaks, infos))), flush=True)
        return shape, peaks, shares

    def metrics(self, batches, results) -> dict[str, float]:
        first = self._known is None
        if first:
            self._known = self._ask()
        shape, peaks, shares = self._known
        if not shape:
            return {}
        out = mfu_metrics(shape, [[len(t) for t in b.tokens] for b in batches],
                          [r.actor_train_time for r in results], peaks, shares)
        if first:  # the denominator, once per trainer (review N25: two runs' MFU compared need it)
            out.update({f"perf/rank_{r}_peak_tflops": p / 1e12 for r, p in enumerate(peaks)
                        if math.isfinite(p) and p > 0})
        return out


def peak_source_words(source: str | None) -> str:
    """`rank_peak_flops`'s source as a reader takes it: "data sheet: NAME" or "measured: HOW"."""
    kind, _, what = (source or "").partition(":")
    if kind == "table":
        return f"data sheet: {what}"
    return f"measured: {what}" if kind == "measured" else "source unknown"
