"""Naming the tiny task's files loads no torch: every run's driver (and `miles train`, doctor, the dashboard)
names them as it starts, and the model makers' imports cost a 4-rollout plain run's driver 4.7 of its 15.1
CPU-seconds."""
from __future__ import annotations

import json
import subprocess
import sys

from miles.tiny import recipes, tool_warmstart, warmstart

PROBE = """
import json, sys
from miles.tiny.defaults import task_defaults
paths = [str(p) for d in (task_defaults(False), task_defaults(True)) for p in (d.model, d.train_data, d.eval_data)]
print(json.dumps({"paths": paths, "loaded": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def test_task_defaults_load_no_torch_and_name_the_makers_paths():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    probe = json.loads(done.stdout.splitlines()[-1])
    assert probe["loaded"] == []
    assert probe["paths"][0] == str(warmstart.base_model_dir()) == str(recipes.base_model_dir())
    assert probe["paths"][3] == str(tool_warmstart.tool_model_dir())
    assert warmstart.RECIPE is recipes.ADDITION and tool_warmstart.RECIPE is recipes.TOOL
