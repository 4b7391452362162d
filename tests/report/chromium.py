"""Headless Chromium driven over the DevTools protocol on a pipe, with the standard library only.

Chromium started with ``--remote-debugging-pipe`` reads protocol commands from file
descriptor 3 and writes replies and events to descriptor 4, each message JSON ended by a NUL
byte.  Used by the report tests and ``benchmarks/report_bench.py``.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

INSTALL_HINT = ("apt-get install -y --no-install-recommends chromium fonts-liberation "
                "(tools/setup.sh does it when run as root)")


class ChromiumMissing(RuntimeError):
    """No Chromium binary on this machine."""


def find_chromium() -> str:
    """The Chromium executable, or ``ChromiumMissing`` saying how to install it."""
    for name in (os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome", "chrome"):
        if name and shutil.which(name):
            return str(shutil.which(name))
    raise ChromiumMissing(f"Chromium is not installed; the report tests open the report in it: {INSTALL_HINT}")


class Chromium:
    """One headless browser with one page.  ``console`` collects console errors and uncaught
    exceptions of the page, as ``(kind, text)``."""

    def __init__(self, width: int = 1300, height: int = 900, timeout_s: float = 60.0) -> None:
        self.exe = find_chromium()
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self.profile = tempfile.mkdtemp(prefix="orchestra-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # numbers above 4, so that moving them to 3 and 4 in the child never overwrites one
        for_child = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_chrome_r, from_chrome_w)]
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        to_chrome_r, from_chrome_w = for_child

        def fds() -> None:  # in the child: the pipe ends become descriptors 3 and 4
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [self.exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--remote-debugging-pipe", f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=fds,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._cond = threading.Condition()
        self.console: list[tuple[str, str]] = []
        self.page_events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    # -- protocol ------------------------------------------------------------------------
    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._cond.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._replies[msg["id"]] = msg
                        self._cond.notify_all()
                else:
                    self._on_event(msg)

    def _on_event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method", ""), msg.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append(("console.error", text))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.console.append(("exception", str(details.get("exception", {}).get("description")
                                                  or details.get("text"))))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.console.append(("log", str(params["entry"].get("text")) + " " + str(params["entry"].get("url", ""))))
        self._events.put(msg)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and wait for its reply's ``result``."""
        self._next_id += 1
        ident = self._next_id
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while ident not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise TimeoutError(f"Chromium did not answer {method} (exit code {self.proc.poll()})")
                self._cond.wait(min(left, 0.5))
            reply = self._replies.pop(ident)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A command to the page's session."""
        return self.send(method, params, self.session)

    def wait_event(self, method: str, timeout_s: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {method} event")
            try:
                msg = self._events.get(timeout=left)
            except queue.Empty:
                continue
            if msg.get("method") == method:
                return dict(msg.get("params", {}))

    # -- page helpers ----------------------------------------------------------------------
    def open(self, path: str) -> float:
        """Load a local file and wait for its load event; returns seconds to the load event."""
        while not self._events.empty():
            self._events.get_nowait()
        t0 = time.monotonic()
        self.call("Page.navigate", {"url": "file://" + os.path.abspath(path)})
        self.wait_event("Page.loadEventFired")
        return time.monotonic() - t0

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited)."""
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression[:80]}: {res['exceptionDetails']}")
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 20.0) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout_s} s: {expression}")
            time.sleep(0.05)

    def hover(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def screenshot(self, path: str, full_page: bool = True) -> None:
        """Save a PNG of the page (all of it with ``full_page``, up to 8,000 px high)."""
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": self.width, "height": min(int(size["height"]) + 1, 8000), "deviceScaleFactor": 1,
                       "mobile": False})
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        if full_page:
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
