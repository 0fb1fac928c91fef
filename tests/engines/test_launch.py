"""Starting engines as subprocesses: readiness with a deadline and clear errors when they cannot start."""
from __future__ import annotations

import pytest

from miles.engines.launch import EngineStartError, engine_command, free_port, launch_engine, wait_healthy


def test_engine_that_cannot_start_reports_its_log(tmp_path):
    with pytest.raises(EngineStartError) as err:
        launch_engine(tmp_path / "no-such-model", device="cpu", log_path=tmp_path / "engine.log", timeout=120)
    message = str(err.value)
    assert "exited with code 2" in message
    assert "--model: path does not exist" in message  # the engine's own error, from the log tail
    assert "miles.engines.cli" in message


def test_wait_healthy_times_out_on_a_silent_port():
    with pytest.raises(TimeoutError, match="not healthy within"):
        wait_healthy(f"http://127.0.0.1:{free_port()}", timeout=1.0)


def test_engine_command_line(tmp_path):
    argv = engine_command(tmp_path, "127.0.0.1", 31000, "embedded", "cpu", 8, ["--context-length", "128"])
    assert argv[1:3] == ["-m", "miles.engines.cli"]
    assert argv[3:] == ["--host", "127.0.0.1", "--port", "31000", "--engine", "embedded", "--engine-device", "cpu",
                        "--model", str(tmp_path), "--engine-max-batch-size", "8", "--context-length", "128"]


def test_handle_reports_and_stops(engine):
    assert engine.alive and engine.url == f"http://127.0.0.1:{engine.port}" and engine.pid == engine.process.pid


def test_engine_config_fields_travel_as_flags():
    from miles.config import EngineConfig
    from miles.engines.launch import engine_flags

    assert engine_flags(EngineConfig()) == []
    flags = engine_flags(EngineConfig(tool_call_parser="tiny", engine_max_queued_requests=8, context_length=128))
    assert flags == ["--engine-max-queued-requests", "8", "--tool-call-parser", "tiny", "--context-length", "128"]
