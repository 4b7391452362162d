"""A double of Anthropic's Messages and Message Batches API, a real HTTP server on 127.0.0.1.

Strict where the service is, and parsed with strict validation by the official ``anthropic``
SDK (tests/servers/test_batch_double.py):

* ``POST /v1/messages`` needs ``x-api-key`` (when a key is set), ``anthropic-version``,
  ``model``, ``max_tokens`` >= 1 and ``messages``; any other top-level field the Messages API
  does not know is a 400 (``invalid_request_error``).  ``system`` is a top-level field, not a
  message role.  Answers are those of tests/servers/openai_server.py, with ``usage``
  (``input_tokens``: characters of the prompt, ``output_tokens``: characters of the answer).
* ``POST /v1/messages/batches`` takes exactly ``requests`` (1..100,000 of ``{custom_id,
  params}``, ``custom_id`` matching ``^[a-zA-Z0-9_-]{1,64}$`` and unique); a request whose
  ``params`` are invalid is errored in the results, not refused.  ``GET .../{id}``,
  ``GET /v1/messages/batches?limit=&after_id=`` (newest first), ``POST .../{id}/cancel``
  (``canceling``, then ``ended``), ``GET .../{id}/results`` (JSONL, shuffled; 404 until ended).
* Markers: ``ROW_500_ONCE`` (an ``api_error`` result the first time), ``ROW_DUP_ONCE`` (the first
  time, a succeeded result followed, last in the file, by an ``api_error`` one for the same
  ``custom_id``), ``expire_after``
  (a batch ends with that many succeeded, the rest ``expired``).  Counters: calls per route,
  batches per custom_id, gets per batch, cancelled batches.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import json
import os
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

_spec = importlib.util.spec_from_file_location(
    "orchestra_test_openai_server_b", os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_server.py"))
assert _spec is not None and _spec.loader is not None
_answers = sys.modules.get(_spec.name) or importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _answers
_spec.loader.exec_module(_answers)
_tspec = importlib.util.spec_from_file_location(
    "orchestra_test_double_thread", os.path.join(os.path.dirname(os.path.abspath(__file__)), "double_thread.py"))
assert _tspec is not None and _tspec.loader is not None
_thread = sys.modules.get(_tspec.name) or importlib.util.module_from_spec(_tspec)
sys.modules[_tspec.name] = _thread
_tspec.loader.exec_module(_thread)

PARAMS = {"model", "max_tokens", "messages", "system", "temperature", "top_p", "top_k", "stop_sequences",
          "metadata", "stream", "tools", "tool_choice", "thinking", "service_tier"}
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass
class AnthropicConfig:
    """What the double does; every field can be changed at run time."""

    turnaround_s: float = 0.3
    create_delay_s: float = 0.0  # the batch exists this long before POST /messages/batches answers
    cancel_delay_s: float = 0.2
    expire_after: int | None = None
    api_key: str | None = None
    seed: int = 0


@dataclass
class AnthropicStats:
    calls: Counter[str] = field(default_factory=Counter)
    submitted: Counter[str] = field(default_factory=Counter)  # custom_id -> batches that held it
    prompts: Counter[str] = field(default_factory=Counter)  # prompt key -> times answered or batched
    gets: Counter[str] = field(default_factory=Counter)
    cancelled: list[str] = field(default_factory=list)
    unauthorized: int = 0
    first_call_t: float | None = None  # time.time() of the first call, and of the last answer
    last_call_t: float | None = None


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat()


def _err(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


class AnthropicServer:
    """The aiohttp application and its state."""

    def __init__(self, config: AnthropicConfig | None = None) -> None:
        self.config = config or AnthropicConfig()
        self.stats = AnthropicStats()
        self.batches: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self._rng = random.Random(self.config.seed)
        self._tasks: set[asyncio.Task[Any]] = set()
        app = web.Application(client_max_size=300 * 1024 * 1024, middlewares=[self._auth])
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/batches", self.create)
        app.router.add_get("/v1/messages/batches", self.list)
        app.router.add_get("/v1/messages/batches/{id}", self.get)
        app.router.add_post("/v1/messages/batches/{id}/cancel", self.cancel)
        app.router.add_get("/v1/messages/batches/{id}/results", self.results)
        self.app = app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        route = request.match_info.route.resource
        self.stats.calls[f"{request.method} {route.canonical if route else request.path}"] += 1
        if self.stats.first_call_t is None:
            self.stats.first_call_t = time.time()
        key = self.config.api_key
        if key is not None and request.headers.get("x-api-key") != key:
            self.stats.unauthorized += 1
            return _err(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return _err(400, "invalid_request_error", "anthropic-version: header is required")
        resp: web.StreamResponse = await handler(request)
        self.stats.last_call_t = time.time()
        return resp

    # -- one message --------------------------------------------------------------------
    def _answer(self, params: Any, count: bool = True) -> tuple[str, dict[str, Any]]:
        """``("ok", message)`` or ``(error type, message text)`` for one Messages request."""
        if not isinstance(params, dict):
            return "invalid_request_error", {"message": "params: Input should be an object"}
        unknown = sorted(set(params) - PARAMS)
        if unknown:
            return "invalid_request_error", {"message": f"{unknown[0]}: Extra inputs are not permitted"}
        for name in ("model", "max_tokens", "messages"):
            if name not in params:
                return "invalid_request_error", {"message": f"{name}: Field required"}
        if not isinstance(params["max_tokens"], int) or params["max_tokens"] < 1:
            return "invalid_request_error", {"message": "max_tokens: must be at least 1"}
        msgs = params["messages"]
        if any(m.get("role") not in ("user", "assistant") for m in msgs):
            return "invalid_request_error", {"message": "messages: roles must be 'user' or 'assistant' "
                                                        "(use the top-level system parameter)"}
        key = str(_answers.prompt_key(msgs))
        if count:
            self.stats.prompts[key] += 1
        if "ROW_500_ONCE" in json.dumps(msgs) and self.stats.prompts[key] == 1:
            return "api_error", {"message": "Internal server error (injected)"}
        text = _answers.answer(msgs)[: params["max_tokens"]]
        stops = [s for s in params.get("stop_sequences") or [] if s in text]
        usage = {"input_tokens": sum(len(str(m.get("content", ""))) for m in msgs) + len(params.get("system", "")),
                 "output_tokens": len(text)}
        return "ok", {"id": f"msg_{self._rng.getrandbits(48):012x}", "type": "message", "role": "assistant",
                      "model": params["model"], "content": [{"type": "text", "text": text}],
                      "stop_reason": "stop_sequence" if stops else "end_turn", "stop_sequence": None,
                      "usage": usage}

    async def messages(self, request: web.Request) -> web.Response:
        kind, out = self._answer(await request.json())
        if kind == "ok":
            return web.json_response(out)
        return _err(500 if kind == "api_error" else 400, kind, out["message"])

    # -- batches ------------------------------------------------------------------------
    def _public(self, b: dict[str, Any], request: web.Request) -> dict[str, Any]:
        ended = b["ended_at"] is not None
        return {"id": b["id"], "type": "message_batch", "processing_status": b["status"],
                "request_counts": dict(b["counts"]), "ended_at": _iso(b["ended_at"]),
                "created_at": _iso(b["created_at"]), "expires_at": _iso(b["created_at"] + 86400),
                "archived_at": None, "cancel_initiated_at": _iso(b["cancel_at"]),
                "results_url": f"http://{request.host}/v1/messages/batches/{b['id']}/results" if ended else None}

    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        unknown = sorted(set(body) - {"requests"})
        if unknown:
            return _err(400, "invalid_request_error", f"{unknown[0]}: Extra inputs are not permitted")
        reqs = body.get("requests")
        if not isinstance(reqs, list) or not 1 <= len(reqs) <= 100_000:
            return _err(400, "invalid_request_error", "requests: between 1 and 100000 items")
        seen: set[str] = set()
        for i, r in enumerate(reqs):
            cid = r.get("custom_id") if isinstance(r, dict) else None
            if not isinstance(r, dict) or set(r) != {"custom_id", "params"} or not isinstance(cid, str) \
                    or not _CUSTOM_ID.match(cid):
                return _err(400, "invalid_request_error", f"requests.{i}: needs exactly custom_id (matching "
                                                          f"^[a-zA-Z0-9_-]{{1,64}}$) and params")
            if cid in seen:
                return _err(400, "invalid_request_error", f"requests.{i}.custom_id: duplicate {cid!r}")
            seen.add(cid)
        bid = f"msgbatch_{len(self.order) + 1:04d}{self._rng.getrandbits(40):010x}"
        b = {"id": bid, "status": "in_progress", "created_at": time.time(), "ended_at": None, "cancel_at": None,
             "requests": reqs, "results": b"",
             "counts": {"processing": len(reqs), "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}}
        for r in reqs:
            self.stats.submitted[r["custom_id"]] += 1
        self.batches[bid] = b
        self.order.append(bid)
        task = asyncio.get_running_loop().create_task(self._process(b))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.config.create_delay_s:
            await asyncio.sleep(self.config.create_delay_s)
        return web.json_response(self._public(b, request))

    async def _process(self, b: dict[str, Any]) -> None:
        t_end = time.monotonic() + self.config.turnaround_s
        while time.monotonic() < t_end and b["status"] == "in_progress":
            await asyncio.sleep(0.02)
        cancelled = b["status"] == "canceling"
        if cancelled:
            await asyncio.sleep(self.config.cancel_delay_s)
        lines = []
        done = 0 if cancelled else (self.config.expire_after if self.config.expire_after is not None
                                    else len(b["requests"]))
        for i, r in enumerate(b["requests"]):
            if i >= done:
                kind = "canceled" if cancelled else "expired"
                lines.append({"custom_id": r["custom_id"], "result": {"type": kind}})
            else:
                kind, out = self._answer(r["params"])
                if kind == "ok":
                    lines.append({"custom_id": r["custom_id"], "result": {"type": "succeeded", "message": out}})
                    kind = "succeeded"
                else:
                    lines.append({"custom_id": r["custom_id"], "result": {"type": "errored", "error": {
                        "type": "error", "error": {"type": kind, "message": out["message"]}}}})
                    kind = "errored"
            b["counts"][kind] += 1
            b["counts"]["processing"] -= 1
        self._rng.shuffle(lines)
        for line in list(lines):  # ROW_DUP_ONCE: the answered row again, errored, after its answer
            msgs = next(r["params"].get("messages") for r in b["requests"] if r["custom_id"] == line["custom_id"])
            if (line["result"]["type"] == "succeeded" and "ROW_DUP_ONCE" in json.dumps(msgs)
                    and self.stats.prompts[str(_answers.prompt_key(msgs))] == 1):
                lines.append({"custom_id": line["custom_id"], "result": {"type": "errored", "error": {
                    "type": "error", "error": {"type": "api_error", "message": "Internal server error (dup)"}}}})
        b["results"] = "".join(json.dumps(x) + "\n" for x in lines).encode()
        b["status"], b["ended_at"] = "ended", time.time()

    async def get(self, request: web.Request) -> web.Response:
        b = self.batches.get(request.match_info["id"])
        if b is None:
            return _err(404, "not_found_error", "batch not found")
        self.stats.gets[b["id"]] += 1
        return web.json_response(self._public(b, request))

    async def list(self, request: web.Request) -> web.Response:
        limit = int(request.query.get("limit", "20"))
        ids = list(reversed(self.order))
        after = request.query.get("after_id")
        if after:
            ids = ids[ids.index(after) + 1:] if after in ids else []
        page = ids[:limit]
        return web.json_response({"data": [self._public(self.batches[i], request) for i in page],
                                  "has_more": len(ids) > limit, "first_id": page[0] if page else None,
                                  "last_id": page[-1] if page else None})

    async def cancel(self, request: web.Request) -> web.Response:
        b = self.batches.get(request.match_info["id"])
        if b is None:
            return _err(404, "not_found_error", "batch not found")
        if b["status"] == "in_progress":
            b["status"], b["cancel_at"] = "canceling", time.time()
            self.stats.cancelled.append(b["id"])
        return web.json_response(self._public(b, request))

    async def results(self, request: web.Request) -> web.Response:
        b = self.batches.get(request.match_info["id"])
        if b is None or b["ended_at"] is None:
            return _err(404, "not_found_error", "results are not available until the batch has ended")
        return web.Response(body=b["results"], content_type="application/binary")


class AnthropicServerThread(_thread.DoubleThread):
    """The double on its own thread and event loop, on 127.0.0.1 and a free port."""

    def __init__(self, config: AnthropicConfig | None = None) -> None:
        super().__init__(AnthropicServer(config), "anthropic-double")
