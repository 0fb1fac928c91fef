"""`miles train` refuses what only `python -m miles.train` does (engine supervision, engine and router
faults it cannot inject), naming the flag, before anything starts."""
from __future__ import annotations

import pytest

from flows.grpo import refuse_plain_only
from miles.config import ConfigError, parse_config


@pytest.mark.parametrize("flags, flag", [
    (["--use-fault-tolerance"], "--use-fault-tolerance"),
    (["--inject-fault", "kill-router@1"], "--inject-fault"),
    (["--inject-fault", "stop-engine@1"], "--inject-fault"),
    (["--inject-fault", "kill-engine:1@1"], "--inject-fault"),
])
def test_plain_driver_only_flags_are_refused(flags, flag):
    with pytest.raises(ConfigError, match=flag):
        refuse_plain_only(parse_config(flags))


def test_what_the_flow_can_do_passes():
    config = parse_config(["--inject-fault", "kill-engine@1"])
    assert refuse_plain_only(config) is config
