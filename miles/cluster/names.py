"""`RunNames`: the one scheme for naming a run's Ray actors (router, engines, training ranks)."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

NAMESPACE = "miles"  # the Ray namespace of every named actor of every run


@dataclass(frozen=True)
class RunNames:
    """Names of one run's actors: `<prefix>-router`, `<prefix>-engine-<i>`, `<prefix>-train-rank<k>`."""

    prefix: str

    @classmethod
    def for_run_dir(cls, run_dir: str | Path) -> "RunNames":
        """Readable, and unique per run dir (two runs named alike in different places do not collide)."""
        digest = hashlib.sha1(str(run_dir).encode()).hexdigest()[:6]
        return cls(f"miles-{re.sub(r'[^A-Za-z0-9_.-]', '_', Path(run_dir).name)}-{digest}")

    @property
    def router(self) -> str:
        return f"{self.prefix}-router"

    def engine(self, index: int) -> str:
        return f"{self.prefix}-engine-{index}"

    def rank(self, rank: int) -> str:
        return f"{self.prefix}-train-rank{rank}"

    def owns(self, name: str) -> bool:
        return name.startswith(self.prefix + "-")


def run_names(config) -> RunNames:
    """The names of a resolved run's Ray actors (they follow from its run dir)."""
    return RunNames.for_run_dir(config.train.run_dir)
