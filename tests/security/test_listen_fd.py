"""Probes LF1 and LF2: `MILES_LISTEN_FD` (the socket a miles launcher binds and hands to the engine or
router it starts, `miles/serving/held_port.py`) taken from the environment as it is.

- LF1: any odd value (not a number, stdin, a closed descriptor, a pipe, a file, a UDP or unix socket, a
  socket on another port) was a traceback; now one line naming the variable, exit 2.
- LF2: only the port was compared, so a socket bound to 127.0.0.2 or ::1 was served while the router
  announced `http://127.0.0.1:PORT` and judged its token rule on --host; now the address must be one
  --host names.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import pytest

from miles.config import ConfigError
from miles.serving.held_port import LISTEN_FD_ENV, hold_port, take_handed_socket


def odd_descriptors(tmp_path):
    """(name, fd) of descriptors that are no TCP socket for 127.0.0.1:port, and what to close after."""
    read, write = os.pipe()
    regular = tempfile.TemporaryFile(dir=tmp_path)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(tmp_path / "s.sock"))
    closed = os.dup(read)
    os.close(closed)
    cases = {"a pipe": read, "a regular file": regular.fileno(), "a UDP socket": udp.fileno(),
             "a unix socket": unix.fileno(), "a closed descriptor": closed}
    return cases, [regular, udp, unix], (read, write)


@pytest.mark.parametrize("value", ["abc", "-1", " 3 ", "0", "2", "", "\u0663", "9" * 40])
def test_a_value_that_is_no_descriptor_is_one_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(LISTEN_FD_ENV, value)
    with pytest.raises(ConfigError, match=f"^{LISTEN_FD_ENV}: .* is not (a file descriptor number|an open file)"):
        take_handed_socket("127.0.0.1", 31886)


def test_a_descriptor_that_is_no_tcp_socket_is_one_error_naming_the_variable(monkeypatch, tmp_path):
    cases, keep, pipe = odd_descriptors(tmp_path)
    try:
        for name, fd in cases.items():
            monkeypatch.setenv(LISTEN_FD_ENV, str(fd))
            with pytest.raises(ConfigError, match=f"^{LISTEN_FD_ENV}: '{fd}' is not ") as caught:
                take_handed_socket("127.0.0.1", 31886)
            assert "open file descriptor" in str(caught.value) if name == "a closed descriptor" else \
                "socket" in str(caught.value), (name, caught.value)
            os.fstat(fd) if name != "a closed descriptor" else None  # a refused descriptor is left as it was
    finally:
        for item in keep:
            item.close()
        for fd in pipe:
            os.close(fd)


@pytest.mark.parametrize("bound", ["127.0.0.2", "0.0.0.0"])
def test_a_socket_bound_to_another_address_is_refused(monkeypatch, bound):
    held = hold_port(bound, None)
    port = held.getsockname()[1]
    monkeypatch.setenv(LISTEN_FD_ENV, str(held.fileno()))
    try:
        with pytest.raises(ConfigError, match=f"is bound to {bound}, not 127.0.0.1 \\(--host\\)"):
            take_handed_socket("127.0.0.1", port)
    finally:
        held.detach()  # the refusal closed its descriptor


def test_an_ipv6_loopback_socket_is_refused_for_an_ipv4_host(monkeypatch):
    try:
        held = hold_port("::1", None)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    monkeypatch.setenv(LISTEN_FD_ENV, str(held.fileno()))
    try:
        with pytest.raises(ConfigError, match="is bound to ::1, not 127.0.0.1"):
            take_handed_socket("127.0.0.1", held.getsockname()[1])
    finally:
        held.detach()


def test_a_socket_bound_to_what_host_names_is_taken(monkeypatch):
    held = hold_port("localhost", None)  # as a launcher binds --host localhost
    monkeypatch.setenv(LISTEN_FD_ENV, str(held.fileno()))
    sock = take_handed_socket("localhost", held.getsockname()[1])
    try:
        assert sock.fileno() == held.fileno()
    finally:
        held.detach()
        sock.close()


def test_the_router_says_one_line_and_exits_2(tmp_path):
    """Before: a ValueError traceback and exit 1 for `abc`; a socket on 127.0.0.2 served while the
    router printed "listening on http://127.0.0.1:PORT"."""
    odd = hold_port("127.0.0.2", None)
    try:
        for value, pass_fds in (("abc", ()), (str(odd.fileno()), (odd.fileno(),))):
            port = odd.getsockname()[1]
            done = subprocess.run([sys.executable, "-m", "flows.cli", "router", "--host", "127.0.0.1", "--port",
                                   str(port), "--worker-urls", "http://127.0.0.1:9"], capture_output=True, text=True,
                                  env={**os.environ, LISTEN_FD_ENV: value}, pass_fds=pass_fds, timeout=120,
                                  stdin=subprocess.DEVNULL)
            assert done.returncode == 2, done.stdout + done.stderr
            assert "Traceback" not in done.stderr and f"error: {LISTEN_FD_ENV}: '{value}'" in done.stderr
            assert "listening on" not in done.stdout
    finally:
        odd.close()
