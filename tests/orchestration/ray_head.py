"""A real `ray start --head --block` for the launch-path tests: token auth on, its own temp dir and
free ports (a cluster in the default /tmp/ray would capture every other `ray.init()` on the
machine), the job server on loopback; stopped by its process group, never by `ray stop`."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from miles.serving.process import free_ports

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0
START_ATTEMPTS = 3
STOP_GRACE_S = 3.0  # a head's `ray start --block` and its GCS outlast SIGTERM by 15 s; a test cluster needs no graceful end


def base_env() -> dict[str, str]:
    """This environment without any Ray address or auth setting, with this checkout importable and
    the venv's `python`, `ray` and `miles` first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    return env


@dataclass
class RayNode:
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        """The whole process group (raylet, GCS, workers): SIGTERM, then SIGKILL after a grace period."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                continue
            try:  # the leader is gone; its children may linger a moment
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return


@dataclass
class RayHead:
    """What a driver needs: the GCS address, the job server URL and where the token is."""

    root: Path
    token_path: Path
    port: int
    dashboard_port: int
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def driver_env(self, **extra: str) -> dict[str, str]:
        """A driver on this machine: the token where Ray looks for it, RAY_AUTH_MODE unset."""
        return {**base_env(), "RAY_AUTH_TOKEN_PATH": str(self.token_path), **extra}

    def cli_env(self) -> dict[str, str]:
        """Ray's own CLI (`ray job submit`) sends the token only with RAY_AUTH_MODE=token."""
        return self.driver_env(RAY_AUTH_MODE="token")

    def alive_nodes(self) -> int:
        headers = {"Authorization": f"Bearer {self.token_path.read_text().strip()}"}
        answer = httpx.get(f"{self.dashboard}/api/v0/nodes?limit=100", headers=headers, timeout=10.0)
        nodes = answer.raise_for_status().json()["data"]["result"]["result"]
        return sum(1 for n in nodes if n["state"] == "ALIVE")

    def join_node(self, num_cpus: int = 1, timeout: float = START_TIMEOUT_S, share_temp_dir: bool = False) -> None:
        """A second Ray node on this machine, joined to the head; returns once the head counts it.
        `share_temp_dir`: the head's temp dir, as two nodes started with Ray's default (/tmp/ray) share it.
        A `ray start` that gives up (Ray's fixed 30 s for its raylet to register) is started again while
        `timeout` lasts, as for the head."""
        want = self.alive_nodes() + 1
        deadline = time.monotonic() + timeout
        for attempt in range(1, START_ATTEMPTS + 1):
            node = self._start_node(num_cpus, share_temp_dir)
            while self.alive_nodes() < want:
                if node.process.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.5)  # poll interval of the readiness loop, bounded by the deadline above
            else:
                return
            log = node.log.read_text()[-3000:]
            node.stop()
            self.nodes.remove(node)
            if time.monotonic() > deadline or attempt == START_ATTEMPTS:
                raise RuntimeError(f"the second Ray node did not join ({attempt} attempt(s)):\n{log}")

    def _start_node(self, num_cpus: int, share_temp_dir: bool) -> RayNode:
        # never the default /tmp/ray
        temp_dir = self.root / "ray" if share_temp_dir else self.root / f"ray-node{len(self.nodes)}"
        listen, runtime_env, metrics, grpc = free_ports(4)
        argv = ["ray", "start", "--block", f"--address={self.address}", f"--num-cpus={num_cpus}",
                f"--temp-dir={temp_dir}",
                "--object-store-memory", str(128 * 2**20), "--disable-usage-stats",
                f"--dashboard-agent-listen-port={listen}", f"--runtime-env-agent-port={runtime_env}",
                f"--metrics-export-port={metrics}", f"--dashboard-agent-grpc-port={grpc}"]
        self.nodes.append(_start(argv, self.cli_env(), self.root / f"node{len(self.nodes)}.log"))
        return self.nodes[-1]

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _start(argv: list[str], env: dict[str, str], log: Path) -> RayNode:
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, cwd=log.parent)
    return RayNode(process, log)


def start_head(num_cpus: int = 2, timeout: float = START_TIMEOUT_S) -> RayHead:
    """`ray start --head --block` with token auth (a fresh token in its own file) and the dashboard's
    job server on 127.0.0.1; returns once the job server answers an authenticated request. A head whose
    `ray start` gives up is started afresh (new dir, new ports) while `timeout` lasts: Ray waits a fixed
    30 s for its own raylet to register, which a loaded 2-core machine has overrun."""
    deadline = time.monotonic() + timeout
    for attempt in range(1, START_ATTEMPTS + 1):
        head, log = _try_head(num_cpus, deadline)
        if head is not None:
            return head
        if time.monotonic() > deadline or attempt == START_ATTEMPTS:
            raise RuntimeError(f"ray start --head did not come up ({attempt} attempt(s)):\n{log}")
    raise AssertionError("unreachable")


def _try_head(num_cpus: int, deadline: float) -> tuple[RayHead | None, str]:
    """One `ray start --head`: the head once it answers, or None and the end of its log once it exits or the
    deadline passes (stopped and removed)."""
    root = Path(tempfile.mkdtemp(prefix="ray-miles-test-", dir="/tmp"))  # short: Ray's socket paths
    token = root / "auth_token"
    token.write_text(os.urandom(16).hex())
    port, dashboard, client, listen, grpc, runtime_env, metrics = free_ports(7)
    head = RayHead(root=root, token_path=token, port=port, dashboard_port=dashboard)
    argv = ["ray", "start", "--head", "--block", f"--temp-dir={root / 'ray'}", f"--port={head.port}",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={head.dashboard_port}",
            f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={listen}",
            f"--dashboard-agent-grpc-port={grpc}", f"--runtime-env-agent-port={runtime_env}",
            f"--metrics-export-port={metrics}", f"--num-cpus={num_cpus}",
            "--object-store-memory", str(256 * 2**20), "--disable-usage-stats"]
    head.nodes.append(_start(argv, head.cli_env(), root / "head.log"))
    while True:
        try:
            if head.alive_nodes() >= 1:
                return head, ""
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        if head.nodes[0].process.poll() is not None or time.monotonic() > deadline:
            log = (root / "head.log").read_text()[-3000:]
            head.stop()
            return None, log
        time.sleep(0.5)  # poll interval of the readiness loop, bounded by the deadline above
