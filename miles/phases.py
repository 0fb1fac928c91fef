"""Named phases of an iteration (`with timed("rollout", times):`), the one place profiling and the timeline hook.

The phase names are fixed: `rollout`, `log_probs`, `ref_log_probs`, `actor_train`,
`update_weights`, `checkpoint`, `eval`. The driver times the phases it runs itself;
`log_probs`, `ref_log_probs` and `actor_train` are timed inside each training rank.

A phase hook is a callable `hook(name) -> context manager` entered around every phase of
the process it was added in, e.g. `add_phase_hook(torch.profiler.record_function)` in a
rank, or a hook that writes a span file for the timeline. Hooks are per process.
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Callable, Iterator

PHASES = ("rollout", "log_probs", "ref_log_probs", "actor_train", "update_weights", "checkpoint", "eval")
PhaseHook = Callable[[str], AbstractContextManager]

_hooks: list[PhaseHook] = []


def add_phase_hook(hook: PhaseHook) -> None:
    _hooks.append(hook)


def remove_phase_hook(hook: PhaseHook) -> None:
    if hook in _hooks:
        _hooks.remove(hook)


@contextmanager
def timed(name: str, into: dict[str, float] | None = None) -> Iterator[None]:
    """Run the block as phase `name` inside every hook; add its seconds to `into[name]`."""
    if name not in PHASES:
        raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
    with ExitStack() as hooks:
        for hook in list(_hooks):
            hooks.enter_context(hook(name))
        start = time.perf_counter()
        try:
            yield
        finally:
            if into is not None:
                into[name] = into.get(name, 0.0) + time.perf_counter() - start
