"""The dashboard's FastAPI app: JSON endpoints over one run directory and the static page.

Off loopback every `/api` request must carry the token (`Authorization: Bearer <token>`
or `?token=`), as the router's admin endpoints do; the static files hold no run data.
"""
from __future__ import annotations

import hmac
import os
from pathlib import Path

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from miles.serving import auth
from miles.dashboard import baselines as compare_view
from miles.dashboard import views
from miles.dashboard.diagnose_action import Busy, Failed, run_diagnose
from miles.dashboard.mismatch_view import mismatch_view
from miles.dashboard.rank_heatmap import rank_heatmap
from miles.dashboard.rank_traces import trace_path, with_traces
from miles.dashboard.routing_view import routing_view
from miles.dashboard.run_files import RunFiles

STATIC_DIR = Path(__file__).parent / "static"
TOKEN_ENV = "MILES_DASHBOARD_TOKEN"


def resolve_token(flag_value: str | None) -> str | None:
    return flag_value or os.environ.get(TOKEN_ENV) or None


def check_bind(host: str, token: str | None) -> None:
    """Refuse to show a run beyond loopback without a token."""
    auth.require_token_off_loopback(host, token, "--dashboard-token", TOKEN_ENV, "the run's samples")


def build_app(run_dir: Path, follow: bool = False, token: str | None = None,
              baselines: list[Path] | None = None) -> FastAPI:
    files = RunFiles(run_dir)
    app = FastAPI(title="miles dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    _require_token(app, token)
    _run_routes(app, files, follow)
    _timing_routes(app, files)
    _rollout_routes(app, files)
    _compare_routes(app, run_dir, list(baselines or []))
    _diagnose_route(app, files)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


def _require_token(app: FastAPI, token: str | None) -> None:
    """With a token, every `/api` request must carry it (the static files hold no run data)."""

    @app.middleware("http")
    async def require_token(request: Request, call_next):
        if token and request.url.path.startswith("/api"):
            header = request.headers.get("authorization", "")
            given = header[7:] if header.lower().startswith("bearer ") else request.query_params.get("token", "")
            if not hmac.compare_digest(given.encode(), token.encode()):
                return JSONResponse({"error": "token missing or wrong (send Authorization: Bearer <token>)"}, 401)
        return await call_next(request)


def _run_routes(app: FastAPI, files: RunFiles, follow: bool) -> None:
    """The run's own views: its state, summary, evals, metrics and live watch."""

    @app.get("/api/run")
    def run() -> dict:
        return views.run_summary(files, follow)

    @app.get("/api/summary")
    def summary() -> dict:
        return views.summary(files)

    @app.get("/api/evals")
    def evals(step: int | None = None) -> dict:
        try:
            return views.evals(files, step)
        except views.NotFound as exc:
            raise HTTPException(404, str(exc)) from None

    @app.get("/api/metrics")
    def metrics() -> dict:
        return views.metrics(files)

    @app.get("/api/watch")
    def watch() -> dict:
        return views.watch(files)


def _timing_routes(app: FastAPI, files: RunFiles) -> None:
    """Where the run's time went: its timeline (also as a Chrome trace), health, profiler."""

    @app.get("/api/timeline")
    def timeline(rollout_id: int | None = None) -> dict:
        return views.timeline(files, rollout_id)

    @app.get("/api/timeline/chrome")
    def chrome() -> JSONResponse:
        return JSONResponse(views.chrome(files), headers={
            "Content-Disposition": f'attachment; filename="{files.run_dir.name}-timeline.json"'})

    @app.get("/api/ranks")
    def ranks() -> dict:
        return with_traces(rank_heatmap(files.timeline().rows), files.profiler().rows)

    @app.get("/api/health")
    def health() -> dict:
        return views.health(files)

    @app.get("/api/routing")
    def routing() -> dict:
        return routing_view(files.journal().rows, files.health().rows, files.config())

    @app.get("/api/mismatch")
    def mismatch() -> dict:
        return mismatch_view(files.journal().rows)

    @app.get("/api/profiler")
    def profiler() -> dict:
        return views.profiler(files)

    @app.get("/api/profiler/{index}/trace")
    def profiler_trace(index: int) -> FileResponse:
        path = trace_path(files.run_dir, files.profiler().rows, index)
        if path is None:
            raise HTTPException(404, f"no trace file for profiler window {index}")
        return FileResponse(path, filename=path.name, media_type="application/octet-stream")


def _rollout_routes(app: FastAPI, files: RunFiles) -> None:
    """The rollouts, one rollout's samples (filtered), and one sample."""

    @app.get("/api/rollouts")
    def rollouts() -> dict:
        return views.rollouts(files)

    @app.get("/api/rollouts/{rollout_id}")
    def rollout(rollout_id: int, min_reward: float | None = None, max_reward: float | None = None,
                min_length: int | None = Query(None, ge=0), max_length: int | None = Query(None, ge=0),
                truncated: bool | None = None, min_turns: int | None = Query(None, ge=0),
                max_turns: int | None = Query(None, ge=0), zero_std: bool | None = None) -> dict:
        keep = views.SampleFilter(min_reward, max_reward, min_length, max_length, truncated, min_turns, max_turns,
                                  zero_std)
        try:
            return views.rollout_samples(files, rollout_id, keep)
        except views.NotFound as exc:
            raise HTTPException(404, str(exc)) from None

    @app.get("/api/rollouts/{rollout_id}/samples/{index}")
    def sample(rollout_id: int, index: int) -> dict:
        try:
            return views.sample_detail(files, rollout_id, index)
        except views.NotFound as exc:
            raise HTTPException(404, str(exc)) from None


def _compare_routes(app: FastAPI, run_dir: Path, given: list[Path]) -> None:
    """The baselines the run may be compared with (`given`: its `--baseline`s), the comparison."""

    @app.get("/api/baselines")
    def baseline_candidates() -> dict:
        return {"candidates": [c.as_json() for c in compare_view.candidates(run_dir, given)]}

    @app.get("/api/compare")
    def compare(baseline: list[str] = Query(default=[])) -> dict:
        listed = compare_view.candidates(run_dir, given)
        chosen = baseline or [c.path for c in listed if c.given]
        try:
            return compare_view.comparison(run_dir, chosen, listed)
        except compare_view.BadBaseline as exc:
            raise HTTPException(400, str(exc)) from None


def _diagnose_route(app: FastAPI, files: RunFiles) -> None:
    @app.post("/api/diagnose")
    def diagnose(request: Request) -> dict:
        """Write a diagnose bundle of the run now; the verdict and the bundle's path (a sync endpoint: it
        runs in a worker thread, off the event loop, for the seconds the diagnosis takes)."""
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise HTTPException(415, "send Content-Type: application/json")
        try:
            return run_diagnose(files.run_dir)
        except Busy as exc:
            raise HTTPException(409, str(exc)) from None
        except Failed as exc:
            raise HTTPException(500, str(exc)) from None
