"""Which of the addresses a run dir names `miles diagnose` may talk to, and with which secret.

`profiler/services.json` is a file in the run dir: anyone who could write there can name any URL. So
diagnose probes only services on this machine (a loopback address, or one of this machine's own
addresses: a local Ray cluster records the node's IP), sends the router admin token only to a router
whose port a live process of the run's own process list listens on and whose command line is a miles
router's for that port (its /health and /metrics are open and get no token at all), and sends Ray's
auth token only to a GCS on this machine or the one the user named in RAY_ADDRESS."""
from __future__ import annotations

import ipaddress
import os
import socket
import urllib.parse
from pathlib import Path

LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp


def is_local_host(host: str) -> bool:
    """A loopback name or address, or an address of one of this machine's interfaces (it can be bound);
    other names are not resolved (a name is whatever DNS says it is)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if address.is_loopback:
        return True
    if address.is_unspecified or address.is_multicast:
        return False
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(address), 0))  # only an address of this machine can be bound
        return True
    except OSError:
        return False


def http_host_port(url: str) -> tuple[str, int] | None:
    """(host, port) of a plain http://host:port URL; None for anything else."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "http" or not parts.hostname or port is None:
        return None
    return parts.hostname, port


def local_url_problem(url: str) -> str | None:
    """Why diagnose does not probe `url` (None: it does)."""
    where = http_host_port(url)
    if where is None:
        return "not probed: not an http://HOST:PORT URL"
    if not is_local_host(where[0]):
        return f"not probed: {where[0]} is not this machine (diagnose probes only the run's local services)"
    return None


def listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on TCP `port` (IPv4 and IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def held_by(pids: list[int], port: int) -> int | None:
    """The pid among `pids` that listens on TCP `port` (its own socket, seen in /proc/PID/fd), else None;
    a process of another user cannot be looked into and holds nothing here."""
    inodes = {f"socket:[{i}]" for i in listening_inodes(port)}
    if not inodes:
        return None
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return pid
            except OSError:
                continue
    return None


def process_argv(pid: int) -> list[str]:
    """A process's command line ([] when it cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [word.decode(errors="replace") for word in raw.split(b"\0")[:-1]]


ROUTER_MODULE = "miles.router.cli"  # what the run's launcher starts (`python -m miles.router.cli`)


def is_miles_router(pid: int, port: int) -> bool:
    """Whether the process runs a miles router for `port`: `python -m miles.router.cli` (the run's
    launcher) or `miles router`, with `--port PORT` (or 0) when its command line names one. Listening on the
    port a run dir names is not enough to be sent the admin token: the run dir also names the pid, and
    any process can listen (probe DG1: a header-logging listener listed as the router got the token)."""
    argv = process_argv(pid)
    module = any(argv[i:i + 2] == ["-m", ROUTER_MODULE] for i in range(len(argv)))
    script = any(Path(argv[i]).name == "miles" and argv[i + 1] == "router" for i in range(len(argv) - 1))
    if not (module or script):
        return False
    ports = [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--port"]
    ports += [w.split("=", 1)[1] for w in argv if w.startswith("--port=")]
    return all(p in (str(port), "0") for p in ports)  # 0: the port the OS picked, which it listens on


def process_environ(pid: int) -> dict[str, str]:
    """A process's environment as it was started ({} when it cannot be read: gone, another user's)."""
    try:
        items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").partition("=")[::2] for item in items if b"=" in item)


def gcs_problem(address: str) -> str | None:
    """Why diagnose does not connect to (nor send Ray's token to) the GCS at `address` (None: it does)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return f"the run's GCS address {address!r:.100} is not HOST:PORT"
    if is_local_host(host):
        return None
    configured = os.environ.get("RAY_ADDRESS", "").removeprefix("ray://")
    if configured and configured == address.removeprefix("ray://"):
        return None
    return (f"the run's Ray cluster ({address:.100}) is not on this machine: run `miles diagnose` on its head "
            f"node, or set RAY_ADDRESS={address:.100} to let diagnose connect (and send Ray's token) there")
