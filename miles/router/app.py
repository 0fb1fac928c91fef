"""The Router: one object owning the worker pool, the proxy, the health loop and the admin API.

Proxied requests go straight to the raw ASGI proxy; only the router's own endpoints pass
through FastAPI, so its routing and validation cost nothing on the hot path.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import uuid
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from miles.serving import auth, origin_guard
from miles.config import RouterConfig
from miles.config.secrets import RUN_TOKEN_ENV, resolve_admin_token
from miles.router import metrics
from miles.router.liveness import HealthChecker
from miles.router.proxy import Proxy, send_json
from miles.router.stats import RouterStats, StatsSnapshot
from miles.router.lane import LANE, RouterTimeline
from miles.serving.upstream import UpstreamPool
from miles.serving.upstream import Endpoint
from miles.router.workers import WorkerError, WorkerPool
from miles.record.timeline import TimelineWriter

TOKEN_ENV = RUN_TOKEN_ENV
# The router's own endpoints (served by FastAPI); every other path goes to a worker.
# SGLang's pause/continue go to every worker, not to one: a weight update pauses the whole fleet
FANNED_OUT = ("/pause_generation", "/continue_generation")
ADMIN_PATHS = frozenset({"/add_worker", "/remove_worker", "/set_worker_state", "/list_workers", "/workers", "/router_health", "/metrics",
                         "/router_stats", "/update_weight_version"}) | frozenset(FANNED_OUT)
is_loopback = auth.is_loopback


def is_state_changing_get(path: str) -> bool:
    """GETs that change state: /router_stats resets the counters, engine admin paths pass through."""
    return path == "/router_stats" or (path not in ADMIN_PATHS and not auth.is_open_engine_path(path))


class AdminError(Exception):
    """Bad input to an admin endpoint; becomes a 4xx JSON answer naming the problem."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_bind(host: str, admin_token: str | None) -> None:
    """Refuse to serve the admin endpoints beyond loopback without a token."""
    auth.require_token_off_loopback(host, admin_token, "--router-admin-token", TOKEN_ENV,
                                    "/add_worker, /remove_worker and the engines' admin endpoints")


def is_own_address(url: Any, listening: list[tuple[str, int]]) -> bool:
    """Whether `url` resolves to an address this router listens on (a wildcard bind counts every
    loopback and unspecified address on its port). An IPv4-mapped IPv6 address (::ffff:127.0.0.1) is
    its IPv4 one, and an unspecified target (0.0.0.0, ::) is this host: connecting to it reaches any
    local listener."""
    if not isinstance(url, str) or not listening:
        return False
    try:
        endpoint = Endpoint.from_url(url.strip())
        infos = socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    except (ValueError, OSError):
        return False  # not resolvable: the pool's own check reports the bad URL
    targets = {_plain(ipaddress.ip_address(info[4][0].split("%")[0])) for info in infos}
    for host, port in listening:
        if port != endpoint.port:
            continue
        own = _plain(ipaddress.ip_address(host.strip("[]")))
        if own in targets or any(t.is_unspecified for t in targets) or \
                (own.is_unspecified and any(t.is_loopback for t in targets)):
            return True
    return False


def _plain(address: ipaddress.IPv4Address | ipaddress.IPv6Address):
    """An IPv4-mapped IPv6 address as the IPv4 address it is."""
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


class Router:
    """ASGI app: `Router(config)(scope, receive, send)`; plain methods for everything the endpoints do."""

    def __init__(self, config: RouterConfig, worker_urls=(), admin_token: str | None = None,
                 timeline_path: str | None = None):
        self.config = config
        self._admin_token = admin_token if admin_token is not None else resolve_admin_token(config)
        self.pool = WorkerPool(config.router_policy, config.miles_router_health_check_failure_threshold,
                               config.router_readmit_successes)
        self.upstream = UpstreamPool(connect_timeout=min(config.router_request_timeout, 10.0))
        self.stats = RouterStats()
        self.proxy = Proxy(self.pool, self.upstream, self.stats, max_retries=config.router_max_retries,
                           retry_backoff=config.router_retry_backoff, request_timeout=config.router_request_timeout,
                           max_body_bytes=int(config.router_max_body_mb * 2**20),
                           hop_id=uuid.uuid4().hex[:16].encode())
        # the run's timeline (`--timeline-path`): without one, requests go straight to the proxy
        self.timeline = RouterTimeline(TimelineWriter(timeline_path, lane=LANE), self.stats)
        self.forward = self.timeline.wrap(self.proxy) if self.timeline.enabled else self.proxy
        self.listening: list[tuple[str, int]] = []  # (host, port) this router serves on, set once bound
        self._host_rule: tuple[int, bool] | None = None  # (len(listening), whether Host must be loopback)
        self.health = HealthChecker(self.pool, self.upstream, config.rollout_health_check_interval,
                                    config.rollout_health_check_timeout, self.timeline)
        for url in worker_urls:
            self.timeline.event("add_worker", url=self.pool.add(url).url)
        self.admin = self._admin_app()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            refused = origin_guard.guard_answer(scope, self._check_host(), is_state_changing_get)
            if refused is not None:
                await send_json(send, refused[0], {"error": refused[1]})
                return
        if scope["type"] == "http" and scope["path"] not in ADMIN_PATHS:
            # Engine endpoints that change state (weights, pause, abort, ...) are admin too.
            if self._admin_token and not auth.is_open_engine_path(scope["path"]):
                try:
                    auth.check_token(auth.scope_headers(scope), self._admin_token)
                except auth.Unauthorized as exc:
                    await send_json(send, 401, {"error": str(exc)})
                    return
            await self.forward(scope, receive, send)
        else:
            await self.admin(scope, receive, send)

    def _check_host(self) -> bool:
        # bound only to loopback: requests must name a loopback host (DNS rebinding); an unbound router
        # (a test driving the ASGI app directly) counts as loopback, the default. Cached per bind list.
        if self._host_rule is None or self._host_rule[0] != len(self.listening):
            value = all(origin_guard.is_loopback_name(host.strip("[]")) for host, _port in self.listening)
            self._host_rule = (len(self.listening), value)
        return self._host_rule[1]

    @asynccontextmanager
    async def lifespan(self, _app):
        tasks = [] if self.config.disable_rollout_health_check else [asyncio.create_task(self.health.run())]
        if self.timeline.enabled:
            tasks.append(asyncio.create_task(self.timeline.run()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.proxy.close()
            self.upstream.close()
            self.timeline.close()

    # what the endpoints do
    def add_worker(self, url: Any, state: Any = "healthy", weight_version: Any = None) -> dict:
        state = "healthy" if state == "ready" else state
        if state not in ("healthy", "stale"):
            raise AdminError(400, f"state must be 'healthy' or 'stale', got {state!r}")
        try:
            if is_own_address(url, self.listening):
                raise WorkerError(f"worker url {url!r} is this router's own address; it would send every "
                                  f"request round in a loop")
            worker = self.pool.add(url, stale=state == "stale", weight_version=_version_or_none(weight_version))
        except WorkerError as exc:
            raise AdminError(409 if "already registered" in str(exc) else 400, str(exc)) from None
        self.timeline.event("add_worker", url=worker.url, state=worker.state)
        return {"status": "success", "worker_urls": {w.url: w.inflight for w in self.pool.workers}}

    def remove_worker(self, url: Any) -> dict:
        try:
            worker = self.pool.remove(url)
        except WorkerError as exc:
            raise AdminError(404, str(exc)) from None
        self.upstream.forget(worker.endpoint)
        self.timeline.event("remove_worker", url=worker.url)
        return {"status": "success", "worker_urls": self.pool.urls}

    def set_worker_state(self, url: Any, state: Any, weight_version: Any = None) -> dict:
        """stale: out of traffic now; healthy (or ready): admitted, only at the router's current weight version
        (409 else)."""
        state = "healthy" if state == "ready" else state
        try:
            if state == "stale":
                worker = self.pool.mark_stale(url)
                self.upstream.forget(worker.endpoint)
            elif state == "healthy":
                if _version_or_none(weight_version) is None:
                    raise AdminError(400, "admitting a worker needs the weight_version it serves")
                worker = self.pool.admit(url, _version_or_none(weight_version))
            else:
                raise AdminError(400, f"state must be 'healthy' or 'stale', got {state!r}")
        except WorkerError as exc:
            raise AdminError(404 if "not registered" in str(exc) else 409, str(exc)) from None
        self.timeline.event("worker_state", url=worker.url, state=worker.state, weight_version=worker.weight_version)
        return {"status": "success", "url": worker.url, "state": worker.state, "weight_version": worker.weight_version}

    def list_workers(self) -> dict:
        return {"urls": self.pool.urls, "workers": [{"url": w.url, "state": w.state, "weight_version": w.weight_version}
                                                    for w in self.pool.workers]}

    def describe_workers(self) -> dict:
        return {"weight_version": self.pool.weight_version, "policy": self.pool.policy,
                "workers": [w.describe() for w in self.pool.workers]}

    def update_weight_version(self, version: Any) -> dict:
        checked = _version_or_none(version)
        if checked is None:
            raise AdminError(400, f"weight_version must be a non-empty string or number, got {version!r}")
        self.pool.set_weight_version(checked)
        self.timeline.event("update_weight_version", weight_version=self.pool.weight_version)
        return {"status": "success", "weight_version": self.pool.weight_version}

    def router_health(self) -> dict:
        healthy = len(self.pool.healthy)
        return {"status": "ok" if healthy else "no_healthy_worker", "healthy_workers": healthy,
                "quarantined_workers": len(self.pool.urls) - healthy, "weight_version": self.pool.weight_version,
                "pid": os.getpid()}  # for py-spy dumps of the run's processes

    def snapshot(self, reset: bool = True) -> StatsSnapshot:
        """Figures since the previous snapshot (the trainer calls this once per iteration)."""
        healthy = len(self.pool.healthy)
        return self.stats.snapshot(healthy, len(self.pool.urls) - healthy,
                                   sum(w.inflight for w in self.pool.workers), reset=reset)

    def check_admin(self, headers) -> None:
        try:
            auth.check_token(headers, self._admin_token)
        except auth.Unauthorized as exc:
            raise AdminError(401, str(exc)) from None

    # HTTP surface
    def _admin_app(self) -> FastAPI:
        app = FastAPI(title="miles router", lifespan=self.lifespan, docs_url=None, redoc_url=None,
                      openapi_url=None)

        @app.exception_handler(AdminError)
        async def admin_error(_request: Request, exc: AdminError):
            return JSONResponse({"error": str(exc)}, status_code=exc.status)

        self._worker_routes(app)
        for path in FANNED_OUT:
            app.post(path)(self.fan_out)
        self._read_routes(app)
        return app

    def _worker_routes(self, app: FastAPI) -> None:
        """The admin calls that change the pool: add, set the state of, and remove a worker; set the
        weight version."""

        @app.post("/add_worker")
        async def add_worker(request: Request):
            self.check_admin(request.headers)
            payload = await _json_object(request)
            state = request.query_params.get("state") or payload.get("state", "healthy")
            return self.add_worker(await _url_param(request), state, payload.get("weight_version"))

        @app.post("/set_worker_state")
        async def set_worker_state(request: Request):
            self.check_admin(request.headers)
            payload = await _json_object(request)
            return self.set_worker_state(await _url_param(request), payload.get("state"),
                                         payload.get("weight_version"))

        @app.post("/remove_worker")
        async def remove_worker(request: Request):
            self.check_admin(request.headers)
            return self.remove_worker(await _url_param(request))

        @app.post("/update_weight_version")
        async def update_weight_version(request: Request):
            self.check_admin(request.headers)
            payload = await _json_object(request)
            if "weight_version" not in payload:
                raise AdminError(400, 'body must be {"weight_version": "..."}')
            return self.update_weight_version(payload["weight_version"])

    async def fan_out(self, request: Request):
        """Pause or continue every worker (SGLang's body, e.g. {"mode": "in_place"}, passed through
        with the caller's Authorization); 502 naming the workers that did not accept it."""
        self.check_admin(request.headers)
        body = await request.body()
        headers = {"content-type": "application/json"}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        urls = [w.url for w in self.pool.workers]

        async def one(client: httpx.AsyncClient, url: str) -> tuple[str, int, str]:
            try:
                answer = await client.post(url + request.url.path, content=body or b"{}",
                                           headers=headers)
                return url, answer.status_code, answer.text[:300]
            except httpx.HTTPError as exc:
                return url, 502, repr(exc)[:300]

        async with httpx.AsyncClient(timeout=self.config.router_request_timeout) as client:
            results = await asyncio.gather(*(one(client, u) for u in urls))
        failed = {u: f"{code} {text}" for u, code, text in results if code != 200}
        codes = {code for _, code, _ in results}
        # every worker refused the caller alike (401/403: the engines keep their own token): that
        # answer is the caller's, as a proxied request's would be; a mixed or transport failure is
        # the router's 502
        refused_alike = len(codes) == 1 and codes <= {401, 403}
        status = 200 if not failed else codes.pop() if refused_alike else 502
        return JSONResponse({"success": not failed, "workers": urls, "failed": failed},
                            status_code=status)

    def _read_routes(self, app: FastAPI) -> None:
        """The pool, the router's health, its figures (reading stats with `reset`: admin only)."""

        # async on purpose: sync endpoints would run in a thread pool, racing the event loop on the pool state
        @app.get("/list_workers")
        async def list_workers():
            return self.list_workers()

        @app.get("/workers")
        async def workers():
            return self.describe_workers()

        @app.get("/router_health")
        async def router_health():
            return self.router_health()

        @app.get("/router_stats")
        async def router_stats(request: Request, reset: bool = True):
            if reset:  # resetting moves the window the trainer reads: admin only
                self.check_admin(request.headers)
            return self.snapshot(reset=reset).as_metrics()

        @app.get("/metrics")
        async def prometheus_metrics():
            return Response(metrics.render(self.pool, self.stats), media_type=metrics.CONTENT_TYPE)


MAX_VERSION_CHARS = 256  # a version is a counter or a short tag; it is stored, logged and echoed


def _version_or_none(version: Any) -> str | None:
    """The weight version as stored, or a 400: not text or a number, empty, too long, or not valid Unicode
    (a lone surrogate cannot be encoded into the answer, the timeline or the log: it was a 500, N7)."""
    if version is None:
        return None
    if isinstance(version, (dict, list, bool)) or str(version) == "":
        raise AdminError(400, f"weight_version must be a non-empty string or number, got {version!r}")
    text = str(version)
    if len(text) > MAX_VERSION_CHARS:
        raise AdminError(400, f"weight_version is {len(text)} characters long; at most {MAX_VERSION_CHARS}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise AdminError(400, "weight_version is not valid Unicode text (it holds a lone surrogate)") from None
    return text


async def _json_object(request: Request) -> dict:
    body = await request.body()
    if not body.strip():
        return {}
    try:
        payload = json.loads(body)
    except ValueError:
        raise AdminError(400, f"body is not valid JSON: {body[:80]!r}") from None
    if not isinstance(payload, dict):
        raise AdminError(400, f"body must be a JSON object, got {type(payload).__name__}")
    return payload


async def _url_param(request: Request) -> Any:
    """The worker URL from `?url=` (or `?worker_url=`), else from the JSON body's `url`/`worker_url`."""
    url = request.query_params.get("url") or request.query_params.get("worker_url")
    if url:
        return url
    payload = await _json_object(request)
    url = payload.get("url") or payload.get("worker_url")
    if url is None:
        raise AdminError(400, "worker url is required (use ?url=... or a JSON body {\"url\": ...})")
    return url
