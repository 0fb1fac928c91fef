"""Router throughput and added latency, side by side: direct to a stub engine, through `miles router`, and
through the Rust `sglang-router` (an outside reference, installed into a throwaway venv, never a dependency).

    .venv/bin/python benchmarks/router.py [--seconds 10] [--connections 32] [--soak-seconds 20] [--baseline DIR]
                                          [--timeline]

`--baseline DIR` adds the `miles router` of another checkout (e.g. `git worktree add /tmp/base <commit>`)
as a column, so a change to the router is measured side by side with the code before it. `--timeline`
adds our router writing its timeline lane (`--timeline-path`, as a training run starts it) as a column.

Every server and the load generator run as separate processes (wrk when installed, else a lean
asyncio generator from this file). Prints a table, then one JSON line with the figures and ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from miles.serving.process import free_port, stop_process  # noqa: E402
PYTHON = sys.executable
STUB = ROOT / "tests" / "router" / "stub_engine.py"
SGLR_VENV = Path(os.environ.get("SGLR_VENV", "/tmp/sglr-venv"))
SGLR_VERSION = "0.3.2"
BODY = b'{"text": "37+58=", "sampling_params": {"max_new_tokens": 4, "temperature": 1.0}}'
WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests": %%d, "duration_us": %%d, "errors": %%d, "non2xx": %%d, '
    .. '"p50_us": %%f, "p99_us": %%f}\\n', summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status, latency:percentile(50), latency:percentile(99)))
end
""" % BODY.decode()


@dataclass
class LoadResult:
    """One load run against one URL."""

    requests: int
    seconds: float
    errors: int
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


# ---------------------------------------------------------------- servers

def wait_http(url: str, timeout: float = 60.0, method: str = "GET", body: bytes | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(url, data=body, method=method,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)  # poll interval of a readiness check
    raise TimeoutError(f"{url} did not answer 200 within {timeout}s")


def start_reading_url(cmd: list[str], pattern: str, root: Path = ROOT,
                      marker: str = "") -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the checkout whose code runs
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=root, env=env)
    for _ in range(20):  # a server may print its settings first; the URL is on the line with `marker`
        line = proc.stdout.readline()
        if marker in line or not line:
            break
    match = re.search(pattern, line)
    if not match:
        proc.kill()
        raise RuntimeError(f"{cmd[:3]} did not print its URL: {line!r}")
    return proc, match.group(0)


def start_stub() -> tuple[subprocess.Popen, str]:
    proc, url = start_reading_url([PYTHON, str(STUB), "--port", "0"], r"http://\S+")
    wait_http(url + "/health")
    return proc, url


def start_ours(worker: str, root: Path = ROOT, extra: list[str] = ()) -> tuple[subprocess.Popen, str]:
    proc, url = start_reading_url([PYTHON, "-m", "flows.cli", "router", "--port", "0", "--worker-urls", worker,
                                   *extra], r"http://[^\s]+", root, marker="listening on")
    wait_http(url + "/router_health")
    wait_http(url + "/generate", method="POST", body=BODY)
    return proc, url


def ensure_sglang_router() -> Path | None:
    """The throwaway venv's python with sglang-router installed, or None (the column is then skipped)."""
    python = SGLR_VENV / "bin" / "python"
    check = [str(python), "-c", "import sglang_router"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    try:
        subprocess.run([sys.executable, "-m", "venv", str(SGLR_VENV)], check=True, capture_output=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"sglang-router=={SGLR_VERSION}"], check=True,
                       capture_output=True, timeout=600)
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"note: sglang-router {SGLR_VERSION} could not be installed ({exc}); skipping that column",
              file=sys.stderr)
        return None
    return python


def start_sglang(python: Path, worker: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([str(python), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                             "--port", str(port), "--worker-urls", worker, "--policy", "round_robin"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir())
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/generate", method="POST", body=BODY, timeout=120)
    return proc, url


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        stop_process(proc, 10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (robust to a loaded machine, unlike req/s)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


# ---------------------------------------------------------------- load

def run_load(url: str, connections: int, seconds: float) -> LoadResult:
    """Load from a separate process: wrk when installed, else this file's asyncio generator."""
    if shutil.which("wrk"):
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
            script.write(WRK_SCRIPT)
        try:
            done = subprocess.run(["wrk", "-t", "1", "-c", str(connections), "-d", f"{max(1, round(seconds))}s", "-s", script.name,
                                   url + "/generate"], capture_output=True, text=True, timeout=seconds + 60)
        finally:
            os.unlink(script.name)
        out = done.stdout
        if "WRKJSON" not in out:
            raise RuntimeError(f"wrk against {url} gave no result:\n{out}\n{done.stderr}")
        figures = json.loads(out.split("WRKJSON", 1)[1])
        return LoadResult(figures["requests"], figures["duration_us"] / 1e6, figures["errors"] + figures["non2xx"],
                          figures["p50_us"] / 1000, figures["p99_us"] / 1000)
    out = subprocess.run([PYTHON, __file__, "--loadgen", url, "--connections", str(connections),
                          "--seconds", str(seconds)], capture_output=True, text=True, timeout=seconds + 60, cwd=ROOT)
    return LoadResult(**json.loads(out.stdout.strip().splitlines()[-1]))


def loadgen_main(url: str, connections: int, seconds: float) -> None:
    """The fallback load generator: `connections` keep-alive loops on the router's own lean client."""
    from miles.serving.upstream import Endpoint, UpstreamPool

    async def run() -> LoadResult:
        endpoint, pool = Endpoint.from_url(url), UpstreamPool()
        request = (b"POST /generate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (endpoint.host_header, len(BODY), BODY))
        latencies: list[float] = []
        errors = 0
        stop_at = time.perf_counter() + seconds

        async def loop() -> None:
            nonlocal errors
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                conn = await pool.acquire(endpoint)
                try:
                    await conn.send(request, 30)
                    while await conn.read() is not None:
                        pass
                    errors += conn.status != 200
                except Exception:
                    errors += 1
                finally:
                    pool.release(endpoint, conn)
                latencies.append(time.perf_counter() - start)

        began = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(connections)))
        took = time.perf_counter() - began
        latencies.sort()
        return LoadResult(len(latencies), took, errors, latencies[len(latencies) // 2] * 1000,
                          latencies[int(len(latencies) * 0.99)] * 1000)

    try:
        import uvloop
        result = uvloop.run(run())
    except ImportError:
        result = asyncio.run(run())
    print(json.dumps(asdict(result)))


# ---------------------------------------------------------------- report

def measure(targets: dict[str, str], pids: dict[str, int], connections: int, seconds: float,
            rounds: int) -> dict[str, dict]:
    """Each target at `connections` and at 1 connection, interleaved per round; the best round is kept
    (and the least server CPU per request at `connections`)."""
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for name, url in targets.items():
            run_load(url, connections, 2)  # warm-up: pools filled, code paths hot
            cpu_before = cpu_seconds(pids[name])
            many = run_load(url, connections, seconds)
            cpu_us = (cpu_seconds(pids[name]) - cpu_before) / max(many.requests, 1) * 1e6
            one = run_load(url, 1, seconds)
            prior = best.get(name)
            if prior is None or cpu_us < prior["cpu_us_per_request"]:
                best.setdefault(name, {})["cpu_us_per_request"] = cpu_us
            if prior is None or many.rps > prior["rps"]:
                best.setdefault(name, {}).update(rps=many.rps, errors=many.errors, p50_ms=many.p50_ms,
                                                 p99_ms=many.p99_ms)
            if prior is None or "one_p50_ms" not in prior or one.p50_ms < prior["one_p50_ms"]:
                best[name].update(one_p50_ms=one.p50_ms, one_rps=one.rps)
    return best


def soak(url: str, pid: int, connections: int, seconds: float) -> dict:
    run_load(url, connections, 2)
    start_mb = rss_mb(pid)
    result = run_load(url, connections, seconds)
    end_mb = rss_mb(pid)
    return {"seconds": seconds, "requests": result.requests, "errors": result.errors, "rss_start_mb": round(start_mb, 1),
            "rss_end_mb": round(end_mb, 1), "rss_growth_mb": round(end_mb - start_mb, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each load run")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; the best of each is kept")
    parser.add_argument("--soak-seconds", type=float, default=20.0, help="soak our router this long (0: skip)")
    parser.add_argument("--baseline", metavar="DIR", type=Path,
                        help="another checkout whose router runs as the 'baseline router' column")
    parser.add_argument("--timeline", action="store_true",
                        help="add a column: our router writing its timeline lane (--timeline-path)")
    parser.add_argument("--loadgen", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loadgen:
        loadgen_main(args.loadgen, args.connections, args.seconds)
        return
    procs: list[subprocess.Popen] = []
    try:
        stub, stub_url = start_stub()
        procs.append(stub)
        ours, ours_url = start_ours(stub_url)
        procs.append(ours)
        targets = {"direct": stub_url, "miles router": ours_url}
        pids = {"direct": stub.pid, "miles router": ours.pid}
        if args.baseline:
            if not (args.baseline / "miles" / "router").is_dir():
                parser.error(f"--baseline {args.baseline}: not a checkout of this project (no miles/router)")
            base, base_url = start_ours(stub_url, args.baseline.resolve())
            procs.append(base)
            targets["baseline router"], pids["baseline router"] = base_url, base.pid
        if args.timeline:
            spans = Path(tempfile.mkdtemp(prefix="miles-bench-")) / "timeline.jsonl"
            timed, timed_url = start_ours(stub_url, extra=["--timeline-path", str(spans)])
            procs.append(timed)
            targets["with timeline"], pids["with timeline"] = timed_url, timed.pid
        sglr_python = ensure_sglang_router()
        if sglr_python is not None:
            sglr, sglr_url = start_sglang(sglr_python, stub_url)
            procs.append(sglr)
            targets["sglang-router"], pids["sglang-router"] = sglr_url, sglr.pid
        results = measure(targets, pids, args.connections, args.seconds, args.rounds)
        soaked = soak(ours_url, ours.pid, args.connections, args.soak_seconds) if args.soak_seconds > 0 else None
    finally:
        for proc in procs:
            stop(proc)
    report(results, args, soaked)


def report(results: dict[str, dict], args, soaked: dict | None) -> None:
    loader = "wrk" if shutil.which("wrk") else "asyncio loadgen"
    print(f"\nsmall POST /generate against a stub engine on loopback ({loader}, {args.seconds:g}s per run)\n")
    print(f"{'target':<15} {'req/s @' + str(args.connections):>12} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
          f" {'p50 ms @1':>10} {'added ms @1':>12} {'CPU us/req':>11}")
    direct = results["direct"]["one_p50_ms"]
    for name, r in results.items():
        added = r["one_p50_ms"] - direct
        r["added_ms_at_1"] = round(added, 3)
        print(f"{name:<15} {r['rps']:>12.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['errors']:>7}"
              f" {r['one_p50_ms']:>10.3f} {added:>12.3f} {r['cpu_us_per_request']:>11.1f}")
    ratios = {"ours_vs_direct": results["miles router"]["rps"] / results["direct"]["rps"]}
    if "baseline router" in results:
        ratios["ours_vs_baseline"] = results["miles router"]["rps"] / results["baseline router"]["rps"]
    if "with timeline" in results:
        ratios["timeline_vs_ours"] = results["with timeline"]["rps"] / results["miles router"]["rps"]
        ratios["timeline_cpu_vs_ours"] = (results["with timeline"]["cpu_us_per_request"]
                                          / results["miles router"]["cpu_us_per_request"])
    if "sglang-router" in results:
        ratios["ours_vs_sglang_router"] = results["miles router"]["rps"] / results["sglang-router"]["rps"]
    else:
        print("\n(sglang-router column skipped: it could not be installed)")
    print("\nratios: " + ", ".join(f"{k} = {v:.2f}x" for k, v in ratios.items()))
    if soaked:
        print(f"soak {soaked['seconds']:g}s: {soaked['requests']} requests, {soaked['errors']} errors, RSS "
              f"{soaked['rss_start_mb']} -> {soaked['rss_end_mb']} MB")
    figures = {name: {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}
               for name, r in results.items()}
    print(json.dumps({"connections": args.connections, "seconds": args.seconds, "load": loader,
                      "results": figures, "ratios": {k: round(v, 3) for k, v in ratios.items()}, "soak": soaked}))


if __name__ == "__main__":
    main()
