"""Probes R3-R5, C13: the router refuses its own address and odd worker URLs, and a loop is cut at one hop."""
from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from miles.router.proxy import HOP_HEADER

from .probes import AUTH, generate


def test_the_router_refuses_to_add_itself(router):
    handle = router(worker_urls=[])
    port = handle.port
    for url in (handle.url, f"http://localhost:{port}", f"http://127.0.0.1:{port}/",
                f"http://0.0.0.0:{port}", f"http://[::ffff:127.0.0.1]:{port}", f"http://[::]:{port}"):  # R5
        r = httpx.post(handle.url + "/add_worker", json={"url": url}, headers=AUTH)
        assert r.status_code == 400 and "own address" in r.json()["error"], url
    assert httpx.get(handle.url + "/list_workers").json()["urls"] == []


def test_a_loop_through_two_routers_is_cut_with_508(router):
    """A behind B behind A: each request goes round at most once per retry, never ~10k times."""
    a = router(worker_urls=[], router_max_retries=1, router_retry_backoff=0.0)
    b = router(worker_urls=[a.url])
    httpx.post(a.url + "/add_worker", json={"url": b.url}, headers=AUTH).raise_for_status()
    r = httpx.post(a.url + "/generate", json={"text": "1+1="}, timeout=60)
    assert r.status_code in (502, 508)
    stats = a.stats(reset=False)
    assert stats["router_requests"] <= 3  # the client's, then at most one loop per retry


def test_the_hop_header_goes_to_the_engine(router):
    handle = router()
    assert generate(handle.url).status_code == 200  # one hop is no loop
    r = httpx.post(handle.url + "/generate", json={"text": "1+1="}, timeout=60,
                   headers={HOP_HEADER.decode(): handle.router.proxy.hop_id.decode()})
    assert r.status_code == 508


@pytest.mark.parametrize("url, message", [
    ("http://127.0.0.1:0", "port 0"),
    ("http://admin:hunter2-secret@127.0.0.1:31999", "credentials"),
    ("http://127.0.0.1:5/some/path?q=1#frag", "path"),
])
def test_odd_worker_urls_are_refused_and_credentials_never_shown(router, url, message):
    handle = router(worker_urls=[])
    r = httpx.post(handle.url + "/add_worker", json={"url": url}, headers=AUTH)
    assert r.status_code == 400 and message in r.json()["error"]
    assert "hunter2" not in r.text
    assert "hunter2" not in httpx.get(handle.url + "/metrics").text


@pytest.mark.parametrize("url", ["http://a\u0000b:1", "http://exa mple:1", "http://127.0.0.1:3\n1999",
                                 'http://"x":1', "http://x':1", "http://127.0.0.1:31999\t", "http://caf\u00e9:1"])
def test_worker_urls_with_control_characters_spaces_or_quotes_are_refused(router, url):
    """R2b: such URLs were stored as given, and the newline one forged lines in router.log."""
    handle = router(worker_urls=[])
    r = httpx.post(handle.url + "/add_worker", json={"url": url}, headers=AUTH)
    assert r.status_code == 400 and "no http://host:port URL has" in r.json()["error"], r.text
    assert "\n" not in r.json()["error"]
    assert httpx.get(handle.url + "/list_workers").json()["urls"] == []


@pytest.mark.parametrize("url", ["https://x", "http://h:notaport"])
def test_bad_worker_urls_on_the_command_line_are_one_line(url):
    done = subprocess.run([sys.executable, "-m", "miles.router.cli", "--port", "0", "--worker-urls", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--worker-urls" in done.stderr and "Traceback" not in done.stderr


def test_the_router_refuses_itself_on_the_command_line():
    """N10: `--worker-urls` naming the router's own address was taken at start-up (and quarantined only
    after three failed checks); now the /add_worker rule holds there too: one line, exit 2."""
    import os

    from miles.serving.held_port import LISTEN_FD_ENV, hold_port

    held = hold_port("127.0.0.1", None)  # the port is known before the router starts, and kept for it
    port = held.getsockname()[1]
    try:
        for url in (f"http://127.0.0.1:{port}", f"http://localhost:{port}/", f"http://0.0.0.0:{port}"):
            done = subprocess.run([sys.executable, "-m", "miles.router.cli", "--host", "127.0.0.1", "--port",
                                   str(port), "--worker-urls", "http://127.0.0.1:9", url], capture_output=True,
                                  text=True, timeout=120, env={**os.environ, LISTEN_FD_ENV: str(held.fileno())},
                                  pass_fds=(held.fileno(),), stdin=subprocess.DEVNULL)
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
            assert f"--worker-urls: {url} is this router's own address" in done.stderr
            assert "listening on" not in done.stdout
    finally:
        held.close()
