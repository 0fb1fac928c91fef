"""`miles train`'s argv and the `grpo` flow's parameters, each way: a `--config FILE` is the flow's
`config_file` parameter, the other flags its `flags`. Plain string work, shared by the command (which
splits argv) and the flow (which rebuilds it to prepare, name and describe the run)."""
from __future__ import annotations


def build_argv(config_file: str | None, flags: list[str] | None) -> list[str]:
    return ([f"--config={config_file}"] if config_file else []) + list(flags or [])


def flow_parameters(argv: list[str]) -> dict:
    """`miles train`'s arguments as the flow's parameters: a `--config FILE` is the `config_file`
    parameter (the Prefect UI shows it there, not as null beside flags that name it), the rest `flags`."""
    flags, config_file, i = [], None, 0
    while i < len(argv):
        if argv[i] == "--config" and i + 1 < len(argv) and config_file is None:
            config_file, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith("--config=") and config_file is None:
            config_file = argv[i].split("=", 1)[1]
        else:
            flags.append(argv[i])
        i += 1
    return {"config_file": config_file, "flags": flags}


def config_source(config_file: str | None, flags: list[str] | None) -> str | None:
    """The YAML the run's flags come from (`config_file`, or a --config among the flags); None: flags only."""
    return config_file or flag_value(list(flags or []), "--config")


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value `argv` gives `flag` (`--flag V` or `--flag=V`; the last wins, as when parsing), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value
