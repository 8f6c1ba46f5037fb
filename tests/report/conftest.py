"""Report test fixtures: results with known series, and a headless Chromium driven over the DevTools pipe."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hookscope.results import WatchResults

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--remote-debugging-pipe",
)


def known_results(layers: tuple[str, ...] = ("0", "2"), steps: int = 5) -> WatchResults:
    """Return WatchResults whose series are simple functions of (layer index, step)."""
    s = torch.arange(steps, dtype=torch.float32)
    results = WatchResults(steps=torch.arange(steps), layers={path: "Linear" for path in layers})
    for i, path in enumerate(layers):
        results.activations[path] = {"mean": s * (i + 1), "std": s + i + 1, "near_zero": torch.full((steps,), 0.1)}
        results.output_grads[path] = {"norm": 10.0 ** -(s + i)}
        results.param_grads[f"{path}.weight"] = {"norm": 2.0 ** -(s + i)}
        results.update_ratios[f"{path}.weight"] = torch.full((steps,), 10.0 ** -(i + 2))
        results.histograms[path] = torch.arange(steps * 4, dtype=torch.float32).reshape(steps, 4)
        results.hist_edges[path] = torch.linspace(-1, 1, 5)
        results.unit_activity[path] = torch.tensor([0.0, 0.5, 1.0, 0.25])
    results.losses = 1.0 / (s + 1)
    return results


@pytest.fixture(scope="session")
def make_results() -> Callable[..., WatchResults]:
    return known_results


class Browser:
    """Headless Chromium spoken to over `--remote-debugging-pipe` (NUL-separated JSON on fds 3 and 4)."""

    def __init__(self, executable: str, profile: Path) -> None:
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        script = (
            f'exec "$0" "$@" 3<&{to_browser_read} 4>&{from_browser_write} {to_browser_read}<&- {from_browser_write}>&-'
        )
        self.process = subprocess.Popen(
            ["bash", "-c", script, executable, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(to_browser_read, from_browser_write),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_browser, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                buffer += chunk
                *complete, buffer = buffer.split(b"\0")
                for raw in complete:
                    self._messages.put(json.loads(raw))
        self._messages.put(None)

    def send(self, method: str, session: str | None = None, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._messages.get(timeout=timeout)
            if reply is None:
                raise RuntimeError(f"chromium closed the DevTools pipe while waiting for {method}")
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method} failed: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30.0, session: str | None = None) -> dict[str, Any]:
        """Return the first event named `method` (of page `session`, when given), waiting for it if need be."""

        def matches(event: dict[str, Any]) -> bool:
            return event.get("method") == method and (session is None or event.get("sessionId") == session)

        for event in self.events:
            if matches(event):
                return event
        while True:
            event = self._messages.get(timeout=timeout)
            if event is None:
                raise RuntimeError(f"chromium closed the DevTools pipe while waiting for {method}")
            self.events.append(event)
            if matches(event):
                return event

    def open(self, url: str) -> str:
        """Open `url` in a new page with console, log and runtime events on; return the page's session id."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session)
        self.send(
            "Emulation.setDeviceMetricsOverride", session, width=1280, height=900, deviceScaleFactor=1, mobile=False
        )
        self.send("Page.navigate", session, url=url)
        self.wait_for("Page.loadEventFired", session=session)  # this page's: an earlier page's came already
        return session

    def evaluate(self, session: str, expression: str) -> Any:
        """Evaluate `expression` in the page and return its JSON value."""
        reply = self.send("Runtime.evaluate", session, expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"evaluating {expression!r} raised {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def screenshot(self, session: str, path: Path) -> Path:
        """Save a PNG of the whole page to `path`."""
        shot = self.send("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def problems(self) -> list[str]:
        """Console errors/warnings, uncaught exceptions and log errors seen so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(f"exception: {details.get('text')} {details.get('exception', {}).get('description')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                found.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
                found.append(f"log {params['entry']['level']}: {params['entry'].get('text')}")
        return found

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, queue.Empty):
            self.send("Browser.close", timeout=10)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)


def find_chromium() -> str | None:
    """Return the Chromium executable on PATH, or None."""
    return next((path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    executable = find_chromium()
    if executable is None:
        message = "chromium is not installed: apt-get install chromium (.ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; in CI the browser test must run")
        pytest.skip(message)
    chrome = Browser(executable, tmp_path / "profile")
    try:
        yield chrome
    finally:
        chrome.close()
