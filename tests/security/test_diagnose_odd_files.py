"""Probes DG4 and HA3: `miles diagnose` (and the dashboard's Diagnose request, which runs it) on run dirs
shaped to make it hang.

- DG4: a FIFO where a run file belongs (`timeline-open.jsonl`, `tracking/config.yaml`, any file diagnose
  reads, a log) blocked its open for good. Now such a file is left out and named; every read opens
  without blocking and checks the open descriptor.
- HA3: each open phase scanned every ended span for its median: 20,000 of each took 46 s. Now the ended
  spans are grouped by (lane, name) once; the test counts the work, never the time.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from miles.health import open_phase
from miles.record import layout
from miles.record.timeline import Span

SAFETY_TIMEOUT_S = 300  # a hang fails the test instead of the suite; a working diagnose needs seconds


def journal(run_dir: Path, rollouts: int = 3) -> None:
    (run_dir / layout.JOURNAL).write_text("".join(json.dumps({"rollout_id": i, "time": 100.0 + i, "train/loss": 0.5})
                                                  + "\n" for i in range(rollouts)))


def test_fifos_where_run_files_belong_are_left_out_and_named(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    journal(run_dir)
    fifos = ["timeline-open.jsonl", "timeline.jsonl", "health.jsonl", "tracking/config.yaml",
             "tracking/trainer.json", "tracking/delivery.json", "tracking/delivery.log", "profiler/processes.json",
             "profiler/services.json", "profiler/summaries.jsonl"]
    for rel in fifos + ["logs/trainer.log"]:
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(run_dir / rel)
    (run_dir / "logs" / "router.log").write_text("router up\nError: a real line\n")
    done = subprocess.run([sys.executable, "-m", "miles.diagnose.cli", str(run_dir), "--json"], capture_output=True,
                          text=True, timeout=SAFETY_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    notes = "\n".join(answer["verdict"]["details"])
    for rel in fifos:
        assert f"left out RUN_DIR/{rel}: not a regular file" in notes, notes
    with tarfile.open(answer["bundle"]) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    assert "logs/logs__router.log.tail" in names and "run/metrics.jsonl" in names
    assert not any("trainer.log" in n for n in names)


class CountingSpan:
    """An ended span that counts how often its lane is read: the work the median lookup does."""

    reads = 0

    def __init__(self, lane: str, name: str, start: float, end: float):
        self._lane, self.name, self.start, self.end = lane, name, start, end

    @property
    def lane(self) -> str:
        CountingSpan.reads += 1
        return self._lane


def lane_reads(tmp_path: Path, monkeypatch, spans: int) -> int:
    """Lane reads of open_phases over `spans` ended and `spans` open spans of distinct lanes."""
    run_dir = tmp_path / f"run{spans}"
    run_dir.mkdir()
    with open(run_dir / layout.TIMELINE_OPEN, "w") as f:
        for i in range(spans):
            f.write(Span(f"l{i}", "rollout", 5000.0, 5000.0, rollout_id=i).to_json() + "\n")
    ended = [CountingSpan(f"l{i % 50}", "rollout", 10.0 + i, 11.0 + i) for i in range(spans)]
    monkeypatch.setattr(open_phase, "read_spans", lambda path: ended)
    CountingSpan.reads = 0
    phases = open_phase.open_phases(run_dir, now=6000.0)
    assert len(phases) == spans
    assert phases[0].median_s == 1.0  # lanes l0..l49 have ended spans of 1 s
    return CountingSpan.reads


def test_the_open_phase_medians_take_one_pass_over_the_ended_spans(tmp_path, monkeypatch):
    small, large = lane_reads(tmp_path, monkeypatch, 200), lane_reads(tmp_path, monkeypatch, 4000)
    # linear: 20 times the spans is about 20 times the reads (quadratic would be 400 times: 16 million)
    assert large <= 25 * small, (small, large)


def test_phase_names_are_printed_escaped_and_absurd_starts_skipped(tmp_path):
    """DG3: a lane and name holding `\\x1b[2J\\x1b]0;pwn\\x07` cleared and retitled the terminal, and a start
    at 1.0 made the verdict "in `actor_train` of rollout 3 for 1796613739 s"."""
    from miles.config.health import HealthConfig
    from miles.diagnose.bundle import collect

    now = 1_800_000_000.0
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    journal(run_dir)
    spans = [Span("\x1b[2J\x1b]0;pwn\x07rank0", "actor_train\x1b[31m", now - 50, now - 50, rollout_id=5),
             Span("trainer", "actor_train", 1.0, 1.0, rollout_id=3),
             Span("trainer", "rollout", now + 86400, now + 86400, rollout_id=4)]
    (run_dir / layout.TIMELINE_OPEN).write_text("".join(s.to_json() + "\n" for s in spans))
    diagnosis = collect(run_dir, HealthConfig(), now=now)
    assert "\x1b" not in diagnosis.text and "\x07" not in diagnosis.text
    assert "\\x1b[2J\\x1b]0;pwn\\x07rank0" in diagnosis.text
    assert "1796613739" not in diagnosis.text and "rollout 3" not in diagnosis.text
    assert "skipped 2 phase start(s) in timeline-open.jsonl" in diagnosis.text
