"""First-hour N21: `miles doctor --env` without PREFECT_API_URL said `miles train` would start a local
server while the one the last run started was up (and the next run reuses it); it names that server now."""
from __future__ import annotations

import http.server
import threading

import pytest

from miles.config.prefect_home import HOME_ENV, write_record
from miles.health.cli import local_prefect_server


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def prefect_home(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    return tmp_path


def test_the_local_server_that_is_up_is_named(prefect_home):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        write_record(prefect_home, f"{url}/api", 4242)
        assert local_prefect_server() == (f"PREFECT_API_URL unset: local server up at {url} "
                                          f"(pid 4242; reused by the next `miles train`)")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert local_prefect_server() == "PREFECT_API_URL unset: `miles train` starts a local server"  # now down


def test_no_record_or_a_broken_one_means_a_new_server(prefect_home):
    assert local_prefect_server() == "PREFECT_API_URL unset: `miles train` starts a local server"
    (prefect_home / "server.json").write_text("{not json")
    assert local_prefect_server() == "PREFECT_API_URL unset: `miles train` starts a local server"
