"""OpenAIAPI reads at most 64 MiB of a response body: a real aiohttp server on 127.0.0.1 that
answers with a body without end (chunked) or one whose Content-Length is too large."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from servers.double_thread import AppServer

from orchestra.errors import ModelError
from orchestra.models.openai_api import OpenAIAPI
from orchestra.requests import GenRequest


class HugeServer(AppServer):
    """Answers every chat completion with a JSON body of ``size`` bytes, sent in 1 MiB pieces
    (``declared``: with its Content-Length, else chunked); counts the requests."""

    def __init__(self, size: int, declared: bool) -> None:
        self.size, self.declared, self.requests = size, declared, 0
        self.serve("huge-server")

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if self.declared:
            resp.content_length = self.size
        await resp.prepare(request)
        head = b'{"choices": [{"message": {"content": "'
        await resp.write(head)
        left = self.size - len(head) - 4
        piece = b"a" * (1 << 20)
        try:
            while left > 0:
                await resp.write(piece[:left])
                left -= len(piece)
            await resp.write(b'"}}]')
        except (ConnectionError, RuntimeError):
            pass  # the client stopped reading: what is under test
        return resp

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._answer)


@pytest.fixture(autouse=True)
def _lock_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHESTRA_LOCK_DIR", str(tmp_path / "locks"))


@pytest.fixture(params=[False, True], ids=["chunked", "content-length"])
def huge(request: pytest.FixtureRequest) -> Iterator[HugeServer]:
    server = HugeServer(80 << 20, declared=request.param)
    yield server
    server.close()


def test_a_body_over_64_mib_is_a_one_line_model_error_not_a_read_without_end(huge: HugeServer) -> None:
    model = OpenAIAPI(abbr="m", path="p", base_url=f"http://127.0.0.1:{huge.port}/v1", key_env=None)
    model.policy = dataclasses.replace(model.policy, backoff_base_s=0.01)

    async def main() -> Any:
        try:
            return await model.generate(GenRequest(prompt="hi", max_out_len=4))
        except ModelError as exc:
            return exc
        finally:
            await model.aclose()

    err = asyncio.run(main())
    assert isinstance(err, ModelError), type(err)
    assert "response body over 64 MiB" in str(err) and "\n" not in str(err), str(err)
    assert huge.requests == 1  # not retried: the next answer would be as large
