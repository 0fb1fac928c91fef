"""A run's directory read back while it runs or after: rollouts done, diagnose bundles, journal steps."""
from __future__ import annotations

import json
import tarfile
from pathlib import Path


def rollouts_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def journal_steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [int(json.loads(line)["rollout/step"]) for line in lines if line.strip()]


def bundles(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "diagnose").glob("diagnose-*.tar.gz"))


def extract(bundle: Path, into: Path) -> Path:
    """Unpack a diagnose bundle into `into`; its one top folder."""
    with tarfile.open(bundle) as tar:
        tar.extractall(into, filter="data")
    (root,) = into.iterdir()
    return root


def recorded(run_dir: Path, rollouts) -> Path:
    """A run dir holding `rollouts` (health.Rollout) as its journal and the default config: what
    `miles doctor` reads."""
    import yaml

    from miles.config import parse_config, redacted_flat_dict
    from miles.record.journal import JournalLine
    from miles.tracking.state import CONFIG_ARTIFACT

    run_dir.mkdir()
    lines = [JournalLine(r.rollout_id, float(r.rollout_id), r.metrics) for r in rollouts]
    (run_dir / "metrics.jsonl").write_text("".join(line.to_json() + "\n" for line in lines))
    (run_dir / CONFIG_ARTIFACT).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_ARTIFACT).write_text(yaml.safe_dump(redacted_flat_dict(parse_config([]))))
    return run_dir
