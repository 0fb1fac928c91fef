"""Settings of the health watch: the "What to watch" detectors' windows and thresholds, and the reaction."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import ConfigError, flag


@dataclass(frozen=True)
class HealthConfig:
    """Health watch: red flags of the "What to watch" signals, live and in `miles doctor RUN_DIR`."""

    health_watch: str = flag("on", "evaluate the red-flag detectors every iteration", choices=("on", "off"))
    on_red_flag: str = flag("warn", "what a red flag does: warn (log, metric, alert), stop (checkpoint and end "
                                    "the run as failed), profile (open a profiler window for the next rollouts)",
                            choices=("warn", "stop", "profile"))
    health_profile_rollouts: int = flag(2, "--on-red-flag profile: how many rollouts after the flag to profile "
                                           "(--profile-target, --profile-ranks)", minimum=1)
    health_alert_interval: float = flag(300.0, "seconds between two wandb alerts of one signal", minimum=0.0)

    health_loss_window: int = flag(20, "loss: rollouts of history its spike is measured against", minimum=3)
    health_loss_spike_mads: float = flag(25.0, "loss: a red flag this many MADs from the window's median", minimum=1.0)

    health_raw_reward_window: int = flag(5, "raw_reward: rollouts the saturation is judged over", minimum=2)
    health_raw_reward_min_std: float = flag(0.02, "raw_reward: saturated when every rollout of the window has an "
                                                  "across-sample std below this", minimum=0.0)
    health_raw_reward_max_range: float = flag(0.05, "raw_reward: ... and its mean moved less than this", minimum=0.0)
    health_raw_reward_zero_std_share: float = flag(
        0.95, "raw_reward: red flag when this share of reward groups has zero std over the whole window",
        minimum=0.0, maximum=1.0)

    health_kl_loss_window: int = flag(10, "kl_loss: rollouts of trend a jump is measured against", minimum=3)
    health_kl_loss_jump: float = flag(5.0, "kl_loss: a red flag at this many times the window's median, "
                                           "and above --health-kl-loss-floor", minimum=1.0)
    health_kl_loss_floor: float = flag(0.01, "kl_loss: values below this never count as a jump", minimum=0.0)

    health_logprob_diff_window: int = flag(20, "train_rollout_logprob_abs_diff: rollouts of its trend", minimum=3)
    health_logprob_diff_growth: float = flag(
        3.0, "train_rollout_logprob_abs_diff: red flag when the window's last quarter is this many times its first "
             "and rises in most steps", minimum=1.0)
    health_logprob_diff_floor: float = flag(0.01, "train_rollout_logprob_abs_diff: a climb below this is noise",
                                            minimum=0.0)
    health_logprob_diff_ceiling: float = flag(0.5, "train_rollout_logprob_abs_diff: red flag at or above this",
                                              minimum=0.0)

    health_entropy_loss_window: int = flag(10, "entropy_loss: rollouts over which a fall counts as fast", minimum=1)
    health_entropy_loss_min_ratio: float = flag(
        0.25, "entropy_loss: red flag when it falls below this share of its highest value in the window before",
        minimum=0.0, maximum=1.0)
    health_entropy_loss_floor: float = flag(0.05, "entropy_loss: red flag at or below this (collapsed)", minimum=0.0)

    health_grad_norm_window: int = flag(20, "grad_norm: rollouts of the clip share", minimum=1)
    health_grad_norm_clip_share: float = flag(1.0, "grad_norm: red flag when this share of the window is at or "
                                                   "above --clip-grad", minimum=0.0, maximum=1.0)

    health_time_window: int = flag(5, "rollout_time / train_time: rollouts the imbalance must last", minimum=1)
    health_time_ratio: float = flag(50.0, "rollout_time / train_time: warning when one is this many times the other "
                                          "for the whole window", minimum=1.0)

    health_pg_clipfrac_warn: float = flag(0.2, "pg_clipfrac: warning above this", minimum=0.0, maximum=1.0)
    health_pg_clipfrac_red: float = flag(0.5, "pg_clipfrac: red flag above this (drop the LR)", minimum=0.0,
                                         maximum=1.0)

    health_stall_factor: float = flag(10.0, "liveness: red flag when an iteration takes this many times the median "
                                           "of the ones before", minimum=1.0)
    health_stall_min_s: float = flag(300.0, "liveness: ... and at least this many seconds longer", minimum=0.0)
    health_stall_check_interval: float = flag(
        10.0, "liveness: seconds between two checks of the phase open now against its median (the same factor "
              "and minimum): a hang is flagged while it lasts, the diagnose bundle written once; 0: off",
        minimum=0.0)
    health_router_error_share: float = flag(0.05, "liveness: red flag when this share of a rollout's router "
                                                  "requests failed, were retried or found no worker",
                                            minimum=0.0, maximum=1.0)
    health_engine_flap_restarts: int = flag(3, "liveness: red flag when engines were relaunched this many times "
                                                 "within --health-engine-flap-window rollouts (one restart: a "
                                                 "warning)", minimum=1)
    health_engine_flap_window: int = flag(10, "liveness: rollouts over which engine restarts are counted", minimum=1)
    health_abort_storm_share: float = flag(0.2, "abort_storm: red flag when this share of a rollout's samples was "
                                                "aborted by the engines (warning from half of it)",
                                           minimum=0.0, maximum=1.0)
    health_degenerate_groups_share: float = flag(
        0.9, "degenerate_groups: flagged when this share of a rollout's reward groups has zero advantage variance "
             "(no GRPO signal): a warning for one rollout, red once it held for --health-degenerate-groups-window",
        minimum=0.0, maximum=1.0)
    health_degenerate_groups_window: int = flag(3, "degenerate_groups: rollouts in a row the share must hold for a "
                                                   "red flag", minimum=1)
    health_truncated_ratio: float = flag(0.5, "liveness: red flag when this share of samples was truncated "
                                              "(warning from half of it)", minimum=0.0, maximum=1.0)
    health_param_norm_growth: float = flag(10.0, "param_norm: red flag when the weights' norm grows by this factor "
                                                 "in one iteration (weights exploding: learning rate too high)",
                                           minimum=1.0)

    health_straggler_slowdown: float = flag(
        1.5, "straggler: red flag when one rank's own work in a phase is above this many times the ranks' "
             "median (straggler/<phase>/slowdown) for --health-straggler-window rollouts in a row; with "
             "two ranks the slowdown is at most 2", minimum=1.0)
    health_straggler_lag_s: float = flag(
        0.25, "straggler: ... and at least this many seconds above the median (millisecond phases jitter "
              "far past any ratio)", minimum=0.0)
    health_straggler_window: int = flag(3, "straggler: rollouts in a row the same rank must be the straggler "
                                           "of the same phase", minimum=1)

    health_router_max_share: float = flag(
        0.95, "router_collapse (MoE): red flag when one expert takes more than this share of a "
              "layer's tokens (k/E when balanced, 1 when all) for --health-router-collapse-window "
              "rollouts in a row, the same expert each time", minimum=0.0, maximum=1.0)
    health_router_collapse_window: int = flag(
        3, "router_collapse (MoE): rollouts in a row an expert's share must stay above "
           "--health-router-max-share, and a layer's dead experts above their count before them",
        minimum=1)

    def validate(self) -> None:
        if self.health_pg_clipfrac_red < self.health_pg_clipfrac_warn:
            raise ConfigError("--health-pg-clipfrac-red", f"must be >= --health-pg-clipfrac-warn "
                              f"({self.health_pg_clipfrac_warn}), got {self.health_pg_clipfrac_red}")
