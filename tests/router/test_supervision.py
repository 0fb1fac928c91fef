"""The engine supervisor against stub engines (real processes) and a real router: a SIGKILLed engine and a
SIGSTOPped (hung) one are relaunched on their port, kept stale, and admitted only at the current weights."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from miles.engines.supervisor import EngineSupervisor, SupervisionPolicy
from miles.rollout.generate import watch_outage
from miles.run.engine_loss import NoEngineLeft
from miles.serving.process import ServiceProcess
from miles.serving.router_client import RouterClient

from tests.support.wait import wait_for

from .stubs import launch_stub
from .rollout_client import post_once

POLICY = SupervisionPolicy(interval=0.2, timeout=0.5, hung_checks=3, max_restarts=2, backoff=0.1)


class KeptWeights:
    """What the trainer's weight sync lends the supervisor: its lock and the current weights."""

    def __init__(self, model_dir: Path, version: int):
        self.lock, self._current = threading.Lock(), (model_dir, version)

    def current(self):
        return self._current


def as_service(stub) -> ServiceProcess:
    return ServiceProcess(url=stub.url, pid=stub.proc.pid, port=stub.port, process=stub.proc)


def listed(handle, url: str) -> dict:
    return next(w for w in httpx.get(handle.url + "/list_workers").json()["workers"] if w["url"] == url)


def supervised(router, tmp_path, version: int = 3):
    stubs = [launch_stub(), launch_stub()]
    handle = router([s.url for s in stubs])
    httpx.post(handle.url + "/update_weight_version", json={"weight_version": str(version)}).raise_for_status()
    started: list = list(stubs)

    def relaunch(index: int, port: int) -> ServiceProcess:
        stub = launch_stub(port=port)
        started.append(stub)
        return as_service(stub)

    supervisor = EngineSupervisor([as_service(s) for s in stubs], relaunch, POLICY, RouterClient(handle.url, None),
                                  log=lambda line: None)
    supervisor.attach_weights(KeptWeights(tmp_path, version))
    return supervisor.start(), handle, stubs, started


def cleanup(supervisor, started) -> None:
    supervisor.stop()
    for stub in started:
        if stub.proc.poll() is None:
            os.kill(stub.proc.pid, signal.SIGCONT)  # a stopped stub cannot die of SIGTERM otherwise
        stub.kill()


def test_a_killed_engine_comes_back_on_its_port_at_the_current_weights(router, tmp_path):
    supervisor, handle, stubs, started = supervised(router, tmp_path)
    try:
        os.kill(stubs[1].proc.pid, signal.SIGKILL)
        wait_for(lambda: listed(handle, stubs[1].url) == {"url": stubs[1].url, "state": "healthy",
                                                         "weight_version": "3"} and len(started) == 3, 60,
                 "engine 1 relaunched and admitted at version 3")
        assert supervisor.ready_urls() == [stubs[0].url, stubs[1].url]  # the same URL: same port
        assert supervisor.served_versions() == ["default", "3"]  # the relaunched one got the pushed version
        assert supervisor.slots[1].restarts == 1 and supervisor.slots[1].service.pid != stubs[1].proc.pid
    finally:
        cleanup(supervisor, started)


def test_a_stopped_engine_is_found_hung_killed_and_relaunched(router, tmp_path):
    supervisor, handle, stubs, started = supervised(router, tmp_path)
    try:
        os.kill(stubs[0].proc.pid, signal.SIGSTOP)
        wait_for(lambda: stubs[0].proc.poll() is not None, 30, "the hung engine killed")
        assert stubs[0].proc.returncode == -signal.SIGKILL
        wait_for(lambda: listed(handle, stubs[0].url)["state"] == "healthy" and len(started) == 3, 60,
                 "engine 0 admitted again")
        assert listed(handle, stubs[0].url)["weight_version"] == "3"
        counters = supervisor.take()
        assert counters.deaths == 1 and counters.restarts == 1 and counters.readmissions == 1
    finally:
        cleanup(supervisor, started)


def test_an_engine_past_its_restart_budget_is_left_down(router, tmp_path):
    supervisor, handle, stubs, started = supervised(router, tmp_path)
    supervisor.policy = SupervisionPolicy(interval=0.2, timeout=0.5, hung_checks=3, max_restarts=0, backoff=0.1)
    try:
        os.kill(stubs[1].proc.pid, signal.SIGKILL)
        wait_for(lambda: supervisor.states()["failed"] == 1, 30, "engine 1 left down")
        assert listed(handle, stubs[1].url)["state"] == "stale" and supervisor.ready_urls() == [stubs[0].url]
    finally:
        cleanup(supervisor, started)


def test_a_killed_router_comes_back_on_its_address_with_every_engine_registered_at_its_state(tmp_path):
    from miles.config import RouterConfig
    from miles.router.launch import launch_router

    stubs = [launch_stub(), launch_stub()]
    routers = [launch_router(RouterConfig(), worker_urls=[s.url for s in stubs], log_path=tmp_path / "router.log")]

    def relaunch_router(port: int) -> ServiceProcess:
        routers.append(launch_router(RouterConfig(), port=port, log_path=tmp_path / "router.log"))
        return routers[-1]

    url = routers[0].url
    supervisor = EngineSupervisor([as_service(s) for s in stubs], lambda i, port: as_service(launch_stub(port=port)),
                                  POLICY, RouterClient(url, None), log=lambda line: None, router_process=routers[0],
                                  relaunch_router=relaunch_router)
    supervisor.attach_weights(KeptWeights(tmp_path, 4))
    supervisor.slots[1].state = "relaunching"  # as if engine 1 were being relaunched when the router died
    supervisor.start()
    try:
        os.kill(routers[0].pid, signal.SIGKILL)
        wait_for(lambda: len(routers) == 2 and not supervisor.router_down.is_set(), 60,
                 "the router relaunched and told the engines")
        assert routers[1].url == url and supervisor.take().router_restarts == 1  # the same address
        listing = httpx.get(url + "/list_workers").json()["workers"]
        assert listing == [{"url": stubs[0].url, "state": "healthy", "weight_version": "4"},
                           {"url": stubs[1].url, "state": "stale", "weight_version": None}]
        assert httpx.get(url + "/workers").json()["weight_version"] == "4"
    finally:
        supervisor.stop()
        for router in routers:
            router.stop()
        for stub in stubs:
            stub.kill()


def test_once_every_engine_is_left_down_a_waiting_request_stops_at_once(router, tmp_path):
    """N39: the supervisor says it gave up, and the rollout client stops waiting out --engine-wait-timeout."""
    supervisor, handle, stubs, started = supervised(router, tmp_path)
    supervisor.policy = SupervisionPolicy(interval=0.2, timeout=0.5, hung_checks=3, max_restarts=0, backoff=0.1)
    try:
        os.kill(stubs[1].proc.pid, signal.SIGKILL)
        wait_for(lambda: supervisor.states()["failed"] == 1, 30, "engine 1 left down")
        assert supervisor.gave_up() is None  # engine 0 still serves
        os.kill(stubs[0].proc.pid, signal.SIGKILL)
        wait_for(lambda: supervisor.states()["failed"] == 2, 30, "both engines left down")
        assert supervisor.gave_up() == "every engine (0, 1) used its 0 restarts (--engine-max-restarts) and is down"
        watch_outage(supervisor.gave_up)
        began = time.monotonic()
        with pytest.raises(NoEngineLeft, match="--engine-max-restarts"):
            post_once(handle.url, SimpleNamespace(use_fault_tolerance=True, engine_wait_timeout=300.0))
        assert time.monotonic() - began < 30  # not the 300 s of --engine-wait-timeout
    finally:
        watch_outage(None)
        cleanup(supervisor, started)
