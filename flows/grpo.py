"""The GRPO training flow: `miles train [flags]` (same flags as `python -m miles.train`).

Reads top to bottom: parse the flags (a bad one fails here, before anything starts), bring up
the Ray cluster, then on Ray start the router and engines, register the engines, train
chunk by chunk (a profiling window as its own task), finish; Ray is shut down if we started it.
"""
from __future__ import annotations

import hashlib
import re
import sys
import time
from pathlib import Path

from prefect import flow
from prefect.settings import PREFECT_API_URL

from flows.on_ray import train_on_ray
from miles.config import ConfigError, MilesConfig, parse_config
from miles.config.secrets import export_secrets, secrets_to_env
from miles.run_lock import RunDirLock
from tasks.cluster import bring_up_cluster, shut_down_cluster
from tasks.finish import RunReport
from tasks.options import configured


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("grpo-%Y%m%d-%H%M%S")


def build_argv(config_file: str | None, flags: list[str] | None) -> list[str]:
    return ([f"--config={config_file}"] if config_file else []) + list(flags or [])


def with_resolved_paths(config: MilesConfig) -> MilesConfig:
    """Absolute paths (Ray workers may run elsewhere) and the defaults every task must agree on."""
    from miles.tiny.warmstart import ensure_base_model

    def absolute(value: str | None) -> str | None:
        return str(Path(value).expanduser().resolve()) if value else value

    run_dir = Path(config.train.run_dir or default_run_dir()).resolve()
    return config.replace(
        run_dir=str(run_dir),
        hf_checkpoint=absolute(config.rollout.hf_checkpoint) or str(ensure_base_model(progress=False)),
        prompt_data=absolute(config.rollout.prompt_data),
        save=absolute(config.train.save), load=absolute(config.train.load),
        wandb_dir=absolute(config.tracking.wandb_dir), tensorboard_dir=absolute(config.tracking.tensorboard_dir),
        eval_prompt_data=[v if i % 2 == 0 else absolute(v) for i, v in enumerate(config.rollout.eval_prompt_data)],
    )


def run_prefix(run_dir: str) -> str:
    """Names of the run's Ray actors: readable, and unique per run dir."""
    digest = hashlib.sha1(run_dir.encode()).hexdigest()[:6]
    return f"miles-{re.sub(r'[^A-Za-z0-9_.-]', '_', Path(run_dir).name)}-{digest}"


def api_url() -> str:
    url = PREFECT_API_URL.value()
    if not url:
        raise ConfigError("PREFECT_API_URL", "the flow needs a real Prefect server that its Ray workers can reach; "
                                             "run it with `miles train` (starts one) or set PREFECT_API_URL")
    return url


@flow(name="grpo", log_prints=True)
def grpo(config_file: str | None = None, flags: list[str] | None = None) -> RunReport:
    """GRPO post-training on Ray. `config_file`: a YAML of flags; `flags`: Miles-style flags."""
    # a secret in the YAML goes to the environment, so the subflow's `config` parameter holds none
    config = export_secrets(with_resolved_paths(parse_config(build_argv(config_file, flags))))
    with RunDirLock(config.train.run_dir):  # one trainer per run dir; the next one fails here naming this one
        cluster = configured(bring_up_cluster, config.orchestration)(config.orchestration, api_url())
        try:
            return train_on_ray(config, config.train.run_dir, run_prefix(config.train.run_dir))
        finally:
            shut_down_cluster(cluster)


def main(argv: list[str] | None = None) -> int:
    """`miles train`: check the flags, start or find the Prefect server, run the flow, say where to look."""
    from prefect.settings import temporary_settings

    from flows.prefect_server import ensure_server
    from flows.where import print_finished, print_where_to_look

    argv = list(sys.argv[1:] if argv is None else argv)
    config = parse_config(argv)  # a bad flag is reported before any server or cluster starts
    if config.train.run_dir is None:
        argv += ["--run-dir", str(default_run_dir())]
        config = parse_config(argv)
    argv = secrets_to_env(config, argv)  # the flow's `flags` parameter is stored by Prefect: no secrets in it
    server = ensure_server()
    print_where_to_look(config, server)
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        report = grpo(flags=argv)
    print_finished(report, server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
