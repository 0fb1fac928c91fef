"""Run a `miles` command only as far as its flags are parsed: the hooks stop it at the first point where
the parser has accepted every flag, so nothing is started, trained or served."""
from __future__ import annotations

import argparse
import contextlib
import io
from dataclasses import dataclass, field

import pytest

import miles.config.parse as config_parse


class Parsed(BaseException):
    """The command's flags were accepted; BaseException so that no handler of the command catches it."""


@dataclass
class Capture:
    sections: list[list[type]] = field(default_factory=list)  # per build_parser call, the config sections
    raw: dict | None = None  # the config values read (flags and YAML), when a config parser accepted them
    stdout: str = ""
    stderr: str = ""


def parse_only(monkeypatch: pytest.MonkeyPatch, entry, argv: list[str]) -> tuple[Capture, int | str]:
    """Call `entry(argv)` with the hooks in place; returns what was captured and "parsed", or the exit code
    (a rejected flag: 2) when the command stopped before its flags were accepted."""
    capture = Capture()
    real_build_parser, real_parse_args = config_parse.build_parser, argparse.ArgumentParser.parse_args

    def build_parser(sections, *args, **kwargs):
        capture.sections.append(list(sections))
        return real_build_parser(sections, *args, **kwargs)

    def build_section(section, raw):  # parse_sections calls it only after the flags and YAML keys are known
        capture.raw = dict(raw)
        raise Parsed()

    def parse_args(self, args=None, namespace=None):
        result = real_parse_args(self, args, namespace)
        raise Parsed()

    monkeypatch.setattr(config_parse, "build_parser", build_parser)
    monkeypatch.setattr(config_parse, "build_section", build_section)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                outcome: int | str = entry(argv) or 0
            except Parsed:
                outcome = "parsed"
            except SystemExit as exc:  # argparse: --help (0) or a rejected flag (2)
                outcome = exc.code if isinstance(exc.code, int) else 2
    finally:
        monkeypatch.undo()
    capture.stdout, capture.stderr = out.getvalue(), err.getvalue()
    return capture, outcome
