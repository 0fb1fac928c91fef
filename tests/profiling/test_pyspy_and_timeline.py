"""py-spy dumps name the dumped process's Python frames (`miles py-spy RUN` and the periodic dumps),
and the Ray timeline is saved as JSON."""
import json
import subprocess
import sys
import textwrap
import time

import pytest

from flows.cli import main as miles
from miles.profiling import pyspy
from miles.profiling.ray_timeline import save_ray_timeline

TRAINER_LIKE = textwrap.dedent("""
    import time
    def rollout_wait_loop():
        while True:
            time.sleep(0.05)
    print("ready", flush=True)
    rollout_wait_loop()
""")


@pytest.fixture
def python_process():
    process = subprocess.Popen([sys.executable, "-c", TRAINER_LIKE], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"  # its frames exist once it printed
        yield process
    finally:
        process.kill()
        process.wait()


def dump_or_skip(fn):
    try:
        return fn()
    except pyspy.PySpyUnavailable as exc:
        if "ptrace" in str(exc):
            pytest.skip(f"the kernel forbids ptrace here: {exc}")
        raise


def test_miles_py_spy_dumps_every_listed_process(python_process, tmp_path, capsys):
    pyspy.write_processes(tmp_path, {"trainer": python_process.pid, "gone": 2 ** 22 + 17})
    dump_or_skip(lambda: pyspy.dump(python_process.pid, tmp_path / "probe.txt"))
    assert miles(["py-spy", str(tmp_path)]) == 0
    (written,) = capsys.readouterr().out.split()
    assert written.startswith(str(tmp_path / "profiler" / "py-spy")) and written.endswith(f"trainer-{python_process.pid}.txt")
    assert "rollout_wait_loop" in open(written).read()


def test_miles_py_spy_without_a_run_says_so(tmp_path, capsys):
    assert miles(["py-spy", str(tmp_path)]) == 1
    assert "processes.json does not exist" in capsys.readouterr().err


def test_periodic_dumps_until_stopped(python_process, tmp_path):
    dump_or_skip(lambda: pyspy.dump(python_process.pid, tmp_path / "probe.txt"))
    dumps = pyspy.PeriodicDumps(tmp_path, 0.1, lambda: {"trainer": python_process.pid}).start()
    try:
        deadline = time.monotonic() + 120
        files = []
        while len(files) < 2:  # two rounds happened (each writes its own timestamped folder)
            assert dumps.thread.is_alive() and time.monotonic() < deadline
            dumps.thread.join(0.1)
            files = sorted((tmp_path / "profiler" / "py-spy").glob("*/trainer-*.txt"))
    finally:
        dumps.stop()
    assert not dumps.thread.is_alive()
    assert "rollout_wait_loop" in files[-1].read_text()


def test_ray_timeline_is_saved_as_json(ray_cluster, tmp_path):
    import ray

    ray.get(ray.remote(lambda: 1).remote())
    path = save_ray_timeline(tmp_path)
    assert path == tmp_path / "profiler" / "ray-timeline.json"
    assert isinstance(json.loads(path.read_text()), list)
