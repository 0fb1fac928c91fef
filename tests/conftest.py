"""Session-wide fixtures: one real Prefect server (SQLite, loopback) shared by every test that asks, the tiny
base model (warm-started, and an untrained one of its shape), and the plugins of tests/support (the session
runs, the shared Ray)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# Ray starts a default worker per CPU when a driver first connects; a run's actors and a flow's tasks start
# workers of their own, so in the suite those sat idle until their Ray went down (59 of them, 26 CPU-s, in a
# suite run of about 30 local Rays, 2026-12-06). The tests' Rays (this process's, and those of the runs it
# starts, which inherit the variable) start none; a user's run keeps Ray's default.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")

pytest_plugins = [
    "tests.support.sessions",  # the runs many tests read (train once, check many times)
    "tests.support.ray_session",  # ray_cluster: one local Ray per test process, for the modules that ask
]


@pytest.fixture(scope="session")
def base_model():
    from miles.tiny.warmstart import ensure_base_model

    return ensure_base_model(progress=False)


@pytest.fixture(scope="session")
def untrained_model(tmp_path_factory) -> Path:
    """A tiny checkpoint freshly initialised (seconds), for tests of what is done with a model's files or its
    requests, not of what it learnt: on a machine without the cached models, the warm-started one is minutes
    of the other worker's warm start to wait for."""
    from miles.tiny.model import build_tiny_model
    from miles.tiny.warmstart import save_checkpoint

    out = tmp_path_factory.mktemp("untrained") / "model"
    save_checkpoint(*build_tiny_model(0), out)
    return out


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """A `prefect server start` subprocess on a free loopback port with a temp PREFECT_HOME.

    PREFECT_API_URL points at it for this process (settings context and env, so subprocesses
    and Ray workers see it too); teardown kills the server by PID."""
    from flows.prefect_server import start_server

    home = tmp_path_factory.mktemp("prefect-home")
    server = start_server(home, port=None, timeout=180.0, ui=False)
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME")}
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ["PREFECT_HOME"] = str(home / "client")
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url, PREFECT_HOME: str(home / "client")}):
            yield server
            from prefect.logging.handlers import APILogHandler

            APILogHandler().flush()  # send the last task-run logs while the server is still up
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


RUN_SECRET_ENV = ("MILES_ROUTER_ADMIN_TOKEN", "MILES_ENGINE_ADMIN_TOKEN", "WANDB_API_KEY")


@pytest.fixture(autouse=True)
def run_secrets_stay_in_their_test():
    """A run exports its token (and `--wandb-key`) into this process's environment, as `miles train` does
    for its flow; in one pytest process a token left behind would make every later test's router and
    engines demand it. Each test leaves these variables as it found them."""
    before = {name: os.environ.get(name) for name in RUN_SECRET_ENV}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


WARM_MAKER, WARM_LOG = pytest.StashKey(), pytest.StashKey()  # the controller's maker process and its log


def pytest_sessionstart(session):
    """Under `make test`'s workers, the controller starts making the cached tiny models at once, in a process of
    their own (tests/support/warm_cache.py); a no-op when they are made, in a worker, or without workers."""
    config = session.config
    if hasattr(config, "workerinput") or (getattr(config.option, "numprocesses", None) or 0) < 2:
        return
    from tests.support import warm_cache

    config.stash[WARM_LOG] = Path(config.rootpath) / ".pytest_cache" / "warm-cache.log"
    config.stash[WARM_MAKER] = warm_cache.start(config.stash[WARM_LOG])


def pytest_sessionfinish(session):
    config = session.config
    if SCOPE_CLOCK is not None and session.testsfailed == 0:
        SCOPE_CLOCK.write()  # a failed run's timeouts would mislead the next order
    if WARM_MAKER in config.stash:
        from tests.support import warm_cache

        failed = warm_cache.stop(config.stash[WARM_MAKER], config.stash[WARM_LOG])
        if failed:
            print(f"\nmaking the cached tiny models in the background failed:\n{failed}")


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs the suite on two workers (`-n 2`), a scope of `tests/support/scheduling.py` at a time, in
    its order. (xdist's own `--dist loadgroup` marks do not reach its scheduler under pytest 9.2, which keeps a
    node's id in `_id`, not `_nodeid`: that is why this is a scheduler and not marks.)"""
    from xdist.scheduler import LoadScopeScheduling

    from tests.support.scheduling import ScopeClock, ordered, scope_of

    class ModuleScheduling(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid, config.rootpath)

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:  # the queue is whole before the first unit goes out: order it once
                self._ordered = True
                queue = ordered(list(self.workqueue.items()), config.rootpath)
                self.workqueue.clear()
                self.workqueue.update(queue)
            super()._assign_work_unit(node)

    global SCOPE_CLOCK
    SCOPE_CLOCK = ScopeClock(config.rootpath)
    return ModuleScheduling(config, log)


SCOPE_CLOCK = None  # on `make test`'s controller only: each scope's seconds, for the next run's order


def pytest_runtest_logreport(report):
    if SCOPE_CLOCK is not None:
        SCOPE_CLOCK.add(report.nodeid, report.duration)
