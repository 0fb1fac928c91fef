"""Probe AS5: `--use-tis --tis-clip 0` passed (every TIS weight min(ratio, 0) = 0: no policy gradient at
all), and `--tis-clip 5` without `--use-tis` was ignored without a word. Both are one line now."""
from __future__ import annotations

import pytest

from miles.config import ConfigError, parse_config


@pytest.mark.parametrize("argv, flag, words", [
    (["--use-tis", "--tis-clip", "0"], "--tis-clip", "must be above 0 with --use-tis"),
    (["--tis-clip", "5"], "--tis-clip", "5.0 is given without --use-tis"),
    (["--tis-clip-low", "0.5"], "--tis-clip-low", "0.5 is given without --use-tis"),
])
def test_tis_settings_that_do_nothing_are_refused(argv, flag, words):
    with pytest.raises(ConfigError, match=f"^{flag}: {words}"):
        parse_config(argv)


def test_tis_settings_that_work_pass():
    assert parse_config(["--use-tis", "--tis-clip", "0.5", "--tis-clip-low", "0.1"]).train.tis_clip == 0.5
    assert parse_config([]).train.use_tis is False
