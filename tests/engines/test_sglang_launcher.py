"""`--engine sglang`: the SGLang command line we build, and the clear failure without GPU or package."""
from __future__ import annotations

import subprocess
import sys

import pytest

from miles.config import EngineConfig, parse_sections
from miles.engines.sglang_launcher import SGLangUnavailable, build_command, check_available


def engine_config(*argv: str) -> EngineConfig:
    return parse_sections([EngineConfig], list(argv))[EngineConfig]


def test_command_line_carries_the_flags():
    config = engine_config("--engine", "sglang", "--sglang-tp-size", "2", "--sglang-mem-fraction-static", "0.7",
                           "--context-length", "4096",
                           # SGLang's own flags travel as one quoted string, split like a shell would
                           "--sglang-extra-args", "--disable-radix-cache --chunked-prefill-size 4096")
    command = build_command("/ckpt/qwen3-4b", "127.0.0.1", 30001, config, weight_version="step-3",
                            python="/usr/bin/python3")
    assert command.argv == ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "/ckpt/qwen3-4b",
                            "--host", "127.0.0.1", "--port", "30001", "--tp-size", "2", "--enable-metrics",
                            "--mem-fraction-static", "0.7", "--context-length", "4096",
                            "--weight-version", "step-3", "--disable-radix-cache", "--chunked-prefill-size", "4096"]


def test_defaults_leave_sglang_to_size_itself():
    argv = build_command("m", "127.0.0.1", 1, engine_config(), python="py").argv
    assert "--mem-fraction-static" not in argv and "--context-length" not in argv and "--weight-version" not in argv


def test_missing_package_or_gpu_is_a_clear_error():
    with pytest.raises(SGLangUnavailable, match="`sglang` package"):
        check_available(gpu_count=8, has_package=False)
    with pytest.raises(SGLangUnavailable, match="needs a CUDA GPU"):
        check_available(gpu_count=0, has_package=True)
    check_available(gpu_count=1, has_package=True)  # both present: no error


def test_cli_fails_at_start_up_without_sglang(base_model):
    done = subprocess.run([sys.executable, "-m", "miles.engines.cli", "--engine", "sglang", "--model",
                           str(base_model)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "miles engine: error: --engine sglang needs" in done.stderr
