"""What megatron-core needs to run on a CPU-only torch with gloo; with a GPU it changes nothing
(but 7, which is about Transformer Engine, not CUDA).

Megatron-core assumes CUDA in a few places on the path this backend uses (GPTModel, local
layer spec, tensor and pipeline parallel ranks, megatron-core's own pipeline schedule, its MoE
layer with the all-to-all token dispatcher over expert parallel ranks, no dropout). Each piece below was found by running that path on a CPU-only torch and is the
smallest change that lets it through; the math is untouched.

1. `torch.cuda.current_device()` is where megatron-core puts new tensors: RoPE's `inv_freq`,
   the attention-score buffer (`GlobalMemoryBuffer`), the tensor-parallel gathers
   (`tensor_parallel.mappings`, sequence parallel's all-gathers and reduce-scatters among them),
   the pipeline's receive buffers and the shapes it exchanges
   (`pipeline_parallel.p2p_communication`). On a CPU-only torch it answers "cpu", process-wide
   (a valid `device=` everywhere megatron passes it; a CPU-only torch has no device to name).
2. `torch.cuda.synchronize()` is called after every exchange of tensor shapes between pipeline
   stages (variable sequence lengths): a no-op, as there is no device stream to wait for.
3. The torch softmax fallback builds its default causal mask with `device="cuda"`
   (`megatron.core.transformer.utils.get_default_causal_mask`): replaced, in the module that
   calls it, by the same mask built on the CPU.
4. The RNG tracker: `DotProductAttention` always enters `get_cuda_rng_tracker().fork()` around
   attention dropout (even at p = 0), which needs registered states, and
   `model_parallel_cuda_manual_seed` registers them with `torch.cuda.get_rng_state()`. A tracker
   with the same names and seeds (per tensor-parallel rank) that keeps CPU generator states
   stands in for it.
5. Two sites name the device as the literal "cuda", so no answer of `current_device` reaches
   them: the schedules' token counter (`torch.zeros(..., device="cuda")`, in every schedule, PP = 1
   too) and the last pipeline stage's copy of tied embeddings (`weight.data.cuda()` while the
   model is built). `cuda_to_cpu()` is a TorchFunctionMode entered only around those two calls:
   it rewrites `device="cuda"` to the CPU and makes `Tensor.cuda()` the identity.
6. The MoE all-to-all token dispatcher (`MoEAlltoAllTokenDispatcher`) creates a side CUDA stream
   when built and, on every forward, copies its token counts (splits, tokens per expert) from
   the device to the host on that stream, the all-to-all splits as numpy arrays (what
   `all_to_all_single` takes as split sizes), and waits on a CUDA event. Its copy skips tensors
   already on the host, so on the CPU the splits would stay tensors and the all-to-all refuse
   them. The stream is never made (a placeholder stands in) and the copy-and-wait step becomes:
   the splits as numpy arrays, at the same point, nothing to wait for.
7. Not a CUDA assumption but a missing name: without Transformer Engine, `moe_utils` never
   defines `te_general_gemm`, which the router's gating linear tests against None on every call
   (NameError). `define_te_gemm_absent()` defines it as None, so the router takes its torch
   matmul. This one applies on a GPU without Transformer Engine too.
8. Not CUDA but NCCL: with sequence parallel and expert parallel together, the all-to-all
   dispatcher gathers (and in the backward pass reduce-scatters) each TP rank's tokens along the
   first dimension with uneven sizes per rank (`output_split_sizes` / `input_split_sizes` in
   `tensor_parallel.mappings`), as lists of unequal tensors, which gloo refuses ("invalid tensor
   size"). On the CPU those two branches become: the gather pads every rank's part to the
   largest, gathers equal parts and cuts the padding off; the reduce-scatter all-reduces the
   whole tensor and keeps this rank's part. The equal-size branches are untouched.

The configuration keeps megatron-core off its other CUDA-only paths
(`model.transformer_config`): CPU initialisation, no
gradient-accumulation fusion, no recompute, no autocast, `batch_p2p_sync=False`, float32
between stages.

Not needed, tried: `parallel_state.initialize_model_parallel` works on a gloo world as it is.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

_installed = False


def needed() -> bool:
    return not torch.cuda.is_available()


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


class _CudaToCpu(TorchFunctionMode):
    """`device="cuda"` becomes the CPU and `Tensor.cuda()` the identity, while entered (5)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        device = kwargs.get("device")
        if device is not None and "cuda" in str(device):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def cuda_to_cpu():
    """Around megatron-core's schedule calls and model construction: a no-op with CUDA."""
    return _CudaToCpu() if needed() else contextlib.nullcontext()


def install() -> None:
    """Patch megatron-core's CUDA-only spots (1-3); idempotent; nothing on a GPU."""
    global _installed
    if _installed or not needed():
        return
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import layers

    # its advice to set CUDA_DEVICE_MAX_CONNECTIONS (for overlapping TP all-reduces on a GPU) means
    # nothing on the CPU: counted as given
    layers.linear_with_grad_accumulation_and_async_allreduce.warned = True
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    fused_softmax.get_default_causal_mask = _cpu_causal_mask
    _host_token_counts()
    _uneven_first_dim_on_gloo()
    _installed = True


def define_te_gemm_absent() -> None:
    """`moe_utils.te_general_gemm = None` where Transformer Engine did not define it (7)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _host_token_counts() -> None:
    """The all-to-all dispatcher without its device-to-host stream and event (6)."""
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    def counts_on_host(self, point, tokens_per_expert=None):
        if not self.drop_and_pad and point == self.cuda_dtoh_point:
            for name in ("input_splits", "output_splits", "output_splits_tp"):
                if torch.is_tensor(getattr(self, name)):
                    setattr(self, name, getattr(self, name).numpy())
        return tokens_per_expert

    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = "no stream: the counts are on the host"
    MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = counts_on_host


def _uneven_first_dim_on_gloo() -> None:
    """Uneven first-dimension gathers and reduce-scatters as gloo can do them (8)."""
    from megatron.core.tensor_parallel import mappings

    gather, reduce_scatter = mappings._gather_along_first_dim, \
        mappings._reduce_scatter_along_first_dim

    def gather_uneven(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return gather(input_, group, output_split_sizes, use_global_buffer)
        most = max(output_split_sizes)
        part = input_.new_zeros((most, *input_.shape[1:]))
        part[:input_.shape[0]] = input_
        parts = [torch.empty_like(part) for _ in output_split_sizes]
        torch.distributed.all_gather(parts, part.contiguous(), group=group)
        return torch.cat([p[:n] for p, n in zip(parts, output_split_sizes)])

    def reduce_scatter_uneven(input_, group, input_split_sizes=None, use_global_buffer=False):
        if input_split_sizes is None or group.size() == 1:
            return reduce_scatter(input_, group, input_split_sizes, use_global_buffer)
        whole = input_.contiguous().clone()
        torch.distributed.all_reduce(whole, group=group)
        return torch.split(whole, input_split_sizes, dim=0)[group.rank()].clone()

    mappings._gather_along_first_dim = gather_uneven
    mappings._reduce_scatter_along_first_dim = reduce_scatter_uneven


def seed_model_parallel_rng(seed: int, tp_rank: int = 0, ep_rank: int = 0,
                            etp_rank: int = 0) -> None:
    """`model_parallel_cuda_manual_seed` on a GPU; on CPU the same named states, seeded alike (4)."""
    from megatron.core.tensor_parallel import random as mrandom

    if not needed():
        mrandom.model_parallel_cuda_manual_seed(seed)
        return
    tracker = _cpu_rng_tracker_class()()
    # The names and seeds of model_parallel_cuda_manual_seed: the model-parallel state differs per
    # TP rank (dropout inside a TP region draws different masks on each shard), the experts' per
    # expert-parallel and expert-TP rank (each rank's experts are other weights).
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * ep_rank + etp_rank)
    mrandom._CUDA_RNG_STATE_TRACKER = tracker
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
