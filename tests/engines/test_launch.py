"""Starting engines as subprocesses: readiness with a deadline and clear errors when they cannot start."""
from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from miles.config import EngineConfig
from miles.engines.launch import EngineStartError, engine_command, free_port, launch_engine, wait_healthy


def test_engine_that_cannot_start_reports_its_log(tmp_path):
    with pytest.raises(EngineStartError) as err:
        launch_engine(tmp_path / "no-such-model", EngineConfig(engine_device="cpu"), log_path=tmp_path / "engine.log", timeout=120)
    message = str(err.value)
    assert "exited with code 2" in message
    assert "--model: path does not exist" in message  # the engine's own error, from the log tail
    assert "miles.engines.cli" in message


def test_wait_healthy_times_out_on_a_silent_port():
    with pytest.raises(TimeoutError, match="not healthy within"):
        wait_healthy(f"http://127.0.0.1:{free_port()}", timeout=1.0)


def test_engine_command_line_carries_the_whole_engine_section(tmp_path):
    config = EngineConfig(engine="sglang", engine_device="cpu", engine_max_batch_size=8, context_length=128,
                          sglang_extra_args=["--disable-radix-cache", "--chunked-prefill-size 4096"])
    argv = engine_command(tmp_path, "127.0.0.1", 31000, config)
    assert argv[1:3] == ["-m", "miles.engines.cli"]
    assert argv[3:9] == ["--host", "127.0.0.1", "--port", "31000", "--model", str(tmp_path)]
    assert argv[argv.index("--engine-max-batch-size") + 1] == "8" and argv[argv.index("--context-length") + 1] == "128"
    assert "--sglang-extra-args=--disable-radix-cache --chunked-prefill-size 4096" in argv
    from miles.config import EngineServeConfig, parse_sections

    parsed = parse_sections([EngineServeConfig, EngineConfig], argv[3:])
    assert parsed[EngineConfig] == dataclasses.replace(config, sglang_extra_args=[
        "--disable-radix-cache --chunked-prefill-size 4096"])  # every field arrives


def test_handle_reports_and_stops(engine):
    assert engine.alive and engine.url == f"http://127.0.0.1:{engine.port}" and engine.pid == engine.process.pid


def test_sglang_engine_flags_reach_the_engine_process(tmp_path):
    """Without a GPU SGLang cannot start, but the engine process states the settings it got first."""
    config = EngineConfig(engine="sglang", sglang_tp_size=2, sglang_mem_fraction_static=0.7, context_length=4096,
                          sglang_extra_args=["--disable-radix-cache"])
    argv = engine_command(tmp_path, "127.0.0.1", free_port(), config)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    first = json.loads(proc.stdout.splitlines()[0])
    want = dataclasses.asdict(config)
    assert first["service"] == "engine" and {k: first["settings"][k] for k in want} == want
    assert proc.returncode == 2  # then: no GPU / no sglang package, a clean error


def test_sglang_flags_need_the_sglang_engine():
    from miles.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="--sglang-tp-size: applies to SGLang engines only"):
        parse_config(["--sglang-tp-size", "2"])
    with pytest.raises(ConfigError, match="--rollout-num-gpus-per-engine: the embedded engine runs on one device"):
        parse_config(["--rollout-num-gpus-per-engine", "2"])
    with pytest.raises(ConfigError, match="--sglang-tp-size: 4 disagrees"):
        parse_config(["--engine", "sglang", "--rollout-num-gpus-per-engine", "2", "--sglang-tp-size", "4"])
    from miles.config.resolve import resolve

    config = parse_config(["--engine", "sglang", "--rollout-num-gpus-per-engine", "2", "--run-dir", "/tmp/x"])
    assert resolve(config).engine.sglang_tp_size == 2  # Miles: GPUs per engine = its tensor-parallel size


def test_a_launched_engine_waits_passively_in_openmp(engine):
    """Its torch threads sleep while they wait (miles.serving.process.passive_omp), unless the user chose."""
    import os

    from miles.diagnose.local_services import process_environ

    environ = process_environ(engine.pid)
    assert environ["OMP_WAIT_POLICY"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
