"""--staleness-guard: tighten async GRPO's staleness bound, down to synchronous, while the rollout's policy
drifts too far from the trained one.

After each iteration the guard reads the iteration's `train/mismatch_kl`, `train/ess` and
`train/pg_clipfrac`. When any crosses its bound (--staleness-guard-max-mismatch-kl, -min-ess,
-max-clipfrac) the producer's bound K drops by one for every request not yet admitted, and the
iteration's journal line says so (`rollout/staleness_guard/tightened` = 1, `.../reason_*`, the new
`rollout/max_weight_staleness`). It never loosens K again within the run: a run that needed it is one
to look at (the trackers and, in the Prefect flow, a `miles.staleness.tightened` event say when).
"""
from __future__ import annotations

TIGHTENED = "rollout/staleness_guard/tightened"


class StalenessGuard:
    """The controller; `observe` returns the metrics it adds to the iteration's line."""

    def __init__(self, train_config):
        self.max_kl = train_config.staleness_guard_max_mismatch_kl
        self.min_ess = train_config.staleness_guard_min_ess
        self.max_clipfrac = train_config.staleness_guard_max_clipfrac

    def crossed(self, metrics: dict[str, float]) -> list[str]:
        """The bounds this iteration crossed (by the metric's name)."""
        reasons = []
        if metrics.get("train/mismatch_kl", 0.0) > self.max_kl:
            reasons.append("mismatch_kl")
        if metrics.get("train/ess", 1.0) < self.min_ess:
            reasons.append("ess")
        if metrics.get("train/pg_clipfrac", 0.0) > self.max_clipfrac:
            reasons.append("pg_clipfrac")
        return reasons

    def observe(self, rollout_id: int, metrics: dict[str, float], producer) -> dict[str, float]:
        reasons = self.crossed(metrics)
        k = producer.max_staleness
        tightened = bool(reasons) and k > 0
        if tightened:
            k -= 1
            producer.set_max_staleness(k)
            shown = ", ".join(f"{r}={metrics.get('train/' + r, float('nan')):.4g}" for r in reasons)
            print(f"[trainer] staleness guard: {shown} crossed a bound after rollout {rollout_id}; "
                  f"--max-weight-staleness tightened to {k}" + (" (synchronous)" if k == 0 else ""), flush=True)
        out = {TIGHTENED: float(tightened), "rollout/max_weight_staleness": float(k)}
        out.update({f"rollout/staleness_guard/reason_{r}": 1.0 for r in reasons})
        return out


def resumed_bound(train_config, journal, rollout_id: int) -> int:
    """--max-weight-staleness as the run left it at its checkpoint: the guard only tightens, so the
    least bound its journal recorded up to `rollout_id` (the flag's own value without the guard)."""
    bound = train_config.max_weight_staleness
    if not train_config.staleness_guard:
        return bound
    recorded = [ln.metrics.get("rollout/max_weight_staleness") for ln in journal
                if ln.rollout_id <= rollout_id]
    return int(min([bound, *[v for v in recorded if isinstance(v, (int, float))]]))
