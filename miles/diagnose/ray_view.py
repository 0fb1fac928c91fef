"""Ray's view of a run for `miles diagnose`, bounded in time and kept off the terminal.

A GCS that accepts connections but never answers made `ray.init` wait 150-623 s, and Ray's C++ client
printed a line a second ("Failed to get cluster ID from GCS server") into the user's terminal. So the
Ray part runs in two child processes of their own (`ray status`, and a short-lived driver that saves
the actors, tasks, workers and timeline: `python -m miles.diagnose.ray_view`), started before the
stacks are taken and given one overall deadline; what they print goes to files of the bundle
(`ray/status.txt`, `ray/driver.log`), and a child still running at the deadline is killed with its
process group. Inside a process already connected to the cluster (the stall watch in the trainer) the
same facts come from that connection, in a thread given the same deadline.

The children get the run's Ray token: token auth is on for every local cluster a run starts (the
token in ~/.ray/auth_token, or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH in the run's environment), but
Ray sends it to an explicit address only with RAY_AUTH_MODE=token, which an ordinary shell lacks.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from miles.diagnose.local_services import process_environ

RAY_DEADLINE_S = 30.0  # for the whole Ray part: status, state and timeline
AUTH_PROBE_S = 5.0
TOKEN_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def ray_auth_env(pids: list[int], environ: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    """The variables that make a child present the run's Ray token, and where the token is (in words,
    never its value). This shell's own RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH win (the user set them);
    then the run's processes' (its ranks and engines are Ray workers with the cluster's environment);
    then ~/.ray/auth_token of the run's trainer's home, then of this user's. RAY_AUTH_MODE: this
    shell's when set, else the run's, else `token` when a token was found."""
    here = dict(os.environ if environ is None else environ)
    theirs = [process_environ(pid) for pid in pids]
    env: dict[str, str] = {}
    where = ""
    for source, words in [(here, "this shell's environment")] + [(e, "the run's environment") for e in theirs]:
        found = {k: source[k] for k in TOKEN_VARS if source.get(k)}
        if found:
            env, where = found, f"{' / '.join(sorted(found))} of {words}"
            break
    if not env:
        homes = [e["HOME"] for e in theirs if e.get("HOME")] + [here.get("HOME") or str(Path.home())]
        for home in homes:
            path = Path(home) / ".ray" / "auth_token"
            if path.is_file():
                env, where = {"RAY_AUTH_TOKEN_PATH": str(path)}, str(path)
                break
    mode = here.get("RAY_AUTH_MODE") or next((e["RAY_AUTH_MODE"] for e in theirs if e.get("RAY_AUTH_MODE")), "")
    if mode:
        env["RAY_AUTH_MODE"] = mode
    elif env:
        env["RAY_AUTH_MODE"] = "token"
    return env, where or "none found"


class RayView:
    """The Ray part of a diagnosis, started now and finished (or given up) by `finish`."""

    def __init__(self, gcs_address: str, dashboard_url: str | None, out: Path, run_dir: Path, env: dict[str, str],
                 token_words: str, deadline_s: float | None = None):
        self.gcs, self.out, self.token_words = gcs_address, out, token_words
        deadline_s = RAY_DEADLINE_S if deadline_s is None else deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.deadline_s = deadline_s
        out.mkdir(parents=True, exist_ok=True)
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.thread: threading.Thread | None = None
        self.result: dict[str, Any] = {}
        ray = sys.modules.get("ray")  # imported (and maybe connected) only inside a run's own process

        child_env = {**os.environ, **env}
        status = [sys.executable, "-m", "ray.scripts.scripts", "status", "--address", gcs_address]
        self._spawn("ray status", status, out / "status.txt", child_env)
        if ray is not None and ray.is_initialized():  # the stall watch inside the trainer: its own connection
            self.thread = threading.Thread(target=self._in_process, args=(run_dir, dashboard_url), daemon=True)
            self.thread.start()
        else:
            driver = [sys.executable, "-m", "miles.diagnose.ray_view", gcs_address, str(out), str(run_dir),
                      dashboard_url or ""]
            self._spawn("the Ray driver", driver, out / "driver.log", child_env)

    def _spawn(self, name: str, command: list[str], log: Path, env: dict[str, str]) -> None:
        with log.open("wb") as f:  # the child's output (Ray's C++ lines too) goes to the bundle, not the terminal
            proc = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        self.children.append((name, proc))

    def _in_process(self, run_dir: Path, dashboard_url: str | None) -> None:
        try:
            self.result = collect_state(self.gcs, dashboard_url, self.out, run_dir)
        except OSError:  # past the deadline the bundle's folder is gone: nothing left to write into
            pass

    def finish(self) -> tuple[dict[str, Any], list[str]]:
        """Wait for the children until the deadline; kill what is left. Returns Ray's state and notes."""
        notes: list[str] = []
        late = []
        for name, proc in self.children:
            try:
                proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                late.append(name)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: the child and what it started
                except ProcessLookupError:
                    pass
                proc.wait()
        if self.thread is not None:
            self.thread.join(timeout=max(0.0, self.deadline - time.monotonic()))
            if self.thread.is_alive():
                late.append("the Ray state query")
        if late:
            notes.append(f"Ray state incomplete: no answer from the Ray cluster at {self.gcs} in {self.deadline_s:.0f} s "
                         f"({', '.join(late)} stopped; a hung or vanished GCS); the stacks and probes are here")
        status = self.out / "status.txt"
        if "ray status" in late:
            status.write_text(f"ray status --address {self.gcs}: no answer in {self.deadline_s:.0f} s\n")
        result_file = self.out / "result.json"
        if self.thread is None and result_file.is_file():
            try:
                self.result = json.loads(result_file.read_text())
            except ValueError:
                self.result = {}
            result_file.unlink()
        elif self.thread is None and "the Ray driver" not in late:
            notes.append("Ray state missing: the Ray driver of diagnose failed (see ray/driver.log)")
        notes += [n.replace("{token}", self.token_words) for n in self.result.get("notes", [])]
        return self.result.get("state", {}), notes


def collect_state(gcs_address: str, dashboard_url: str | None, out: Path, run_dir: Path) -> dict[str, Any]:
    """In the Ray driver (or a connected process): the actors, tasks, workers and timeline into `out`."""
    import ray

    from miles.diagnose import probes
    from miles.profiling.ray_timeline import save_ray_timeline

    notes, state = [], {}
    connected_here = False
    try:
        if not ray.is_initialized():
            refused = auth_refusal(gcs_address)
            if refused:
                return {"notes": [refused], "state": {}}
            ray.init(address=gcs_address, logging_level="ERROR", log_to_driver=False, namespace="miles-diagnose")
            connected_here = True
        try:
            save_ray_timeline(run_dir, out / "timeline.json")
        except Exception as exc:
            notes.append(f"no Ray timeline: {type(exc).__name__}: {exc}"[:500])
        state = probes.ray_state(dashboard_url)
    except Exception as exc:
        notes.append(f"cannot connect to the run's Ray cluster at {gcs_address}: {type(exc).__name__}: {exc}"[:500])
    finally:
        if connected_here:
            ray.shutdown()
    for key, rows in state.items():
        (out / f"{key}.json").write_text(json.dumps(rows, indent=1, default=str))
    return {"notes": notes, "state": state}


def auth_refusal(gcs_address: str) -> str | None:
    """One GCS request with the token this process has: a refusal in words (Ray's own `ray.init` retries
    for ~20 s and then says only that it found no cluster), else None."""
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=gcs_address).internal_kv_get(b"miles-diagnose-auth-probe", None, timeout=AUTH_PROBE_S)
    except AuthenticationError:
        return (f"Ray state skipped: the Ray cluster at {gcs_address} refused diagnose's auth token (token: "
                "{token}); give it the cluster's token (`ray get-auth-token` on the head node) in RAY_AUTH_TOKEN_PATH "
                "or RAY_AUTH_TOKEN")
    except Exception:  # a slow or odd GCS: ray.init reports it in its own words, within the deadline
        return None
    return None


def main(argv: list[str]) -> int:
    gcs, out, run_dir, dashboard = argv
    result = collect_state(gcs, dashboard or None, Path(out), Path(run_dir))
    (Path(out) / "result.json").write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
