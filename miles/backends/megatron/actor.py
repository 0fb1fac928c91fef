"""One Megatron-core training rank (wrapped as a Ray actor by the trainer): GPTModel, data parallel only.

The PPO pass and its loss normalisation are `miles.backends.ppo.PPORank`, shared with FSDP.
Here: the model is megatron-core's GPTModel (TP = PP = 1, every rank holds all weights), its
forward, and the gradient reduction: after a step's backward passes the gradients are averaged
over the world with one all-reduce (gloo on CPU, NCCL on GPU) before the shared clip and step.
Everything that leaves the rank is in HF names and layout (`convert`): checkpoints, the
optimizer state, exported weights and their digest, so the engines, the trainer's checkpoints
and the FSDP backend read them unchanged.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from miles.backends import hf_weights as W
from miles.backends.base import ActorInfo
from miles.backends.batch import MicroBatch
from miles.backends.logprobs import TokenStats, stats_from_logits
from miles.backends.megatron import convert
from miles.backends.megatron.model import build_gpt, destroy_parallel, init_parallel
from miles.backends.ppo import PPORank, load_state_file

MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's per-parameter tensors, shaped like the parameter


class MegatronTrainActor(PPORank):
    # ---- set-up -------------------------------------------------------------------------
    def _init_parallel(self) -> None:
        init_parallel(self.config.train.seed)

    def _build_models(self, model_path: str) -> None:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(model_path)
        self.layout = convert.Layout.of(hf_config)
        self.tied = self.layout.tied
        self.pad_id = hf_config.pad_token_id or 0
        base = W.read_hf_weights(self.model_path, self.tied)
        self.model = self._build(hf_config, base, trainable=True)
        self.ref_model = self._build(hf_config, base, trainable=False) if self.config.train.use_kl_loss else None
        self.param_names = [name for name, _ in self.model.named_parameters()]  # the optimizer's order

    def _build(self, hf_config, hf_state: dict[str, torch.Tensor], trainable: bool):
        model = build_gpt(hf_config, self.device)
        self._load_hf(model, hf_state)
        model.train(trainable)
        model.requires_grad_(trainable)
        return model

    @torch.no_grad()
    def _load_hf(self, model, hf_state: dict[str, torch.Tensor]) -> None:
        state = convert.hf_to_megatron(hf_state, self.layout)
        params = dict(model.named_parameters())
        if params.keys() != state.keys():
            raise ValueError(f"HF -> Megatron names disagree: model only {sorted(params.keys() - state.keys())}, "
                             f"checkpoint only {sorted(state.keys() - params.keys())}")
        for name, param in params.items():
            param.copy_(state[name])

    # ---- training -----------------------------------------------------------------------
    def token_stats(self, model, mb: MicroBatch) -> TokenStats:
        b, t = mb.input_ids.shape
        positions = torch.arange(t, device=mb.input_ids.device).expand(b, t)
        # Right-padded rows: the causal mask alone is exact for the real tokens (pads come after them).
        logits = model(mb.input_ids, positions, attention_mask=None)  # (B, T, V)
        return stats_from_logits(logits, mb.input_ids, self.config.rollout.rollout_temperature)

    def reduce_gradients(self) -> None:
        """One all-reduce of all gradients (flattened), divided by the world size: gloo has no AVG."""
        if self.world_size == 1:
            return
        params = list(self.model.parameters())
        for p in params:
            if p.grad is None:  # a rank whose micro-batches never reached a parameter still takes part
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(self.world_size)
        for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(averaged)

    # ---- weights, checkpoints -----------------------------------------------------------
    def hf_state(self) -> dict[str, torch.Tensor]:
        """The full model in HF names (every rank holds all of it), on the CPU."""
        return convert.megatron_to_hf({n: p.detach().cpu() for n, p in self.model.named_parameters()}, self.layout)

    def export_weights(self, directory: str | None) -> dict | None:
        if self.rank != 0:
            return None
        if directory is None:
            return W.drop_tied(self.hf_state(), self.tied)
        W.write_hf_checkpoint(self.hf_state(), Path(directory), self.model_path, self.tied)
        return None

    def weights_digest(self) -> str:
        return W.digest(self.hf_state())

    def save(self, directory: str) -> list[str]:
        """Collective: rank 0 writes model (HF layout), optimizer (HF names) and scheduler; each rank its RNG."""
        if self.rank == 0:
            return self.save_files(Path(directory), self.hf_state(), self._hf_optimizer_state())
        return self.save_files(Path(directory), {}, {})

    def load(self, directory: str) -> ActorInfo:
        """Collective: every rank reads the full files (shared storage)."""
        src = Path(directory)
        self._load_hf(self.model, W.read_hf_weights(src, self.tied))
        self.optimizer.load_state_dict(self._megatron_optimizer_state(
            load_state_file(src / "optimizer.pt")))
        self.load_schedule_and_rng(src)
        dist.barrier()  # the reference model stays the base model: it is never checkpointed
        return self.info()

    def _hf_optimizer_state(self) -> dict:
        """torch's AdamW state keyed by HF parameter name, as FSDP's full optimizer state dict is:
        {"state": {hf_name: {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [{..., "params": [hf_name]}]}."""
        saved = self.optimizer.state_dict()
        by_name = {self.param_names[i]: s for i, s in saved["state"].items()}
        hf_names = [n for n in convert.megatron_to_hf(dict(self.model.named_parameters()), self.layout)
                    if not (self.tied and n == convert.OUTPUT[1])]  # HF's parameters(): one tied tensor
        state = {}
        if by_name:
            moments = {key: convert.megatron_to_hf({n: s[key].cpu() for n, s in by_name.items()}, self.layout)
                       for key in MOMENTS}
            for name in hf_names:
                step = by_name[convert.megatron_source(name, self.layout)]["step"]
                state[name] = {"step": step.clone(), **{key: moments[key][name].contiguous() for key in MOMENTS}}
        (group,) = saved["param_groups"]
        return {"state": state, "param_groups": [{**group, "params": hf_names}]}

    def _megatron_optimizer_state(self, hf: dict) -> dict:
        """The inverse of `_hf_optimizer_state`: torch's index-keyed state in this model's parameter order."""
        state = {}
        if hf["state"]:
            moments = {key: convert.hf_to_megatron({n: s[key] for n, s in hf["state"].items()}, self.layout)
                       for key in MOMENTS}
            steps = {convert.megatron_source(n, self.layout): s["step"] for n, s in hf["state"].items()}
            state = {i: {"step": steps[name], **{key: moments[key][name] for key in MOMENTS}}
                     for i, name in enumerate(self.param_names)}
        (group,) = hf["param_groups"]
        return {"state": state, "param_groups": [{**group, "params": list(range(len(self.param_names)))}]}

    def shutdown(self) -> None:
        """Leave megatron's parallel state, then the process group (no abort at exit)."""
        destroy_parallel()
        super().shutdown()
