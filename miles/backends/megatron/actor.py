"""One Megatron-core training rank (wrapped as a Ray actor by the trainer): a TP x PP x DP layout.

The PPO pass and its loss normalisation are `miles.backends.ppo.PPORank`, shared with FSDP.
Here: megatron-core's GPTModel, this rank's pipeline stage and tensor-parallel slice
(`--tensor-model-parallel-size`, `--pipeline-model-parallel-size`; the rest of the world is data
parallel, and a mixture-of-experts model's experts are split over `--expert-model-parallel-size`
of the data parallel ranks, tokens reaching them all-to-all), run through megatron-core's own
schedule (`pipeline`), its log-probs and entropy taken vocab-parallel (`vocab_parallel`), and
the gradient reduction, norms and clipping of a split model (`grads`). The ranks of one
model-parallel group pool the samples the trainer gave them (`replica_batch`) and one of them
(TP rank 0 of the last stage, where the loss is) reports them. Everything that leaves the rank
is in HF names and layout (`gather`): checkpoints, the optimizer state, exported weights and
their digest, so the engines, the trainer's checkpoints and the FSDP backend read them
unchanged, and a checkpoint resumes with any layout.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from miles.backends import hf_weights as W
from miles.backends.base import ActorInfo, RankBatch, RankTrainResult
from miles.backends.batch import MicroBatch
from miles.backends.logprobs import TokenStats
from miles.backends.megatron import convert, gather, grads, pipeline, replica_batch
from miles.backends.megatron.model import build_gpt, destroy_parallel, init_parallel, parallel_state
from miles.backends.megatron.vocab_parallel import stats_from_vocab_shard
from miles.backends.ppo import PPORank, load_state_file
from miles.run.stragglers import RankCoords

MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's per-parameter tensors, shaped like the parameter


class MegatronTrainActor(PPORank):
    # ---- set-up -------------------------------------------------------------------------
    def _init_parallel(self) -> None:
        train = self.config.train
        tp, pp = train.tensor_model_parallel_size, train.pipeline_model_parallel_size
        ep = train.expert_model_parallel_size
        if self.world_size % (tp * pp * ep):
            raise ValueError(f"{self.world_size} training ranks do not split into "
                             f"--tensor-model-parallel-size {tp} x "
                             f"--pipeline-model-parallel-size {pp} x "
                             f"--expert-model-parallel-size {ep}")
        init_parallel(self.config.train.seed, tp, pp, ep)
        self.ps = parallel_state()
        self.par = convert.Parallel(tp, self.ps.get_tensor_model_parallel_rank(), pp,
                                    self.ps.get_pipeline_model_parallel_rank(), ep,
                                    self.ps.get_expert_model_parallel_rank())
        self.data_parallel_size = self.ps.get_data_parallel_world_size()
        # The ranks whose shards make one whole model: the first replica's, or with EP > 1 those
        # holding each expert once (the EP group spans data parallel ranks; at EP = 1 the same)
        self.first_replica = self.ps.get_expert_data_parallel_rank() == 0
        self.reports = self.par.tp_rank == 0 and self.par.last_stage  # where the loss is computed

    def layout_name(self) -> str:
        experts = f" (EP={self.par.ep_size})" if self.par.ep_size > 1 else ""
        return (f"TP={self.par.tp_size} x PP={self.par.pp_size} x DP={self.data_parallel_size}"
                + experts)

    def info(self) -> ActorInfo:
        """With this rank's place in the layout (`extra["parallel"]`: tp, pp, dp coordinates)."""
        info = super().info()
        if getattr(self, "par", None) is not None:
            info.extra["parallel"] = {"tp_rank": self.par.tp_rank, "pp_rank": self.par.pp_rank,
                                      "dp_rank": self.ps.get_data_parallel_rank(),
                                      "tp_size": self.par.tp_size, "pp_size": self.par.pp_size,
                                      "ep_rank": self.par.ep_rank, "ep_size": self.par.ep_size,
                                      "layout": self.layout_name()}
        return info

    def rank_coords(self) -> RankCoords:
        """This rank's node and its data-parallel, pipeline and tensor-parallel indices (phase
        spans, straggler metrics and profiler traces name the rank by them)."""
        per_node = self.config.train.actor_num_gpus_per_node
        return RankCoords(node=self.rank // per_node, dp=self.ps.get_data_parallel_rank(),
                          pp=self.par.pp_rank, tp=self.par.tp_rank)

    def _build_models(self, model_path: str) -> None:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(model_path)
        self.layout = convert.Layout.of(hf_config)
        ffn = hf_config.moe_intermediate_size if self.layout.num_experts else \
            hf_config.intermediate_size
        convert.check_tp_divides(self.layout, self.par.tp_size, ffn)
        convert.local_experts(self.layout, self.par.ep_size)  # raises unless EP splits the experts
        # raises unless the layers split evenly over the stages
        convert.stage_layers(self.layout.num_layers, self.par.pp_size, self.par.pp_rank)
        self.tied = self.layout.tied
        self.pad_id = hf_config.pad_token_id or 0
        self.padded_vocab = convert.padded_vocab(hf_config.vocab_size, self.par.tp_size)
        base = self._read_hf(self.model_path)
        self.model = self._build(hf_config, base, trainable=True)
        self.ref_model = self._build(hf_config, base, trainable=False) if self.config.train.use_kl_loss else None
        self.param_names = [name for name, _ in self.model.named_parameters()]  # the optimizer's order

    def routes_own_tokens(self) -> bool:
        """TP peers route the same tokens (no sequence parallelism): TP rank 0 counts them for
        its pipeline stage's layers. With sequence parallel each TP rank routes its own chunk of
        the (padded) sequence, which the routing capture cannot count yet: no rank counts."""
        return self.par.tp_rank == 0 and not self.config.train.sequence_parallel

    def routing_replay_of(self, model):
        """megatron-core's RouterReplay on each router of an MoE model (R3): this stage's layers,
        their mismatches added over the pipeline group. None with sequence parallel: each TP
        rank's routers see their own chunk of the sequence, which the records are not cut for
        (--use-rollout-routing-replay is refused there; no r3_mismatch_fraction is logged)."""
        from miles.moe.megatron_replay import MegatronRoutingReplay

        if self.config.train.sequence_parallel:
            return None
        group = self.ps.get_pipeline_model_parallel_group() if self.par.pp_size > 1 else None
        return MegatronRoutingReplay.attach(model, self.layout.num_layers, group)

    def _build(self, hf_config, hf_state: dict[str, torch.Tensor], trainable: bool):
        model = build_gpt(hf_config, self.device, self.padded_vocab,
                          self.config.train.sequence_parallel)
        self._load_hf(model, hf_state)
        model.train(trainable)
        model.requires_grad_(trainable)
        return model

    def _read_hf(self, directory) -> dict[str, torch.Tensor]:
        """An HF checkpoint in the in-memory names (a MoE's per-expert files fused)."""
        return convert.fuse_expert_files(W.read_hf_weights(Path(directory), self.tied),
                                         self.layout)

    @torch.no_grad()
    def _load_hf(self, model, hf_state: dict[str, torch.Tensor]) -> None:
        state = convert.hf_to_megatron_shard(hf_state, self.layout, self.par)
        params = dict(model.named_parameters())
        if params.keys() != state.keys():
            raise ValueError(f"HF -> Megatron names disagree: model only {sorted(params.keys() - state.keys())}, "
                             f"checkpoint only {sorted(state.keys() - params.keys())}")
        for name, param in params.items():
            param.copy_(state[name])

    # ---- training -----------------------------------------------------------------------
    def train(self, batch: RankBatch) -> RankTrainResult:
        """Train on the model-parallel group's pooled samples; only the reporting member returns
        metric sums."""
        members = gather.gather_objects(batch, self.ps.get_model_parallel_group())
        pooled = replica_batch.merge(members)
        result = super().train(pooled)
        if self.reports:
            return result
        return dataclasses.replace(result, sums={}, num_samples=0, num_tokens=0, token_stats={},
                                   maxes={}, mismatch=None)

    def _stats(self, logits: torch.Tensor, mb: MicroBatch) -> TokenStats:
        """Log-probs and entropy from this rank's vocabulary slice of the logits."""
        local = logits.shape[-1]
        group = self.ps.get_tensor_model_parallel_group() if self.par.tp_size > 1 else None
        return stats_from_vocab_shard(logits, mb.input_ids, self.config.rollout.rollout_temperature,
                                      self.par.tp_rank * local, self.layout.vocab_size, group)

    def token_stats(self, model, mb: MicroBatch) -> TokenStats:
        """One micro-batch straight through the model (a single pipeline stage only)."""
        if self.par.pp_size > 1:
            raise RuntimeError("token_stats needs the whole model on one rank; at PP > 1 the "
                               "schedule runs it")
        return self._stats(pipeline.forward(model, mb), mb)

    @torch.no_grad()
    def _score(self, model, mbs: list[MicroBatch]) -> list[TokenStats]:
        """Forward-only through the schedule; the last stage's stats reach every stage."""
        model.eval()
        stats: list[TokenStats | None] = [None] * len(mbs)

        def keep(k: int, logits: torch.Tensor) -> torch.Tensor:
            stats[k] = self._stats(logits, mbs[k])
            return logits.new_zeros(())

        with self.replaying_pass(model, mbs):
            pipeline.run(model, mbs, keep, forward_only=True)
        if self.par.pp_size == 1:
            return stats
        return pipeline.broadcast_stats(stats, mbs, self.ps.get_pipeline_model_parallel_last_rank(),
                                        self.ps.get_pipeline_model_parallel_group())

    def _step_backward(self, rows: list[int], mbs: list[MicroBatch], old: list[TokenStats],
                       ref: list[TokenStats] | None, global_step_size: int, sums) -> None:
        def loss(k: int, logits: torch.Tensor) -> torch.Tensor:
            i = rows[k]
            ref_log_probs = None if ref is None else ref[i].log_probs
            return self.micro_batch_loss(self._stats(logits, mbs[i]), mbs[i], old[i].log_probs,
                                         ref_log_probs, global_step_size, sums)

        with self.replaying_pass(self.model, [mbs[i] for i in rows]):
            pipeline.run(self.model, [mbs[i] for i in rows], loss, forward_only=False,
                         rec=self.rank_phases)

    def reduce_gradients(self) -> None:
        grads.reduce_gradients(self.model, self.ps)

    def clip_gradients(self, limit: float) -> float:
        return grads.clip(self.model, limit, self.ps)

    @torch.no_grad()
    def param_norm(self) -> float:
        dense, experts = grads.split_experts(self.model, lambda p: p)
        return grads.model_norm(dense, self.ps, experts)

    # ---- weights, checkpoints -----------------------------------------------------------
    def _gather_hf(self, local: dict[str, torch.Tensor],
                   to_first: bool = False) -> dict[str, torch.Tensor] | None:
        ep_group = self.ps.get_expert_model_parallel_group() if self.par.ep_size > 1 else None
        return gather.gather_hf(local, self.layout, self.par, self.ps.get_model_parallel_group(),
                                ep_group, to_first)

    def hf_state(self, to_first: bool = False) -> dict[str, torch.Tensor] | None:
        """Collective over the model-parallel group: the replica's whole model in HF names (CPU),
        on every member, or with `to_first` on the group's first member only (None elsewhere)."""
        local = {n: p.detach().cpu() for n, p in self.model.named_parameters()}
        return self._gather_hf(local, to_first)

    def export_weights(self, directory: str | None) -> dict | None:
        if not self.first_replica:
            return None
        state = self.hf_state(to_first=True)  # rank 0 is its group's first member
        if self.rank != 0:
            return None
        if directory is None:
            return W.drop_tied(state, self.tied)
        W.write_hf_checkpoint(state, Path(directory), self.model_path, self.tied)
        return None

    def weight_source(self) -> tuple[int, int] | None:
        """Each pipeline stage's source rank (TP rank 0 of the first data-parallel replica; with
        EP the experts are pooled there first) sends that stage over its own group."""
        if self.first_replica and self.ps.get_data_parallel_rank() == 0 and self.par.tp_rank == 0:
            return self.par.pp_rank, self.par.pp_size
        return None

    def export_stage(self) -> dict | None:
        """Collective over each stage's TP group (EP group first): the source rank's stage in HF
        names and layout, nothing of the other stages gathered."""
        if not self.first_replica:
            return None
        ep_group = self.ps.get_expert_model_parallel_group() if self.par.ep_size > 1 else None
        local = {n: p.detach().cpu() for n, p in self.model.named_parameters()}
        state = gather.gather_stage_hf(local, self.layout, self.par,
                                       self.ps.get_tensor_model_parallel_group(), ep_group)
        return state if self.weight_source() is not None else None

    def weights_digest(self) -> str:
        """Each replica's own digest (its group gathers its shards): equal replicas, equal
        digests."""
        return W.digest(self.hf_state())

    def save(self, directory: str) -> list[str]:
        """Collective: rank 0 writes model (HF layout), optimizer (HF names) and scheduler; each rank its RNG."""
        if self.first_replica:
            model, optim = self.hf_state(to_first=True), self._hf_optimizer_state(to_first=True)
            if self.rank == 0:
                return self.save_files(Path(directory), model, optim)
        return self.save_files(Path(directory), {}, {})

    def load(self, directory: str) -> ActorInfo:
        """Collective: every rank reads the full files (shared storage) and cuts its own shards."""
        src = Path(directory)
        self._load_hf(self.model, self._read_hf(src))
        optim = load_state_file(src / "optimizer.pt")
        self.optimizer.load_state_dict(self._megatron_optimizer_state(optim))
        self.load_schedule_and_rng(src)
        dist.barrier()  # the reference model stays the base model: it is never checkpointed
        return self.info()

    def _hf_optimizer_state(self, to_first: bool = False) -> dict:
        """Collective over the model-parallel group. torch's AdamW state keyed by HF parameter name,
        as FSDP's full optimizer state dict is:
        {"state": {hf_name: {"step", "exp_avg", "exp_avg_sq"}},
         "param_groups": [{..., "params": [hf_name]}]}."""
        saved = self.optimizer.state_dict()
        by_name = {self.param_names[i]: s for i, s in saved["state"].items()}
        hf_names = self._hf_param_names()
        steps = {}
        mine = {gather.global_name(n, self.layout, self.par): s["step"] for n, s in by_name.items()}
        for part in gather.gather_objects(mine, self.ps.get_model_parallel_group()):
            steps.update(part)
        if self.par.ep_size > 1:  # the other EP ranks' experts
            for part in gather.gather_objects(steps, self.ps.get_expert_model_parallel_group()):
                steps.update(part)
        state = {}
        if by_name:
            moments = {key: self._gather_hf({n: s[key].cpu() for n, s in by_name.items()}, to_first)
                       for key in MOMENTS}
            for name in hf_names if moments[MOMENTS[0]] is not None else ():  # None: not the writer
                step = steps[convert.megatron_source(name, self.layout)]
                state[name] = {"step": step.clone(), **{key: moments[key][name].contiguous() for key in MOMENTS}}
        (group,) = saved["param_groups"]
        return {"state": state, "param_groups": [{**group, "params": hf_names}]}

    def _hf_param_names(self) -> list[str]:
        """HF's `parameters()` names in `convert.megatron_to_hf`'s order (tied: no lm_head)."""
        names = [convert.EMBED[1], convert.FINAL_NORM[1]]
        names += [] if self.tied else [convert.OUTPUT[1]]
        per_layer = self.layout.hf_layer_names()
        layers = range(self.layout.num_layers)
        return names + [f"model.layers.{i}.{n}" for i in layers for n in per_layer]

    def _megatron_optimizer_state(self, hf: dict) -> dict:
        """The inverse of `_hf_optimizer_state`: torch's index-keyed state in this rank's parameter
        order, its moments cut from the HF-named ones for this rank's layout (whatever layout
        saved them)."""
        state = {}
        if hf["state"]:
            named = {key: {n: s[key] for n, s in hf["state"].items()} for key in MOMENTS}
            moments = {key: convert.hf_to_megatron_shard(named[key], self.layout, self.par)
                       for key in MOMENTS}
            steps = {convert.megatron_source(n, self.layout): s["step"] for n, s in hf["state"].items()}
            for i, name in enumerate(self.param_names):
                source = gather.global_name(name, self.layout, self.par)
                if self.tied and source == convert.OUTPUT[0]:  # the last stage's embedding copy
                    source = convert.EMBED[0]
                source = convert.fused_source(source)  # an expert: its fused HF tensor's step
                # a copy each: AdamW adds 1 to every parameter's step tensor in place, and the
                # experts of one fused HF tensor share its step
                state[i] = {"step": steps[source].clone(),
                            **{key: moments[key][name] for key in MOMENTS}}
        (group,) = hf["param_groups"]
        return {"state": state, "param_groups": [{**group, "params": list(range(len(self.param_names)))}]}

    def shutdown(self) -> None:
        """Leave megatron's parallel state, then the process group (no abort at exit)."""
        destroy_parallel()
        super().shutdown()
