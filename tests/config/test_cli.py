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


def test_a_bad_generate_hook_fails_before_any_server_starts(capsys):
    assert main(["train", "--custom-generate-function-path", "no_such_pkg.generate"]) == 2
    assert "--custom-generate-function-path" in capsys.readouterr().err
