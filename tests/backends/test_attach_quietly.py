"""First-hour N17: every chunk after the first attaches to the run's training ranks (they outlive it), and
said so on stdout each time ("miles.backends.group: attached to 1 existing training actors ..."); it is
routine, so it is a debug line now."""
from __future__ import annotations

import logging

from miles.backends import group
from miles.cluster.names import RunNames
from miles.config import parse_config


class Rank:
    class info:  # noqa: N801 - the actor method's name
        @staticmethod
        def remote():
            return "alive"


def test_attaching_to_existing_ranks_logs_nothing_at_info(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(group, "_named", lambda names, world_size: [Rank()] * world_size)
    monkeypatch.setattr(group.ray, "get", lambda refs: refs)
    config = parse_config(["--run-dir", str(tmp_path / "r")])
    with caplog.at_level(logging.DEBUG, logger="miles.backends.group"):
        attached = group.ActorGroup(config, "unused", RunNames.for_run_dir(tmp_path / "r"))
    assert attached.attached
    assert [r.levelno for r in caplog.records if "attached to" in r.getMessage()] == [logging.DEBUG]
