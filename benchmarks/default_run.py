"""The default run's result (`make run`), measured once and written once:
docs/developer/default-run.json holds the figures, and every page that quotes them carries them
between markers this script rewrites.

    .venv/bin/python benchmarks/default_run.py --measure   # run `make run`'s command, record, write
    .venv/bin/python benchmarks/default_run.py --run-dir RUN_DIR --wall-seconds S --machine "..."
    .venv/bin/python benchmarks/default_run.py --write            # rewrite the pages from the JSON
    .venv/bin/python benchmarks/default_run.py --check            # exit 1 where a page disagrees
    .venv/bin/python benchmarks/default_run.py --screenshot       # the recorded run's Metrics view

`--screenshot` shoots the recorded run's Metrics view (headless Chromium, the dashboard served
on it) into docs/dashboard/metrics.png, the figures it shows written into the PNG (a tEXt chunk)
so that the test can tell a screenshot of another run (first-hour A2: the page showed a run whose
reward fell).

A marker is `<!-- default-run:NAME -->TEXT<!-- /default-run -->`; TEXT is TEMPLATES[NAME] filled
from the JSON (a marker around a fenced block keeps its fences inside).
tests/docs/test_default_result.py runs the check, so a page cannot quote another figure than the one
measured."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs/developer/default-run.json"
SCREENSHOT = ROOT / "docs/dashboard/metrics.png"
SHOT_KEY = "miles.default-run"  # the PNG tEXt keyword holding the figures the screenshot shows
SHOWN = ("base", "final", "reward_first", "reward_last", "rollouts", "signals")
COMMAND = ["miles", "train", "--config", "configs/tiny-cpu.yaml", "--use-wandb", "--use-mlflow"]
MARKER = re.compile(r"<!-- default-run:(?P<name>[\w-]+) -->(?P<body>.*?)<!-- /default-run -->",
                    re.S)


def _evals(f: dict) -> str:
    ids = list(f["evals"])
    values = [f"{f['evals'][i]:.3f}" for i in ids]
    return (f"{', '.join(values[:-1])} and {values[-1]} after rollouts {', '.join(ids[:-1])} "
            f"and {ids[-1]}")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"


TEMPLATES = {
    "headline": lambda f: f"from {f['base']:.3f} to {f['final']:.3f}",
    "curve": _evals,
    "when": lambda f: f"{_duration(f['wall_seconds'])} on {f['machine']} (measured {f['date']}, "
                      f"commit {f['commit']})",
    "signals": lambda f: f"{f['signals']} signals checked",
    "base-line": lambda f: f"`[trainer] base eval eval/arithmetic-pass_at_1={f['base']:.3f} ...`",
    "first-eval-line": lambda f: (
        f"`[trainer] eval after rollout {next(iter(f['evals']))}: eval/arithmetic-pass_at_1="
        f"{next(iter(f['evals'].values())):.3f} (base {f['base']:.3f}) ...`"),
    "scorecard": lambda f: "\n".join([
        "\n```", f"miles train: scorecard of /work/runs/{f['run_dir']}",
        f"  held-out eval  eval/arithmetic-pass_at_1: {f['base']:.3f} (base) -> {f['final']:.3f} "
        f"(after rollout {f['rollouts'] - 1}), {f['final'] - f['base']:+.3f}",
        f"  reward         rollout/raw_reward: {f['reward_first']:.3f} (rollout 0) -> "
        f"{f['reward_last']:.3f} (rollout {f['rollouts'] - 1})",
        f"  rollouts       {f['rollouts']} (0..{f['rollouts'] - 1}) in "
        f"{_duration(f['wall_seconds'])} "
        f"wall time (training {_duration(f['training_seconds'])})",
        f"  red flags      none ({f['signals']} signals checked)",
        f"  model          /work/runs/{f['run_dir']}/checkpoints/iter_{f['rollouts'] - 1:07d}",
        f"  health         .venv/bin/miles doctor /work/runs/{f['run_dir']}",
        f"  dashboard      .venv/bin/miles dashboard /work/runs/{f['run_dir']}",
        "  Prefect        http://127.0.0.1:4200/runs/flow-run/...  (the run that trains)",
        "  MLflow         http://127.0.0.1:5000/#/experiments/1/runs/...  "
        "(serve it first: .venv/bin/mlflow ui ...)",
        "```\n"]),
}


def load() -> dict:
    return json.loads(SOURCE.read_text())


def render(text: str, figures: dict) -> str:
    """`text` with every marker's body filled from `figures`; an unknown marker name is an error."""
    def fill(match: re.Match) -> str:
        name = match["name"]
        if name not in TEMPLATES:
            raise KeyError(f"unknown default-run marker {name!r} (known: {', '.join(TEMPLATES)})")
        return f"<!-- default-run:{name} -->{TEMPLATES[name](figures)}<!-- /default-run -->"
    return MARKER.sub(fill, text)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def stale_pages(figures: dict) -> list[Path]:
    return [p for p in pages() if render(p.read_text(), figures) != p.read_text()]


def figures_of(run_dir: Path, wall_seconds: float, machine: str) -> dict:
    """The figures of a finished default run, read as its scorecard reads them."""
    sys.path.insert(0, str(ROOT))
    from miles.record.journal import read_journal
    from miles.record.layout import RunLayout
    from miles.run.scorecard import scorecard

    card = scorecard(run_dir)
    journal = read_journal(RunLayout(run_dir).journal)
    evals = {str(ln.rollout_id): ln.metrics[card.eval_key] for ln in journal  # before the final one
             if 0 <= ln.rollout_id != card.rollouts[-1] and card.eval_key in ln.metrics}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    return {"date": dt.date.today().isoformat(), "commit": commit, "machine": machine,
            "source": f"benchmarks/default_run.py, run dir {run_dir.name}", "run_dir": run_dir.name,
            "base": card.base_eval, "final": card.final_eval, "evals": evals,
            "reward_first": card.reward_first[1], "reward_last": card.reward_last[1],
            "rollouts": card.iterations, "wall_seconds": wall_seconds,
            "training_seconds": card.journal_seconds, "signals": len(card.flags.checked)}


def measure(machine: str) -> dict:
    """Run `make run`'s command once (have the base model cached first) and read its figures."""
    runs = ROOT / "runs"
    before = set(runs.iterdir()) if runs.exists() else set()
    start = time.monotonic()
    subprocess.run([str(ROOT / ".venv/bin" / COMMAND[0]), *COMMAND[1:]], cwd=ROOT, check=True)
    wall = time.monotonic() - start
    made = sorted(p for p in set(runs.iterdir()) - before if p.is_dir())
    if not made:
        raise SystemExit("the run left no new run dir under runs/")
    return figures_of(made[-1], wall, machine)


def shown(figures: dict) -> dict:
    """The figures a Metrics screenshot shows (its run summary), for the PNG and the test."""
    return {k: figures[k] for k in SHOWN}


def png_text(path: Path) -> dict[str, str]:
    """The tEXt chunks of a PNG, keyword -> text."""
    data, pos, out = path.read_bytes(), 8, {}
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"tEXt":
            key, _, text = data[pos + 8:pos + 8 + length].partition(b"\0")
            out[key.decode("latin-1")] = text.decode("latin-1")
        pos += 12 + length
    return out


def with_text(png: bytes, key: str, text: str) -> bytes:
    """`png` with a tEXt chunk after its header chunk (IHDR: 8 + 25 bytes)."""
    body = key.encode("latin-1") + b"\0" + text.encode("latin-1")
    crc = struct.pack(">I", zlib.crc32(b"tEXt" + body))
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + crc
    return png[:33] + chunk + png[33:]


def _chromium(url: str, *flags: str) -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("--screenshot needs chromium (apt-get install -y chromium)")
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--window-size=1400,1000",
                           "--virtual-time-budget=15000", *flags, url],
                          capture_output=True, text=True, timeout=120, check=True).stdout


def screenshot(run_dir: Path, figures: dict) -> None:
    """The Metrics view of `run_dir` (the run whose figures are `figures`) into SCREENSHOT."""
    command = [sys.executable, "-m", "miles.dashboard.cli", str(run_dir), "--port", "0"]
    dashboard = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        found = re.search(r"(http://\S+?)/? ", dashboard.stdout.readline())
        if not found:
            raise SystemExit(f"the dashboard did not start on {run_dir}")
        url = found.group(1) + "/#metrics"
        if 'data-ready="1"' not in _chromium(url, "--dump-dom"):
            raise SystemExit(f"the Metrics view of {run_dir} did not finish drawing")
        with tempfile.TemporaryDirectory() as tmp:
            shot = Path(tmp) / "metrics.png"
            _chromium(url, f"--screenshot={shot}")
            png = shot.read_bytes()
    finally:
        dashboard.terminate()
        dashboard.wait(15)
    SCREENSHOT.write_bytes(with_text(png, SHOT_KEY, json.dumps(shown(figures), sort_keys=True)))
    print(f"wrote {SCREENSHOT.relative_to(ROOT)} from {run_dir}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", action="store_true", help="run the default run once and record it")
    ap.add_argument("--run-dir", type=Path, help="record a finished default run instead")
    ap.add_argument("--wall-seconds", type=float, help="with --run-dir: its wall time as measured")
    ap.add_argument("--machine", default="an idle 2-core machine", help="where it ran, in words")
    ap.add_argument("--write", action="store_true", help="rewrite the pages from the JSON")
    ap.add_argument("--check", action="store_true", help="exit 1 if a page disagrees with the JSON")
    ap.add_argument("--screenshot", action="store_true",
                    help=f"the recorded run's Metrics view into {SCREENSHOT.relative_to(ROOT)} "
                         "(the run dir: --run-dir, else runs/RUN_DIR of the JSON's run_dir)")
    args = ap.parse_args(argv)
    if args.run_dir and args.wall_seconds is None:
        ap.error("--run-dir needs --wall-seconds (the scorecard's wall time of that run)")
    if args.measure or args.run_dir:
        figures = measure(args.machine) if args.measure else \
            figures_of(args.run_dir, args.wall_seconds, args.machine)
        SOURCE.write_text(json.dumps(figures, indent=2) + "\n")
        args.write = True
    figures = load()
    if args.screenshot:
        # the dashboard runs in ROOT: a --run-dir as given, the recorded one as runs/NAME
        shot_dir = args.run_dir.resolve() if args.run_dir else Path("runs") / figures["run_dir"]
        screenshot(shot_dir, figures)
    if args.write:
        for page in stale_pages(figures):
            page.write_text(render(page.read_text(), figures))
            print(f"rewrote {page.relative_to(ROOT)}")
    stale = stale_pages(figures)
    for page in stale:
        print(f"{page.relative_to(ROOT)}: a default-run figure differs from "
              f"{SOURCE.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
