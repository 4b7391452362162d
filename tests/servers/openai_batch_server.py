"""A double of OpenAI's Files + Batches API, a real HTTP server on 127.0.0.1 (aiohttp).

It follows the documented contract where the real service is strict, and the official
``openai`` SDK parses every answer with strict validation (tests/servers/test_batch_double.py):

* ``POST /v1/files`` (multipart, ``purpose=batch``, a file name ending ``.jsonl``; at most
  ``max_requests`` lines and ``max_bytes`` bytes), ``GET /v1/files/{id}``,
  ``GET /v1/files/{id}/content``.
* ``POST /v1/batches`` with exactly ``input_file_id``, ``endpoint``, ``completion_window``
  (``24h``) and optional ``metadata`` (at most 16 pairs); any other field is a 400.
* ``GET /v1/batches/{id}``, ``GET /v1/batches?limit=&after=`` (newest first, ``has_more``),
  ``POST /v1/batches/{id}/cancel`` (``cancelling``, then ``cancelled``).
* A batch runs ``validating`` -> ``in_progress`` -> ``finalizing`` -> ``completed`` in
  ``turnaround_s``.  A line whose keys are not ``custom_id, method, url, body``, whose url is
  not the batch's endpoint, or a repeated ``custom_id`` fails validation (``failed`` with
  ``errors``).  A row body with a parameter the endpoint does not know gets a 400 row.
  Output lines come in shuffled order; failed rows go to the error file with
  ``response.status_code`` and the error in ``response.body``.

Answers are those of tests/servers/openai_server.py.  Markers in a prompt script failures:
``ROW_500_ONCE`` (a 500 row the first time that prompt is sent), ``ROW_429_ALWAYS``,
``INVALID_BATCH`` (the whole batch fails validation), ``TOKEN_LIMIT_ONCE`` (the first batch
holding it fails with ``token_limit_exceeded``, visible only when retrieved), ``ROW_DUP_ONCE`` (the first
time that prompt is sent, its answered row comes twice in the output file: the answer, then, last in
the file, a 500 row with the same ``custom_id``).  ``expire_after``
makes a batch expire with that many rows done (the rest ``batch_expired`` in the error file).
Counters: HTTP calls per route, submissions per custom_id, gets per batch.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("orchestra_test_openai_server_b",
                                               os.path.join(_HERE, "openai_server.py"))
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

ENDPOINTS = {"/v1/chat/completions", "/v1/completions"}
CHAT_PARAMS = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
               "stop", "n", "frequency_penalty", "presence_penalty", "logprobs", "top_logprobs", "user"}
COMPLETION_PARAMS = {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "echo",
                     "logprobs", "frequency_penalty", "presence_penalty", "user"}


@dataclass
class BatchConfig:
    """What the double does; every field can be changed at run time."""

    turnaround_s: float = 0.3  # from creation to completed
    create_delay_s: float = 0.0  # the batch exists this long before POST /batches answers
    cancel_delay_s: float = 0.2  # cancelling -> cancelled
    expire_after: int | None = None  # a batch expires with this many rows done
    max_requests: int = 50_000
    max_bytes: int = 200 * 1024 * 1024
    api_key: str | None = None
    seed: int = 0


@dataclass
class BatchStats:
    """What the double served."""

    calls: Counter[str] = field(default_factory=Counter)  # "METHOD route" -> count
    submitted: Counter[str] = field(default_factory=Counter)  # custom_id -> batches that held it
    prompts: Counter[str] = field(default_factory=Counter)  # prompt key -> rows sent
    gets: Counter[str] = field(default_factory=Counter)  # batch id -> GET /batches/{id}
    cancelled: list[str] = field(default_factory=list)
    unauthorized: int = 0
    first_call_t: float | None = None  # time.time() of the first call, and of the last answer
    last_call_t: float | None = None


def _err(status: int, message: str, code: str | None = None, param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                        "code": code}}, status=status)


class BatchServer:
    """The aiohttp application and its state (files, batches)."""

    def __init__(self, config: BatchConfig | None = None) -> None:
        self.config = config or BatchConfig()
        self.stats = BatchStats()
        self.files: dict[str, dict[str, Any]] = {}
        self.contents: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._seq = 0
        self._rng = random.Random(self.config.seed)
        app = web.Application(client_max_size=300 * 1024 * 1024, middlewares=[self._auth])
        app.router.add_post("/v1/files", self.upload)
        app.router.add_get("/v1/files/{id}", self.get_file)
        app.router.add_get("/v1/files/{id}/content", self.file_content)
        app.router.add_post("/v1/batches", self.create)
        app.router.add_get("/v1/batches", self.list)
        app.router.add_get("/v1/batches/{id}", self.get_batch)
        app.router.add_post("/v1/batches/{id}/cancel", self.cancel)
        self.app = app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        route = request.match_info.route.resource
        self.stats.calls[f"{request.method} {route.canonical if route else request.path}"] += 1
        if self.stats.first_call_t is None:
            self.stats.first_call_t = time.time()
        key = self.config.api_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            self.stats.unauthorized += 1
            return _err(401, "Incorrect API key provided.", "invalid_api_key")
        resp: web.StreamResponse = await handler(request)
        self.stats.last_call_t = time.time()
        return resp

    def _id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self._seq:06d}{self._rng.getrandbits(24):06x}"

    # -- files --------------------------------------------------------------------------
    def _file(self, purpose: str, filename: str, data: bytes) -> dict[str, Any]:
        fid = self._id("file")
        obj = {"id": fid, "object": "file", "bytes": len(data), "created_at": int(time.time()),
               "filename": filename, "purpose": purpose, "status": "processed"}
        self.files[fid], self.contents[fid] = obj, data
        return obj

    async def upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            return _err(400, f"'{purpose}' is not one of ['assistants', 'batch', 'fine-tune', 'vision', "
                             "'user_data', 'evals'] - 'purpose'", param="purpose")
        if not isinstance(upload, web.FileField):
            return _err(400, "Missing file", param="file")
        if not upload.filename.endswith(".jsonl"):
            return _err(400, f"Invalid file format for Batch API. Must be .jsonl (got {upload.filename})")
        data = upload.file.read()
        lines = [ln for ln in data.splitlines() if ln.strip()]
        if len(data) > self.config.max_bytes:
            return _err(400, f"File is too large: {len(data)} bytes; the limit is {self.config.max_bytes}")
        if len(lines) > self.config.max_requests:
            return _err(400, f"File has {len(lines)} requests; the limit is {self.config.max_requests}")
        return web.json_response(self._file("batch", upload.filename, data))

    async def get_file(self, request: web.Request) -> web.Response:
        obj = self.files.get(request.match_info["id"])
        return web.json_response(obj) if obj else _err(404, "No such File object", "file_not_found")

    async def file_content(self, request: web.Request) -> web.Response:
        data = self.contents.get(request.match_info["id"])
        if data is None:
            return _err(404, "No such File object", "file_not_found")
        return web.Response(body=data, content_type="application/octet-stream")

    # -- batches ------------------------------------------------------------------------
    async def create(self, request: web.Request) -> web.Response:
        body = await request.json()
        allowed = {"input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"}
        unknown = sorted(set(body) - allowed)
        if unknown:
            return _err(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
        fid, endpoint = body.get("input_file_id"), body.get("endpoint")
        if fid not in self.files:
            return _err(400, f"Invalid 'input_file_id': '{fid}'.", param="input_file_id")
        if endpoint not in ENDPOINTS | {"/v1/embeddings", "/v1/responses"}:
            return _err(400, f"Invalid 'endpoint': '{endpoint}'.", param="endpoint")
        if body.get("completion_window") != "24h":
            return _err(400, "Invalid 'completion_window': only '24h' is supported.", param="completion_window")
        meta = body.get("metadata")
        if meta is not None and (not isinstance(meta, dict) or len(meta) > 16
                                 or any(len(k) > 64 or not isinstance(v, str) or len(v) > 512
                                        for k, v in meta.items())):
            return _err(400, "Invalid 'metadata': at most 16 string pairs, keys <= 64, values <= 512 chars.",
                        param="metadata")
        now = int(time.time())
        batch: dict[str, Any] = {
            "id": self._id("batch"), "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": fid, "completion_window": "24h", "status": "validating", "output_file_id": None,
            "error_file_id": None, "created_at": now, "in_progress_at": None, "expires_at": now + 86400,
            "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
            "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": meta,
        }
        self.batches[batch["id"]] = batch
        self.order.append(batch["id"])
        task = asyncio.get_running_loop().create_task(self._process(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.config.create_delay_s:
            await asyncio.sleep(self.config.create_delay_s)
        return web.json_response(batch)

    async def get_batch(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return _err(404, "No batch found", "batch_not_found")
        self.stats.gets[batch["id"]] += 1
        if batch.get("_token_limit") and batch["status"] == "validating":
            self._fail(batch, [{"code": "token_limit_exceeded", "line": None, "param": None, "message":
                                "Enqueued token limit reached for this model. Try again later."}])
        return web.json_response(self._public(batch))

    @staticmethod
    def _public(batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in batch.items() if not k.startswith("_")}

    async def list(self, request: web.Request) -> web.Response:
        limit = int(request.query.get("limit", "20"))
        after = request.query.get("after")
        ids = list(reversed(self.order))
        if after:
            ids = ids[ids.index(after) + 1:] if after in ids else []
        page = ids[:limit]
        data = [self._public(self.batches[i]) for i in page]
        return web.json_response({"object": "list", "data": data, "first_id": page[0] if page else None,
                                  "last_id": page[-1] if page else None, "has_more": len(ids) > limit})

    async def cancel(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return _err(404, "No batch found", "batch_not_found")
        if batch["status"] in ("validating", "in_progress", "finalizing"):
            batch["status"], batch["cancelling_at"] = "cancelling", int(time.time())
            self.stats.cancelled.append(batch["id"])
        elif batch["status"] not in ("cancelling", "cancelled"):
            return _err(409, f"Cannot cancel a batch with status '{batch['status']}'.")
        return web.json_response(self._public(batch))

    # -- running a batch ----------------------------------------------------------------------
    def _fail(self, batch: dict[str, Any], errors: list[dict[str, Any]]) -> None:
        batch["status"], batch["failed_at"] = "failed", int(time.time())
        batch["errors"] = {"object": "list", "data": errors}

    def _validate(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """The batch's rows, or (when it fails validation) its errors."""
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for n, raw in enumerate(self.contents[batch["input_file_id"]].splitlines(), 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError:
                return [{"code": "invalid_json_line", "line": n, "param": None, "message": "Invalid JSON."}]
            extra = sorted(set(row) - {"custom_id", "method", "url", "body"})
            if extra or row.get("method") != "POST" or not isinstance(row.get("body"), dict):
                return [{"code": "invalid_request", "line": n, "param": extra[0] if extra else None,
                         "message": f"Invalid request line: unexpected fields {extra}" if extra else
                         "Each line needs method POST and a JSON body."}]
            if row.get("url") != batch["endpoint"]:
                return [{"code": "mismatched_endpoint", "line": n, "param": "url", "message":
                         f"The url {row.get('url')!r} does not match the batch's endpoint {batch['endpoint']!r}."}]
            cid = row.get("custom_id")
            if not isinstance(cid, str) or cid in seen:
                return [{"code": "duplicate_custom_id", "line": n, "param": "custom_id",
                         "message": f"The custom_id for this request is a duplicate of another: {cid!r}."}]
            seen.add(cid)
            if "INVALID_BATCH" in json.dumps(row["body"]):
                return [{"code": "invalid_request", "line": n, "param": "body",
                         "message": "This line has an invalid request body (INVALID_BATCH)."}]
            rows.append(row)
        return rows

    async def _process(self, batch: dict[str, Any]) -> None:
        c = self.config
        checked = self._validate(batch)
        if checked and "code" in checked[0]:
            await asyncio.sleep(c.turnaround_s / 10)
            self._fail(batch, checked)
            return
        rows = checked
        batch["request_counts"]["total"] = len(rows)
        for row in rows:
            self.stats.submitted[row["custom_id"]] += 1
            self.stats.prompts[self._key(row)] += 1
        if any("TOKEN_LIMIT_ONCE" in json.dumps(r["body"]) and self.stats.prompts[self._key(r)] == 1 for r in rows):
            batch["_token_limit"] = True  # failed once it is next retrieved
            return
        if await self._runs(batch, c.turnaround_s / 10) and batch["status"] == "validating":
            batch["status"], batch["in_progress_at"] = "in_progress", int(time.time())
        if not await self._runs(batch, c.turnaround_s * 0.8):
            await asyncio.sleep(c.cancel_delay_s)
            self._finish(batch, rows, done=0, final="cancelled", cut="batch_cancelled")
            return
        batch["status"], batch["finalizing_at"] = "finalizing", int(time.time())
        await asyncio.sleep(c.turnaround_s / 10)
        if c.expire_after is not None:
            self._finish(batch, rows, done=c.expire_after, final="expired", cut="batch_expired")
        else:
            self._finish(batch, rows, done=len(rows), final="completed", cut="")

    @staticmethod
    async def _runs(batch: dict[str, Any], seconds: float) -> bool:
        """Wait ``seconds`` unless the batch is cancelled meanwhile; False if it was."""
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end and batch["status"] != "cancelling":
            await asyncio.sleep(min(0.05, max(0.0, t_end - time.monotonic())))
        return batch["status"] != "cancelling"

    @staticmethod
    def _key(row: dict[str, Any]) -> str:
        body = row["body"]
        msgs = body.get("messages") or [{"role": "user", "content": str(body.get("prompt", ""))}]
        return str(_answers.prompt_key(msgs))

    def _answer(self, row: dict[str, Any], endpoint: str) -> tuple[int, dict[str, Any]]:
        body = row["body"]
        known = CHAT_PARAMS if endpoint.endswith("chat/completions") else COMPLETION_PARAMS
        unknown = sorted(set(body) - known)
        if unknown:
            return 400, {"error": {"message": f"Unrecognized request argument supplied: {unknown[0]}",
                                   "type": "invalid_request_error", "param": unknown[0], "code": None}}
        text_all = json.dumps(body)
        key = self._key(row)
        if "ROW_429_ALWAYS" in text_all:
            return 429, {"error": {"message": "Rate limit reached for requests", "type": "requests",
                                   "param": None, "code": "rate_limit_exceeded"}}
        if "ROW_500_ONCE" in text_all and self.stats.prompts[key] == 1:
            return 500, {"error": {"message": "The server had an error processing your request.",
                                   "type": "server_error", "param": None, "code": None}}
        msgs = body.get("messages") or [{"role": "user", "content": str(body.get("prompt", ""))}]
        text = _answers.answer(msgs)[: int(body.get("max_tokens") or 1 << 30)]
        usage = {"prompt_tokens": sum(len(str(m.get("content", ""))) for m in msgs), "completion_tokens": len(text)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if "messages" in body:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop", "logprobs": None}
            return 200, {"id": "chatcmpl-b", "object": "chat.completion", "created": int(time.time()),
                         "model": body.get("model"), "choices": [choice], "usage": usage}
        return 200, {"id": "cmpl-b", "object": "text_completion", "created": int(time.time()),
                     "model": body.get("model"), "choices": [{"index": 0, "text": text, "finish_reason": "stop",
                                                              "logprobs": None}], "usage": usage}

    def _finish(self, batch: dict[str, Any], rows: list[dict[str, Any]], done: int, final: str, cut: str) -> None:
        out, errs = [], []
        for i, row in enumerate(rows):
            rid = f"batch_req_{self._rng.getrandbits(48):012x}"
            if i >= done:
                errs.append({"id": rid, "custom_id": row["custom_id"], "response": None,
                             "error": {"code": cut, "message": f"This request could not be executed before the "
                                                               f"batch ended ({cut})."}})
                continue
            status, body = self._answer(row, batch["endpoint"])
            line = {"id": rid, "custom_id": row["custom_id"],
                    "response": {"status_code": status, "request_id": f"req_{rid[-8:]}", "body": body},
                    "error": None}
            (out if status == 200 else errs).append(line)
        self._rng.shuffle(out)
        self._rng.shuffle(errs)
        for line in list(out):  # ROW_DUP_ONCE: the same custom_id again, a 500 after the answer
            row = next(r for r in rows if r["custom_id"] == line["custom_id"])
            if "ROW_DUP_ONCE" in json.dumps(row["body"]) and self.stats.prompts[self._key(row)] == 1:
                out.append({**line, "id": f"{line['id']}-dup", "response": {
                    "status_code": 500, "request_id": "req_dup", "body": {"error": {
                        "message": "The server had an error processing your request.", "type": "server_error",
                        "param": None, "code": None}}}})
        counts = batch["request_counts"]
        counts["completed"] = sum(1 for r in out)
        counts["failed"] = len(errs)
        if out:
            batch["output_file_id"] = self._file("batch_output", "batch_output.jsonl",
                                                 "".join(json.dumps(r) + "\n" for r in out).encode())["id"]
        if errs:
            batch["error_file_id"] = self._file("batch_output", "batch_errors.jsonl",
                                                "".join(json.dumps(r) + "\n" for r in errs).encode())["id"]
        batch["status"] = final
        batch[{"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}[final]] = \
            int(time.time())


class BatchServerThread(_thread.DoubleThread):
    """The double on its own thread and event loop, on 127.0.0.1 and a free port."""

    def __init__(self, config: BatchConfig | None = None) -> None:
        super().__init__(BatchServer(config), "openai-batch-double")
