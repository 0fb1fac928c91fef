"""A minimal W3C WebDriver client for chromedriver + headless Chromium (no Selenium needed).

Tests skip, naming the install command, where Debian's `chromium` / `chromium-driver` are missing.
"""
from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from miles.serving.process import free_port, stop_process

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"
INSTALL = "apt-get install -y chromium chromium-driver"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000"]


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not shutil.which("chromium"):
        return f"chromium not installed ({INSTALL})"
    if not shutil.which("chromedriver"):
        return f"chromedriver not installed ({INSTALL})"
    return None


class WebDriverError(RuntimeError):
    pass


class Browser:
    """One chromedriver process and one headless Chromium session with a fresh profile."""

    def __init__(self):
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="miles-chromium-")
        self.driver = subprocess.Popen(["chromedriver", f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60.0)
        self._wait_driver()
        caps = {"browserName": "chrome", "goog:chromeOptions": {
            "binary": shutil.which("chromium"), "args": CHROMIUM_FLAGS + [f"--user-data-dir={self.profile}"]}}
        self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]

    def _wait_driver(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.http.get("/status").json()["value"]["ready"]:
                    return
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.1)
        raise WebDriverError("chromedriver did not become ready in 30 s")

    def _call(self, method: str, path: str, body: dict | None = None):
        response = self.http.request(method, path, json=body)
        value = response.json().get("value")
        if response.status_code >= 400:
            raise WebDriverError(f"{method} {path}: {value}")
        return value

    def _s(self, path: str) -> str:
        return f"/session/{self.session}{path}"

    def get(self, url: str) -> None:
        self._call("POST", self._s("/url"), {"url": url})

    def script(self, source: str, *args):
        return self._call("POST", self._s("/execute/sync"), {"script": source, "args": list(args)})

    def find_all(self, css: str) -> list[str]:
        return [e[ELEMENT] for e in self._call("POST", self._s("/elements"), {"using": "css selector", "value": css})]

    def click(self, css: str) -> None:
        found = self.wait_for(css)
        self._call("POST", self._s(f"/element/{found[0]}/click"), {})

    def text(self, css: str) -> str:
        found = self.wait_for(css)
        return self._call("GET", self._s(f"/element/{found[0]}/text"))

    def wait_for(self, css: str, timeout: float = 30.0, count: int = 1) -> list[str]:
        """Elements matching `css` once at least `count` exist (the page renders asynchronously)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.find_all(css)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise WebDriverError(f"no {count} x {css!r} after {timeout} s")
            time.sleep(0.1)

    def wait_true(self, expression: str, timeout: float = 30.0) -> None:
        """Until the JavaScript `expression` is true in the page."""
        deadline = time.monotonic() + timeout
        while not self.script(f"return Boolean({expression})"):
            if time.monotonic() > deadline:
                raise WebDriverError(f"{expression} still false after {timeout} s")
            time.sleep(0.1)

    def wait_view(self, hash_: str, timeout: float = 30.0) -> None:
        """Until the page has finished drawing the view of URL hash `hash_` (e.g. "#metrics")."""
        self.wait_for(f'main[data-hash="{hash_}"][data-ready="1"]', timeout)

    def open(self, url: str, timeout: float = 30.0) -> None:
        """Load `url` (a dashboard page with a #view) and wait until that view is drawn."""
        self.get(url)
        self.wait_view("#" + url.split("#", 1)[1], timeout)

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._call("GET", self._s("/screenshot"))))
        return path

    def close(self) -> None:
        try:
            self._call("DELETE", self._s(""))
        except (WebDriverError, httpx.HTTPError):
            pass
        finally:
            self.http.close()
            stop_process(self.driver, 10)
            shutil.rmtree(self.profile, ignore_errors=True)
