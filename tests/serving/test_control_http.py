"""The driver's admin calls share one client: no SSL context (a CA bundle parsed, 5-10 ms of CPU) per call.
Before control_http, every router and engine admin call made its own httpx client, which cost an async
run's driver 40% of its main thread and a synchronous step 0.04 s of its weight push."""
from __future__ import annotations

import ssl
import threading

from miles.serving.control_http import control_client
from miles.serving.router_client import RouterClient
from tests.support.routers import router_factory


def test_admin_calls_make_no_client_and_no_ssl_context_per_call(monkeypatch):
    contexts = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: contexts.append(1) or real(*a, **k))
    with router_factory() as start:
        router = RouterClient(start().url)
        shared = control_client()
        made_before = len(contexts)
        for version in range(20):  # what a step of the driver calls: a version, then the stats window
            router.set_weight_version(version)
            assert isinstance(router.take_stats(), dict)
        assert len(contexts) == made_before, f"{len(contexts) - made_before} SSL contexts for 40 admin calls"
        assert control_client() is shared


def test_threads_share_the_client_and_answers_stay_their_own():
    """The producer thread and the trainer's thread call at once: one client, every answer right."""
    with router_factory() as start:
        router = RouterClient(start().url)
        errors, clients = [], set()

        def call(n: int) -> None:
            try:
                clients.add(id(control_client()))
                for i in range(10):
                    router.set_weight_version(f"{n}-{i}")
                    router.take_stats()
            except Exception as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)
        threads = [threading.Thread(target=call, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors and len(clients) == 1
