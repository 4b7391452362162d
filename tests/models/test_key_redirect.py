"""An endpoint that redirects to another origin never gets the API key sent there.

aiohttp drops ``Authorization`` when it follows a redirect to another origin, but not Anthropic's
``x-api-key``: ``AnthropicAPI`` (direct calls and batch mode) used to send the key to whatever
address a 307 named.  No model call follows a redirect now; the task fails with one line naming
where the endpoint redirects.  Through ``run.py``; the other origin is the Anthropic double on
another port, which counts the calls that reached it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from servers.double_thread import AppServer

_spec = importlib.util.spec_from_file_location("orchestra_test_batch_run_redirect",
                                               os.path.join(os.path.dirname(__file__), "test_batch_run.py"))
assert _spec is not None and _spec.loader is not None
br = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(br)


class Redirect(AppServer):
    """Answers every request with a 307 to the same path at ``target`` (another origin)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.serve("redirect")

    def routes(self, app: web.Application) -> None:
        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect(self.target + request.path_qs)

        app.router.add_route("*", "/{tail:.*}", redirect)


@pytest.mark.parametrize("batch", ["None", "dict(size=8, poll_s=0.2, flush_s=0.2)"])
def test_a_redirect_to_another_origin_gets_no_key(tmp_path: Path, anthropic_server: Any, batch: str) -> None:
    anthropic_server.configure(api_key=br.KEY)  # a call reaching it with the key is answered 200
    target = anthropic_server.base_url.removesuffix("/v1")
    redirect = Redirect(target)
    try:
        cfg = br.write_config(tmp_path, redirect.base_url, rows=4, model="AnthropicAPI", batch=batch, max_retries=0)
        res = br.orchestra(cfg)
    finally:
        redirect.close()
    st = anthropic_server.stats()
    assert sum(st.calls.values()) == 0 and st.unauthorized == 0, st  # before: every call went on, key and all
    assert res.returncode == 1, res.stderr[-3000:]
    assert "HTTP 307: the endpoint redirects to 'http://127.0.0.1:" in res.stderr, res.stderr[-3000:]
    assert "set base_url" in res.stderr


class RelativeRedirect(AppServer):
    """Answers every request with a 307 whose ``Location`` is a path on the same server (``/v2/...``),
    as frameworks that emit relative locations do."""

    def __init__(self) -> None:
        self.serve("relative-redirect")

    def routes(self, app: web.Application) -> None:
        async def redirect(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect(request.path.replace("/v1/", "/v2/", 1))

        app.router.add_route("*", "/{tail:.*}", redirect)


def test_a_redirect_within_the_endpoint_is_named_by_its_path(tmp_path: Path) -> None:
    """A relative ``Location`` (a path on the same server) was reported as '(no Location)', and one on
    the same origin by that origin alone, which is the address the user already set: the line now
    names where the endpoint wants the request."""
    redirect = RelativeRedirect()
    try:
        cfg = br.write_config(tmp_path, redirect.base_url, rows=2, batch="None", max_retries=0)
        res = br.orchestra(cfg)
    finally:
        redirect.close()
    assert res.returncode == 1, res.stderr[-3000:]
    origin = redirect.base_url.removesuffix("/v1")
    assert f"HTTP 307: the endpoint redirects to '{origin}/v2/chat/completions'" in res.stderr, res.stderr[-3000:]
