"""Named phases of an iteration (`with timed("rollout", times):`): each phase's seconds, its
wall-clock span (a rank's timeline lane is made of these) and the hooks entered around it
(profiling's).

The phase names are fixed: `rollout`, `train` (the driver's wait for the ranks), `log_probs`,
`ref_log_probs`, `actor_train`, `token_stats`, `log_tokens`, `update_weights`, `checkpoint`,
`eval`. The driver times the phases it runs itself; `log_probs`, `ref_log_probs`,
`actor_train` and `token_stats` are timed inside each training rank.

A phase hook is a callable `hook(name) -> context manager` entered around every phase of
the process it was added in, e.g. `add_phase_hook(torch.profiler.record_function)` in a
rank, or the profiler's window spans. Hooks are per process. The driver's phases reach the
run's timeline through `RLTrainer.phase`, which writes a span around `timed`.
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Callable, Iterator

PHASES = ("rollout", "train", "log_probs", "ref_log_probs", "actor_train", "token_stats", "log_tokens",
          "update_weights", "checkpoint", "eval")
PhaseHook = Callable[[str], AbstractContextManager]

_hooks: list[PhaseHook] = []


def add_phase_hook(hook: PhaseHook) -> None:
    _hooks.append(hook)


def remove_phase_hook(hook: PhaseHook) -> None:
    if hook in _hooks:
        _hooks.remove(hook)


@contextmanager
def timed(name: str, into: dict[str, float] | None = None,
          spans: list[tuple[str, float, float]] | None = None) -> Iterator[None]:
    """Run the block as phase `name` inside every hook; add its seconds to `into[name]` and its
    (name, wall-clock start, end) to `spans`."""
    if name not in PHASES:
        raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
    with ExitStack() as hooks:
        for hook in list(_hooks):
            hooks.enter_context(hook(name))
        wall, start = time.time(), time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            if into is not None:
                into[name] = into.get(name, 0.0) + seconds
            if spans is not None:
                spans.append((name, wall, wall + seconds))
