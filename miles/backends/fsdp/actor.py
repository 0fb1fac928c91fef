"""One FSDP2 training rank (wrapped as a Ray actor by the trainer): the HF model sharded with `fully_shard`.

The PPO pass and its loss normalisation are `miles.backends.ppo.PPORank`; this class supplies the
sharded model and its forward. FSDP averages gradients over ranks in the backward pass
(reduce-scatter), so the shared gradient step has nothing to reduce.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
# torch's FSDP, device mesh and checkpoint state-dict modules load DTensor (a second of CPU): imported where a
# rank uses them, so the driver, which imports this class only to name the Ray actor, never loads them

from miles.backends import hf_weights as W
from miles.backends.base import ActorInfo
from miles.backends.batch import MicroBatch
from miles.backends.fsdp.logprobs import token_stats
from miles.backends.fsdp.weights import gather_full
from miles.backends.logprobs import TokenStats
from miles.backends.ppo import PPORank, load_state_file


class FSDPTrainActor(PPORank):
    collectives_in_passes = True  # per-layer gathers and reduce-scatters: wait after each pass

    # ---- set-up -------------------------------------------------------------------------
    def _init_parallel(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from miles.config.parallel import check_parallel_flags

        # the flags refuse TP/PP here already; a config built without parsing meets the same refusal
        check_parallel_flags(self.config.train)
        self.mesh = init_device_mesh(self.device.type, (self.world_size,))

    def _sharded(self, model_path: str, trainable: bool):
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM

        with W.no_loading_bar():  # the engine's load shows the bar for these weights
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.device)
        # With one rank there is nothing to free between forward and backward: keeping the
        # gathered parameters skips a second all-gather (copy) per layer in the backward pass.
        reshard = self.world_size > 1
        for layer in model.model.layers:
            fully_shard(layer, mesh=self.mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=self.mesh, reshard_after_forward=reshard)
        model.train(trainable)
        model.requires_grad_(trainable)
        return model

    def _build_models(self, model_path: str) -> None:
        self.model = self._sharded(model_path, trainable=True)
        self.tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        self.pad_id = self.model.config.pad_token_id or 0
        self.ref_model = self._sharded(model_path, trainable=False) if self.config.train.use_kl_loss else None

    # ---- training -----------------------------------------------------------------------
    def token_stats(self, model, mb: MicroBatch) -> TokenStats:
        return token_stats(model, mb.input_ids, mb.attention_mask, self.config.rollout.rollout_temperature)

    def _step_backward(self, rows, mbs, old, ref, global_step_size: int, sums) -> None:
        self.step_micro_batches = len(rows)  # megatron scales its router loss by 1 / this
        super()._step_backward(rows, mbs, old, ref, global_step_size, sums)

    def micro_batch_loss(self, stats: TokenStats, mb: MicroBatch, old_log_probs, ref_log_probs,
                         global_step_size: int, sums) -> torch.Tensor:
        """The PPO loss, plus on a MoE policy its routers' load-balancing loss at the model's
        router_aux_loss_coef, as megatron-core adds it (`load_balancing`): the gradient holds it,
        train/loss and the log-probs do not."""
        loss = super().micro_batch_loss(stats, mb, old_log_probs, ref_log_probs, global_step_size,
                                        sums)
        aux = getattr(stats, "load_balancing_loss", None)
        if aux is None:
            return loss
        coef = self.model.config.router_aux_loss_coef
        return loss + coef * aux / self.step_micro_batches

    # ---- weights, checkpoints -----------------------------------------------------------
    def export_weights(self, directory: str | None) -> dict | None:
        state = gather_full(self.model)
        if self.rank != 0:
            return None
        if directory is None:
            return W.drop_tied(state, self.tied)
        W.write_hf_checkpoint(state, Path(directory), self.model_path, self.tied)
        return None

    def weights_digest(self) -> str:
        return W.digest(gather_full(self.model, on_all_ranks=True))

    def save(self, directory: str) -> list[str]:
        """Collective: rank 0 writes model (HF layout), optimizer and scheduler; each rank its RNG."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        out = Path(directory)
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=options)
        return self.save_files(out, model_state, optim_state)

    def load(self, directory: str) -> ActorInfo:
        """Collective: every rank reads the full files (shared storage) and keeps its shard."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        src = Path(directory)
        model_state = W.read_hf_weights(src, self.tied)
        optim_state = load_state_file(src / "optimizer.pt")
        set_state_dict(self.model, self.optimizer, model_state_dict=model_state, optim_state_dict=optim_state,
                       options=StateDictOptions(full_state_dict=True))
        self.load_schedule_and_rng(src)
        dist.barrier()  # the reference model stays the base model: it is never checkpointed
        return self.info()
