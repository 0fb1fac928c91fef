"""Async GRPO's flags: uncorrected async is refused at start (both drivers), with a message naming the
correction's flags; the guard needs a bound to tighten; K = 0 needs no correction."""
from __future__ import annotations

import pytest

from flows.cli import main as miles
from miles.config import ConfigError, parse_config


@pytest.mark.parametrize("argv", [["--max-weight-staleness", "1"], ["--max-weight-staleness", "3", "--fully-async"]])
def test_async_without_a_correction_is_refused_naming_the_flags(argv, capsys):
    with pytest.raises(ConfigError, match="needs a loss correction.*--use-tis.*--tis-clip"):
        parse_config(argv)
    assert miles(["train", *argv]) == 2  # before any cluster, engine or run starts
    err = capsys.readouterr().err
    assert "--max-weight-staleness" in err and "--use-tis" in err


def test_the_plain_driver_refuses_it_too(capsys):
    from miles.config import run_main
    from miles.train import main

    with pytest.raises(SystemExit) as stop:
        run_main(lambda: main(["--max-weight-staleness", "1"]), "python -m miles.train")
    assert stop.value.code == 2 and "--use-tis" in capsys.readouterr().err


def test_what_is_accepted():
    assert parse_config(["--fully-async"]).train.max_weight_staleness == 0  # sync schedule: nothing to correct
    config = parse_config(["--max-weight-staleness", "2", "--use-tis", "--tis-clip", "1.5", "--staleness-guard"])
    assert config.train.use_tis and config.train.tis_clip == 1.5 and config.train.staleness_guard
    with pytest.raises(ConfigError, match="--staleness-guard"):
        parse_config(["--staleness-guard", "--use-tis"])
    with pytest.raises(ConfigError, match="--tis-clip-low"):
        parse_config(["--use-tis", "--tis-clip", "1.0", "--tis-clip-low", "2.0"])
    with pytest.raises(ConfigError, match="--pause-generation-mode"):
        parse_config(["--pause-generation-mode", "abort"])
