"""When a run's engines are gone for good: one clear error, and a checkpoint of what the ranks trained.

Two cases end a run this way. Supervised (--use-fault-tolerance): the supervisor gave up (every engine used
its --engine-max-restarts, or the router did), so no request can be served again and waiting out
--engine-wait-timeout would only idle. Unsupervised: an engine died, so its requests or the weight push
fail at once. `EnginesLost` carries one line saying which engine, at which rollout, and what to do, and
`trained_through`, the last rollout the ranks trained (the loop checkpoints it before the driver exits 1).
"""
from __future__ import annotations

import threading

import httpx

from miles.rollout.generate import NoEngineLeft  # noqa: F401  (raised by the rollout client; re-exported)
from miles.serving.control_http import control_client

FLAG_HINT = ("without --use-fault-tolerance a dead engine ends the run; with it the engine is relaunched "
             "and the run goes on")


class EnginesLost(RuntimeError):
    """The run cannot go on: its engines are gone. `trained_through`: the last rollout the ranks trained
    (None or below the resumed rollout: nothing new to save)."""

    def __init__(self, message: str, trained_through: int | None = None):
        super().__init__(message)
        self.trained_through = trained_through


def silent_engines(engine_urls: list[str], timeout: float = 2.0) -> list[int]:
    """The indices of the engines whose /health does not answer 200 within `timeout` (dead or hung),
    probed in parallel so a hung engine costs `timeout` once."""
    answers: dict[int, bool] = {}

    def probe(index: int, url: str) -> None:
        try:
            answers[index] = control_client().get(url.rstrip("/") + "/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            answers[index] = False

    threads = [threading.Thread(target=probe, args=(i, u), daemon=True) for i, u in enumerate(engine_urls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 1.0)
    return [i for i in range(len(engine_urls)) if not answers.get(i, False)]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def when(phase: str, rollout_id: int | None) -> str:
    """`during rollout 3`, `in the weight push after rollout 3`, `in the eval before training`."""
    if rollout_id is None:
        return "in the eval before training"
    if phase == "rollout":
        return f"during rollout {rollout_id}"
    what = {"update_weights": "the weight push", "eval": "the eval"}.get(phase, f"the {phase} phase")
    return f"in {what} after rollout {rollout_id}"


def unsupervised_loss(engine_urls: list[str], dead: list[int], at: str, cause: BaseException) -> str:
    """The one line for a plain run whose engine died: which engine(s), at which rollout, and the flag."""
    names = ", ".join(f"engine {i} ({engine_urls[i]})" for i in dead)
    verb = "does" if len(dead) == 1 else "do"
    return f"{names} {verb} not answer: lost {at} ({first_line(cause)}); {FLAG_HINT}"


def supervised_loss(reason: str, at: str) -> str:
    """The one line for a supervised run whose supervisor gave up."""
    return f"the engine supervisor gave up {at}: {reason}; no engine can serve the run any more"


def engines_lost(exc: Exception, at: str, trained_through: int | None, supervisor,
                 engine_urls: list[str]) -> EnginesLost | None:
    """`EnginesLost` when `exc` comes from engines that are gone: the supervisor gave up, or
    (unsupervised) an engine no longer answers /health. None: another failure, raised as it is."""
    if isinstance(exc, NoEngineLeft):
        return EnginesLost(supervised_loss(str(exc), at), trained_through)
    if supervisor is not None:
        reason = supervisor.gave_up()
        return None if reason is None else EnginesLost(supervised_loss(reason, at), trained_through)
    dead = silent_engines(engine_urls)
    if not dead:
        return None
    return EnginesLost(unsupervised_loss(engine_urls, dead, at, exc), trained_through)
