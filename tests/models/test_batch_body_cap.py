"""The Batch API path reads provider answers with a bound too: a real aiohttp server on 127.0.0.1
sends 80 MiB (chunked, or with its Content-Length) for a batch object and for a file's content.

A control call's JSON is capped at 64 MiB (one-line model error, not retried); a batch's output
file may legitimately be larger (up to 50,000 answers), so its cap is its own
(``BatchTransport.file_limit``, 1 GiB): 80 MiB of content is read whole, and refused once the cap is
below it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from servers.double_thread import AppServer

from orchestra.errors import ModelError
from orchestra.limits.retry import RetryPolicy
from orchestra.models.batch.openai import OpenAIBatches
from orchestra.models.batch.transport import MAX_FILE_BYTES, BatchTransport

SIZE = 80 << 20


class BigAnswers(AppServer):
    """Answers ``GET /v1/batches/ID`` (JSON) and ``GET /v1/files/ID/content`` (JSONL) with
    :data:`SIZE` bytes in 1 MiB pieces (``declared``: with a Content-Length, else chunked)."""

    def __init__(self, declared: bool) -> None:
        self.declared, self.requests = declared, 0
        self.serve("big-answers")

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if self.declared:
            resp.content_length = SIZE
        await resp.prepare(request)
        line = b'{"custom_id": "r", "response": {"status_code": 200, "body": {"pad": "' + b"a" * 1000 + b'"}}}\n'
        left = SIZE
        piece = line * ((1 << 20) // len(line) + 1)
        try:
            while left > 0:
                await resp.write(piece[:min(left, 1 << 20)])
                left -= min(left, 1 << 20)
        except (ConnectionError, RuntimeError):
            pass  # the client stopped reading: what is under test
        return resp

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/batches/{bid}", self._answer)
        app.router.add_get("/v1/files/{fid}/content", self._answer)


@pytest.fixture(autouse=True)
def _lock_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRA_LOCK_DIR", str(tmp_path / "locks"))


@pytest.fixture(params=[False, True], ids=["chunked", "content-length"])
def big(request: pytest.FixtureRequest) -> Iterator[BigAnswers]:
    server = BigAnswers(declared=request.param)
    yield server
    server.close()


async def _call(server: BigAnswers, what: str, file_limit: int = MAX_FILE_BYTES) -> Any:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        transport = BatchTransport(f"http://127.0.0.1:{server.port}/v1", lambda: session, lambda: (None, None),
                                   RetryPolicy(max_retries=3, timeout_s=60, attempt_timeout_s=30),
                                   lambda status, why: why, "test-batch-cap")
        transport.file_limit = file_limit
        http = OpenAIBatches(transport)
        return await (http.get("b1") if what == "batch" else http.content("f1"))


def test_a_batch_object_over_64_mib_is_one_line_error_not_retried(big: BigAnswers) -> None:
    with pytest.raises(ModelError) as err:
        asyncio.run(_call(big, "batch"))
    assert "over 64 MiB (refused)" in str(err.value) and "\n" not in str(err.value)
    assert big.requests == 1  # not retried: the same answer would come again


def test_a_batch_file_is_read_whole_under_its_own_cap_and_refused_over_it(big: BigAnswers) -> None:
    content = asyncio.run(_call(big, "file"))
    assert isinstance(content, bytes) and len(content) == SIZE
    with pytest.raises(ModelError, match=r"over 32 MiB \(refused\)"):
        asyncio.run(_call(big, "file", file_limit=32 << 20))
    assert big.requests == 2


class Trickle:
    """A provider that lies or stalls: ``drip`` declares 1 MiB and sends a byte every 0.2 s;
    ``short`` declares 1 MiB, sends a few bytes and closes; ``long`` declares 20 bytes and
    sends a whole JSON object after them on the same connection."""

    def __init__(self, mode: str) -> None:
        self.mode, self.requests = mode, 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.requests += 1
        await reader.readuntil(b"\r\n\r\n")
        body = b'{"id": "b1", "status": "completed"}'
        declared = 20 if self.mode == "long" else 1 << 20
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % declared)
        try:
            if self.mode == "drip":
                for _ in range(300):
                    writer.write(b" ")
                    await writer.drain()
                    await asyncio.sleep(0.2)
            else:
                writer.write(body)
                await writer.drain()
        except (ConnectionError, RuntimeError):
            pass
        writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.mark.parametrize("mode", ["drip", "short", "long"])
def test_a_stalling_or_lying_provider_ends_in_its_time_budget_with_one_line(mode: str) -> None:
    import time

    import aiohttp

    server = Trickle(mode)

    async def call() -> Any:
        async with aiohttp.ClientSession() as session:
            http = OpenAIBatches(BatchTransport(f"http://127.0.0.1:{server.port}/v1", lambda: session,
                                                lambda: (None, None),
                                                RetryPolicy(max_retries=1, timeout_s=4, attempt_timeout_s=1.5),
                                                lambda status, why: why, "test-batch-trickle"))
            return await http.get("b1")

    began = time.monotonic()
    try:
        with pytest.raises(ModelError) as err:
            asyncio.run(call())
    finally:
        server.close()
    assert time.monotonic() - began < 8  # the drip does not reset the attempt's clock
    assert "\n" not in str(err.value)
    assert server.requests in (1, 2)
