"""Connect this process to Ray: an existing cluster (`--ray-address`, or `RAY_ADDRESS` inside a Ray job) or a new local one."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys

import ray

from miles.cluster.names import NAMESPACE
from miles.cluster.working_dir import unpack_on_every_node
from miles.config import ConfigError
from miles.config.secrets import child_env
from miles.serving.process import SERVICE_KEEP_ENV, passive_omp

CONNECT_TIMEOUT_S = 5.0
# Secret-named variables a local cluster's processes (GCS, raylet, workers) keep: Ray's own token, and
# the Hub token the services keep (a training rank may load a gated model by its Hub id).
RAY_KEEP_ENV = frozenset({"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"}) | SERVICE_KEEP_ENV
TOKEN_HELP = ("Ray token authentication rejected this driver's token (wrong or missing): give it the cluster's "
              "token (`ray get-auth-token` on the head node) in ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or "
              "RAY_AUTH_TOKEN")


def existing_cluster_address(ray_address: str | None) -> str | None:
    """The cluster to join: the flag, else `RAY_ADDRESS` (set by Ray for a job's driver), else None (start one)."""
    return ray_address or os.environ.get("RAY_ADDRESS") or None


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S, source: str = "--ray-address") -> None:
    """Fail fast with the address in the message; `ray.init` itself may wait minutes."""
    if address == "auto":
        return  # resolved by ray.init from the local node's address file, and it fails fast
    host_port = address.removeprefix("ray://")
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(source, f"expected HOST:PORT, ray://HOST:PORT or auto, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(source, f"cannot reach a Ray cluster at {address} ({exc}); "
                                  f"start one with `ray start --head` or leave the flag out") from None


def use_token_if_available() -> bool:
    """Send Ray's auth token when one is on this machine. Ray sends it to an explicit address only with
    RAY_AUTH_MODE=token, but `ray start --head` turns token auth on whenever ~/.ray/auth_token exists;
    a cluster without token auth ignores it. An explicit RAY_AUTH_MODE is left as it is."""
    from ray._raylet import AuthenticationTokenLoader, Config

    if "RAY_AUTH_MODE" in os.environ:
        return os.environ["RAY_AUTH_MODE"].lower() == "token"
    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        return False
    os.environ["RAY_AUTH_MODE"] = "token"  # inherited by the processes this driver starts
    Config.initialize("")  # Ray caches its config: make this process see the mode too
    return True


def check_authenticated(address: str, timeout: float = CONNECT_TIMEOUT_S, source: str = "--ray-address") -> None:
    """One GCS request with this driver's token: a wrong or missing one is named at once, where
    `ray.init` would retry for ~20 s and then report only that it found no cluster."""
    if address == "auto" or address.startswith("ray://"):
        return  # found or reached through Ray's own machinery, which reports auth errors itself
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=address).internal_kv_get(b"miles-auth-probe", None, timeout=timeout)
    except AuthenticationError:
        raise ConfigError(source, f"the Ray cluster at {address} refused the connection: {TOKEN_HELP}") from None
    except Exception:  # anything else (a slow GCS): ray.init reports it with its own words
        return


def without_job_env_vars(runtime_env: dict | None) -> dict | None:
    """Inside a Ray job, the env vars the job's own runtime env sets (`ray job submit --runtime-env-json`)
    reach every worker already, and Ray refuses a driver that sets one of them again."""
    job_config = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")  # set by Ray for a job's driver
    if not runtime_env or not job_config:
        return runtime_env
    job_vars = (json.loads(job_config).get("runtime_env") or {}).get("env_vars") or {}
    env_vars = {k: v for k, v in runtime_env.get("env_vars", {}).items() if k not in job_vars}
    return {**runtime_env, "env_vars": env_vars}


def with_worker_env(runtime_env: dict | None) -> dict | None:
    """The job's runtime env plus what every worker of this driver gets from miles: passive OpenMP waiting
    (`miles.serving.process.passive_omp`; training ranks run torch threads beside engines and other jobs),
    unless this driver's environment chose a policy."""
    extra = passive_omp(os.environ)
    if not extra:
        return runtime_env
    runtime_env = dict(runtime_env or {})
    runtime_env["env_vars"] = {**extra, **(runtime_env.get("env_vars") or {})}
    return runtime_env


def check_cluster(ray_address: str | None) -> str:
    """For an existing cluster: reachable, and this driver's token accepted (a no-op when one will be
    started). Returns where the address came from, for error messages."""
    address = existing_cluster_address(ray_address)
    source = "--ray-address" if ray_address else "RAY_ADDRESS"
    if address is not None:
        check_reachable(address, source=source)
        use_token_if_available()
        check_authenticated(address, source=source)
    return source


def plain_prefixes() -> None:
    """Ray colours the `(task pid=N)` prefix of every worker line it forwards; off a terminal (a file, a
    pipe, `| tee`) those are escape codes in the log, so there Ray is told to print them plain (it reads
    RAY_COLOR_PREFIX in this, the driver's, process; a value the user set is kept)."""
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


@contextlib.contextmanager
def quiet_token_auth():
    """Token auth for a local cluster, without Ray's two lines about it. Left unset, RAY_AUTH_MODE makes
    `ray.init` turn token auth on and WARN that it did (every run), and log "Generated new authentication
    token" the first time on a machine. Set here to the same mode, the warning goes; the token file
    (~/.ray/auth_token) is still made when missing, with its log line held back. An explicit
    RAY_AUTH_MODE (`disabled` too) is left as it is."""
    import logging

    from ray._raylet import Config

    if "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = "token"  # inherited by the cluster's processes, as Ray's default does
        Config.initialize("")  # Ray caches its config: make this process see the mode too
    setup_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = setup_log.level
    setup_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        setup_log.setLevel(level)


@contextlib.contextmanager
def environ_without_secrets(keep: frozenset[str]):
    """os.environ without its secret-named variables (but `keep`) while the block runs: the processes
    a local `ray.init` starts copy this environment, and every worker copies the raylet's."""
    saved = dict(os.environ)
    allowed = child_env(saved, keep)
    for name in set(saved) - set(allowed):
        del os.environ[name]
    try:
        yield
    finally:
        os.environ.update({k: v for k, v in saved.items() if k not in os.environ})


def connect(ray_address: str | None, num_cpus: int | None = None, object_store_mb: int | None = None,
            runtime_env: dict | None = None, log_to_driver: bool = True,
            keep_env: frozenset[str] = frozenset()) -> bool:
    """`ray.init` for this process; returns True when it started a new local cluster (sized by
    `num_cpus` and `object_store_mb`, which an existing cluster already has and Ray refuses).
    A local cluster's processes inherit no secret-named variable but Ray's token and `keep_env`
    (this driver keeps them all); an existing cluster's processes have the environment they were started with.
    Either way this driver's workers also get `with_worker_env`'s variables (passive OpenMP waiting)."""
    plain_prefixes()
    runtime_env = with_worker_env(runtime_env)
    address = existing_cluster_address(ray_address)
    if address is None:
        with quiet_token_auth(), environ_without_secrets(RAY_KEEP_ENV | keep_env):
            ray.init(num_cpus=num_cpus or os.cpu_count(),
                     object_store_memory=object_store_mb * 2**20 if object_store_mb else None,
                     include_dashboard=False, namespace=NAMESPACE, runtime_env=runtime_env,
                     log_to_driver=log_to_driver)
        return True
    source = check_cluster(ray_address)
    try:
        ray.init(address=address, namespace=NAMESPACE, runtime_env=without_job_env_vars(runtime_env),
                 log_to_driver=log_to_driver)
    except ConnectionError as exc:
        raise ConfigError(source, f"no Ray cluster at {address}: {exc}") from None
    unpack_on_every_node()  # before anything is placed: see miles.cluster.working_dir
    return False
