"""The router's lane of a run's timeline (`--timeline-path`): one `proxy` span per burst of requests with the
router's counters over it, and the admin events as spans of their own, written by a timer."""
from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import time

import httpx

from miles.config import RouterConfig
from miles.router.launch import launch_router
from miles.router.stats import RouterStats
from miles.router.lane import IDLE_GAP_S, MAX_BURST_S, RouterTimeline
from miles.record.timeline import TimelineWriter, read_spans

from tests.support.wait import wait_for


def test_a_burst_is_one_span_with_the_routers_counters_and_admin_events_are_spans(stubs, router, tmp_path):
    path = tmp_path / "timeline.jsonl"
    good, failing = stubs("--delay", "0.3"), stubs("--generate-status", "500")
    handle = router([good.url, failing.url], timeline_path=path, router_policy="round-robin",
                    rollout_health_check_interval=0.2, router_retry_backoff=0.001)
    sent_at = time.time()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # a rollout: requests that arrive together
        answers = list(pool.map(lambda _: httpx.post(handle.url + "/generate", json={}, timeout=30), range(8)))
    assert [a.status_code for a in answers] == [200] * 8
    figures = handle.stats()
    assert figures["router_requests"] == 8 and figures["router_retries"] >= 1  # round robin hit the failing one

    first = wait_for(lambda: [s for s in read_spans(path) if s.name == "proxy"], 10, "the burst's span")
    assert len(first) == 1 and first[0].lane == "router" and first[0].rollout_id is None
    assert sent_at <= first[0].start <= first[0].end <= time.time()
    assert first[0].args == {"requests": 8, "errors": figures["router_errors"],
                             "retries": figures["router_retries"], "no_worker": figures["router_no_worker"]}

    httpx.post(handle.url + "/remove_worker", params={"url": failing.url}).raise_for_status()
    httpx.post(handle.url + "/add_worker", params={"url": failing.url}).raise_for_status()
    httpx.post(handle.url + "/update_weight_version", json={"weight_version": "7"}).raise_for_status()
    assert httpx.post(handle.url + "/flush_cache").status_code == 404  # an engine admin call (the stub has none)
    httpx.post(good.url + "/stub/unhealthy").raise_for_status()
    wait_for(lambda: any(s.name == "quarantine" for s in read_spans(path)), 20, "the quarantine event")
    spans = read_spans(path)
    events = [(s.name, s.args.get("url") or s.args.get("weight_version")) for s in spans if s.name != "proxy"]
    assert events[:6] == [("add_worker", good.url), ("add_worker", failing.url), ("remove_worker", failing.url),
                          ("add_worker", failing.url), ("update_weight_version", "7"), ("flush_cache", None)]
    assert ("quarantine", good.url) in events[6:]
    bursts = [s for s in spans if s.name == "proxy"]  # the burst, then the flush_cache call's own
    assert [b.args["requests"] for b in bursts] == [8, 1]
    assert bursts[0].end <= bursts[1].start


def test_bursts_end_at_their_last_answer_and_steady_traffic_is_cut(tmp_path):
    clock = [1000.0]
    stats = RouterStats()
    timeline = RouterTimeline(TimelineWriter(tmp_path / "timeline.jsonl", lane="router"), stats, clock=lambda: clock[0])

    async def scenario() -> None:
        answered = asyncio.Event()

        async def proxy(scope, receive, send) -> None:
            await answered.wait()
            stats.record(1.0, False, 0)

        async def request(after: float) -> asyncio.Future:
            """A request arriving `after` seconds from now, left waiting for `answered`."""
            clock[0] += after
            future = asyncio.ensure_future(timeline.wrap(proxy)({"path": "/generate"}, None, None))
            await asyncio.sleep(0)  # in flight
            return future

        first = await request(0.0)  # 1000
        clock[0] += MAX_BURST_S
        timeline.tick()  # in flight for MAX_BURST_S: this span ends, the next begins now (1010)
        clock[0] += 1.0
        answered.set()
        await first  # answered at 1011
        clock[0] += IDLE_GAP_S / 2
        timeline.tick()  # not idle long enough: still open
        answered.clear()
        second = await request(IDLE_GAP_S)  # idle IDLE_GAP_S * 1.5 before the timer saw it: a new span
        answered.set()
        await second
        clock[0] += IDLE_GAP_S * 2
        timeline.tick()  # idle: the span ends at the answer, not now

    asyncio.run(scenario())
    spans = read_spans(tmp_path / "timeline.jsonl")
    second_at = 1001.0 + MAX_BURST_S + IDLE_GAP_S * 1.5
    assert [(s.name, s.start, s.end, s.args["requests"]) for s in spans] == [
        ("proxy", 1000.0, 1000.0 + MAX_BURST_S, 0), ("proxy", 1000.0 + MAX_BURST_S, 1001.0 + MAX_BURST_S, 1),
        ("proxy", second_at, second_at, 1)]


def test_router_process_writes_its_lane_and_flushes_at_shutdown(stubs, tmp_path):
    stub, path = stubs(), tmp_path / "timeline.jsonl"
    service = launch_router(RouterConfig(), worker_urls=[stub.url], log_path=tmp_path / "router.log",
                            serve_args=["--timeline-path", str(path)])
    try:
        assert httpx.post(service.url + "/generate", json={}).status_code == 200
    finally:
        service.stop()  # SIGTERM: the router writes what it holds on the way out
    spans = read_spans(path)
    assert [(s.lane, s.name) for s in spans] == [("router", "add_worker"), ("router", "proxy")]
    assert spans[1].args["requests"] == 1


def test_without_the_flag_requests_go_straight_to_the_proxy(router):
    handle = router([])
    assert handle.router.forward is handle.router.proxy and not handle.router.timeline.enabled


def test_a_timeline_path_that_cannot_be_written_is_a_flag_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = subprocess.run([sys.executable, "-m", "miles.router.cli", "--port", "0",
                           "--timeline-path", str(blocker / "timeline.jsonl")], check=False, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--timeline-path" in done.stderr and "Traceback" not in done.stderr
