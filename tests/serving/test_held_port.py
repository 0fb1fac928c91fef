"""A service's port is held from the moment it is picked: no other process can bind it while the service
starts (an engine loads for seconds before it listens), and the service listens on the socket it was handed.
Before, the port was picked, closed and bound by the child seconds later; a suite run lost an engine to
"[Errno 98] address already in use" in between."""
from __future__ import annotations

import errno
import os
import socket

import httpx
import pytest

from miles.config import EngineConfig, RouterConfig
from miles.engines.launch import EngineStartError, launch_engine
from miles.router.launch import router_command
from miles.serving.held_port import LISTEN_FD_ENV, PortUnavailable, hold_port, take_handed_socket
from miles.serving.process import ServiceStartError, start_service


def bind_fails(port: int) -> bool:
    """Whether another process binding 127.0.0.1:port now is refused (as a client or a second service is)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        try:
            other.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE
            return True
        return False


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_held_port_is_taken_and_refuses_connections_until_the_service_listens():
    held = hold_port("127.0.0.1", None)
    port = held.getsockname()[1]
    try:
        assert bind_fails(port) and refused(port)
    finally:
        held.close()
    assert not bind_fails(port)  # released with the socket


def test_a_port_in_use_is_named_before_anything_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(PortUnavailable, match=f"cannot bind 127.0.0.1:{port}"):
            hold_port("127.0.0.1", port)
        with pytest.raises(EngineStartError, match=f"the engine's port: cannot bind 127.0.0.1:{port}"):
            launch_engine(tmp_path, EngineConfig(engine_device="cpu"), port=port, log_path=tmp_path / "e.log")
        assert not (tmp_path / "e.log").exists()  # no process was started


def test_the_handed_socket_is_taken_once_and_must_be_the_ports(monkeypatch):
    assert take_handed_socket("127.0.0.1", 1234) is None  # none handed: the service binds its own --port
    held = hold_port("127.0.0.1", None)
    port = held.getsockname()[1]
    monkeypatch.setenv(LISTEN_FD_ENV, str(held.fileno()))
    with pytest.raises(RuntimeError, match=f"bound to port {port}, not {port + 1}"):
        take_handed_socket("127.0.0.1", port + 1)
    held.detach()  # the refusal closed its descriptor
    held = hold_port("127.0.0.1", port)
    monkeypatch.setenv(LISTEN_FD_ENV, str(held.fileno()))
    sock = take_handed_socket("127.0.0.1", port)
    try:
        assert sock.fileno() == held.fileno() and not refused(port)  # listening now
        assert LISTEN_FD_ENV not in os.environ  # this process's children do not inherit it
    finally:
        held.detach()  # one descriptor, two socket objects: closed once, below
        sock.close()


@pytest.mark.slow
def test_an_engine_holds_its_port_from_launch_and_serves_on_it(tmp_path, base_model):
    engine = launch_engine(base_model, EngineConfig(engine_device="cpu", engine_cpu_threads=1), wait=False,
                           log_path=tmp_path / "engine.log")
    try:
        assert engine.alive  # still loading torch and the model: seconds before it could bind a port itself
        assert bind_fails(engine.port)
        engine.wait_ready(180)
        assert httpx.get(f"{engine.url}/health_generate", timeout=30).status_code == 200
    finally:
        engine.stop()


def test_the_router_serves_on_the_socket_it_was_handed(tmp_path):
    held = hold_port("127.0.0.1", None)
    port = held.getsockname()[1]
    argv = router_command(RouterConfig(), "127.0.0.1", port, [])
    router = start_service(argv, "127.0.0.1", port, tmp_path / "router.log", health_path="/router_health",
                           timeout=60, error=ServiceStartError, wait=False, held=held)
    try:
        assert held.fileno() == -1  # the launcher's copy is closed: the port is the router's
        assert bind_fails(port)
        router.wait_ready(60)
        assert httpx.get(f"{router.url}/router_health", timeout=10).status_code == 200
    finally:
        router.stop()
