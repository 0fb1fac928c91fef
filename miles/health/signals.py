"""The signals the health watch judges: their names, the journal keys they read, and the page's advice.

A verdict is what one detector says about one rollout; `health/<signal>` is 1 on a red flag.
"""
from __future__ import annotations

from dataclasses import dataclass, field

WARNING, RED = "warning", "red"
SEVERITIES = (WARNING, RED)


@dataclass(frozen=True)
class Signal:
    name: str
    keys: tuple[str, ...]  # the journal keys it reads (their values go into the verdict)
    advice: str  # what the "What to watch" table says to do about it


SIGNALS: dict[str, Signal] = {s.name: s for s in [
    Signal("loss", ("train/loss",), "a spike that crashes within an iteration: lower --lr or check the data"),
    Signal("raw_reward", ("rollout/raw_reward", "rollout/raw_reward_std"),
           "reward saturated near one value (collapse or reward hacking): check the reward function"),
    Signal("kl_loss", ("train/kl_loss",), "sudden jump: the policy diverged from the reference; lower --lr"),
    Signal("train_rollout_logprob_abs_diff", ("train/train_rollout_logprob_abs_diff",),
           "climbing without bound: train/inference precision drift; check weight sync and dtypes"),
    Signal("entropy_loss", ("train/entropy_loss",),
           "falling to ~0 too fast (mode collapse): raise --rollout-temperature or --entropy-coef"),
    Signal("grad_norm", ("train/grad_norm",), "repeatedly hitting --clip-grad: lower --lr"),
    Signal("rollout_train_time", ("perf/rollout_time", "perf/train_time"),
           "one much larger than the other: resource imbalance; rebalance engines and training ranks"),
    Signal("pg_clipfrac", ("train/pg_clipfrac",), "above 0.5 the policy is moving fast: drop the LR"),
    Signal("stall", ("perf/step_time", "perf/rollout_time", "perf/train_time", "perf/update_weights_time"),
           "an iteration or phase far slower than usual: look for a hung engine or rank (py-spy dump)"),
    Signal("router_errors", ("rollout/router_requests", "rollout/router_errors", "rollout/router_retries",
                             "rollout/router_no_worker"),
           "router errors, retries or no-worker answers: check the engines (/workers, RUN_DIR/logs)"),
    Signal("engine_flapping", ("rollout/engine_restarts",),
           "an engine relaunched again and again (--use-fault-tolerance): read its RUN_DIR/logs/engine-N.log "
           "for the cause (OOM, a bad device) before it uses its --engine-max-restarts"),
    Signal("abort_storm", ("rollout/aborted_ratio",),
           "the engines aborted many requests (aborted samples score 0 and train nothing): look for who calls "
           "/abort_request, a client that disconnects, or an engine being paused and flushed"),
    Signal("degenerate_groups", ("rollout/degenerate_group_ratio",),
           "reward groups whose samples all scored the same carry no GRPO signal: the task is too hard or too "
           "easy for the policy, or the reward is constant; check the reward and --n-samples-per-prompt"),
    Signal("truncated_ratio", ("rollout/truncated_ratio",),
           "most answers hit --rollout-max-response-len: raise it"),
    Signal("param_norm", ("train/param_norm", "train/param_norm_growth", "train/lr"),
           "learning rate too high / weights exploding: lower --lr"),
    Signal("straggler", ("straggler/<phase>/slowdown",),
           "one training rank slower than the others in one phase, every iteration: the message names it "
           "(node/dp/pp/tp) and the phase; look for a slow or throttled device, a noisy neighbour on its "
           "node, or an uneven batch split (the dashboard's rank x phase heat map shows where); or one "
           "engine slower than the others to receive and apply a weight push (`engine <i>`, its "
           "index in the run's engine list): look at that engine's device, disk and load"),
    Signal("router_collapse", ("moe/max_expert_share_layer_<l>", "moe/dead_experts_layer_<l>"),
           "a mixture-of-experts layer routing (nearly) every token to one expert, or losing "
           "experts: the message names the layer and expert; raise the model's "
           "router_aux_loss_coef (its config.json; both backends add that load-balancing loss) or "
           "lower --lr; if the engine's and trainer's routing disagree, try "
           "--use-rollout-routing-replay (the dashboard's routing panel shows each layer)"),
    Signal("non_finite", (), "a metric overflowed or is NaN: check the reward function's range (rewards near "
                             "1e308 overflow a mean) and lower --lr"),
]}


PREFIX = "health/"  # the signals' keys in the journal and the trackers: health/<signal>, 0 or 1


def metric_name(signal: str) -> str:
    """The 0/1 journal and tracker key of a signal."""
    return f"{PREFIX}{signal}"


@dataclass(frozen=True)
class Verdict:
    """One detector's flag on one rollout; `values` are the figures it judged."""

    rollout_id: int
    signal: str
    severity: str  # WARNING | RED
    message: str
    values: dict[str, float] = field(default_factory=dict)
    live: bool = False  # given while the rollout was still running (a phase open far past its median)

    def as_json(self) -> dict:
        raw = {"rollout_id": self.rollout_id, "signal": self.signal, "severity": self.severity,
               "message": self.message, "values": self.values}
        return {**raw, "live": True} if self.live else raw

    @classmethod
    def from_json(cls, raw: dict) -> "Verdict":
        return cls(int(raw["rollout_id"]), raw["signal"], raw["severity"], raw["message"], dict(raw["values"]),
                   raw.get("live") is True)

    def line(self) -> str:
        """The WARN line: signal, rollout, observed values, the page's advice."""
        shown = " ".join(f"{k}={v:.4g}" for k, v in self.values.items())
        label = "RED FLAG " if self.severity == RED else ""  # a warning is the WARN itself (N34)
        return (f"[health] WARN {label}{self.signal} at rollout {self.rollout_id}: {self.message} "
                f"({shown}) -> {SIGNALS[self.signal].advice}")
