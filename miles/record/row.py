"""The per-iteration stdout row, in the three-line shape of the Miles page."""
from __future__ import annotations

import statistics

from miles.record.names import map_metrics

PREFIX = "[trainer] "


SMALL = 1e-3  # below this a fixed-point figure reads as 0.000 (GRPO's on-policy loss is ~1e-9 by construction)


def _num(value: float | None, fmt: str) -> str:
    """`value` in `fmt`, or in scientific notation when it is non-zero but would print as zero."""
    if value is None:
        return "n/a"
    if value != 0 and abs(value) < SMALL and fmt.endswith("f"):
        return f"{value:.1e}"
    return format(value, fmt)


def _secs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}s"


def _span(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def progress(lines, num_rollout: int, now: float, recent: int = 10) -> tuple[float | None, float | None]:
    """(elapsed, left) of a run from its journal `lines`: elapsed since its first line began (that line's
    time less its own step time), left = the rollouts still to do x the median step time of the last
    `recent` rows (evals and hand-offs not counted, so it is an estimate). The run's first iteration is
    not a pace: it loads the weights and warms every cache (1.6 s against 0.15 s after it on the tiny run,
    so the first row said ~2m39s left of 65 s); nor is a chunk's first, which the median passes over.
    None where the journal has no line, and `left` None until a step past the first is measured."""
    if not lines:
        return None, None
    first = lines[0]
    elapsed = now - first.time + first.metrics.get("perf/step_time", 0.0)
    trained = [ln for ln in lines if ln.rollout_id >= 0]
    steps = [ln.metrics["perf/step_time"] for ln in trained[1:][-recent:] if "perf/step_time" in ln.metrics]
    done = max(ln.rollout_id for ln in trained) + 1 if trained else 0
    todo = max(0, num_rollout - done)
    left = 0.0 if not todo else (todo * statistics.median(steps) if steps else None)
    return elapsed, left


def format_row(rollout_id: int, num_rollout: int, metrics: dict[str, float], show_kl: bool,
               elapsed: float | None = None, left: float | None = None) -> str:
    """`[trainer] iter 12 (13/3000) | loss=0.412 reward=0.61 kl=0.018` then the timing and optimiser lines,
    their `|` under the first one; a missing metric prints as n/a. `iter 12` is the rollout id (the one
    checkpoints and eval lines name, from 0), `13/3000` how many of the run's rollouts are done with it, so
    the last row reads `(3000/3000)`. `elapsed`, `left` (seconds, see `progress`): the run's time so far and
    an estimate of what is left, after the step's total."""
    get = metrics.get
    # padded to the run's widest counter, so the `|` column stays put as the ids grow (9 -> 10 -> 100)
    widest = len(f"{PREFIX}iter {num_rollout - 1} ({num_rollout}/{num_rollout})")
    head = f"{PREFIX}iter {rollout_id} ({rollout_id + 1}/{num_rollout})".ljust(widest) + " "
    first = f"loss={_num(get('train/loss'), '.3f')} reward={_num(get('rollout/raw_reward'), '.2f')}"
    if show_kl:
        first += f" kl={_num(get('train/kl_loss'), '.3f')}"
    if get("multi_turn/round_number_mean") is not None:  # a multi-turn run: mean assistant turns per trajectory
        first += f" turns={get('multi_turn/round_number_mean'):.2f}"
    clock = "" if elapsed is None else f"; training {_span(elapsed)}" + ("" if left is None else f", ~{_span(left)} left")
    second = (f"rollout={_secs(get('perf/rollout_time'))} train={_secs(get('perf/train_time'))} "
              f"p2p={_secs(get('perf/update_weights_time'))}  (total {_secs(get('perf/step_time'))}{clock})")
    third = f"grad_norm={_num(get('train/grad_norm'), '.2f')} lr={_num(get('train/lr'), '.1e')}"
    if get("moe/load_balancing_loss") is not None:  # an MoE policy: its routers, worst layer
        third += (f" load_balancing_loss={get('moe/load_balancing_loss'):.3f}"
                  f" max_expert_share={_num(get('moe/max_expert_share'), '.2f')}"
                  f" dead_experts={_num(get('moe/dead_experts'), '.0f')}")
    pad = " " * len(head)
    return f"{head}| {first}\n{pad}| {second}\n{pad}| {third}"


def format_eval(label: str, metrics: dict[str, float]) -> str:
    """`[trainer] base eval eval/arithmetic-pass_at_1=0.230 ...`: under the names the trackers store."""
    return f"{PREFIX}{label} " + " ".join(f"{k}={_num(v, '.3f')}" for k, v in map_metrics(metrics).items())


def format_eval_result(label: str, metrics: dict[str, float], base: dict[str, float]) -> str:
    """`[trainer] eval after rollout 19: eval/arithmetic-pass_at_1=0.613 (base 0.229) ...`: each pass@k under
    its tracker name, with the starting weights' value beside it when the base eval measured it."""
    mapped, base = map_metrics(metrics), map_metrics(base)
    parts = [f"{k}={_num(v, '.3f')}" + (f" (base {_num(base[k], '.3f')})" if k in base else "")
             for k, v in mapped.items() if "-pass_at_" in k]  # the headline figures; the journal has the rest
    return f"{PREFIX}{label} " + " ".join(parts)
