"""docs/user-guide/flags.md is exactly what `python -m miles.config.reference` writes, and each command
the reference lists parses exactly the config sections it says."""
from __future__ import annotations

from pathlib import Path

from flows.cli import main as miles
from miles.config.reference import COMMANDS, PAGE, REGENERATE, render
from tests.docs.parsing import parse_only

ROOT = Path(__file__).resolve().parents[2]


def test_the_flag_page_is_the_generated_one():
    page = ROOT / PAGE
    assert page.is_file(), f"{PAGE} is missing: run `{REGENERATE}`"
    assert page.read_text() == render(), f"{PAGE} differs from the config: run `{REGENERATE}`"


def test_each_command_parses_the_sections_the_reference_lists(monkeypatch, tmp_path):
    for command, sections in COMMANDS:
        subcommand = command.split()[1]
        argv = [str(tmp_path)] if subcommand == "doctor" else []  # the doctor's health flags replay a run
        capture, outcome = parse_only(monkeypatch, miles, [subcommand, *argv])
        assert outcome == "parsed", (command, outcome, capture.stderr)
        assert capture.sections and capture.sections[0] == sections, \
            f"{command} parses {capture.sections[:1]}, the reference lists {sections}: fix COMMANDS in miles/config/reference.py"

