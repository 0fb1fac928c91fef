"""A rank's forward and backward spans inside megatron-core's schedule, its pipeline waits apart.

The schedule (1F1B across stages, or no pipelining at PP = 1) calls megatron-core's own
`forward_step` and `backward_step` per micro-batch and moves activations and their gradients
between stages through a `P2PCommunicator`. For the block of `recording`, those are wrapped: each
`forward_step` is a `forward` compute span (our forward and loss), each `backward_step` a
`backward` compute span, and each receive from a neighbouring stage a wait span of the pass it
feeds (the next forward's activations: `forward`; the gradients from the next stage: `backward`).
So a slow stage shows as its own long compute span, and the stages around it as waits: the
per-rank view and the straggler metrics name the stage by its pp coordinate.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from functools import wraps
from typing import Iterator

from miles.backends.rank_phases import RankPhaseRecorder

# P2PCommunicator's calls that wait for a neighbour, by the pass whose input they bring
WAITS = {"recv_forward": "forward", "send_backward_recv_forward": "forward",
         "recv_backward": "backward", "send_forward_recv_backward": "backward"}


def _patched(owner, name: str, wrap) -> ExitStack:
    """`owner.name` replaced by `wrap(original)` until the returned stack closes."""
    stack = ExitStack()
    original = getattr(owner, name)
    setattr(owner, name, wrap(original))
    stack.callback(setattr, owner, name, original)
    return stack


def _span(rec: RankPhaseRecorder, phase: str, wait: bool):
    def wrap(original):
        @wraps(original)
        def timed(*args, **kwargs):
            with (rec.waiting(phase) if wait else rec.span(phase)):
                return original(*args, **kwargs)
        return timed
    return wrap


@contextmanager
def recording(rec: RankPhaseRecorder) -> Iterator[None]:
    """Spans for the training schedule run in the block (see the module)."""
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

    with ExitStack() as stack:
        stack.enter_context(_patched(schedules, "forward_step", _span(rec, "forward", False)))
        stack.enter_context(_patched(schedules, "backward_step", _span(rec, "backward", False)))
        for name, phase in WAITS.items():
            stack.enter_context(_patched(P2PCommunicator, name, _span(rec, phase, True)))
        yield
