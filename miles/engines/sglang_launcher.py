"""Build and start a real SGLang server (`python -m sglang.launch_server`) for `--engine sglang`.

SGLang needs a CUDA GPU and the `sglang` package (the `[gpu]` extra); without either,
start-up stops at once with a message saying which is missing, before anything runs.
"""
from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from dataclasses import dataclass

from miles.config.engine import EngineConfig


class SGLangUnavailable(RuntimeError):
    """SGLang cannot run here; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class SGLangCommand:
    argv: list[str]

    def __str__(self) -> str:
        return " ".join(self.argv)


def build_command(model: str, host: str, port: int, config: EngineConfig, weight_version: str | None = None,
                  python: str = sys.executable) -> SGLangCommand:
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--host", host, "--port", str(port),
            "--tp-size", str(config.sglang_tp_size), "--enable-metrics"]
    if config.sglang_mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(config.sglang_mem_fraction_static)]
    if config.tool_call_parser is not None:
        argv += ["--tool-call-parser", config.tool_call_parser]
    if config.context_length is not None:
        argv += ["--context-length", str(config.context_length)]
    if weight_version is not None and weight_version != "default":
        argv += ["--weight-version", weight_version]
    for extra in config.sglang_extra_args:  # one quoted string ("--a --b 2") or several; split like a shell
        argv += shlex.split(extra)
    return SGLangCommand(argv)


def check_available(gpu_count: int | None = None, has_package: bool | None = None) -> None:
    """Raise SGLangUnavailable unless a CUDA GPU and the sglang package are both here."""
    if has_package is None:
        has_package = importlib.util.find_spec("sglang") is not None
    if not has_package:
        raise SGLangUnavailable("--engine sglang needs the `sglang` package, which is not installed; install the "
                                "GPU extra (pip install 'miles-prefect[gpu]') or use --engine embedded")
    if gpu_count is None:
        import torch

        gpu_count = torch.cuda.device_count()
    if gpu_count == 0:
        raise SGLangUnavailable("--engine sglang needs a CUDA GPU and none is visible here "
                                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                                "use --engine embedded on CPU")


def exec_sglang(command: SGLangCommand) -> None:
    """Replace this process with SGLang, so whoever started us (launch_engine) owns SGLang's pid."""
    os.execv(command.argv[0], command.argv)
