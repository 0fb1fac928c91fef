"""`miles dashboard RUN_DIR [--follow] [--host] [--port] [--dashboard-token]`: serve a run's web view."""
from __future__ import annotations

import argparse
import socket
from pathlib import Path

from miles.config import ConfigError
from miles.record import layout

DEFAULT_PORT = 8300
MAX_HEAD_BYTES = 64 * 1024  # request line + headers (431 past it), as the engine's and router's defaults
HEAD_TIMEOUT_S = 10.0  # a request's head must arrive within this (408 after); an idle connection counts too


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="miles dashboard", description=(
        "Serve a web view of a run directory: the What-to-watch panels and every metric, the phase timeline, "
        "the sampled rollouts and their tokens. Reads the run and never changes it; only the Diagnose button "
        "writes, a bundle into RUN_DIR/diagnose/ as `miles diagnose` does."))
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (--run-dir of the run)")
    parser.add_argument("--baseline", action="append", default=[], metavar="DIR",
                        help="a run dir to compare the run with (repeat for several; the Compare view "
                             "also offers the run's sibling run dirs)")
    parser.add_argument("--follow", action="store_true", help="keep reading while the run goes on (the page "
                        "refreshes itself every few seconds)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; off loopback "
                        "--dashboard-token is required)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    parser.add_argument("--dashboard-token", default=None, help="token every API request must carry "
                        "(env MILES_DASHBOARD_TOKEN); required off loopback")
    args = parser.parse_args(argv)
    if not Path(args.run_dir).is_dir():
        raise ConfigError("RUN_DIR", f"{args.run_dir} is not a directory")
    for baseline in args.baseline:
        if not (Path(baseline) / layout.JOURNAL).is_file():
            raise ConfigError("--baseline", f"{baseline} is not a run directory (no {layout.JOURNAL})")
    if not 0 <= args.port <= 65535:
        raise ConfigError("--port", f"{args.port} is not a port number (0-65535)")
    return args


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from miles.dashboard.app import build_app, check_bind, resolve_token
    from miles.serving.limits import guarded_protocol
    from miles.serving.origin_guard import OriginGuard

    args = parse_args(argv)
    token = resolve_token(args.dashboard_token)
    check_bind(args.host, token)
    app = build_app(Path(args.run_dir), follow=args.follow, token=token, baselines=[Path(b) for b in args.baseline])
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        raise ConfigError("--port", f"cannot bind {args.host}:{args.port}: {exc}") from None
    sock.listen(128)  # listening before the URL is printed: a client that reads it can connect at once
    host = f"[{args.host}]" if ":" in args.host else args.host
    # The one line a parent process reads to learn the port (with --port 0); the token is never printed.
    print(f"miles dashboard on http://{host}:{sock.getsockname()[1]}/ for {args.run_dir}"
          + (" (following)" if args.follow else ""), flush=True)
    # Host check against DNS rebinding (a page rebinding its name to 127.0.0.1 could read the samples)
    guarded = OriginGuard(app, args.host)
    server = uvicorn.Server(uvicorn.Config(guarded, log_level="warning", access_log=False,
                                           http=guarded_protocol(MAX_HEAD_BYTES, HEAD_TIMEOUT_S)))
    server.run(sockets=[sock])
    return 0


def command(run_dir: Path) -> str:
    """The command that shows a run, as `miles train` prints it."""
    from miles.config.commands import runnable

    return f"{runnable('miles')} dashboard {run_dir} --follow"


if __name__ == "__main__":
    from miles.config import run_main

    run_main(main, "miles dashboard")
