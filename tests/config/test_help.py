"""`--help` as a user reads it: a short usage line, each flag's default said once, and `miles doctor --help`
naming its own arguments (RUN_DIR, --env) as well as the --health-* flags it passes on."""
from __future__ import annotations

import re
import subprocess
import sys

from miles.config import SECTIONS
from miles.config.parse import build_parser


def train_help() -> str:
    return build_parser(SECTIONS, prog="miles train").format_help()


def test_the_usage_line_is_one_line():
    text = train_help()
    usage = text.split("\n\n", 1)[0]
    assert usage == "usage: miles train [--config YAML] [--FLAG VALUE ...]"


def test_each_flag_states_its_default_once():
    entries = re.split(r"\n  (?=-)", train_help())
    # the builder adds a default only where the flag's own help names none (--tensorboard-dir names two
    # defaults of its own, of two different things: that is not a doubled default)
    doubled = [e.split()[0] for e in entries if re.search(r"\(default.*\(default: (None|\[\]|False|True)\)", e, re.S)]
    assert doubled == []
    assert len(re.findall(r"\(default: runs/<time>\)", train_help())) == 1
    assert not re.search(r"_OR_NONE", train_help())


def test_bool_flags_name_their_negation():
    assert "--no-use-mlflow sets" in re.sub(r"\s+", " ", train_help())


def test_doctor_help_shows_run_dir_env_and_the_health_flags():
    out = subprocess.run([sys.executable, "-m", "flows.cli", "doctor", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: miles doctor [RUN_DIR | --env]")
    assert "RUN_DIR" in out.stdout and "--env" in out.stdout and "--health-watch" in out.stdout
    assert "--config" not in out.stdout  # the doctor refuses a YAML
