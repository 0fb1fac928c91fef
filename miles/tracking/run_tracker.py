"""A first run tracker: the stdout row and the journal (trackers are added by the tracking work)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class JournalTracker:
    def __init__(self, config: Any, run_dir: Path):
        self.config = config
        self.path = run_dir / "metrics.jsonl"
        run_dir.mkdir(parents=True, exist_ok=True)

    def resume(self, committed_rollout_id, extra):
        if not self.path.exists():
            return
        keep = [line for line in self.path.read_text().splitlines()
                if committed_rollout_id is not None and json.loads(line)["rollout/step"] <= committed_rollout_id]
        self.path.write_text("".join(line + "\n" for line in keep))

    def checkpoint_extra(self):
        return {}

    def log_rollout(self, rollout_id, args, samples, extra_metrics, rollout_time):
        pass

    def log_eval(self, rollout_id, args, data, extra_metrics):
        pass

    def record(self, rollout_id, metrics):
        with self.path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        print(f"[trainer] iter {rollout_id} | " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()
                                                            if k in ("train/loss", "rollout/raw_reward")), flush=True)

    def commit(self, rollout_id):
        pass

    def close(self):
        pass


def build_run_tracker(config: Any, run_dir: Path) -> JournalTracker:
    return JournalTracker(config, run_dir)
