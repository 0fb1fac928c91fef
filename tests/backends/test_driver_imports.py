"""The driver imports a rank's class only to name its Ray actor: the FSDP class loads no DTensor (torch's FSDP,
device mesh and checkpoint state-dict modules, a second of CPU in every run's driver); the ranks load them."""
from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from miles.backends import actor_class
actor_class("fsdp")
print(json.dumps(sorted(m for m in ("torch.distributed.tensor", "torch.distributed.fsdp",
                                    "torch.distributed.checkpoint") if m in sys.modules)))
"""


def test_naming_the_fsdp_actor_loads_no_dtensor():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
