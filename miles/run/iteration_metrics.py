"""The iteration's own metrics beside the rollout's (step 7): training, the router's window, engine
faults, Miles' `perf/*` times and the steps, in the order the journal line has always had them."""
from __future__ import annotations

from miles.rollout.generate import NoEngineLeft, take_resends


def iteration_metrics(config, rollout_id: int, summary, times: dict[str, float], step_time: float,
                      *, router: dict[str, float], supervisor,
                      more: list[dict[str, float]]) -> dict[str, float]:
    """`summary`: the ranks' combined `TrainSummary`; `router`: the router's counters of this window
    (`take_router_stats`); `more`: what else joins the line before the steps (MFU, the weight push's
    times, the rollout source's), in that order."""
    metrics = dict(summary.metrics)
    metrics.update({f"rollout/{key}": value for key, value in router.items()})
    metrics.update(fault_metrics(supervisor, metrics.get("rollout/router_retries", 0.0)))
    metrics.update(perf_metrics(times, step_time, summary, config))
    for part in more:
        metrics.update(part)
    steps = config.train.num_steps_per_rollout
    metrics.update({"train/step": float(rollout_id * steps + steps - 1),
                    "rollout/step": float(rollout_id)})
    return metrics


def take_router_stats(router, supervisor, wait_timeout: float) -> dict[str, float]:
    """The router's requests, errors, retries, latency and worker counts since they were last
    taken; taking them starts a new window (reading /router_stats resets them). {} without a router
    (rollouts go straight to one engine). Supervised, a relaunching router is waited for
    (`wait_timeout`)."""
    if router is None:
        return {}

    def given_up() -> None:  # no use waiting for a router the supervisor gave up on
        if supervisor is not None and (reason := supervisor.gave_up()) is not None:
            raise NoEngineLeft(reason) from None

    return router.take_stats(wait_timeout if supervisor is not None else 0.0, give_up=given_up)


def fault_metrics(supervisor, router_retries: float) -> dict[str, float]:
    """`rollout/engine_restarts` and the engines' states (with --use-fault-tolerance), and
    `rollout/requests_resent`: requests sent again because an engine never answered them (the
    router's failovers plus the rollout client's own re-sends while no engine was ready)."""
    resent = take_resends() + router_retries  # taken in any case: the next window starts now
    if supervisor is None:
        return {}
    counters, states = supervisor.take(), supervisor.states()
    out = {"rollout/requests_resent": float(resent),
           "rollout/engine_restarts": float(counters.restarts),
           "rollout/engine_deaths": float(counters.deaths),
           "rollout/router_restarts": float(counters.router_restarts)}
    out.update({f"rollout/engines_{state}": float(n) for state, n in states.items()})
    if counters.seconds_to_readmit:
        out["perf/engine_readmit_time"] = max(counters.seconds_to_readmit)
    return out


def perf_metrics(times: dict[str, float], step_time: float, summary, config) -> dict[str, float]:
    """Miles' `perf/*` keys from the phase times of one iteration."""
    train_time = times["train"]
    metrics = {
        "perf/rollout_time": times["rollout"], "perf/train_time": train_time,
        "perf/actor_train_time": summary.actor_train_time,
        "perf/log_probs_time": summary.log_probs_time,
        "perf/update_weights_time": times["update_weights"], "perf/step_time": step_time,
        "perf/wait_time_ratio": times["rollout"] / step_time,
        "perf/actor_train_tok_per_s": summary.num_tokens / max(summary.actor_train_time, 1e-9),
        "perf/tokens_per_gpu_per_sec": (summary.num_tokens / max(train_time, 1e-9)
                                        / config.world_size),
    }
    if config.train.use_kl_loss:
        metrics["perf/ref_log_probs_time"] = summary.ref_log_probs_time
    return metrics
