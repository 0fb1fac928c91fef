"""Training-rank groups kept for a module's tests, one per configuration: a second test of the same
layout reuses the ranks instead of starting new ones. Starting a group costs its Ray workers, their
imports, the process group and the model build (seconds a rank); going back to the base weights
(`load_base`: the model, reference, optimizer and schedule rebuilt, the seed set again) costs a
model build. So a test that asks for a layout gets the group as a fresh one would be: the first
asker the group as started, every later one the group reset to the base weights."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from miles.backends.group import ActorGroup


class KeptGroups:
    """`started(cfg)` -> a group of `cfg`'s layout on `model_path`, from the base weights.

    `kept` lists (config, uses): the group of such a config stays up until its `uses`-th test has
    had it (or the fixture's tear-down, `stop_all`, when some of those tests did not run), so the
    module holds no more ranks at once than it must; a group of any other config stops as the
    test's `with` ends."""

    def __init__(self, model_path, kept: list[tuple[object, int]]) -> None:
        self.model_path = str(model_path)
        self.kept = [cfg for cfg, _ in kept]
        self.uses_left = [uses for _, uses in kept]
        self.groups: dict[int, ActorGroup] = {}  # index in `kept` -> its group

    @contextmanager
    def started(self, cfg) -> Iterator[ActorGroup]:
        key = next((i for i, c in enumerate(self.kept) if c == cfg), None)
        if key is None:
            group = ActorGroup(cfg, self.model_path)
            try:
                yield group
            finally:
                group.stop()
            return
        if key in self.groups:
            self.groups[key].call("load_base", self.model_path)  # the base weights, a new optimizer
        else:
            self.groups[key] = ActorGroup(cfg, self.model_path)
        self.uses_left[key] -= 1
        try:
            yield self.groups[key]
        finally:
            if self.uses_left[key] <= 0:
                self.groups.pop(key).stop()

    def stop_all(self) -> None:
        groups, self.groups = list(self.groups.values()), {}
        for group in groups:
            group.stop()
