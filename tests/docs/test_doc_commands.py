"""Every command in a ```bash block of README.md and docs/ still works as shown.

Commands that would train, serve or start a cluster are not run: they are parsed as far as their
program would parse them. `miles ...` and `python -m miles.train ...` run in-process up to the point where
their parser has accepted every flag (tests/docs/parsing.py), and each flag value that is not a
placeholder (DIR, P, URL...) is converted to its field's type; `ray` subcommands and options are looked up
in Ray's own CLI; make targets in the Makefile; Prefect deployments and pools in prefect.yaml; files the
commands name must exist. A program without a rule here fails the test: add its rule.
"""
from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import yaml

from miles.config.parse import convert, section_fields
from tests.docs.pages import ROOT, doc_pages
from tests.docs.parsing import parse_only

VENV_BIN = Path(sys.prefix) / "bin"  # the docs' `.venv/bin/...` is the environment running the tests
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*|\.\.\.)$")  # DIR, RUN_DIR, JOB_ID, P, ...
REPO_DIRS = ("configs/", "benchmarks/", "deployments/", "docs/", "tests/", "miles/", "flows/", "tasks/", ".venv/")


@dataclass(frozen=True)
class DocCommand:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def bash_commands(page: Path) -> list[DocCommand]:
    """One entry per command line of the page's ```bash blocks, `\\` continuations joined."""
    found, lines = [], page.read_text().splitlines()
    inside, pending, start = False, "", 0
    for number, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            inside = line.strip() == "```bash" if not inside else False
            continue
        if not inside:
            continue
        if not pending:
            start = number
        pending += line.rstrip().removesuffix("\\") + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            if pending.strip():
                found.append(DocCommand(str(page.relative_to(ROOT)), start, pending.strip()))
            pending = ""
    return found


ALL = [command for page in doc_pages() for command in bash_commands(page)]


def words(text: str) -> list[str]:
    """The command's words: comments, output redirections, `...` and leading VAR=value dropped."""
    tokens = shlex.split(text, comments=True)
    if ">" in tokens:
        tokens = tokens[:tokens.index(">")]
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        tokens = tokens[1:]
    return [t for t in tokens if t != "..."]


def check_repo_paths(tokens: list[str]) -> None:
    for token in tokens:
        value = token.split("=", 1)[1] if token.startswith("--") and "=" in token else token
        if value.startswith(REPO_DIRS):
            path = VENV_BIN / value.removeprefix(".venv/bin/") if value.startswith(".venv/bin/") else ROOT / value
            assert path.exists(), f"{value} does not exist"


def check_parses(entry, argv: list[str], monkeypatch) -> None:
    capture, outcome = parse_only(monkeypatch, entry, argv)
    if "--help" in argv or "-h" in argv:
        assert outcome == 0, f"--help exited {outcome}: {capture.stderr.strip()}"
        return
    assert outcome == "parsed", f"rejected (exit {outcome}): {capture.stderr.strip()}"
    if capture.raw is None:  # a command with a plain argparse parser: argparse has checked it
        return
    fields = {f.name: (f, tp) for sections in capture.sections[:1] for s in sections for f, tp in section_fields(s)}
    for name, value in capture.raw.items():
        values = value if isinstance(value, list) else [value]
        if name in fields and not any(isinstance(v, str) and PLACEHOLDER.match(v) for v in values):
            convert(*fields[name], value)  # a ConfigError names the flag and the bad value


def check_miles(argv: list[str], monkeypatch) -> None:
    from flows.cli import SUBCOMMANDS, main

    if argv and not argv[0].startswith("-"):
        assert argv[0] in SUBCOMMANDS, f"miles has no command {argv[0]!r}"
    check_parses(main, argv, monkeypatch)


def check_python(argv: list[str], monkeypatch) -> None:
    if argv[:2] == ["-m", "miles.train"]:
        from miles.train import main

        check_parses(main, argv[2:], monkeypatch)
    else:
        assert argv and argv[0].startswith("benchmarks/") and (ROOT / argv[0]).is_file(), \
            f"python {' '.join(argv)}: only `-m miles.train` and benchmarks/*.py have a rule"


def check_ray(argv: list[str], monkeypatch) -> None:
    from ray.scripts.scripts import cli

    if "--" in argv:  # `ray job submit ... -- ENTRYPOINT`: the entry point is a command of its own
        at = argv.index("--")
        check_command(argv[at + 1:], monkeypatch)
        argv = argv[:at]
    command, rest = cli, list(argv)
    while rest and hasattr(command, "commands") and rest[0] in command.commands:
        command = command.commands[rest.pop(0)]
    assert command is not cli and not hasattr(command, "commands"), f"ray has no command {' '.join(argv[:2])!r}"
    options = {opt for param in command.params for opt in param.opts}
    for token in rest:
        if token.startswith("--"):
            assert token.split("=", 1)[0] in options, f"{token} is not an option of `ray {command.name}`"


def check_make(argv: list[str], monkeypatch) -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    assert argv and set(argv) <= targets, f"make {' '.join(argv)}: the Makefile's targets are {sorted(targets)}"


def check_prefect(argv: list[str], monkeypatch) -> None:
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deployments = {d["name"] for d in project["deployments"]}
    pools = {d["work_pool"]["name"] for d in project["deployments"]}
    flows = set(re.findall(r'@flow\(name="([\w-]+)"', (ROOT / "flows" / "grpo.py").read_text()))
    if argv[:2] == ["deployment", "run"]:
        flow, _, name = argv[2].partition("/")
        assert flow in flows and name in deployments, f"{argv[2]}: flows {flows}, deployments {deployments}"
    elif argv[:2] == ["worker", "start"]:
        assert argv[argv.index("--pool") + 1] in pools, f"pools in prefect.yaml: {pools}"
    else:
        pytest.fail(f"prefect {' '.join(argv)}: no rule for this subcommand")


def check_source(argv: list[str], monkeypatch) -> None:
    assert argv == [".venv/bin/activate"], "only the project's .venv is sourced"
    assert (VENV_BIN / "activate").is_file()


def check_export(argv: list[str], monkeypatch) -> None:
    assert all(re.match(r"^[A-Z_][A-Z0-9_]*=\S*$", a) for a in argv), "export VAR=value"


PROGRAMS = {"miles": check_miles, "python": check_python, "ray": check_ray, "make": check_make,
            "prefect": check_prefect, "source": check_source, "export": check_export}


def check_command(tokens: list[str], monkeypatch) -> None:
    program, argv = Path(tokens[0]).name, tokens[1:]
    if tokens[0].startswith(".venv/bin/"):
        assert (VENV_BIN / program).exists(), f"{tokens[0]} is not in the environment"
    elif program not in ("source", "export", "make", "python"):
        assert entry_points(group="console_scripts", name=program), f"no installed package provides `{program}`"
    assert program in PROGRAMS, f"no rule for {program!r}: add one to tests/docs/test_doc_commands.py"
    PROGRAMS[program](argv, monkeypatch)


def test_the_docs_have_commands_to_check():
    assert len(ALL) > 20 and any(c.page == "README.md" for c in ALL)


@pytest.mark.parametrize("command", ALL, ids=str)
def test_a_command_of_the_docs_parses(command: DocCommand, monkeypatch):
    tokens = words(command.text)
    check_repo_paths(tokens)
    check_command(tokens, monkeypatch)
