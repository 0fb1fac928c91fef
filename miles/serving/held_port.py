"""A service's port, held from the moment it is picked until the service listens on it.

Picking a free port, closing it and starting a child that binds it seconds later (an engine binds only
after torch, transformers and its model are loaded) leaves a window in which any other process may take
that port: a client's outgoing connection gets an ephemeral port from the same range. The engine then died
with "[Errno 98] address already in use" (seen once in a test-suite run, under load). Here the launcher binds
the port itself and hands the bound socket to the child as an inherited file descriptor named in
MILES_LISTEN_FD; the child listens on that very socket. Bound but not yet listening, the port refuses
connections (a health poll sees "not up yet", as before) and no other process can bind it.

Only our own services take the socket (the embedded engine, the router); a service started by hand binds
its --port as before.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import stat

from miles.config import ConfigError

LISTEN_FD_ENV = "MILES_LISTEN_FD"


class PortUnavailable(OSError):
    """The port asked for cannot be bound here (another process has it, or the host is not this machine's)."""


def hold_port(host: str, port: int | None) -> socket.socket:
    """A socket bound to host:port (0 or None: a port the OS picks), not listening, inheritable by a child.
    SO_REUSEADDR, as the service's own bind would set it: a service restarted on its port after a crash
    binds through the old connections' TIME_WAIT."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port or 0))
    except OSError as exc:
        sock.close()
        raise PortUnavailable(f"cannot bind {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def handed_env(sock: socket.socket) -> dict[str, str]:
    """What the child's environment needs to find the socket (passed with Popen's pass_fds)."""
    return {LISTEN_FD_ENV: str(sock.fileno())}


class HandedSocketError(ConfigError, RuntimeError):
    """MILES_LISTEN_FD names no TCP socket bound to the service's --host and --port: one line, exit 2."""

    def __init__(self, value: str, message: str):
        super().__init__(LISTEN_FD_ENV, f"{value!r:.40} {message}; the variable is set by a miles launcher "
                                        f"(unset it to bind --host and --port)")


def take_handed_socket(host: str, port: int, backlog: int = 2048) -> socket.socket | None:
    """The socket this process was handed for host:port, now listening; None if it was handed none. The
    variable is removed so that this process's own children do not take it for theirs.

    The socket must be a bound TCP socket whose address is one --host names and whose port is --port:
    the service announces --host and its token rule judges --host, so a socket bound elsewhere (another
    loopback address, ::1, 0.0.0.0) would be served past that rule (probe LF2). Any other value is a
    HandedSocketError naming the variable (LF1: each was a traceback)."""
    value = os.environ.pop(LISTEN_FD_ENV, None)
    if value is None:
        return None
    sock = _handed(value)
    try:
        bound_host, bound_port = sock.getsockname()[:2]
        if bound_port != port:
            raise HandedSocketError(value, f"is bound to port {bound_port}, not {port} (--port)")
        if not _same_address(bound_host, host, port):
            raise HandedSocketError(value, f"is bound to {bound_host}, not {host} (--host)")
    except BaseException:
        sock.close()
        raise
    return listen_on(sock, backlog)


def _handed(value: str) -> socket.socket:
    """The TCP socket the variable's descriptor holds (HandedSocketError for anything else)."""
    # 0-2 are the standard streams, never a handed socket
    if not (value.isascii() and value.isdigit()) or int(value) < 3:
        raise HandedSocketError(value, "is not a file descriptor number of 3 or more")
    fd = int(value)
    try:
        mode = os.fstat(fd).st_mode
    except (OSError, OverflowError):
        raise HandedSocketError(value, "is not an open file descriptor") from None
    if not stat.S_ISSOCK(mode):
        raise HandedSocketError(value, "is not a socket")
    sock = socket.socket(fileno=fd)
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.detach()  # not ours to close: the process keeps its descriptor as it was
        raise HandedSocketError(value, "is not a TCP socket")
    return sock


def _same_address(bound: str, host: str, port: int) -> bool:
    """Whether the bound address is one of those --host resolves to (as hold_port bound it)."""
    try:
        named = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
        return ipaddress.ip_address(bound.split("%")[0]) in {ipaddress.ip_address(a.split("%")[0]) for a in named}
    except (OSError, ValueError):
        return False


def listen_on(sock: socket.socket, backlog: int = 2048) -> socket.socket:
    """`sock`, now this process's listening socket for an asyncio server: not inherited by a process it starts
    (which must not keep its port open), non-blocking."""
    sock.set_inheritable(False)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def release_handed_socket() -> None:
    """Close a handed socket this process will not listen on (before exec of a server that binds its own
    port: an inherited bound socket would make that bind fail)."""
    fd = os.environ.pop(LISTEN_FD_ENV, None)
    if fd is not None:
        try:
            os.close(int(fd))
        except OSError:
            pass
