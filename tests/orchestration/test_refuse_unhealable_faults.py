"""`miles train` refuses the faults that need engine supervision when it is off (a stopped engine or a killed
router would only hang or fail a chunk), naming the flag, before anything starts; with
--use-fault-tolerance every fault kind passes."""
from __future__ import annotations

import pytest

from miles.config import ConfigError, parse_config
from miles.run.faults import require_healable


def check(config) -> None:
    """What `miles train` and the flow ask of a config before anything starts."""
    require_healable(config.orchestration.inject_fault, config.orchestration.use_fault_tolerance)


@pytest.mark.parametrize("flags", [["--inject-fault", "kill-router@1"], ["--inject-fault", "stop-engine@1"],
                                   ["--inject-fault", "stop-engine:1@1"],
                                   ["--inject-fault", "raise@1,kill-engine@2,kill-router@3"]])  # one of a list
def test_faults_that_need_the_supervisor_are_refused_without_it(flags):
    with pytest.raises(ConfigError, match="--inject-fault.*needs --use-fault-tolerance"):
        check(parse_config(flags))


@pytest.mark.parametrize("flags", [
    ["--inject-fault", "kill-engine@1"], ["--inject-fault", "kill-engine:1@1"], ["--use-fault-tolerance"],
    ["--use-fault-tolerance", "--inject-fault", "stop-engine:1@1"],
    ["--use-fault-tolerance", "--inject-fault", "kill-router@2"],
    ["--inject-fault", "raise@1,kill@3,kill-engine@5"],
    ["--use-fault-tolerance", "--inject-fault", "kill-engine:1@1,stop-engine:0@3,kill-router@5"]])
def test_what_the_flow_can_do_passes(flags):
    check(parse_config(flags))  # no error
