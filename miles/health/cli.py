"""`miles doctor RUN_DIR`: a run's health verdicts; `miles doctor --env`: the installation and services."""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

# Versions the project is pinned to; a mismatch works sometimes and is worth a warning.
PINNED = {"torch": "2.13.0", "prefect": "3.9.1", "prefect-ray": "0.6.0", "ray": "2.60.0",
          "mlflow": "3.17.2", "wandb": "0.31.0", "megatron-core": "0.16.1"}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True


def check_packages() -> list[Check]:
    checks = []
    for package, pinned in PINNED.items():
        try:
            found = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            checks.append(Check(package, False, "not installed (run: make install)"))
            continue
        same = found.split("+")[0] == pinned
        checks.append(Check(package, same, found if same else f"{found}, pinned {pinned}", required=False))
    return checks


def cpu_only_torch() -> bool:
    """A CPU build of torch (its version ends `+cpu`) sees no GPU: known without importing torch,
    which takes seconds on a busy 2-core machine and was most of `doctor --env`'s 15 s (N30)."""
    try:
        return importlib.metadata.version("torch").endswith("+cpu")
    except importlib.metadata.PackageNotFoundError:
        return True


def check_devices() -> list[Check]:
    if cpu_only_torch():
        cuda, count = False, 0
    else:
        import torch

        cuda, count = torch.cuda.is_available(), torch.cuda.device_count()
    detail = f"{count} CUDA device(s)" if cuda else f"CPU only, {os.cpu_count()} cores"
    checks = [Check("devices", True, detail)]
    try:
        importlib.metadata.version("sglang")
        sglang = Check("sglang", cuda, "installed" + ("" if cuda else " but no GPU: use --engine embedded"),
                       required=False)
    except importlib.metadata.PackageNotFoundError:
        sglang = Check("sglang", True, "not installed: --engine embedded only (pip install '.[gpu]' on GPUs)",
                       required=False)
    return checks + [sglang]


def check_url(name: str, url: str | None, path: str, unset: str) -> Check:
    if not url:
        return Check(name, True, unset, required=False)
    try:
        response = httpx.get(url.rstrip("/") + path, timeout=5.0)
        return Check(name, response.status_code < 500, f"{url}: HTTP {response.status_code}")
    except httpx.HTTPError as exc:
        return Check(name, False, f"{url} unreachable: {type(exc).__name__}")


def local_prefect_server() -> str:
    """What `miles train` will use without PREFECT_API_URL: the local server it started before, when that is
    still up (it is reused), else a new one it starts."""
    from miles.config.prefect_home import read_record

    known = read_record()
    if known is not None:
        url, pid = known
        try:
            up = httpx.get(url.rstrip("/") + "/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            up = False
        if up:
            return f"PREFECT_API_URL unset: local server up at {url.removesuffix('/api')} " \
                   f"(pid {pid}; reused by the next `miles train`)"
    return "PREFECT_API_URL unset: `miles train` starts a local server"


def check_disk(path: str = ".") -> Check:
    free_gb = shutil.disk_usage(path).free / 2**30
    return Check("disk", free_gb > 2, f"{free_gb:.1f} GiB free in {os.path.abspath(path)}")


def check_base_model() -> Check:
    from miles.tiny.defaults import MAKING_TAKES
    from miles.tiny.recipes import base_model_dir  # not tiny.warmstart: that imports torch

    path = base_model_dir()
    made = (path / "warmstart.json").exists()
    return Check("tiny base model", True,
                 str(path) if made else f"not made yet (made once on the first run, {MAKING_TAKES})",
                 required=False)


def run_checks(mlflow_uri: str | None) -> list[Check]:
    prefect = os.environ.get("PREFECT_API_URL")
    return [
        Check("python", sys.version_info[:2] == (3, 11), sys.version.split()[0]),
        *check_packages(),
        *check_devices(),
        check_disk(),
        check_base_model(),
        check_url("prefect api", prefect, "/health", local_prefect_server()),
        check_url("mlflow", mlflow_uri if mlflow_uri and mlflow_uri.startswith("http") else None, "/health",
                  mlflow_uri or next_mlflow_store()),
    ]


def next_mlflow_store() -> str:
    """The store the next `miles train` here uses without --mlflow-tracking-uri: the one its run
    dirs' folder shares (runs/mlflow.db), and whether it holds runs yet."""
    from miles.config.mlflow_store import default_store_uri, sqlite_path
    from miles.config.resolve import default_run_dir

    uri = default_store_uri(Path.cwd() / default_run_dir())
    made = "exists" if sqlite_path(uri).exists() else "made by the first run"
    return f"MLFLOW_TRACKING_URI unset: {uri} (shared by the runs beside each other; {made})"


def env_report(mlflow_uri: str | None) -> int:
    checks = run_checks(mlflow_uri)
    width = max(len(c.name) for c in checks)
    for c in checks:
        mark = "ok  " if c.ok else ("FAIL" if c.required else "warn")
        print(f"{mark}  {c.name:<{width}}  {c.detail}")
    failed = [c.name for c in checks if c.required and not c.ok]
    print("all required checks passed" if not failed else f"failed: {', '.join(failed)}")
    return 1 if failed else 0


def health_flags_parser() -> argparse.ArgumentParser:
    """The --health-* flags alone, without --help of its own: `miles doctor --help` is answered by the
    doctor's parser, which lists RUN_DIR and --env first and these flags after them."""
    from miles.config.health import HealthConfig
    from miles.config.parse import build_parser

    parser = build_parser([HealthConfig], prog="miles doctor", add_help=False)
    for action in parser._actions:
        if "--config" in action.option_strings:
            action.help = argparse.SUPPRESS  # the doctor refuses a YAML (split_health_flags): not offered
    return parser


def split_health_flags(argv: list[str]) -> tuple[dict, list[str]]:
    """The `--health-*` / `--on-red-flag` flags given to the doctor (they replace the run's own settings
    in the replay), and the other arguments."""
    from miles.config import ConfigError

    namespace, rest = health_flags_parser().parse_known_args(argv)
    given = vars(namespace)
    if given.pop("__config_file", None):
        raise ConfigError("--config", "miles doctor takes the --health-* flags on the command line only")
    return given, rest


EXIT_RED_FLAG = 1
EXIT_UNREADABLE = 3  # the run's files cannot be read as a run's: no verdict at all (2 is a usage error)


def health_report(target: str, mlflow_uri: str | None, overrides: dict | None = None,
                  history: "HistoryArgs | None" = None) -> int:
    """Replay RUN_DIR's journal (or an MLflow run's history) through the health detectors; 1 on a red flag,
    3 (one line on stderr) when the run cannot be read. With `history`, the run is also gated against the
    trusted runs of its directory, and added to them when it passed both."""
    from pathlib import Path

    from miles.compare.text import terminal_safe_lines
    from miles.config import ConfigError
    from miles.health.history import from_mlflow, from_run_dir
    from miles.health.verdicts import format_table, summarize
    from miles.record.journal import UnreadableRun

    try:
        if Path(target).is_dir():
            run_history = from_run_dir(Path(target))
        elif history:
            raise ConfigError("--history", "gates a run directory (RUN_DIR), not an MLflow run id")
        elif mlflow_uri:
            run_history = from_mlflow(target, mlflow_uri)
        else:
            raise ConfigError("RUN_DIR", f"{target} is not a directory (an MLflow run id needs "
                                         f"--mlflow-tracking-uri)")
        rows = summarize(run_history, overrides)
        gate = history.run(Path(target)) if history else None
    except UnreadableRun as exc:
        print(f"miles doctor: cannot read the run: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    print(terminal_safe_lines(format_table(run_history, rows)))  # the run dir's name is anyone's text (N33)
    red = any(r.verdict == "RED" for r in rows)
    if gate is not None:
        try:
            print(history.report(gate, red))
        except UnreadableRun as exc:  # --history-add refused to write (a planted link)
            print(f"miles doctor: not added to the history: {exc}", file=sys.stderr)
            return EXIT_UNREADABLE
    return EXIT_RED_FLAG if red or (gate is not None and gate.fails) else 0


@dataclass(frozen=True)
class HistoryArgs:
    """`--history DIR [--history-mode] [--history-min-runs] [--history-add]`."""

    directory: str
    mode: str
    min_runs: int
    add: bool

    def run(self, run_dir):
        from miles.compare.gate import run_gate

        return run_gate(run_dir, self.directory, self.mode, self.min_runs)

    def report(self, gate, red: bool) -> str:
        from miles.compare.gate import format_gate
        from miles.compare.trusted import add_trusted

        lines = [format_gate(gate)]
        if self.add:
            if red or not gate.passed:
                why = "a red flag" if red else "the history gate did not pass"
                lines.append(f"not added to the history: {why}")
            else:
                path = add_trusted(self.directory, gate.comparison.run)
                lines.append(f"added to the history as trusted: {path}")
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="miles doctor", description=__doc__, parents=[health_flags_parser()],
        usage="miles doctor [RUN_DIR | --env] [--mlflow-tracking-uri URI] [--health-* VALUE ...] [--on-red-flag ...]")
    parser.add_argument("target", nargs="?", metavar="RUN_DIR",
                        help="a run directory, or an MLflow run id with --mlflow-tracking-uri: replay its metrics "
                             "through the health detectors with the run's own --health-* settings, or those given "
                             "here (exit 1 on a red flag; see --help of miles train for the --health-* flags)")
    parser.add_argument("--env", action="store_true", help="check installation, devices, disk and services "
                                                           "(the default without RUN_DIR)")
    parser.add_argument("--mlflow-tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                        help="MLflow store of the run id to replay; with --env the server to check "
                             "(default: env MLFLOW_TRACKING_URI)")
    parser.add_argument("--history", metavar="DIR", default=None,
                        help="gate the run against the trusted runs in DIR (one JSON per run; see "
                             "docs/user-guide/compare.md)")
    parser.add_argument("--history-mode", choices=("shadow", "enforce"), default="shadow",
                        help="shadow (default): report the gate only; enforce: exit 1 when it fails")
    parser.add_argument("--history-min-runs", type=int, default=2,
                        help="trusted runs needed before the corridors are active (default 2; fewer: cold start)")
    parser.add_argument("--history-add", action="store_true",
                        help="add the run to DIR as trusted when it passed (no red flag, gate passed or cold)")
    overrides, rest = split_health_flags(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(rest)
    if args.env and (args.target or overrides or args.history):
        parser.error("--env checks this machine; RUN_DIR, --history and the --health-* flags are for a run")
    history_flags = args.history_add or args.history_mode != "shadow" or args.history_min_runs != 2
    if history_flags and not args.history:
        parser.error("--history-mode, --history-min-runs and --history-add need --history DIR")
    if args.history_min_runs < 1:
        parser.error(f"--history-min-runs: {args.history_min_runs} must be at least 1")
    if args.target is None:
        return env_report(args.mlflow_tracking_uri)
    history = None
    if args.history:
        from miles.compare.trusted import history_dir

        history = HistoryArgs(str(history_dir(args.history, creating=args.history_add)), args.history_mode, args.history_min_runs,
                              args.history_add)
    return health_report(args.target, args.mlflow_tracking_uri, overrides, history)
