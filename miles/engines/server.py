"""The embedded engine's HTTP server: SGLang's native API (/generate, health, weights, metrics) over a scheduler.

`EngineServer` owns the FastAPI app, the model runner and the scheduler thread; requests reach
the scheduler through `EngineFrontend` (`frontend.py`), which the OpenAI-compatible routes
(`openai_api`) use too. Unknown
request fields are ignored, as SGLang does; known fields of the wrong type are a 400.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.routing import Route

from miles.serving import auth
from miles.serving.weight_group import DEFAULT_GROUP, WeightGroupError, state_digest
from miles.config.engine import EngineConfig
from miles.engines import weight_update
from miles.engines.weight_receiver import WeightReceiver, parse_bucket, parse_join
from miles.engines.detokenize import final_text
from miles.engines.http import read_json, sse
from miles.engines.frontend import EngineFrontend
from miles.engines.metrics import EngineMetrics
from miles.engines.model_runner import ModelRunner
from miles.engines.openai_api import add_openai_routes
from miles.engines.sglang_request import (GenerateItem, GenerationResult, RequestError, SamplingParams, parse_generate)
from miles.engines.scheduler import Scheduler, TokenEvent
from miles.engines.profiler import EngineProfiler, parse_profile_request
from miles.engines.push_spans import EngineCoords, PushSpans, SlowApply
from miles.engines.fused_experts import fuse_experts
from miles.engines import routing_capture
from miles.record.timeline import TimelineWriter

log = logging.getLogger(__name__)
HEALTH_GENERATE_TIMEOUT_S = 60.0
class EngineServer:
    def __init__(self, runner: ModelRunner, config: EngineConfig, weight_version: str = "default",
                 timeline: TimelineWriter | None = None, admin_token: str | None = None,
                 coords: EngineCoords | None = None, slow_apply: SlowApply | None = None):
        self.runner = runner
        self.config = config
        self.admin_token = admin_token  # when set, every state-changing endpoint needs it
        self.tokenizer = runner.tokenizer  # decodes short outputs on the event loop
        self.metrics = EngineMetrics(model_name=runner.model_path)
        self.scheduler = Scheduler(runner, self.metrics, config.engine_max_batch_size,
                                   config.engine_max_queued_requests, weight_version, timeline)
        self.frontend = EngineFrontend(runner, self.scheduler)
        self.started_at = self.frontend.started_at
        self.profiler = EngineProfiler()
        self.receiver = WeightReceiver(runner.model)  # the groups of /init_weights_update_group
        # its own phases of each weight push, on its timeline lane (push_spans.py)
        self.push_spans = PushSpans(timeline or TimelineWriter(None),
                                    coords or EngineCoords(None, ""), slow_apply)
        self.app = FastAPI(title="miles embedded engine", lifespan=self._lifespan)
        self.app.add_exception_handler(RequestError, self._request_error)
        self._add_routes()
        add_openai_routes(self.app, self.frontend, config.tool_call_parser)

    @asynccontextmanager
    async def _lifespan(self, app: FastAPI):
        self.scheduler.start()
        try:
            yield
        finally:
            self.scheduler.stop()
            self.frontend.close()

    @staticmethod
    async def _request_error(request: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    def render_generate(self, item: GenerateItem, result: GenerationResult) -> dict:
        """SGLang's /generate response for one finished (or, streaming, partial) request."""
        meta: dict[str, Any] = {
            "id": result.rid,
            "finish_reason": result.finish_reason.as_dict() if result.finish_reason else None,
            "prompt_tokens": len(result.prompt_ids),
            "completion_tokens": len(result.output_ids),
            "cached_tokens": 0,
            "e2e_latency": round(result.e2e_latency, 6),
            "weight_version": result.weight_version,
        }
        if item.return_logprob:
            meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in
                                             zip(result.output_logprobs, result.output_ids)]
            # ours, beyond SGLang: the weight version of each token (a request may span a weight update)
            meta["output_token_weight_versions"] = list(result.output_versions)
        if item.return_routed_experts and result.routed_experts is not None:  # the finished answer
            meta.update(routing_capture.encode(result.routed_experts))
        text = final_text(self.tokenizer, result.output_ids, item.params, result.finish_reason)
        return {"text": text, "output_ids": list(result.output_ids), "meta_info": meta}

    # ---- routes -------------------------------------------------------------------------------------------
    def require_admin(self, request: Request) -> None:
        """FastAPI dependency of the state-changing endpoints (the router's token rule)."""
        try:
            auth.check_token(request.headers, self.admin_token)
        except auth.Unauthorized as exc:
            raise RequestError(str(exc), status=401) from None

    def _add_routes(self) -> None:
        app = self.app
        admin = {"dependencies": [Depends(self.require_admin)]}
        # /generate is the rollout's hot path: a plain ASGI route (still inside the app's middleware) that
        # skips FastAPI's per-request handler machinery (interleaved A/B, 64 in flight: 1,245-1,828 vs
        # 867-1,336 short requests/s).
        app.router.routes.append(Route("/generate", AsgiEndpoint(self.generate), methods=["POST"]))
        for method in (app.get, app.post):
            method("/health")(self.health)
            method("/health_generate")(self.health_generate)
            method("/flush_cache", **admin)(self.flush_cache)
        app.get("/get_model_info")(self.get_model_info)
        app.get("/get_server_info")(self.get_server_info)
        app.get("/get_weight_version")(self.get_weight_version)
        app.post("/abort_request", **admin)(self.abort_request)
        app.post("/pause_generation", **admin)(self.pause_generation)
        app.post("/continue_generation", **admin)(self.continue_generation)
        app.post("/update_weights_from_disk", **admin)(self.update_weights_from_disk)
        app.post("/update_weights_from_tensor", **admin)(self.update_weights_from_tensor)
        app.post("/init_weights_update_group", **admin)(self.init_weights_update_group)
        app.post("/update_weights_from_distributed", **admin)(self.update_weights_from_distributed)
        app.post("/destroy_weights_update_group", **admin)(self.destroy_weights_update_group)
        app.get("/weights_digest", **admin)(self.weights_digest)  # ours; hashing costs: admin
        app.get("/metrics")(self.prometheus_metrics)
        for method in (app.get, app.post):
            method("/start_profile", **admin)(self.start_profile)  # writes files: an admin endpoint
            method("/stop_profile", **admin)(self.stop_profile)

    async def generate(self, request: Request):
        call = await read_json(request, lambda body: parse_generate(body, self.runner.context_length))
        check = lambda: [self.frontend.prompt_ids(item.text, item.input_ids) for item in call.items]  # noqa: E731
        # Only text needs the tokenizer thread; token ids are checked here (a thread hop costs more).
        tokenize = any(item.text is not None for item in call.items)
        prompts = await self.frontend.off_loop(check) if tokenize else check()
        if call.stream:
            return self._stream_generate(call.items[0], prompts[0])
        for ids, item in zip(prompts, call.items):  # refuse the whole batch before any of it runs
            self.frontend.check_length(len(ids), item.params)
            routing_capture.check_asked(item.return_routed_experts, self.runner.routing)
        channels = self.frontend.submit_all([(ids, item.params, item.rid, item.return_routed_experts)
                                             for ids, item in zip(prompts, call.items)])
        # the channels' futures themselves, not a task per request (cancelling them aborts the requests)
        results = await until_disconnect(request, asyncio.gather(*(c.finished for c in channels)))
        if results is None:
            return Response(status_code=499)  # nobody reads it; the requests were aborted
        bodies = [self.render_generate(item, r) for item, r in zip(call.items, results)]
        return JSONResponse(bodies if call.is_batch else bodies[0])  # as is: FastAPI's jsonable_encoder is costly

    def _stream_generate(self, item: GenerateItem, prompt_ids: list[int]) -> StreamingResponse:
        channel = self.frontend.submit(prompt_ids, item.params, item.rid, stream=True,
                                       routed_experts=item.return_routed_experts)

        async def chunks():
            partial = GenerationResult(rid=item.rid, prompt_ids=prompt_ids,
                                       weight_version=self.scheduler.weight_version)
            async for event in channel.events():
                if isinstance(event, TokenEvent):
                    partial.weight_version = event.weight_version  # the batch's, not the one current now
                    partial.output_ids.append(event.token_id)
                    partial.output_logprobs.append(event.logprob)
                    yield sse(self.render_generate(item, partial))
                else:
                    yield sse(self.render_generate(item, event.result))
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def health(self):
        return {}

    async def health_generate(self):
        ids = self.tokenizer.encode("1", add_special_tokens=False) or [0]
        params = SamplingParams(temperature=0.0, max_new_tokens=1)
        try:
            channel = self.frontend.submit(ids, params, rid=f"health-{time.monotonic_ns()}")
            result = await asyncio.wait_for(channel.result(), HEALTH_GENERATE_TIMEOUT_S)
        except (RequestError, asyncio.TimeoutError) as exc:
            return JSONResponse({"healthy": False, "message": f"generation check failed: {exc!r}"}, 503)
        if result.finish_reason is None or result.finish_reason.type == "abort":
            return JSONResponse({"healthy": False, "message": "the generation check was aborted"}, 503)
        return {"healthy": True, "weight_version": result.weight_version}

    async def flush_cache(self):
        # The embedded engine keeps no prefix cache between batches: there is nothing to flush.
        return {"success": True, "message": "Cache flushed."}

    async def get_model_info(self):
        return {"model_path": self.runner.model_path, "tokenizer_path": self.runner.model_path,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": self.scheduler.weight_version,
                "architectures": self.runner.config.architectures, "model_type": self.runner.config.model_type,
                "has_image_understanding": False, "has_audio_understanding": False}

    async def get_server_info(self):
        stats = asdict(self.scheduler.stats())
        return {
            "engine": "embedded",
            "pid": os.getpid(),  # for py-spy dumps of the run's processes
            "model_path": self.runner.model_path,
            "tokenizer_path": self.runner.model_path,
            "device": str(self.runner.device),
            "dtype": str(self.runner.dtype).removeprefix("torch."),
            "weight_version": self.scheduler.weight_version,
            "context_length": self.runner.context_length,
            "max_batch_size": self.config.engine_max_batch_size,
            "max_running_requests": self.config.engine_max_batch_size,
            "max_queued_requests": self.config.engine_max_queued_requests,
            "uptime_s": round(time.time() - self.started_at, 3),
            **stats,
            "internal_states": [{"last_gen_throughput": self.metrics.gen_throughput._value.get()}],
        }

    async def get_weight_version(self):
        return {"weight_version": self.scheduler.weight_version}

    async def abort_request(self, request: Request):
        body = await read_json(request)
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        rid, abort_all = body.get("rid"), body.get("abort_all", False)
        if not isinstance(abort_all, bool):
            raise RequestError(f"abort_all must be true or false, got {abort_all!r}", param="abort_all")
        if not abort_all and not (isinstance(rid, str) and rid):
            raise RequestError("give the `rid` of the request to abort, or \"abort_all\": true", param="rid")
        found = self.scheduler.abort(None if abort_all else rid)
        return {"success": True, "aborted": found}

    async def start_profile(self, request: Request):
        """SGLang's /start_profile: a torch profiler over the scheduler's batches until /stop_profile."""
        raw = await request.body()
        profile_request = parse_profile_request(await read_json(request) if raw.strip() else None)
        await asyncio.wrap_future(self.scheduler.call_between_batches(
            lambda: self.profiler.start(profile_request)))
        return Response(content="Start profiling.\n")

    async def stop_profile(self):
        path = await asyncio.wrap_future(self.scheduler.call_between_batches(self.profiler.stop))
        return Response(content=f"Stop profiling. Trace: {path}\n")

    async def pause_generation(self, request: Request):
        """No body (or no mode): queued requests wait, running ones finish. SGLang's `{"mode": "abort" |
        "retract" | "in_place"}`: answered once the running requests are ended, retracted or frozen, so a
        weight update sent next swaps the weights under requests in flight."""
        start = time.time()
        body = await read_json(request) if await request.body() else {}
        mode = body.get("mode") if isinstance(body, dict) else None
        if mode is None:
            self.scheduler.set_paused(True)
            self.push_spans.paused(start, mode)
            return {"success": True, "message": "Generation paused; queued requests wait."}
        paused = await asyncio.wrap_future(self.scheduler.pause(mode))
        self.push_spans.paused(start, mode)
        return {"success": True, "message": f"Generation paused ({mode}).", "num_paused_requests": paused}

    async def continue_generation(self):
        start = time.time()
        self.scheduler.set_paused(False)
        self.push_spans.continued(start)
        return {"success": True, "message": "Generation continued."}

    async def update_weights_from_disk(self, request: Request):
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            return weight_failure("give \"model_path\": the checkpoint directory to load")
        version = body.get("weight_version")
        if version is not None and not isinstance(version, str):
            return weight_failure(f"weight_version must be a string, got {version!r:.200}")
        for name in ("model_path", "weight_version"):
            if not _encodable(body.get(name)):  # a lone surrogate: no such path, and no answer could quote it
                return weight_failure(f"{name} is not valid Unicode text (it holds a lone surrogate)")
        if version is not None and len(version) > MAX_VERSION_CHARS:
            return weight_failure(_long_version(version))
        path = body["model_path"]
        started = time.perf_counter()
        try:
            with self.push_spans.span("receive", version, source="disk"):
                named = await run_in_threadpool(self._read_checked_dir, path)
        except weight_update.WeightUpdateError as exc:
            self.metrics.weight_update_failures.labels("disk").inc()
            return weight_failure(str(exc))
        await self._swap(named, version, model_path=path)
        self.metrics.weight_update_seconds.labels("disk").observe(time.perf_counter() - started)
        return {"success": True, "message": f"Succeeded to update model weights from {path}.",
                "num_paused_requests": 0, "weight_version": self.scheduler.weight_version}

    async def update_weights_from_tensor(self, request: Request):
        version = request.query_params.get("weight_version") or request.headers.get("x-weight-version")
        if version is not None and len(version) > MAX_VERSION_CHARS:
            return weight_failure(_long_version(version))  # before the body: it is as large as the model
        try:
            # the receive span holds the bytes arriving too; the update's own seconds start after
            with self.push_spans.span("receive", version, source="tensor"):
                data = await request.body()  # bounded by the model's size (BodyLimit's own limit)
                started = time.perf_counter()  # the transfer is the trainer's side of the sync
                named = await run_in_threadpool(self._read_checked_bytes, data)
        except weight_update.WeightUpdateError as exc:
            self.metrics.weight_update_failures.labels("tensor").inc()
            return weight_failure(str(exc))
        await self._swap(named, version)
        self.metrics.weight_update_seconds.labels("tensor").observe(time.perf_counter() - started)
        return {"success": True, "message": f"Succeeded to update {len(named)} tensors in memory.",
                "num_paused_requests": 0, "weight_version": self.scheduler.weight_version}

    async def init_weights_update_group(self, request: Request):
        """SGLang's: join the sender's gloo group (blocks until every member has, within its
        timeout)."""
        try:
            join = parse_join(await read_json(request))
            message = await run_in_threadpool(self.receiver.join, join)
        except (weight_update.WeightUpdateError, WeightGroupError) as exc:
            return weight_failure(str(exc))
        return {"success": True, "message": message}

    async def update_weights_from_distributed(self, request: Request):
        """SGLang's: one bucket by broadcast; staged, or applied with all staged ones when it is
        the last (`flush_cache` true; see weight_receiver)."""
        started, arrived = time.perf_counter(), time.time()
        spans, req = self.push_spans, None
        try:
            req = parse_bucket(await read_json(request))
            version = req.weight_version  # bounded as on the other weight paths, before any receive
            if version is not None and not _encodable(version):
                return weight_failure("weight_version is not valid Unicode text (a lone surrogate)")
            if version is not None and len(version) > MAX_VERSION_CHARS:
                return weight_failure(_long_version(version))
            spans.bucket_arrived(req.group_name, arrived)
            with spans.span("receive", version, source="broadcast", group=req.group_name,
                            tensors=len(req.names)):
                ready = await run_in_threadpool(self.receiver.receive_bucket, req)
        except weight_update.WeightUpdateError as exc:
            if req is not None:
                spans.bucket_answered(req.group_name, staged=False)  # none follows a failed one
            self.metrics.weight_update_failures.labels("distributed").inc()
            return weight_failure(str(exc))
        spans.bucket_answered(req.group_name, staged=not req.flush_cache)  # more of it follow
        if ready is None:
            if req.flush_cache:  # this group's part is whole; the push's other groups are not
                message = (f"Group {req.group_name!r} complete; held until the push's other "
                           f"{req.push_groups - 1} group(s) are in.")
            else:
                staged = self.receiver.staged_buckets(req.group_name)
                message = f"Staged bucket {staged} of group {req.group_name!r} ({len(req.names)} tensors)."
            return {"success": True, "weight_version": self.scheduler.weight_version,
                    "message": message}
        if req.abort_all_requests:
            self.scheduler.abort(None)
        await self._swap(ready, req.weight_version)
        seconds = time.perf_counter() - started
        self.metrics.weight_update_seconds.labels("distributed").observe(seconds)
        return {"success": True, "num_paused_requests": 0,
                "message": f"Succeeded to update {len(ready)} tensors from the group.",
                "weight_version": self.scheduler.weight_version}

    async def destroy_weights_update_group(self, request: Request):
        body = await read_json(request) if (await request.body()).strip() else {}
        name = body.get("group_name", DEFAULT_GROUP) if isinstance(body, dict) else None
        if not isinstance(name, str):
            return weight_failure("group_name must be a string")
        if not self.receiver.leave(name):
            return weight_failure(f"no weight update group {name!r}")
        return {"success": True, "message": f"Left weight update group {name!r}."}

    async def weights_digest(self):
        """sha256 over the served weights' names and bytes (`state_digest`), with their version."""
        def read():
            return state_digest(self.runner.model.state_dict()), self.scheduler.weight_version

        digest, version = await asyncio.wrap_future(self.scheduler.call_between_batches(read))
        return {"digest": digest, "weight_version": version}

    def _read_checked_dir(self, path: str):
        named = weight_update.read_checkpoint_dir(path, self.runner.config)
        named = fuse_experts(named, self.runner.model.state_dict())  # a MoE's per-expert files
        weight_update.check_tensors(named, self.runner.model, require_all=True)
        return named

    def _read_checked_bytes(self, data: bytes):
        named = weight_update.read_safetensors_bytes(data)
        weight_update.check_tensors(named, self.runner.model, require_all=False)  # a trainer may send a subset
        return named

    async def _swap(self, named, version: str | None, model_path: str | None = None) -> None:
        def apply():
            self.runner.load_weights(named)
            if model_path is not None:
                self.runner.model_path = model_path
            if version is not None:
                self.scheduler.weight_version = version

        timed = self.push_spans.timed_apply(apply, version)  # its wait for the batch, its swap
        await asyncio.wrap_future(self.scheduler.call_between_batches(timed))

    async def prometheus_metrics(self):
        self.metrics.set_weight_version(self.scheduler.weight_version)
        return Response(self.metrics.render(), media_type=self.metrics.content_type)


WATCH_AFTER_S = 0.05  # a request answered sooner never starts a disconnect watch (as the router's proxy)


async def until_disconnect(request: Request, work):
    """Await `work`; if the client disconnects first, cancel it (its requests are aborted) and return None.

    The watch on the client starts only once `work` has taken WATCH_AFTER_S: two tasks and an
    asyncio.wait per request were a tenth of a short request's time, and most answers come sooner.
    A client that left earlier is noticed then (its disconnect waits in `receive`)."""
    work = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    watch: list[asyncio.Task] = []
    gone = False

    async def watch_client():
        nonlocal gone
        await wait_disconnect(request)
        gone = True
        work.cancel()

    timer = loop.call_later(WATCH_AFTER_S, lambda: watch.append(loop.create_task(watch_client())))
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise  # this handler itself was cancelled (shutdown), not the client gone
        await asyncio.gather(work, return_exceptions=True)
        return None
    finally:
        timer.cancel()
        for task in watch:
            task.cancel()


async def wait_disconnect(request: Request) -> None:
    """Returns once the client has gone (the body is already read, so `receive` only reports that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class AsgiEndpoint:
    """A `handler(request) -> Response` as a bare ASGI app; a RequestError becomes its JSON error answer."""

    def __init__(self, handler):
        self.handler = handler

    async def __call__(self, scope, receive, send) -> None:
        try:
            response = await self.handler(Request(scope, receive))
        except RequestError as exc:
            response = JSONResponse(exc.body(), status_code=exc.status)
        await response(scope, receive, send)


MAX_VERSION_CHARS = 256  # the router's bound: a version is a counter or a short tag, echoed in every scrape


def _long_version(version: str) -> str:
    """P5: a 1 MiB version was stored and served in every /metrics scrape and answer."""
    return f"weight_version is {len(version)} characters long; at most {MAX_VERSION_CHARS}; the served weights are kept"


def _encodable(value) -> bool:
    """Whether a JSON string value can be written back as UTF-8 (JSON's \\ud800 escape decodes to a lone
    surrogate, which Python strings hold but UTF-8 cannot)."""
    if value is None:
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def weight_failure(message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message}, status_code=400)

