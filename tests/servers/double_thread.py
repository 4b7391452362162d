"""Runs a test double's aiohttp application on its own thread and event loop, on 127.0.0.1.

The doubles of provider APIs (openai_batch_server.py, anthropic_server.py) keep their state in
one object with ``app``, ``config`` (a dataclass), ``stats``, ``batches`` and ``order``; this
class starts it, reads and changes that state on the server's loop, and stops it.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import threading
from typing import Any

from aiohttp import web


class DoubleThread:
    """``with DoubleThread(server) as srv: srv.base_url ...``"""

    def __init__(self, server: Any, name: str) -> None:
        self.server = server
        self.name = name
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def serve() -> None:
            runner = web.AppRunner(self.server.app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        loop.run_until_complete(serve())
        loop.close()

    def start(self) -> DoubleThread:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{self.name} did not start in 10 s")
        return self

    def call(self, fn: Any) -> Any:
        """Run ``fn()`` on the server's loop (its state is only touched there)."""
        assert self._loop is not None
        done, out = threading.Event(), []

        def run() -> None:
            out.append(fn())
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)
        return out[0] if out else None

    def configure(self, **changes: Any) -> None:
        def apply() -> None:
            self.server.config = dataclasses.replace(self.server.config, **changes)

        self.call(apply)

    def stats(self) -> Any:
        return self.call(lambda: dataclasses.replace(self.server.stats))

    def batches(self) -> list[dict[str, Any]]:
        return self.call(lambda: [dict(self.server.batches[i]) for i in self.server.order])

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> DoubleThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class AppServer(abc.ABC):
    """Base of a test's own small server: a subclass adds its routes in :meth:`routes` and calls
    :meth:`serve` from its ``__init__`` (once its state is set); ``port``, ``base_url`` and
    :meth:`close` then work, the app running in a :class:`DoubleThread`."""

    port: int
    base_url: str

    @abc.abstractmethod
    def routes(self, app: web.Application) -> None:
        """Add the server's routes to ``app`` (every subclass has its own)."""

    def serve(self, name: str) -> None:
        self.app = web.Application()
        self.routes(self.app)
        self._thread = DoubleThread(self, name).start()
        self.port, self.base_url = self._thread.port, self._thread.base_url

    def close(self) -> None:
        self._thread.stop()
