"""What every backend's training rank shares: process group, optimizer and schedule, the PPO pass, RNG state.

A backend subclasses `PPORank` and supplies the model (`init`/`load_base`), the forward that
gives a micro-batch's token stats (`token_stats`) and, where its parallelism does not already
average gradients over ranks in the backward pass, that reduction (`reduce_gradients`). Everything that decides the numbers (loss terms, their
normalisation, the metrics) is here once, so the backends take the same step on the same batch.

Loss normalisation: each sample's loss is the mean over its response tokens; a step's loss
is the sum over samples divided by the global step batch, times the data-parallel size, because
gradients are averaged over the data-parallel ranks. One rank or two therefore take the same step.
A backend with its own forward/backward schedule (Megatron's pipeline) runs a step's micro-batches
itself (`_step_backward`) and takes each one's loss from `micro_batch_loss`.
"""
from __future__ import annotations

import math
import os
import pickle
import random
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist

from miles.backends import hf_weights as W
from miles.backends.base import ActorInfo, NonFiniteError, RankBatch, RankTrainResult
from miles.backends.mismatch import MismatchSums, MismatchTally
from miles.backends.batch import MicroBatch, micro_batches
from miles.backends.flops import rank_peak_flops
from miles.backends.logprobs import TokenStats
from miles.backends.rank_memory import rank_memory
from miles.backends.push_deadline import PushWatch
from miles.backends.rank_activity import RankActivity
from miles.backends.rank_phases import RankPhaseRecorder, clock_offset
from miles.backends.loss import approx_kl, importance_weights, mismatch_kl, ppo_clip_loss, sample_ess, sample_mean
from miles.backends.schedule import lr_at
from miles.backends.weight_broadcast import PushStats, RankSender, SendTarget
from miles.moe.capture import RouterCapture
from miles.moe.replay import METRIC as R3_MISMATCH
from miles.moe.replay import RoutingReplay, require_records, require_routers
from miles.run.faults import push_fault, slow_rank
from miles.run.phases import add_phase_hook, timed
from miles.run.stragglers import RankCoords
from miles.profiling.rank import RankProfiler
from miles.profiling.summary import WindowSummary
from miles.profiling.window import ProfileWindow


GROUP_TIMEOUT = timedelta(minutes=30)
# What a weight push's gather is, per backend, for a failed push's message
PUSH_GATHERS = {"fsdp": "all-gather of the FSDP shards (get_model_state_dict)",
                "megatron": "all_gather_object of the TP/PP shards (model-parallel group)"}
# ... and a broadcast push's, where each pipeline stage gathers only its own layers
STAGE_GATHERS = {**PUSH_GATHERS,
                 "megatron": "all_gather_object of the stage's TP shards (tensor-parallel group)"}


def open_master_store(master_addr: str, world_size: int, port: int = 0) -> dist.TCPStore:
    """Rank 0's rendezvous store, by default on a port the OS picks as it binds. A port picked free and bound
    later can be taken in between by any process's outgoing connection: on a busy machine a module's two
    ranks failed with EADDRINUSE that way."""
    return dist.TCPStore(master_addr, port, world_size, is_master=True, timeout=GROUP_TIMEOUT,
                         wait_for_workers=False)


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int,
                       master_store: dist.TCPStore | None = None) -> torch.device:
    """NCCL on this rank's GPU when there is one, else gloo on CPU; returns the device to train on. Every
    rank meets on an explicit store: rank 0 serves `master_store` (opened on `master_port` if not given), the
    others are its clients. (All or none: `init_process_group(store=...)` keys differ from `init_method`'s.)"""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if rank == 0:
        store = master_store or open_master_store(master_addr, world_size, master_port)
    else:
        store = dist.TCPStore(master_addr, master_port, world_size, is_master=False, timeout=GROUP_TIMEOUT)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=world_size,
                            timeout=GROUP_TIMEOUT)
    return device


def build_optimizer(params, cfg) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                             weight_decay=cfg.weight_decay, eps=1e-8, foreach=True)


def build_scheduler(optimizer, config) -> torch.optim.lr_scheduler.LambdaLR:
    """`--lr` scaled by `schedule.lr_at` per optimizer step, over the run's total steps by default."""
    cfg = config.train
    decay = cfg.lr_decay_iters or config.rollout.num_rollout * cfg.num_steps_per_rollout

    def factor(step: int) -> float:
        return lr_at(step, lr=cfg.lr, min_lr=cfg.floor_lr, warmup=cfg.lr_warmup_iters,
                     decay_style=cfg.lr_decay_style, decay_steps=decay) / cfg.lr if cfg.lr else 0.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def seed_rank(seed: int, rank: int) -> None:
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}


def load_state_file(path: Path) -> dict:
    """A checkpoint's .pt file, read with weights_only=True: tensors and plain containers only, so a
    crafted pickle cannot run code (the manifest checks integrity, not who wrote the file)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(f"{path} holds objects other than tensors and plain values (refused by "
                         f"torch.load(weights_only=True)); miles never writes such a file") from None


def squared_norm(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's squared L2 norm as a float64 CPU scalar; a float32 sum of squares that overflows
    (weights of 1e30) is redone scaled by the largest entry, so the result is a number, not inf."""
    t = tensor.detach()
    norm = torch.linalg.vector_norm(t, dtype=torch.float32)
    if not torch.isfinite(norm):
        peak = t.abs().max().double()
        norm = torch.linalg.vector_norm(t.double() / peak) * peak if peak > 0 else norm
    return norm.double().cpu() ** 2


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@dataclass
class SampleLosses:
    """Per-sample (B,) means over the tokens the model wrote (the micro-batch's response mask)."""

    loss: torch.Tensor  # what is minimised: pg - entropy_coef * entropy (+ kl_loss_coef * kl)
    pg: torch.Tensor
    entropy: torch.Tensor
    clipfrac: torch.Tensor
    ppo_kl: torch.Tensor
    kl: torch.Tensor | None  # with --use-kl-loss


def sample_losses(stats: TokenStats, old_log_probs: torch.Tensor, ref_log_probs: torch.Tensor | None,
                  mb: MicroBatch, cfg) -> SampleLosses:
    """The PPO loss terms of one micro-batch. Every term is a masked mean, so a token outside the mask
    (padding, prompt, a tool's observation) changes nothing, whatever its advantage or log-prob."""
    m = mb.response_mask
    eps_high = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    policy = ppo_clip_loss(stats.log_probs, old_log_probs, mb.advantages, cfg.eps_clip, eps_high)
    pg_losses = policy.pg_losses
    if cfg.use_tis:  # weights of constants: no gradient flows through them
        pg_losses = pg_losses * importance_weights(old_log_probs, mb.rollout_log_probs, cfg.tis_clip_low,
                                                   cfg.tis_clip).clipped
    pg = sample_mean(pg_losses, m)
    entropy = sample_mean(stats.entropy, m)
    loss = pg - cfg.entropy_coef * entropy
    kl = None
    if ref_log_probs is not None:
        kl = sample_mean(approx_kl(stats.log_probs, ref_log_probs, cfg.kl_loss_type), m)
        loss = loss + cfg.kl_loss_coef * kl
    return SampleLosses(loss, pg, entropy, sample_mean(policy.clipfrac, m), sample_mean(policy.ppo_kl, m), kl)


def off_policy_metrics(config) -> bool:
    """The importance-weight metrics are reported with --use-tis or async generation (a sync run's journal
    keeps its keys)."""
    t = config.train
    return t.use_tis or t.fully_async or t.max_weight_staleness > 0


class PPORank:
    """One training rank's PPO pass and its set-up; a backend supplies its parallel layout
    (`_init_parallel`), builds its models (`_build_models`, setting the attributes below) and supplies
    `token_stats`."""

    def __init__(self, config, rank: int, world_size: int, num_threads: int = 1):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.data_parallel_size = world_size  # model replicas (set by a model-parallel backend)
        self.num_threads = num_threads
        self.weight_version = 0
        self.optimizer_steps = 0
        self.model = self.ref_model = self.optimizer = self.scheduler = None
        self.device = torch.device("cpu")
        self.model_path: Path | None = None  # the base HF checkpoint: its config files go into every save
        self.tied = False  # tie_word_embeddings: the HF files then hold no lm_head
        self.pad_id = 0
        self.profiler = RankProfiler(rank)
        # this rank's own phase spans and its waits for the others (placed by `init`, see `rank_coords`)
        self.rank_phases = RankPhaseRecorder(RankCoords(0, rank),
                                             slow_rank(config.orchestration.inject_fault, rank))
        add_phase_hook(self.profiler.span)  # this rank's phases are spans of train_overall in a window
        self.replays: dict[int, RoutingReplay] = {}  # id(model) -> its routers' R3 hooks (MoE policies)
        self.r3_sums: dict[str, float] | None = None  # where the log-prob pass adds R3 mismatches

    # ---- set-up -------------------------------------------------------------------------
    def open_store(self, master_addr: str) -> int:
        """Rank 0, before `init`: open the rendezvous store on a port the OS picks; that port, for every rank's
        `init`."""
        self._master_store = open_master_store(master_addr, self.world_size)
        return self._master_store.port

    def init(self, model_path: str, master_addr: str, master_port: int) -> ActorInfo:
        """Join the world (threads, process group), lay out the backend's parallelism, build from the base."""
        torch.set_num_threads(self.num_threads)
        self.device = init_process_group(self.rank, self.world_size, master_addr, master_port,
                                         getattr(self, "_master_store", None))
        self._init_parallel()
        self.rank_phases.coords = self.rank_coords()
        if self.data_parallel_size < self.world_size:  # model parallel: traces name dp/pp/tp
            self.profiler.coords = self.rank_phases.coords
        self.rank_phases.between_passes = self.collectives_in_passes
        self.rank_phases.clock_offset = clock_offset()  # 0 on one host; marks compare on rank 0's clock
        t = self.config.train
        self.push_watch = PushWatch(self.rank, self.world_size, self.rank_phases.coords,
                                    t.update_weight_timeout, t.run_dir,
                                    push_fault(self.config.orchestration.inject_fault, self.rank))
        if t.run_dir is not None and self.world_size > 1:  # whom a hung collective waits for
            RankActivity(self.rank_phases, self.rank, self.world_size, t.run_dir).start()
        return self.load_base(model_path)

    def load_base(self, model_path: str) -> ActorInfo:
        """(Re)build model, reference, optimizer and schedule from an HF checkpoint."""
        seed_rank(self.config.train.seed, self.rank)
        self.model_path = Path(model_path)
        self._build_models(model_path)
        self._attach_replays()
        self.start_optimizer()
        self._attach_router_capture()
        return self.info()

    # ---- what a backend supplies --------------------------------------------------------
    def _init_parallel(self) -> None:
        """The backend's parallel layout, once the process group is up (FSDP's device mesh, Megatron's groups)."""
        raise NotImplementedError

    def _build_models(self, model_path: str) -> None:
        """`model` (and `ref_model` with --use-kl-loss) from the HF checkpoint at `model_path`, with `tied`
        and `pad_id`."""
        raise NotImplementedError

    def token_stats(self, model, mb: MicroBatch) -> TokenStats:
        raise NotImplementedError

    def _attach_replays(self) -> None:
        """R3 hooks on the routers of the policy and reference (`routing_replay_of`; none on a
        dense model); the flag on a dense policy is refused."""
        for replay in self.replays.values():
            replay.detach()
        models = [m for m in (self.model, self.ref_model) if m is not None]
        self.replays = {id(m): r for m in models if (r := self.routing_replay_of(m)) is not None}
        wanted = self.config.train.use_rollout_routing_replay
        require_routers(self.replays.get(id(self.model)), wanted, self.model_path)

    def routing_replay_of(self, model):
        """The R3 hooks of `model`'s routers (transformers' here; a backend with its own modules
        supplies its own), None for a dense model."""
        return RoutingReplay.attach(model)

    @contextmanager
    def replaying_pass(self, model, mbs: list[MicroBatch]) -> Iterator[None]:
        """For a backend whose schedule runs a pass's micro-batches itself: `forward_stats`'s
        routing replay and mismatch count over the whole pass, micro-batches in order."""
        replay = self.replays.get(id(model))
        recorded = all(mb.routed_experts is not None for mb in mbs)
        require_records(self.config.train.use_rollout_routing_replay, replay is not None, recorded)
        if replay is None or not mbs or not recorded:
            yield
            return
        records = [mb.routed_experts for mb in mbs]
        with replay.passing(records, self.config.train.use_rollout_routing_replay):
            yield
        sums = self.r3_sums if model is self.model else None
        # collective at PP > 1: every stage takes this branch in the policy's log-prob pass
        for mb, share in zip(mbs, replay.mismatch_shares() if sums is not None else []):
            share = share[:, :-1].to(mb.response_mask.device)  # aligned with the mask
            sums[R3_MISMATCH] += sample_mean(share, mb.response_mask).sum().item()

    def forward_stats(self, model, mb: MicroBatch) -> TokenStats:
        """`token_stats`, its routers following the engine's record when the batch carries one (and
        replaying it with --use-rollout-routing-replay); in the policy's log-prob pass, adds the
        per-sample share of response (token, layer) routings the trainer's own router chose
        otherwise to `self.r3_sums`."""
        replay = self.replays.get(id(model))
        require_records(self.config.train.use_rollout_routing_replay, replay is not None,
                        mb.routed_experts is not None)
        if replay is None or mb.routed_experts is None:
            return self.token_stats(model, mb)
        with replay.following(mb.routed_experts, self.config.train.use_rollout_routing_replay):
            stats = self.token_stats(model, mb)
        sums = self.r3_sums if model is self.model else None
        if sums is not None:
            # (B, T-1): aligned with the response mask
            differs = replay.mismatch_fraction(mb.input_ids.shape[0])[:, :-1]
            differs = differs.to(mb.response_mask.device)
            sums[R3_MISMATCH] += sample_mean(differs, mb.response_mask).sum().item()
        return stats

    collectives_in_passes = False  # FSDP: forward and backward gather and reduce (rank_phases)

    def rank_coords(self) -> RankCoords:
        """This rank's (node, dp, pp, tp) once `_init_parallel` ran; a backend with model
        parallelism names its own (here every rank is a data-parallel replica)."""
        per_node = self.config.train.actor_num_gpus_per_node
        return RankCoords(node=self.rank // per_node, dp=self.rank)

    def reduce_gradients(self) -> None:
        """Make every rank's gradients the world's average (nothing to do where the backward pass
        already did it, as FSDP's reduce-scatter does)."""

    def _attach_router_capture(self) -> None:
        """The routing statistics of the policy's MoE routers in the training passes (miles.moe
        .capture); a dense policy gets no hooks."""
        if getattr(self, "router_capture", None) is not None:
            self.router_capture.detach()  # a reloaded base: new modules
        own = self.routes_own_tokens()
        self.router_capture = RouterCapture.attach(self.model) if own else None

    def routes_own_tokens(self) -> bool:
        """Whether this rank's routers see tokens no other rank counts (a tensor-parallel peer
        routes the same tokens as its TP rank 0: the backend says so)."""
        return True

    def _expect_routing(self, mbs: list[MicroBatch]) -> None:
        """The routing capture learns this batch's micro-batches (their real tokens)."""
        if getattr(self, "router_capture", None) is not None:
            self.router_capture.expect(mbs)

    # ---- shared -------------------------------------------------------------------------
    def start_optimizer(self) -> None:
        """A fresh AdamW and LR schedule over `self.model`, at step 0 and weight version 0."""
        self.optimizer = build_optimizer(self.model.parameters(), self.config.train)
        self.scheduler = build_scheduler(self.optimizer, self.config)
        self.weight_version = 0
        self.optimizer_steps = 0

    @torch.no_grad()
    def param_norm(self) -> float:
        """Collective on a sharded model. The L2 norm of all the world's weights (identical on every rank), summed
        in float64 so that exploding weights (1e30) give a number, not inf."""
        total = torch.zeros((), dtype=torch.float64)
        sharded = False
        for p in self.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p  # FSDP: this rank's shard of a DTensor
            sharded = sharded or local is not p
            total += squared_norm(local)
        if sharded and dist.is_initialized():
            dist.all_reduce(total)
        return float(total.sqrt())

    def clip_and_step(self) -> float:
        """Reduce and clip this step's gradients, step optimizer and schedule; return the grad norm."""
        rec = self.rank_phases
        rec.arrive("grad_reduce")  # the reduction waits for every rank's backward passes: the others' lateness
        with rec.span("grad_reduce"):
            self.reduce_gradients()
        with rec.span("optimizer"):
            return self._clip_and_apply()

    def _clip_and_apply(self) -> float:
        norm = self.clip_gradients(self.config.train.clip_grad or float("inf"))
        # The norm is of the world's averaged gradients, so every rank refuses the same step together.
        if not math.isfinite(float(norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(f"non-finite gradient norm ({float(norm)}) at optimizer step {self.optimizer_steps}: "
                                 f"the loss, advantages or rewards hold NaN/Inf; the step was not applied")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        return float(norm)

    def clip_gradients(self, limit: float) -> float:
        """The global norm of the reduced gradients (the same on every rank), scaled to `limit`."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), limit)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: a DTensor

    def shutdown(self) -> None:
        """Leave the process group cleanly so the process exits without an abort."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def info(self) -> ActorInfo:
        peak, source = rank_peak_flops(getattr(self, "device", None))
        return ActorInfo(self.rank, self.world_size, self.weight_version, self.optimizer_steps,
                         extra={"pid": os.getpid(), "peak_flops": peak, "peak_source": source})

    # ---- profiling windows (miles.profiling.driver drives these) --------------------------
    def profile_open(self, window: ProfileWindow) -> bool:
        """Arm a profiling window on this rank (False: this rank does not profile)."""
        return self.profiler.open(window)

    def profile_iteration(self, rollout_id: int) -> None:
        """A `train_overall` iteration starts (the previous one ends)."""
        self.profiler.begin("train_overall", rollout_id)

    def profile_span(self, name: str, begin: bool) -> None:
        """A trainer-side phase (rollout, update_weights, checkpoint, eval) starts or ends."""
        if begin:
            self.profiler.enter_span(name)
        else:
            self.profiler.exit_span(name)

    def profile_close(self, end: int | None = None) -> tuple[list[WindowSummary], str | None]:
        """Stop the window (early at `end`): its summaries, and the error (if any) that lost some of it."""
        error, self.profiler.error = self.profiler.error, None
        try:
            return self.profiler.close(end), error
        except Exception as exc:  # disk full, export error: reported by the trainer, training goes on
            return [], f"rank {self.rank}: {type(exc).__name__}: {exc}"

    def push_export(self, directory: str | None, version: int, stage: bool = False) -> dict | None:
        """`export_weights` (with `stage`: `export_stage`) as a weight push's: its gather bounded
        by --update-weight-timeout and recorded for whoever waits on it
        (`miles.backends.push_deadline`)."""
        watch = self.push_watch
        watch.rollout_id = self.rank_phases.rollout_id  # faults aim at the rollout just trained
        gathers = STAGE_GATHERS if stage else PUSH_GATHERS
        gather = gathers.get(self.config.train.train_backend, "gather of the HF weights")
        with watch.collective(version, "weight_gather", gather):
            return self.export_stage() if stage else self.export_weights(directory)

    # ---- broadcast weight sync (--update-weight-transfer-mode broadcast) -------------------
    def weight_source(self) -> tuple[int, int] | None:
        """(stage, stages): this rank sends pipeline stage `stage` of `stages` over its own weight
        update group; None: it sends nothing. One stage here: rank 0 sends everything."""
        return (0, 1) if self.rank == 0 else None

    def export_stage(self) -> dict | None:
        """Collective: the HF tensors this rank sends (`weight_source`), a tied head left out
        (the engine ties it); None on the other ranks."""
        return self.export_weights(None)

    def stage_weights(self, version: int = 0) -> None:
        """Collective (FSDP gathers on every rank; Megatron each stage over its TP group): each
        source rank keeps its stage's HF tensors for `send_weights`."""
        self._sender().stage(self.push_export(None, version, stage=True))

    def send_weights(self, target: SendTarget, version: int) -> tuple[int, PushStats] | None:
        """A source rank streams its staged stage to `target`'s engines in buckets, over its
        stage's group (every stage's source at once): (stage, the send's stats). None: this rank
        sends nothing."""
        source = self.weight_source()
        if source is None:
            return None
        with self.push_watch.working(version, "weight_send", f"send of stage {source[0]} to "
                                     f"the engines over miles-pp_{source[0]}"):
            return source[0], self._sender().send(target.for_stage(*source), version)

    def _sender(self) -> RankSender:
        if getattr(self, "weight_sender", None) is None:
            self.weight_sender = RankSender()
        return self.weight_sender

    def set_weight_version(self, version: int) -> None:
        self.weight_version = version

    @torch.no_grad()
    def _score(self, model, mbs: list[MicroBatch]) -> list[TokenStats]:
        model.eval()
        return [self.forward_stats(model, mb) for mb in mbs]

    def train(self, batch: RankBatch) -> RankTrainResult:
        cfg = self.config.train
        sums: dict[str, float] = defaultdict(float)
        mbs = micro_batches(batch, cfg.micro_batch_size, self.pad_id, self.device)
        self._expect_routing(mbs)  # Megatron's forward has no attention mask to count them by

        times: dict[str, float] = {}
        phases: list[tuple[str, float, float]] = []  # (phase, wall start, wall end) for the run's timeline
        rec = self.rank_phases
        rec.begin(batch.rollout_id)
        with self.profiler.section("train_log_probs", batch.rollout_id):
            with timed("log_probs", times, phases), rec.span("log_probs"):
                self.r3_sums = sums  # the log-prob pass counts routing mismatches
                try:
                    old = self._score(self.model, mbs)
                finally:
                    self.r3_sums = None
            ref = None
            if self.ref_model is not None:
                with timed("ref_log_probs", times, phases), rec.span("ref_log_probs"):
                    ref = self._score(self.ref_model, mbs)
            rec.arrive("log_probs", between_passes=True)  # FSDP: param_norm and the forward gather next
        maxes, mismatch = self._log_prob_sums(mbs, old, ref, sums)

        self.model.train()
        # param_norm after each step and its growth over the step: exploding weights (a learning rate far
        # too high) show here while the loss and grad norm can look ordinary.
        step_values: dict[str, list[float]] = {"train/grad_norm": [], "train/lr": [], "train/param_norm": [],
                                               "train/param_norm_growth": []}
        with self.profiler.section("train_actor", batch.rollout_id), timed("actor_train", times, phases):
            norm_before = self.param_norm()
            for step in range(len(batch.step_sizes)):
                self.optimizer.zero_grad(set_to_none=True)
                rows = [i for i, mb in enumerate(mbs) if mb.step == step]
                self._step_backward(rows, mbs, old, ref, batch.global_step_sizes[step], sums)
                step_values["train/lr"].append(self.optimizer.param_groups[0]["lr"])
                step_values["train/grad_norm"].append(self.clip_and_step())
                norm_after = self.param_norm()
                step_values["train/param_norm"].append(norm_after)
                step_values["train/param_norm_growth"].append(norm_after / norm_before if norm_before > 0 else 1.0)
                norm_before = norm_after
        num_tokens = sum(mb.num_tokens for mb in mbs)
        token_stats = {}
        if batch.return_token_stats:
            with timed("token_stats", times, phases):
                token_stats = response_token_stats(batch, mbs, old)
        return RankTrainResult(dict(sums), step_values, len(batch.tokens), num_tokens, times["log_probs"],
                               times.get("ref_log_probs", 0.0), times["actor_train"], phases, token_stats, maxes,
                               rank_spans=rec.take(),
                               memory=rank_memory(self.model, self.optimizer, self.device),
                               routing=self._take_routing(), mismatch=mismatch)

    def _log_prob_sums(self, mbs: list[MicroBatch], old: list[TokenStats], ref: list[TokenStats] | None,
                       sums) -> tuple[dict[str, float], MismatchSums]:
        """The log-prob pass's per-sample sums (into `sums`), the off-policy maxes and the token sums
        of the train-vs-rollout mismatch (`miles.backends.mismatch`)."""
        cfg = self.config.train
        tally = MismatchTally(cfg.tis_clip_low, cfg.tis_clip, self.device)
        for i, mb in enumerate(mbs):
            m = mb.response_mask
            sums["rollout/log_probs"] += sample_mean(old[i].log_probs, m).sum().item()
            sums["rollout/rollout_log_probs"] += sample_mean(mb.rollout_log_probs, m).sum().item()
            sums["rollout/entropy"] += sample_mean(old[i].entropy, m).sum().item()
            diff = (old[i].log_probs - mb.rollout_log_probs).abs()
            sums["train/train_rollout_logprob_abs_diff"] += sample_mean(diff, m).sum().item()
            if ref is not None:
                sums["rollout/ref_log_probs"] += sample_mean(ref[i].log_probs, m).sum().item()
            tally.add(old[i].log_probs, mb.rollout_log_probs, m, mb.advantages)
        maxes = self._mismatch_metrics(mbs, old, sums) if off_policy_metrics(self.config) else {}
        return maxes, tally.result()

    def _take_routing(self) -> dict:
        """This iteration's routing sums (layer -> LayerRouting); {} on a dense policy."""
        capture = getattr(self, "router_capture", None)
        return capture.take() if capture is not None else {}

    def _mismatch_metrics(self, mbs: list[MicroBatch], old: list[TokenStats], sums) -> dict[str, float]:
        """How far the rollout's policy is from the trained one (async: versions behind): `train/is_weight`
        (mean and max of exp(old - rollout log-prob)), `train/ess` (normalised effective sample size),
        `train/mismatch_kl` and, with --use-tis, `train/tis_clipfrac`. Per-sample means, like the rest."""
        cfg = self.config.train
        peak = 0.0
        for i, mb in enumerate(mbs):
            m = mb.response_mask
            w = importance_weights(old[i].log_probs, mb.rollout_log_probs, cfg.tis_clip_low, cfg.tis_clip)
            sums["train/is_weight"] += sample_mean(w.raw, m).sum().item()
            sums["train/ess"] += sample_ess(w.raw, m).sum().item()
            sums["train/mismatch_kl"] += sample_mean(mismatch_kl(old[i].log_probs, mb.rollout_log_probs), m).sum().item()
            if cfg.use_tis:
                sums["train/tis_clipfrac"] += sample_mean(w.clipfrac, m).sum().item()
            if bool(m.any()):
                peak = max(peak, float(w.raw[m > 0].max()))
        return {"train/is_weight_max": peak}

    def _step_backward(self, rows: list[int], mbs: list[MicroBatch], old: list[TokenStats],
                       ref: list[TokenStats] | None, global_step_size: int, sums) -> None:
        """One optimizer step's forward and backward passes over micro-batches `rows` of `mbs`."""
        rec = self.rank_phases
        for i in rows:
            with rec.span("forward"):
                stats = self.forward_stats(self.model, mbs[i])
                loss = self.micro_batch_loss(stats, mbs[i], old[i].log_probs,
                                             None if ref is None else ref[i].log_probs, global_step_size, sums)
            rec.arrive("forward", between_passes=True)
            with rec.span("backward"):
                loss.backward()
            rec.arrive("backward", between_passes=True)

    def micro_batch_loss(self, stats: TokenStats, mb: MicroBatch, old_log_probs, ref_log_probs,
                         global_step_size: int, sums) -> torch.Tensor:
        """The micro-batch's share of the step's loss (what its backward pass takes); adds its terms
        to `sums`."""
        terms = sample_losses(stats, old_log_probs, ref_log_probs, mb, self.config.train)
        if terms.kl is not None:
            sums["train/kl_loss"] += terms.kl.sum().item()
        sums["train/loss"] += terms.loss.sum().item()
        sums["train/pg_loss"] += terms.pg.sum().item()
        sums["train/entropy_loss"] += terms.entropy.sum().item()
        sums["train/pg_clipfrac"] += terms.clipfrac.sum().item()
        sums["train/ppo_kl"] += terms.ppo_kl.sum().item()
        return terms.loss.sum() * (self.data_parallel_size / global_step_size)

    # ---- checkpoint files, the same for every backend -----------------------------------
    def save_files(self, out: Path, model_state: dict, optim_state: dict) -> list[str]:
        """Collective. Rank 0 writes the full HF-named model and optimizer state (gathered by the
        backend) and the schedule; every rank writes its RNG. Returns the files this rank wrote."""
        written = []
        if self.rank == 0:
            written += W.write_hf_checkpoint(model_state, out, self.model_path, self.tied)
            torch.save(optim_state, out / "optimizer.pt")
            torch.save({"scheduler": self.scheduler.state_dict(), "optimizer_steps": self.optimizer_steps,
                        "weight_version": self.weight_version}, out / "scheduler.pt")
            written += ["optimizer.pt", "scheduler.pt"]
        dist.barrier()  # rank 0 made the directory
        torch.save(rng_state(), out / f"rng_rank{self.rank}.pt")
        written.append(f"rng_rank{self.rank}.pt")
        dist.barrier()
        return written

    def load_schedule_and_rng(self, src: Path) -> None:
        sched = load_state_file(src / "scheduler.pt")
        self.scheduler.load_state_dict(sched["scheduler"])
        self.optimizer_steps, self.weight_version = sched["optimizer_steps"], sched["weight_version"]
        rng_file = src / f"rng_rank{self.rank}.pt"
        if rng_file.exists():  # a checkpoint from a different world size has no file for new ranks
            set_rng_state(load_state_file(rng_file))


def response_token_stats(batch: RankBatch, mbs: list[MicroBatch], stats: list[TokenStats]
                         ) -> dict[int, dict[str, list[float]]]:
    """Each sample's log-probs and entropy on its response tokens, keyed by its rollout index
    (asked for on logged rollouts only: one copy to the CPU per micro-batch)."""
    out = {}
    for mb, st in zip(mbs, stats):
        log_probs, entropy = st.log_probs.detach().cpu(), st.entropy.detach().cpu()
        for r, row in enumerate(mb.rows):
            n_resp = batch.response_lengths[row]
            start = len(batch.tokens[row]) - n_resp - 1  # position t predicts token t+1
            out[batch.sample_indices[row]] = {"log_probs": log_probs[r, start: start + n_resp].tolist(),
                                              "entropy": entropy[r, start: start + n_resp].tolist()}
    return out
