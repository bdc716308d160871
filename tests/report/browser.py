"""A page opened in headless Chromium through the DevTools protocol: what it requested, what its
console said, facts read from its DOM, and a full-page screenshot. A test helper only.

Chromium starts with ``--remote-debugging-port=0`` and writes the port it chose to
``DevToolsActivePort`` in its profile directory; one websocket (aiohttp's client) then drives a
new tab: Network, Runtime, Log and Page events are collected while the page loads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    return next((p for c in CANDIDATES if (p := shutil.which(c))), None)


@dataclass
class PageVisit:
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, itself included
    console_errors: list[str] = field(default_factory=list)  # console.error, uncaught exceptions, log errors
    dom: Any = None  # what ``probe`` evaluated to
    screenshot: Path | None = None


class Cdp:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout: float = 30
    ) -> dict[str, Any]:
        i = next(self.ids)
        msg: dict[str, Any] = {"id": i, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        await self.ws.send_str(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            m = await self.ws.receive_json(timeout=max(0.1, deadline - time.monotonic()))
            if m.get("id") == i:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return dict(m.get("result") or {})
            self.events.append(m)

    async def wait_for(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = next((e for e in self.events if e.get("method") == method), None)
        while seen is None:
            m = await self.ws.receive_json(timeout=max(0.1, deadline - time.monotonic()))
            self.events.append(m)
            if m.get("method") == method:
                seen = m
        return seen


def _port(profile: Path, proc: subprocess.Popen[bytes], timeout: float = 20) -> tuple[int, str]:
    f = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited {proc.returncode} before it listened")
        if f.exists():
            lines = f.read_text().splitlines()
            if len(lines) >= 2:
                return int(lines[0]), lines[1]
        time.sleep(0.05)
    raise RuntimeError("chromium did not write DevToolsActivePort")


async def _visit(port: int, path: str, url: str, probe: str, png: Path, width: int) -> PageVisit:
    visit = PageVisit()
    async with aiohttp.ClientSession() as http, http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0) as ws:
        cdp = Cdp(ws)
        target = (await cdp.call("Target.createTarget", {"url": "about:blank"}))["targetId"]
        sid = (await cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            await cdp.call(f"{domain}.enable", session=sid)
        await cdp.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
            session=sid,
        )
        cdp.events.clear()
        await cdp.call("Page.navigate", {"url": url}, session=sid)
        await cdp.wait_for("Page.loadEventFired")
        visit.dom = json.loads(
            (await cdp.call("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session=sid))["result"][
                "value"
            ]
        )
        size = (await cdp.call("Page.getLayoutMetrics", session=sid))["cssContentSize"]
        await cdp.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": int(size["height"]), "deviceScaleFactor": 1, "mobile": False},
            session=sid,
        )
        shot = await cdp.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid)
        png.write_bytes(base64.b64decode(shot["data"]))
        visit.screenshot = png
        for e in cdp.events:
            p, m = e.get("params") or {}, e.get("method")
            if m == "Network.requestWillBeSent":
                visit.requests.append(p["request"]["url"])
            elif m == "Runtime.exceptionThrown":
                visit.console_errors.append(json.dumps(p.get("exceptionDetails"))[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                visit.console_errors.append(json.dumps(p.get("args"))[:500])
            elif m == "Log.entryAdded" and (p.get("entry") or {}).get("level") == "error":
                visit.console_errors.append(str(p["entry"].get("text")))
        with contextlib.suppress(RuntimeError, TimeoutError, aiohttp.ClientError):
            await cdp.call("Browser.close", timeout=5)
    return visit


def visit(page: Path, png: Path, probe: str, *, chromium: str, profile: Path, width: int = 1400) -> PageVisit:
    """Open ``page`` (a local file), evaluate ``probe`` (JS returning a JSON string), screenshot it."""
    profile.mkdir(parents=True, exist_ok=True)
    with open(profile.parent / "chromium.log", "wb") as log:
        proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        port, path = _port(profile, proc)
        return asyncio.run(asyncio.wait_for(_visit(port, path, page.resolve().as_uri(), probe, png, width), 60))
    finally:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):  # what is left of its session (helpers that outlived it)
            os.killpg(proc.pid, signal.SIGKILL)
