"""The GRPO training flow: `miles train [flags]` (same flags as `python -m miles.train`).

Reads top to bottom: parse the flags and resolve every default once, check everything that can
be checked (a bad flag, hook or data path fails here, before anything starts), bring up the
Ray cluster, then on Ray (`flows.on_ray`) start the router, engines and ranks, train chunk by
chunk with the driver loop, finish; Ray is shut down if we started it.
"""
from __future__ import annotations

import sys

from prefect import flow
from prefect.settings import PREFECT_API_URL

from flows.on_ray import train_on_ray
from miles.config import ConfigError, parse_config
from miles.config.resolve import default_run_dir, resolve
from miles.preflight import preflight
from tasks.cluster import bring_up_cluster, shut_down_cluster
from tasks.finish import RunReport
from tasks.options import with_run_retries


def build_argv(config_file: str | None, flags: list[str] | None) -> list[str]:
    return ([f"--config={config_file}"] if config_file else []) + list(flags or [])


def api_url() -> str:
    url = PREFECT_API_URL.value()
    if not url:
        raise ConfigError("PREFECT_API_URL", "the flow needs a real Prefect server that its Ray workers can reach; "
                                             "run it with `miles train` (starts one) or set PREFECT_API_URL")
    return url


@flow(name="grpo", log_prints=True)
def grpo(config_file: str | None = None, flags: list[str] | None = None) -> RunReport:
    """GRPO post-training on Ray. `config_file`: a YAML of flags; `flags`: Miles-style flags."""
    config = resolve(parse_config(build_argv(config_file, flags)))
    preflight(config)
    with_run_retries(bring_up_cluster, config.orchestration)(config.orchestration, api_url())
    try:
        return train_on_ray(config)
    finally:
        shut_down_cluster()


def main(argv: list[str] | None = None) -> int:
    """`miles train`: check the flags, start or find the Prefect server, run the flow, say where to look."""
    from prefect.settings import temporary_settings

    from flows.prefect_server import ensure_server
    from flows.where import print_finished, print_where_to_look

    argv = list(sys.argv[1:] if argv is None else argv)
    config = parse_config(argv)  # a bad flag is reported before any server or cluster starts
    if config.train.run_dir is None:  # one run dir for the flow and for what we print here
        argv += ["--run-dir", str(default_run_dir().resolve())]
    config = resolve(parse_config(argv))
    preflight(config)
    server = ensure_server()
    print_where_to_look(config, server)
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        report = grpo(flags=argv)
    print_finished(report, server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
