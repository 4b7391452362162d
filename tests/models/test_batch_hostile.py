"""Batch mode against a provider whose control answers are hostile: a real aiohttp server on
127.0.0.1 that speaks just enough of the Files + Batches API and, on request, answers a poll with
JSON that is not an object, writes output rows that are not objects (or whose ``response`` is
not), or answers an upload or a create without an ``id``.

Each such answer must cost at most the rows it touches (a later batch sends them again, bounded
by ``max_retries``), never every request of the task, and never a traceback.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from servers.double_thread import AppServer

from orchestra.errors import ModelError
from orchestra.models.base import SampleTag, current_sample
from orchestra.models.openai_api import OpenAIAPI
from orchestra.requests import GenRequest


class HostileBatches(AppServer):
    """A minimal Batch API.  ``hostile`` names what goes wrong, each once: ``poll_list`` (the first
    poll of a batch is a JSON list), ``bad_rows`` (the first output file has garbage lines and its
    row for the prompt ``q3`` has ``"response": "oops"``), ``alien_ids`` (the first output file
    answers "HIJACK" under ids that are not its rows': path-like, of a megabyte, another task's, not
    text, and each row's own id again after its answer; q4's own row is missing), ``poll_500`` (the
    first batch can never be polled: every GET answers 500), ``upload_no_id`` / ``create_no_id``
    (the first upload / create answers 200 without an ``id``)."""

    def __init__(self, hostile: set[str]) -> None:
        self.hostile = set(hostile)
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.calls: dict[str, int] = {}
        self.serve("hostile-batches")

    def _once(self, what: str) -> bool:
        if what in self.hostile:
            self.hostile.discard(what)
            return True
        return False

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    async def upload(self, request: web.Request) -> web.Response:
        self._count("upload")
        form = await request.post()
        field: Any = form["file"]
        fid = f"file-{len(self.files)}"
        self.files[fid] = field.file.read()
        if self._once("upload_no_id"):
            return web.json_response({"object": "file"})
        return web.json_response({"id": fid, "object": "file"})

    async def create(self, request: web.Request) -> web.Response:
        self._count("create")
        body = await request.json()
        if self._once("create_no_id"):
            return web.json_response({"object": "batch", "status": "validating"})
        bid = f"batch-{len(self.batches)}"
        self.batches[bid] = {"id": bid, "object": "batch", "status": "completed", "metadata": body["metadata"],
                             "input_file_id": body["input_file_id"], "output_file_id": f"out-{bid}",
                             "created_at": 0}
        return web.json_response({**self.batches[bid], "status": "validating"})

    async def get(self, request: web.Request) -> web.Response:
        self._count("get")
        if request.match_info["bid"] == "batch-0" and "poll_500" in self.hostile:  # never readable
            return web.json_response({"error": {"message": "internal error"}}, status=500)
        if self._once("poll_list"):
            return web.json_response([{"id": request.match_info["bid"], "status": "completed"}])
        return web.json_response(self.batches[request.match_info["bid"]])

    async def listing(self, request: web.Request) -> web.Response:
        self._count("list")
        data: list[Any] = list(reversed(self.batches.values()))
        if "list_endless" in self.hostile:  # other clients' batches, page after page, never older
            n = self.calls["list"]
            return web.json_response({"object": "list", "has_more": True, "data": [
                {"id": f"other-{n}-{i}", "object": "batch", "status": "completed", "metadata": {},
                 "created_at": 32503680000} for i in range(100)]})
        if self._once("list_garbage"):  # entries that are no batch, or no batch of ours, first
            data = ["x", {"metadata": "not an object"}, {"id": 7, "metadata": None}, *data,
                    {"id": "old", "created_at": "yesterday"}]
        return web.json_response({"object": "list", "data": data, "has_more": True})

    async def anthropic_create(self, request: web.Request) -> web.Response:
        self._count("create")
        body = await request.json()
        if self._once("create_no_id"):
            return web.json_response({"type": "message_batch", "processing_status": "in_progress"})
        bid = f"msgbatch_{len(self.batches)}"
        self.batches[bid] = {"id": bid, "type": "message_batch", "processing_status": "ended",
                             "requests": body["requests"]}
        return web.json_response({"id": bid, "type": "message_batch", "processing_status": "in_progress"})

    async def anthropic_listing(self, request: web.Request) -> web.Response:
        """Only ``list_endless``: other clients' message batches, page after page, created in the
        far future, with odd ``request_counts``; the ``after_id`` cursor is not honoured."""
        self._count("list")
        n = self.calls["list"]
        return web.json_response({"has_more": True, "last_id": "x", "data": [
            {"id": f"msgbatch_other_{n}_{i}", "type": "message_batch", "processing_status": "ended",
             "created_at": "2999-01-01T00:00:00Z", "request_counts": {"succeeded": 10**30, "odd": "x"}}
            for i in range(100)]})

    async def anthropic_get(self, request: web.Request) -> web.Response:
        self._count("get")
        batch = {k: v for k, v in self.batches[request.match_info["bid"]].items() if k != "requests"}
        if self._once("anthropic_poll_no_id"):
            del batch["id"]
        return web.json_response(batch)

    async def anthropic_results(self, request: web.Request) -> web.Response:
        bid = request.match_info["bid"]
        if bid in self.batches:
            lines = [json.dumps({"custom_id": r["custom_id"], "result": {"type": "succeeded", "message": {
                "content": [{"type": "text", "text": f"re:{r['params']['messages'][-1]['content']}"}]}}}).encode()
                for r in self.batches[bid]["requests"]]
            return web.Response(body=b"\n".join(lines) + b"\n", content_type="application/octet-stream")
        lines = [b"[]", b"null", b"not json", b"[" * 100_000, b'{"custom_id": "a", "result": "done"}',
                 b'{"custom_id": "b", "result": {"type": "errored", "error": "overloaded"}}',
                 b'{"custom_id": "c", "result": {"type": "errored", "error": {"error": {"type": "overloaded_error"}}}}',
                 b'{"custom_id": "d", "result": {"type": "succeeded", "message": {"content": []}}}']
        return web.Response(body=b"\n".join(lines) + b"\n", content_type="application/octet-stream")

    async def cancel(self, request: web.Request) -> web.Response:
        self._count("cancel")
        batch = self.batches[request.match_info["bid"]]
        return web.json_response({**batch, "status": "cancelled"})

    async def content(self, request: web.Request) -> web.Response:
        self._count("content")
        bid = request.match_info["fid"][len("out-"):]
        bad = self._once("bad_rows")
        alien = self._once("alien_ids")
        echo = request.headers.get("Authorization", "") if "echo_key" in self.hostile else ""
        lines = [b"[1, 2]", b'"a string"', b'{"custom_id": "elsewhere", "response": "x", "error": "y"}'] if bad else []
        for raw in self.files[self.batches[bid]["input_file_id"]].splitlines():
            row = json.loads(raw)
            prompt = row["body"]["messages"][-1]["content"]
            body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": f"re:{prompt}{echo}"}}]}
            response: Any = "oops" if bad and prompt == "q3" else {"status_code": 200, "body": body}
            if echo and prompt == "q2":  # a row that fails, its message holding the key this call came with
                response = {"status_code": 400, "body": {"error": {"message": f"bad request from {echo}"}}}
            if alien:  # rows under ids that are not this row's: path-like, enormous, another task's, not text
                hijack = {"status_code": 200, "body": {"choices": [{"index": 0, "message": {"content": "HIJACK"}}]}}
                for cid in ("../../" + row["custom_id"], row["custom_id"] + "x" * 1_000_000,
                            row["custom_id"].rpartition("-t")[0] + "-tother", {"id": row["custom_id"]}, None):
                    lines.append(json.dumps({"custom_id": cid, "response": hijack, "error": None}).encode())
                if prompt == "q4":
                    continue  # its own row is missing: it goes into another batch
            lines.append(json.dumps({"custom_id": row["custom_id"], "response": response, "error": None}).encode())
            if alien:  # its own id again, with another answer, after its answer: the first answer stands
                lines.append(json.dumps({"custom_id": row["custom_id"], "response": hijack, "error": None}).encode())
        return web.Response(body=b"\n".join(lines) + b"\n", content_type="application/octet-stream")

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/files", self.upload)
        app.router.add_post("/v1/batches", self.create)
        app.router.add_get("/v1/batches", self.listing)
        app.router.add_get("/v1/batches/{bid}", self.get)
        app.router.add_post("/v1/batches/{bid}/cancel", self.cancel)
        app.router.add_get("/v1/files/{fid}/content", self.content)
        app.router.add_post("/v1/messages/batches", self.anthropic_create)
        app.router.add_get("/v1/messages/batches", self.anthropic_listing)
        app.router.add_get("/v1/messages/batches/{bid}", self.anthropic_get)
        app.router.add_get("/v1/messages/batches/{bid}/results", self.anthropic_results)


def _ask(server: HostileBatches, run_dir: Path, prompts: list[str],
         cls: type[OpenAIAPI] = OpenAIAPI, key_env: str | None = None,
         fields: list[dict[str, Any]] | None = None) -> tuple[list[Any], list[str]]:
    """Every prompt through one batch-mode model bound to ``run_dir``: answers (or errors), events
    (and each event's fields in ``fields``)."""
    seen: list[str] = []

    def emit(event: str, **more: Any) -> None:
        seen.append(event)
        if fields is not None:
            fields.append(more)

    async def main() -> list[Any]:
        model = cls(abbr="m", path="test-model", base_url=server.base_url, key_env=key_env, max_retries=2,
                    batch=dict(size=50, poll_s=0.05, flush_s=0.05, cancel_wait_s=0.5))
        model.policy = type(model.policy)(max_retries=2, timeout_s=20, attempt_timeout_s=5, backoff_base_s=0.05)
        model.bind_task(str(run_dir), "task-0", emit)

        async def one(i: int, prompt: str) -> str:
            current_sample.set(SampleTag(i))
            return await model.generate(GenRequest(prompt))

        try:
            return await asyncio.wait_for(asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)),
                                                         return_exceptions=True), 30)
        finally:
            await model.aclose()

    return asyncio.run(main()), seen


PROMPTS = [f"q{i}" for i in range(6)]


@pytest.mark.parametrize("hostile", ["poll_list", "bad_rows", "upload_no_id", "create_no_id",
                                     "create_no_id+list_garbage", "alien_ids"])
def test_a_hostile_control_answer_costs_a_retry_not_the_task(tmp_path: Path, hostile: str) -> None:
    server = HostileBatches(set(hostile.split("+")))
    try:
        answers, seen = _ask(server, tmp_path / "run", PROMPTS)
    finally:
        server.close()
    assert answers == [f"re:{p}" for p in PROMPTS], answers
    assert not server.hostile, "the hostile answer was sent"
    if hostile == "poll_list":
        assert server.calls["get"] >= 2 and server.calls["create"] == 1  # the poll was asked again
    elif hostile == "bad_rows":
        assert server.calls["create"] == 2  # q3 alone went into a second batch
    elif hostile == "alien_ids":
        assert server.calls["create"] == 2  # q4, whose row was missing, alone went into a second batch
        assert not [p for p in (tmp_path / "run").rglob("*") if "other" in p.name or "x" * 100 in p.name]
    else:
        assert server.calls["create"] == 1 + hostile.startswith("create_no_id")
    if "list_garbage" in hostile:  # the failed create was looked up by its metadata (not found)
        assert server.calls["list"] >= 1


def test_rows_that_stay_hostile_fail_alone_with_one_line(tmp_path: Path) -> None:
    """A provider that never gives q3 a readable row: q3 fails after max_retries batches, with one
    line; the other prompts are answered."""

    class Stubborn(HostileBatches):
        def _once(self, what: str) -> bool:
            return what == "bad_rows" or super()._once(what)

    server = Stubborn(set())
    try:
        answers, _ = _ask(server, tmp_path / "run", PROMPTS)
    finally:
        server.close()
    bad = answers[3]
    assert isinstance(bad, ModelError) and "gave up after 3 batches" in str(bad) and "\n" not in str(bad), bad
    assert [a for i, a in enumerate(answers) if i != 3] == [f"re:{p}" for i, p in enumerate(PROMPTS) if i != 3]


def test_anthropic_result_lines_that_are_not_results_answer_nothing(tmp_path: Path) -> None:
    """Message Batches results: lines that are not objects (or not JSON, or nested deeper than
    Python parses) are skipped, a ``result`` that is not an
    object is a row to send again, an ``error`` that is not one a final failure; never a crash of
    the batcher."""
    import aiohttp

    from orchestra.limits.retry import RetryPolicy
    from orchestra.models.batch.anthropic import AnthropicBatches
    from orchestra.models.batch.transport import BatchTransport

    server = HostileBatches(set())

    async def rows() -> dict[str, tuple[str, Any]]:
        async with aiohttp.ClientSession() as session:
            http = AnthropicBatches(BatchTransport(server.base_url, lambda: session, lambda: (None, None),
                                                   RetryPolicy(max_retries=0), lambda status, why: why,
                                                   "test-anthropic-rows"))
            return await http.rows({"id": "msgbatch_1"})

    try:
        out = asyncio.run(rows())
    finally:
        server.close()
    assert set(out) == {"a", "b", "c", "d"}
    assert out["a"][0] == out["c"][0] == "retry"
    assert out["b"][0] == "fail"  # errored, and of no type worth another batch
    assert out["d"] == ("ok", {"content": []})


def test_a_batch_that_can_never_be_polled_is_given_up_and_cancelled(tmp_path: Path) -> None:
    """Every poll of the first batch fails (after its own retries): after ``max_retries`` failed
    polls in a row the batch is given up and cancelled; the rows its cancel answer shows done
    are kept (here all of them; rows it did not do go into a later batch:
    test_batch_edges.py::test_a_batch_abandoned_after_failed_polls_is_cancelled_before_its_rows_go_again)."""
    server = HostileBatches({"poll_500"})
    try:
        answers, seen = _ask(server, tmp_path / "run", PROMPTS)
    finally:
        server.close()
    assert answers == [f"re:{p}" for p in PROMPTS], answers
    assert seen.count("batch_poll_failed") == 3  # max_retries=2: the third gives up
    assert server.calls["cancel"] == 1 and server.calls["create"] == 1


def test_an_anthropic_poll_answer_without_its_id_is_read_by_the_id_asked_for(tmp_path: Path) -> None:
    """Message Batches: a poll answered without ``id`` (status ``ended``) must not stop batch mode:
    the results are read by the id that was asked for."""
    from orchestra.models.anthropic_api import AnthropicAPI

    server = HostileBatches({"anthropic_poll_no_id"})
    try:
        answers, _ = _ask(server, tmp_path / "run", PROMPTS, AnthropicAPI)
    finally:
        server.close()
    assert answers == [f"re:{p}" for p in PROMPTS], answers
    assert not server.hostile and server.calls["create"] == 1


def test_a_key_the_provider_echoes_in_batch_rows_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider whose output file repeats the key it was fetched with, in an answer and in a failed row's
    message: the answer, the row's error and every event field hold ``***`` instead (before: the failed
    row's ModelError, which goes to the task log and the summary, held the key)."""
    key = "sk-batch-echo-3c9e1f0a7b"
    monkeypatch.setenv("ORC_BATCH_ECHO_KEY", key)
    server = HostileBatches({"echo_key"})
    fields: list[dict[str, Any]] = []
    try:
        answers, _ = _ask(server, tmp_path / "run", PROMPTS, key_env="ORC_BATCH_ECHO_KEY", fields=fields)
    finally:
        server.close()
    assert answers[1] == "re:q1Bearer ***"
    assert isinstance(answers[2], ModelError) and "bad request from Bearer ***" in str(answers[2])
    assert all(key not in str(a) for a in answers) and key not in json.dumps(fields, default=str)
    assert [p for p in (tmp_path / "run").rglob("*") if p.is_file() and key.encode() in p.read_bytes()] == []


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_batch_list_that_never_ends_is_read_a_bounded_number_of_pages(tmp_path: Path, provider: str) -> None:
    """A create whose answer is lost is looked up on the provider's batch list; a list that pages
    on forever (other clients' batches, ``has_more`` always true, created in the far future, the
    cursor ignored) is read at most ``MAX_LIST_PAGES`` pages: the batch counts as not created and
    its rows go into a later batch (before: the lookup paged forever and no prompt was answered)."""
    from orchestra.models.anthropic_api import AnthropicAPI
    from orchestra.models.batch.provider import MAX_LIST_PAGES

    server = HostileBatches({"create_no_id", "list_endless"})
    try:
        answers, _ = _ask(server, tmp_path / "run", PROMPTS, AnthropicAPI if provider == "anthropic" else OpenAIAPI)
    finally:
        server.close()
    assert answers == [f"re:{p}" for p in PROMPTS], answers
    assert server.calls["create"] == 2
    assert 1 <= server.calls["list"] <= MAX_LIST_PAGES
