"""`miles diagnose` without a training run: the open-phase stall check and its timer (fires once), the
bundle of a run dir whose processes are plain Python children (stacks, secrets scrubbed, py-spy
missing said in words), and clear errors for odd run dirs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from flows.cli import main as miles
from miles.config.health import HealthConfig
from miles.diagnose.bundle import collect
from miles.health.open_phase import check_open_phase, open_phases
from miles.health.stall_timer import StallTimer
from miles.profiling import pyspy
from miles.record.timeline import Span
from tests.support.runs import extract

CFG = HealthConfig(health_stall_factor=3.0, health_stall_min_s=4.0, health_stall_check_interval=1.0)
SECRET_ENV = "offline-env-secret-9e1c"
SECRET_FLAG = "offline-flag-secret-3b7d"
STUCK = textwrap.dedent("""
    import sys, time
    def weights_wait_forever():
        while True:
            time.sleep(0.05)
    print("ready", flush=True)
    weights_wait_forever()
""")


def write_timeline(run_dir, ended_s=(1.0, 1.2, 0.8), open_for=None, now=1000.0):
    spans = [Span("trainer", "update_weights", 100.0 + i * 10, 100.0 + i * 10 + d, i) for i, d in enumerate(ended_s)]
    (run_dir / "timeline.jsonl").write_text("".join(s.to_json() + "\n" for s in spans))
    starts = [Span("trainer", s.name, s.start, s.start, s.rollout_id) for s in spans]
    if open_for is not None:
        starts.append(Span("trainer", "update_weights", now - open_for, now - open_for, len(spans)))
    (run_dir / "timeline-open.jsonl").write_text("".join(s.to_json() + "\n" for s in starts))


def test_an_open_phase_far_past_its_median_is_a_live_stall(tmp_path):
    write_timeline(tmp_path, open_for=30.0)
    (phase,) = open_phases(tmp_path, 1000.0)
    assert phase.span.name == "update_weights" and phase.open_s == pytest.approx(30.0) and phase.median_s == 1.0
    verdict = check_open_phase(tmp_path, 1000.0, CFG)
    assert verdict.signal == "stall" and verdict.live and verdict.rollout_id == 3
    assert "stalled in update_weights for 30s" in verdict.message
    assert check_open_phase(tmp_path, 1000.0 - 27.0, CFG) is None  # 3 s open: within the minimum


def test_no_median_no_stall_and_ended_phases_are_not_open(tmp_path):
    write_timeline(tmp_path, ended_s=(1.0, 1.0), open_for=500.0)
    assert check_open_phase(tmp_path, 1000.0, CFG) is None  # two ended spans are no median
    write_timeline(tmp_path, open_for=None)
    assert open_phases(tmp_path, 1000.0) == []


def test_the_timer_fires_once(tmp_path):
    write_timeline(tmp_path, open_for=60.0)
    fired = []
    timer = StallTimer(tmp_path, CFG, fired.append, clock=lambda: 1000.0)
    assert timer.check() is not None and timer.check() is None and len(fired) == 1
    lines = [json.loads(ln) for ln in (tmp_path / "health.jsonl").read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["live"] is True and lines[0]["signal"] == "stall"


@pytest.fixture
def stuck_process():
    env = dict(os.environ, MILES_OFFLINE_TOKEN=SECRET_ENV)
    proc = subprocess.Popen([sys.executable, "-c", STUCK, "--wandb-key", SECRET_FLAG], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_bundle_of_a_live_run_holds_its_stacks_and_no_secret(tmp_path, stuck_process):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pyspy.write_processes(run_dir, {"trainer": stuck_process.pid})
    write_timeline(run_dir, open_for=60.0, now=time.time())
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "engine-0.log").write_text(f"serving\nthe key is {SECRET_ENV}\n")
    diagnosis = collect(run_dir, CFG)
    assert diagnosis.path.parent == run_dir / "diagnose" and diagnosis.path.name.endswith(".tar.gz")
    root = extract(diagnosis.path, tmp_path / "x")
    for path in root.rglob("*"):
        if path.is_file():
            assert SECRET_ENV.encode() not in path.read_bytes() and SECRET_FLAG.encode() not in path.read_bytes(), path
    verdict = json.loads((root / "verdict.json").read_text())
    assert verdict["status"] == "stalled" and verdict["phase"]["name"] == "update_weights"
    stack = (root / "stacks" / f"trainer-{stuck_process.pid}.txt").read_text()
    if "weights_wait_forever" not in stack:
        pytest.skip(f"py-spy cannot trace here: {stack[:300]}")
    # py-spy sees the thread idle in its sleep, or (on a loaded machine) running the loop between sleeps
    assert re.search(rf"trainer \(pid {stuck_process.pid}\) (waits|busy) in weights_wait_forever", verdict["headline"])
    assert "***" in (root / "logs" / "logs__engine-0.log.tail").read_text()


@pytest.mark.parametrize("why", ["py-spy is not installed (pip install py-spy)",
                                 "py-spy may not trace pid 1 (Permission denied (os error 13)): the kernel forbids "
                                 "ptrace here; run as root, set kernel.yama.ptrace_scope=0, or add CAP_SYS_PTRACE"])
def test_where_py_spy_cannot_attach_the_bundle_says_so_and_holds_the_rest(tmp_path, stuck_process, monkeypatch, why):
    def cannot(pid, out, native=False, nonblocking=False):
        raise pyspy.PySpyUnavailable(why)
    monkeypatch.setattr(pyspy, "dump", cannot)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pyspy.write_processes(run_dir, {"trainer": stuck_process.pid})
    write_timeline(run_dir, open_for=60.0, now=time.time())
    root = extract(collect(run_dir, CFG).path, tmp_path / "x")
    text = (root / "VERDICT.txt").read_text()
    assert "py-spy could not attach" in text and f"no stack ({why[:30]}" in text
    assert why in (root / "stacks" / f"trainer-{stuck_process.pid}.txt").read_text()
    assert (root / "run" / "timeline.jsonl").is_file() and (root / "run" / "timeline-open.jsonl").is_file()
    assert json.loads((root / "verdict.json").read_text())["phase"]["name"] == "update_weights"


def test_odd_run_dirs_get_clear_answers(tmp_path, capsys):
    assert miles(["diagnose", str(tmp_path / "missing")]) == 2
    assert "RUN_DIR" in capsys.readouterr().err
    run_dir = tmp_path / "run"
    (run_dir / "profiler").mkdir(parents=True)
    (run_dir / "profiler" / "processes.json").write_text("not json")
    (run_dir / "logs").mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("private")
    (run_dir / "logs" / "engine-0.log").symlink_to(outside)
    assert miles(["diagnose", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("VERDICT (dead): the trainer died before any rollout") and "no process list" in out
    (bundle,) = (run_dir / "diagnose").glob("*.tar.gz")
    root = extract(bundle, tmp_path / "x")
    assert not any(b"private" in p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_the_delivery_process_sees_each_live_flag_once(tmp_path):
    from miles.health.signals import Verdict
    from miles.tracking.delivery import LiveFlags

    log = tmp_path / "health.jsonl"
    old = Verdict(1, "stall", "red", "stalled before", {}, live=True)
    log.write_text(json.dumps(old.as_json()) + "\n")
    flags = LiveFlags(log)  # a delivery process (re)started after that flag does not alert it again
    assert flags.new() == []
    per_rollout = Verdict(2, "loss", "red", "spiked", {"train/loss": 9.0})
    live = Verdict(3, "stall", "red", "stalled in update_weights for 400s, still open", {"open_s": 400.0}, live=True)
    with log.open("a") as f:
        f.write(json.dumps(per_rollout.as_json()) + "\n" + json.dumps(live.as_json()) + "\n")
    assert flags.new() == [live] and flags.new() == []


def test_a_live_flag_tags_the_mlflow_run_at_once(tmp_path):
    from miles.config import parse_config, redacted_flat_dict
    from miles.health.signals import Verdict
    from miles.tracking.sinks.mlflow_sink import MlflowSink

    sink = MlflowSink(params=redacted_flat_dict(parse_config([])), tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                      experiment="diagnose", artifact_dir=str(tmp_path / "mlartifacts"))
    sink.open()
    try:
        live = Verdict(5, "stall", "red", "stalled in update_weights for 400s, still open", {"open_s": 400.0}, live=True)
        sink.alert_live(live)
        sink.alert_live(live)  # once per signal
        tags = sink.client.get_run(sink.run_id).data.tags
    finally:
        sink.close()
    assert tags["miles.health"] == "red"
    assert tags["miles.health.stall"] == "live red flag at rollout 5: stalled in update_weights for 400s, still open"


def test_a_live_flag_is_one_wandb_alert(tmp_path):
    from miles.health.signals import Verdict
    from miles.tracking.sinks.wandb_sink import WandbSink
    from miles.tracking.wandb_files import read_records

    sink = WandbSink(params={"health_alert_interval": 300.0}, run_id="live1", directory=str(tmp_path),
                     mode="offline", project="diagnose")
    sink.open()
    live = Verdict(5, "stall", "red", "stalled in update_weights for 400s, still open", {"open_s": 400.0}, live=True)
    sink.alert_live(live)
    sink.alert_live(live)  # rate-limited per signal, as the per-rollout alerts
    sink.close()
    path = next(tmp_path.rglob("run-live1.wandb"))
    deadline = time.monotonic() + 60
    while True:  # wandb's writer may still be flushing the file after finish() returned
        alerts = [r.alert for r in read_records(path) if r.WhichOneof("record_type") == "alert"]
        if alerts or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [(a.title, a.level) for a in alerts] == [("miles red flag: stall at rollout 5", "ERROR")]
    assert "still open" in alerts[0].text and "hung engine or rank" in alerts[0].text


def test_a_phase_is_open_from_its_start_until_its_span(tmp_path):
    from miles.record.timeline import TimelineWriter, open_spans, read_spans

    writer = TimelineWriter(tmp_path / "timeline.jsonl", starts=tmp_path / "timeline-open.jsonl")
    with writer.span("update_weights", 7, version=8):
        (begun,) = open_spans(tmp_path)
        assert (begun.lane, begun.name, begun.rollout_id) == ("trainer", "update_weights", 7)
        assert read_spans(tmp_path / "timeline.jsonl") == []
    writer.close()
    assert open_spans(tmp_path) == [] and len(read_spans(tmp_path / "timeline.jsonl")) == 1


def test_the_timer_reads_the_timeline_again_only_when_it_grew(tmp_path):
    from miles.health.open_phase import PhaseCache

    write_timeline(tmp_path, open_for=2.0)
    cache = PhaseCache()
    assert check_open_phase(tmp_path, 1000.0, CFG, cache) is None
    assert check_open_phase(tmp_path, 1040.0, CFG, cache).values["open_s"] == pytest.approx(42.0)  # same files
    with (tmp_path / "timeline.jsonl").open("a") as f:  # the open phase ended
        f.write(Span("trainer", "update_weights", 998.0, 1041.0, 3).to_json() + "\n")
    assert check_open_phase(tmp_path, 1050.0, CFG, cache) is None
