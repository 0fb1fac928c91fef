"""Settings of the training side: backend, optimisation, loss, checkpoints."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import ConfigError, flag
from miles.config.parallel import check_parallel_flags
from miles.config.replay_flags import check_replay_flags
from miles.config.tis_flags import check_tis_flags


@dataclass(frozen=True)
class TrainConfig:
    """Training backend, optimiser, loss terms and checkpoints."""

    train_backend: str = flag("fsdp", "training backend", choices=("fsdp", "megatron"))
    actor_num_nodes: int = flag(1, "training nodes", minimum=1)
    actor_num_gpus_per_node: int = flag(1, "training ranks per node (on CPU: training processes)", minimum=1)
    # The ranks' layout: TP x PP x DP = the training ranks (miles/config/parallel.py checks them).
    tensor_model_parallel_size: int = flag(
        1, "tensor parallel ranks per model replica (Megatron only; heads, KV heads and the MLP "
           "size must divide by it)", minimum=1)
    pipeline_model_parallel_size: int = flag(
        1, "pipeline stages per model replica (Megatron only; the layers must divide by it; "
           "1F1B over micro-batches)", minimum=1)
    expert_model_parallel_size: int = flag(
        1, "expert parallel ranks: each holds a slice of every MoE layer's experts and tokens go "
           "to their experts all-to-all (Megatron only, MoE models only; carved out of the data "
           "parallel ranks, which it must divide, as must the experts)", minimum=1)
    sequence_parallel: bool = flag(False, "split activations along the sequence within a TP group "
                                          "(Megatron; needs `--tensor-model-parallel-size` > 1, "
                                          "else refused; a MoE model at TP > 1 needs it; refused "
                                          "with `--use-rollout-routing-replay`)")
    colocate: bool = flag(False, "engines and trainer share devices; weights sync in memory")
    global_batch_size: int | None = flag(None, "samples per optimizer step (default: rollout batch / steps)",
                                         minimum=1)
    micro_batch_size: int = flag(64, "samples per forward/backward", minimum=1)
    num_steps_per_rollout: int = flag(1, "optimizer steps per rollout", minimum=1)
    lr: float = flag(1e-3, "learning rate", minimum=0.0)
    min_lr: float | None = flag(None, "floor of the decayed learning rate (default: a tenth of --lr)", minimum=0.0)
    lr_warmup_iters: int = flag(0, "optimizer steps of linear warm-up", minimum=0)
    lr_decay_style: str = flag("cosine", "learning-rate schedule after warm-up",
                               choices=("constant", "linear", "cosine"))
    lr_decay_iters: int | None = flag(None, "steps over which the LR decays (default: all steps)", minimum=1)
    weight_decay: float = flag(0.0, "AdamW weight decay", minimum=0.0)
    adam_beta1: float = flag(0.9, "AdamW beta1", minimum=0.0, maximum=1.0)
    adam_beta2: float = flag(0.98, "AdamW beta2", minimum=0.0, maximum=1.0)
    clip_grad: float = flag(1.0, "gradient-norm clipping threshold", minimum=0.0)
    eps_clip: float = flag(0.2, "PPO clip range (low side)", minimum=0.0)
    eps_clip_high: float | None = flag(None, "PPO clip range, high side (default: --eps-clip)", minimum=0.0)
    advantage_estimator: str = flag("grpo", "advantage estimator", choices=("grpo", "reinforce_plus_plus"))
    normalize_advantages_std: bool = flag(True, "divide GRPO advantages by the group std")
    use_kl_loss: bool = flag(False, "add a KL loss against the reference model")
    kl_loss_coef: float = flag(0.0, "weight of the KL loss", minimum=0.0)
    kl_loss_type: str = flag("low_var_kl", "KL estimator", choices=("k1", "k2", "k3", "low_var_kl"))
    entropy_coef: float = flag(0.0, "weight of the entropy bonus", minimum=0.0)
    # torch seeds are unsigned 64-bit at most; the data order and the engines' sampling take it too
    seed: int = flag(1234, "random seed for data order, sampling and init", minimum=0, maximum=2**63 - 1)
    run_dir: str | None = flag(None, "run directory: checkpoints, journal, tracker files (default: runs/<time>)")
    save: str | None = flag(None, "checkpoint directory (default: RUN_DIR/checkpoints)")
    load: str | None = flag(None, "checkpoint directory to resume from, or one checkpoint in it (DIR/iter_N); "
                                    "refused when it holds none (default: --save when it holds one)")
    save_interval: int | None = flag(None, "checkpoint every N rollouts (none: only at the end)", minimum=1)
    keep_checkpoints: int = flag(2, "checkpoints kept on disk", minimum=1)
    # Async GRPO (docs/user-guide/training.md#async-training): generation runs ahead of training.
    max_weight_staleness: int = flag(0, "weight versions a sample may lag the policy it trains (0: synchronous); "
                                        "1 or more: a producer generates the next rollouts while training runs, "
                                        "one rollout at a time; needs --use-tis", minimum=0, maximum=64)
    fully_async: bool = flag(False, "the producer overlaps rollouts too: the next rollout's requests start as "
                                    "soon as admitted, while the last one's finish (with --max-weight-staleness "
                                    "0: the synchronous schedule, through the producer)")
    pause_generation_mode: str = flag("in_place", "how an async weight push pauses the engines' in-flight "
                                                  "requests (SGLang /pause_generation modes)",
                                      choices=("in_place", "retract"))
    update_weight_transfer_mode: str = flag(
        "disk", "how weights reach engines that do not share the trainer's devices: disk (an HF "
                "checkpoint each engine loads, /update_weights_from_disk) or broadcast (each "
                "pipeline stage's source rank streams its own layers in buckets over its own gloo "
                "group miles-pp_<stage>, all stages at once: /update_weights_from_distributed; the "
                "engines serve the new version once every stage's last bucket is in; with "
                "--use-fault-tolerance the push also writes the checkpoint relaunched engines load)",
        choices=("disk", "broadcast"))
    update_weight_buffer_size: int = flag(
        512 * 2**20, "bytes per weight-sync bucket with --update-weight-transfer-mode broadcast, "
                     "per pipeline stage's group (a larger tensor goes alone)", minimum=1)
    update_weight_timeout: float = flag(
        300.0, "seconds each collective and engine call of a weight push may wait: a training "
               "rank or engine that died or stopped mid-push fails the push on every rank within "
               "it, naming the phase, the collective and the peer", minimum=1.0)
    use_tis: bool = flag(False, "truncated importance sampling: weight each token's policy loss by "
                                "min(exp(old - rollout log-prob), --tis-clip)")
    tis_clip: float = flag(2.0, "upper clip of the TIS weight", minimum=0.0)
    tis_clip_low: float = flag(0.0, "lower clip of the TIS weight", minimum=0.0)
    # Rollout routing replay (R3, docs/user-guide/training.md#rollout-routing-replay): MoE policies only.
    record_routed_experts: bool = flag(
        True, "on a mixture-of-experts policy, ask the engines for the experts each token was routed "
              "to (return_routed_experts) and log train/r3_mismatch_fraction; a dense policy ignores it")
    use_rollout_routing_replay: bool = flag(
        False, "R3: the trainer routes each rollout token to the experts the engine chose, in its "
               "log-prob and training passes (MoE policies; FSDP, or Megatron with each pipeline "
               "stage replaying its own layers; needs --record-routed-experts)")
    staleness_guard: bool = flag(False, "tighten --max-weight-staleness (down to 0) while train/mismatch_kl, "
                                        "train/ess or train/pg_clipfrac cross their bounds")
    staleness_guard_max_mismatch_kl: float = flag(0.05, "--staleness-guard bound on train/mismatch_kl", minimum=0.0)
    staleness_guard_min_ess: float = flag(0.5, "--staleness-guard bound on train/ess (normalised, 0..1)",
                                          minimum=0.0, maximum=1.0)
    staleness_guard_max_clipfrac: float = flag(0.4, "--staleness-guard bound on train/pg_clipfrac",
                                               minimum=0.0, maximum=1.0)

    @property
    def floor_lr(self) -> float:
        """The decayed learning rate's floor: --min-lr, or a tenth of --lr (so any --lr is valid alone)."""
        return self.min_lr if self.min_lr is not None else self.lr / 10

    def validate(self) -> None:
        check_parallel_flags(self)
        if self.eps_clip_high is not None and self.eps_clip_high < self.eps_clip:
            raise ConfigError("--eps-clip-high", f"must be >= --eps-clip ({self.eps_clip}), got {self.eps_clip_high}")
        if self.min_lr is not None and self.min_lr > self.lr:
            raise ConfigError("--min-lr", f"must be <= --lr ({self.lr}), got {self.min_lr}")
        if self.max_weight_staleness > 0 and not self.use_tis:
            k = self.max_weight_staleness
            raise ConfigError("--max-weight-staleness",
                              f"async training ({k} version{'s' * (k != 1)} stale) needs a loss "
                              "correction against the rollout's log-probs: add --use-tis (and "
                              "--tis-clip, default 2.0); uncorrected async GRPO is refused")
        if self.tis_clip_low > self.tis_clip:
            raise ConfigError("--tis-clip-low", f"must be <= --tis-clip ({self.tis_clip}), got {self.tis_clip_low}")
        check_tis_flags(self)
        check_replay_flags(self)
        if self.update_weight_transfer_mode == "broadcast" and self.colocate:
            raise ConfigError("--update-weight-transfer-mode",
                              "broadcast is for engines on other devices; with --colocate the "
                              "weights sync in memory")
        if self.staleness_guard and self.max_weight_staleness == 0:
            raise ConfigError("--staleness-guard", "tightens --max-weight-staleness; give it 1 or more "
                                                   "(with --use-tis)")
