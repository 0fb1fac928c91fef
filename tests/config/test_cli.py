"""The `miles` command dispatches subcommands and turns config errors into clean exits."""
from __future__ import annotations

from flows.cli import SUBCOMMANDS, main


def test_lists_commands(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out


def test_unknown_command(capsys):
    assert main(["fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err
