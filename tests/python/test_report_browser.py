"""`dynacp report` in a real headless Chromium (Debian's package; scripts/test.sh installs it for the tests).

The page is loaded from a file:// URL with the network blocked, driven over the DevTools protocol on a pipe (stdlib
only): the page must load with no console message, no JavaScript exception and no failed request, show the
comparison table with one row per strategy, every image decoded, and a screenshot that is not blank.

Skipped when no Chromium is installed, unless DYNACP_REQUIRE_BROWSER=1 (scripts/test.sh sets it: CI must run it).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

import dynacp
from dynacp.cli import main

BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.fixture(scope="module")
def browser() -> str:
    if BROWSER is None:
        if os.environ.get("DYNACP_REQUIRE_BROWSER") == "1":
            pytest.fail("DYNACP_REQUIRE_BROWSER=1 but no chromium is installed (scripts/test.sh installs it)")
        pytest.skip("no chromium installed (scripts/test.sh installs Debian's chromium)")
    return BROWSER


class DevTools:
    """The Chrome DevTools protocol over --remote-debugging-pipe: NUL-terminated JSON, commands on the child's fd 3,
    replies and events on its fd 4."""

    def __init__(self, exe: str, profile: Path) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        args = ["--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}",
                "--hide-scrollbars", "about:blank"]
        r, w = to_child_r, from_child_w  # the protocol wants them as fds 3 and 4: bash moves them there (dash takes one-digit fds only)
        self.proc = subprocess.Popen(["bash", "-c", f'exec "$0" "$@" 3<&{r} 4>&{w} {r}<&- {w}>&-', exe, *args],
                                     pass_fds=(r, w), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next = 0
        self.events: List[Dict[str, Any]] = []

    def _read_message(self, deadline: float) -> Dict[str, Any]:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe: " + self.proc.stderr.read().decode()[-2000:])
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: Optional[dict] = None, session: Optional[str] = None,
             timeout: float = 60.0) -> Dict[str, Any]:
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == self._next:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]
            self.events.append(m)

    def wait_event(self, method: str, timeout: float = 60.0) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        for m in self.events:
            if m.get("method") == method:
                return m
        while True:
            m = self._read_message(deadline)
            self.events.append(m)
            if m.get("method") == method:
                return m

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)


def load_page(exe: str, url: str, tmp: Path) -> Dict[str, Any]:
    """Loads ``url`` offline; returns problems seen, the DOM facts and a PNG screenshot."""
    dt = DevTools(exe, tmp / "profile")
    try:
        target = dt.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = dt.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            dt.send(f"{domain}.enable", session=s)
        dt.send("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1,
                                                     "uploadThroughput": -1}, session=s)
        dt.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 900, "deviceScaleFactor": 1,
                                                       "mobile": False}, session=s)
        dt.send("Page.navigate", {"url": url}, session=s)
        dt.wait_event("Page.loadEventFired")
        facts = dt.send("Runtime.evaluate", {"returnByValue": True, "expression": """({
            rows: [...document.querySelectorAll('#comparison tbody tr')].map(r => r.cells[0].textContent),
            headers: [...document.querySelectorAll('#comparison thead th')].map(h => h.textContent),
            images: [...document.images].map(i => ({id: i.id, cls: i.className, ok: i.complete && i.naturalWidth > 0,
                                                    w: i.naturalWidth, h: i.naturalHeight})),
            title: document.title, scripts: document.scripts.length})"""}, session=s)["result"]["value"]
        shot = dt.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=s)
        problems = [m for m in dt.events if m.get("method") in (
            "Runtime.consoleAPICalled", "Runtime.exceptionThrown", "Network.loadingFailed")
            or (m.get("method") == "Log.entryAdded" and m["params"]["entry"]["level"] in ("error", "warning"))]
        return {"problems": problems, "facts": facts, "png": base64.b64decode(shot["data"])}
    finally:
        dt.close()


def test_report_renders_in_headless_chromium(browser, tmp_path) -> None:
    out = tmp_path / "report.html"
    assert main(["report", "--out", str(out), "--batches", "2", "--gbs", "128", "--ranks", "16", "-q"]) == 0
    page = out.read_text()
    assert "http://" not in page and "https://" not in page and "<script" not in page  # self-contained, offline
    seen = load_page(browser, out.as_uri(), tmp_path)
    assert seen["problems"] == [], seen["problems"]
    facts = seen["facts"]
    assert facts["rows"] == dynacp.strategy_names()
    assert facts["headers"][:3] == ["strategy", "step ms", "speedup"]
    gantts = [i for i in facts["images"] if i["cls"] == "gantt"]
    assert len(gantts) == len(dynacp.strategy_names()) and all(i["ok"] for i in facts["images"])
    assert any(i["id"] == "histogram" and i["ok"] for i in facts["images"])
    # the screenshot is a real rendering: large, and far from one flat colour
    import matplotlib.image as mpimg

    img = mpimg.imread(io.BytesIO(seen["png"]), format="png")
    assert img.shape[1] == 1400 and img.shape[0] > 2000
    rgb = (img[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    colours = np.unique(rgb[:: max(1, rgb.shape[0] // 200_000)], axis=0)
    assert len(colours) > 50 and rgb.std() > 20
    (tmp_path / "screenshot.png").write_bytes(seen["png"])


def test_the_browser_check_catches_a_broken_page(browser, tmp_path) -> None:
    """The checks above can fail: a page with a script error, a missing image and no table is reported."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><head><title>x</title><link rel='icon' href='data:,'></head><body>"
                   "<img id='histogram' src='missing.png'><script>console.error('boom'); undefined_fn();</script>"
                   "</body></html>")
    seen = load_page(browser, bad.as_uri(), tmp_path)
    kinds = {m["method"] for m in seen["problems"]}
    assert "Runtime.consoleAPICalled" in kinds and "Runtime.exceptionThrown" in kinds
    assert seen["facts"]["rows"] == [] and not seen["facts"]["images"][0]["ok"]
