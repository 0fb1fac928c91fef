"""What megatron-core needs to run on a CPU-only torch with gloo; with a GPU it changes nothing.

Megatron-core assumes CUDA in a few places on the path this backend uses (GPTModel, local
layer spec, TP = PP = 1, no dropout). Each piece below was found by running that path on a
CPU-only torch and is the smallest change that lets it through; the math is untouched.

1. `RotaryEmbedding.get_emb` moves `inv_freq` to `torch.cuda.current_device()` on the first
   forward ("Torch not compiled with CUDA enabled").
2. `GlobalMemoryBuffer.get_tensor` allocates the attention-score buffer of
   `DotProductAttention` on `torch.cuda.current_device()`.
   For 1 and 2 the call runs with `torch.cuda.current_device` answering "cpu", only for its duration
   (a rank's actor runs one call at a time, so nothing else sees the swap).
3. The torch softmax fallback builds its default causal mask with `device="cuda"`
   (`megatron.core.transformer.utils.get_default_causal_mask`): replaced, in the module that
   calls it, by the same mask built on the CPU.
4. The RNG tracker: `DotProductAttention` always enters `get_cuda_rng_tracker().fork()` around
   attention dropout (even at p = 0), which needs registered states, and
   `model_parallel_cuda_manual_seed` registers them with `torch.cuda.get_rng_state()`. A tracker
   with the same names and seeds that keeps CPU generator states stands in for it.

Not needed, tried: `parallel_state.initialize_model_parallel` works on a gloo world as it is,
and building the model with `use_cpu_initialization=True` touches no CUDA.
"""
from __future__ import annotations

import contextlib
import functools

import torch

_installed = False


def needed() -> bool:
    return not torch.cuda.is_available()


@contextlib.contextmanager
def _current_device_is_cpu():
    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # a valid `device=` everywhere megatron passes it
    try:
        yield
    finally:
        torch.cuda.current_device = saved


def _on_cpu(method):
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with _current_device_is_cpu():
            return method(*args, **kwargs)
    return wrapper


def _cpu_causal_mask(sq: int) -> torch.Tensor:
    """`get_default_causal_mask` on the CPU: True above the diagonal (masked)."""
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


def _cpu_rng_tracker_class():
    from megatron.core.tensor_parallel import random as mrandom

    class CPURNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """Megatron's named RNG states, as CPU generator states (fork swaps torch's CPU generator)."""

        def add(self, name: str, seed: int) -> None:
            if name in self.states_:
                raise ValueError(f"rng state {name!r} already exists")
            self._is_initialized = True
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise KeyError(f"rng state {name!r} is not added")
            saved = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(saved)

    return CPURNGStatesTracker


def install() -> None:
    """Patch megatron-core's CUDA-only spots (1-3); idempotent; nothing on a GPU."""
    global _installed
    if _installed or not needed():
        return
    from megatron.core.fusions import fused_softmax
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.utils import GlobalMemoryBuffer

    RotaryEmbedding.get_emb = _on_cpu(RotaryEmbedding.get_emb)
    GlobalMemoryBuffer.get_tensor = _on_cpu(GlobalMemoryBuffer.get_tensor)
    fused_softmax.get_default_causal_mask = _cpu_causal_mask
    _installed = True


def seed_model_parallel_rng(seed: int) -> None:
    """`model_parallel_cuda_manual_seed` on a GPU; on CPU the same named states, seeded alike (4)."""
    from megatron.core.tensor_parallel import random as mrandom

    if not needed():
        mrandom.model_parallel_cuda_manual_seed(seed)
        return
    tracker = _cpu_rng_tracker_class()()
    # The same names and seeds as model_parallel_cuda_manual_seed with TP = EP = 1 (rank 0 of each).
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718)
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024)
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
