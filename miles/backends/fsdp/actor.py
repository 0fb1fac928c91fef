"""One FSDP2 training rank (wrapped as a Ray actor by the trainer): log-probs, PPO steps, save/load.

Loss normalisation: each sample's loss is the mean over its response tokens; a step's
loss is the sum over samples divided by the global step batch, times the world size,
because FSDP averages gradients over ranks. One rank or two therefore take the same step.
"""
from __future__ import annotations

import os
import random
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from miles.backends.base import ActorInfo, RankBatch, RankTrainResult
from miles.backends.fsdp import weights as W
from miles.backends.fsdp.batch import MicroBatch, micro_batches
from miles.backends.fsdp.logprobs import token_stats
from miles.backends.loss import approx_kl, ppo_clip_loss, sample_mean
from miles.backends.schedule import lr_at


class FSDPTrainActor:
    def __init__(self, config, rank: int, world_size: int, num_threads: int = 1):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.num_threads = num_threads
        self.weight_version = 0
        self.model = self.ref_model = self.optimizer = self.scheduler = None

    # ---- set-up -------------------------------------------------------------------------
    def init(self, model_path: str, master_addr: str, master_port: int) -> ActorInfo:
        torch.set_num_threads(self.num_threads)
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", self.rank % torch.cuda.device_count())))
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{master_addr}:{master_port}",
                                rank=self.rank, world_size=self.world_size, timeout=timedelta(minutes=30))
        self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        return self.load_base(model_path)

    def _sharded(self, model_path: str, trainable: bool):
        from transformers import AutoModelForCausalLM

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

    def load_base(self, model_path: str) -> ActorInfo:
        """(Re)build model, reference, optimizer and schedule from an HF checkpoint."""
        cfg = self.config.train
        torch.manual_seed(cfg.seed + self.rank)
        random.seed(cfg.seed + self.rank)
        self.model_path = Path(model_path)
        self.model = self._sharded(model_path, trainable=True)
        self.tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        self.pad_id = self.model.config.pad_token_id or 0
        self.ref_model = self._sharded(model_path, trainable=False) if cfg.use_kl_loss else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                           weight_decay=cfg.weight_decay, eps=1e-8, foreach=True)
        total = self.config.rollout.num_rollout * self.config.train.num_steps_per_rollout
        decay = cfg.lr_decay_iters or total

        def factor(step: int) -> float:
            return lr_at(step, lr=cfg.lr, min_lr=cfg.min_lr, warmup=cfg.lr_warmup_iters,
                         decay_style=cfg.lr_decay_style, decay_steps=decay) / cfg.lr if cfg.lr else 0.0

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.weight_version = 0
        self.optimizer_steps = 0
        return self.info()

    def info(self) -> ActorInfo:
        return ActorInfo(self.rank, self.world_size, self.weight_version, self.optimizer_steps)

    def set_weight_version(self, version: int) -> None:
        self.weight_version = version

    # ---- training -----------------------------------------------------------------------
    @torch.no_grad()
    def _score(self, model, mbs: list[MicroBatch]) -> list:
        model.eval()
        return [token_stats(model, mb.input_ids, mb.attention_mask, self.config.rollout.rollout_temperature)
                for mb in mbs]

    def train(self, batch: RankBatch) -> RankTrainResult:
        cfg = self.config.train
        sums: dict[str, float] = defaultdict(float)
        mbs = micro_batches(batch, cfg.micro_batch_size, self.pad_id, self.device)

        t0 = time.perf_counter()
        old = self._score(self.model, mbs)
        log_probs_time = time.perf_counter() - t0
        t1 = time.perf_counter()
        ref = self._score(self.ref_model, mbs) if self.ref_model is not None else None
        ref_time = time.perf_counter() - t1
        for i, mb in enumerate(mbs):
            m = mb.response_mask
            sums["rollout/log_probs"] += sample_mean(old[i].log_probs, m).sum().item()
            sums["rollout/rollout_log_probs"] += sample_mean(mb.rollout_log_probs, m).sum().item()
            sums["rollout/entropy"] += sample_mean(old[i].entropy, m).sum().item()
            diff = (old[i].log_probs - mb.rollout_log_probs).abs()
            sums["train/train_rollout_logprob_abs_diff"] += sample_mean(diff, m).sum().item()
            if ref is not None:
                sums["rollout/ref_log_probs"] += sample_mean(ref[i].log_probs, m).sum().item()

        t2 = time.perf_counter()
        self.model.train()
        step_values: dict[str, list[float]] = {"train/grad_norm": [], "train/lr": []}
        for step in range(len(batch.step_sizes)):
            self.optimizer.zero_grad(set_to_none=True)
            for i, mb in enumerate(mbs):
                if mb.step == step:
                    self._backward(mb, old[i].log_probs, None if ref is None else ref[i].log_probs,
                                   batch.global_step_sizes[step], sums)
            step_values["train/lr"].append(self.optimizer.param_groups[0]["lr"])
            step_values["train/grad_norm"].append(self._clip_and_step())
        actor_train_time = time.perf_counter() - t2
        num_tokens = sum(mb.num_tokens for mb in mbs)
        return RankTrainResult(dict(sums), step_values, len(batch.tokens), num_tokens, log_probs_time, ref_time,
                               actor_train_time)

    def _backward(self, mb: MicroBatch, old_log_probs, ref_log_probs, global_step_size: int, sums) -> None:
        cfg = self.config.train
        m = mb.response_mask
        stats = token_stats(self.model, mb.input_ids, mb.attention_mask, self.config.rollout.rollout_temperature)
        eps_high = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
        policy = ppo_clip_loss(stats.log_probs, old_log_probs, mb.advantages, cfg.eps_clip, eps_high)
        pg = sample_mean(policy.pg_losses, m)  # (B,)
        entropy = sample_mean(stats.entropy, m)
        per_sample = pg - cfg.entropy_coef * entropy
        if ref_log_probs is not None:
            kl = sample_mean(approx_kl(stats.log_probs, ref_log_probs, cfg.kl_loss_type), m)
            per_sample = per_sample + cfg.kl_loss_coef * kl
            sums["train/kl_loss"] += kl.sum().item()
        (per_sample.sum() * (self.world_size / global_step_size)).backward()
        sums["train/loss"] += per_sample.sum().item()
        sums["train/pg_loss"] += pg.sum().item()
        sums["train/entropy_loss"] += entropy.sum().item()
        sums["train/pg_clipfrac"] += sample_mean(policy.clipfrac, m).sum().item()
        sums["train/ppo_kl"] += sample_mean(policy.ppo_kl, m).sum().item()

    def _clip_and_step(self) -> float:
        limit = self.config.train.clip_grad or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), limit)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        return float(norm)

    # ---- weights, checkpoints -----------------------------------------------------------
    def export_weights(self, directory: str | None) -> dict | None:
        state = W.gather_full(self.model)
        if self.rank != 0:
            return None
        if directory is None:
            return W.drop_tied(state, self.tied)
        W.write_hf_checkpoint(state, Path(directory), self.model_path, self.tied)
        return None

    def weights_digest(self) -> str:
        return W.digest(W.gather_full(self.model, on_all_ranks=True))

    def save(self, directory: str) -> list[str]:
        """Collective: rank 0 writes model (HF layout), optimizer and scheduler; each rank its RNG."""
        out = Path(directory)
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=options)
        written = []
        if self.rank == 0:
            written += W.write_hf_checkpoint(model_state, out, self.model_path, self.tied)
            torch.save(optim_state, out / "optimizer.pt")
            torch.save({"scheduler": self.scheduler.state_dict(), "optimizer_steps": self.optimizer_steps,
                        "weight_version": self.weight_version}, out / "scheduler.pt")
            written += ["optimizer.pt", "scheduler.pt"]
        dist.barrier()  # rank 0 made the directory
        rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
               "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}
        torch.save(rng, out / f"rng_rank{self.rank}.pt")
        written.append(f"rng_rank{self.rank}.pt")
        dist.barrier()
        return written

    def load(self, directory: str) -> ActorInfo:
        """Collective: every rank reads the full files (shared storage) and keeps its shard."""
        src = Path(directory)
        model_state = W.read_hf_weights(src, self.tied)
        optim_state = torch.load(src / "optimizer.pt", weights_only=False)
        set_state_dict(self.model, self.optimizer, model_state_dict=model_state, optim_state_dict=optim_state,
                       options=StateDictOptions(full_state_dict=True))
        sched = torch.load(src / "scheduler.pt", weights_only=False)
        self.scheduler.load_state_dict(sched["scheduler"])
        self.optimizer_steps, self.weight_version = sched["optimizer_steps"], sched["weight_version"]
        rng_file = src / f"rng_rank{self.rank}.pt"
        if rng_file.exists():  # a checkpoint from a different world size has no file for new ranks
            rng = torch.load(rng_file, weights_only=False)
            torch.set_rng_state(rng["torch"])
            random.setstate(rng["python"])
            if rng["cuda"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state(rng["cuda"])
        dist.barrier()  # the reference model stays the base model: it is never checkpointed
        return self.info()

    def shutdown(self) -> None:
        """Leave the process group cleanly so the process exits without an abort."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
