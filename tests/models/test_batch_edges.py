"""Batch mode at its edges, through the model's public entry (``bind_task`` + ``generate``) against
a real aiohttp server on 127.0.0.1 (``HostileBatches`` of test_batch_hostile.py, made more hostile):
an output file that is never readable, lines that are not JSON or nested too deep, a status that
never ends or is not one the provider documents, and a ledger line a hand edit spoiled.

Each must end (never poll or download forever), cost at most the rows it touches, and say what
happened in one line.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from orchestra.errors import ModelError
from orchestra.models.base import SampleTag, current_sample
from orchestra.models.openai_api import OpenAIAPI
from orchestra.requests import GenRequest

_spec = importlib.util.spec_from_file_location("orchestra_test_batch_hostile",
                                               os.path.join(os.path.dirname(__file__), "test_batch_hostile.py"))
assert _spec is not None and _spec.loader is not None
hostile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hostile)

PROMPTS = [f"q{i}" for i in range(6)]


class Edges(hostile.HostileBatches):  # type: ignore[name-defined,misc]
    """``out_404``: the output file of ``batch-0`` (``all``: of every batch) answers 404;
    ``bad_lines``: every download of ``batch-0``'s output has q3's line cut (``cut``: not JSON)
    and/or q4's nested deeper than Python parses (``deep``); ``status``: the status ``batch-0``
    (``all``: every batch) shows forever.  Counts downloads per file and cancels per batch."""

    def __init__(self, out_404: str = "", bad_lines: frozenset[str] = frozenset(), status: str = "",
                 which: str = "batch-0",
                 poll_500: bool = False) -> None:
        self.out_404, self.bad_lines, self.status, self.which = out_404, bad_lines, status, which
        self.downloads: dict[str, int] = {}
        self.cancels: list[str] = []
        self.order: list[str] = []  # "create batch-N" / "cancel batch-N", in order
        super().__init__({"poll_500"} if poll_500 else set())

    def _hit(self, bid: str, what: str) -> bool:
        return bool(what) and (self.which == "all" or bid == self.which)

    async def create(self, request: web.Request) -> web.Response:
        resp: web.Response = await super().create(request)
        self.order.append(f"create batch-{len(self.batches) - 1}")
        return resp

    async def get(self, request: web.Request) -> web.Response:
        bid = request.match_info["bid"]
        if self._hit(bid, self.status) and bid in self.batches and "poll_500" not in self.hostile:
            self._count("get")
            return web.json_response({**self.batches[bid], "status": self.status, "output_file_id": None})
        resp: web.Response = await super().get(request)
        return resp

    async def cancel(self, request: web.Request) -> web.Response:
        bid = request.match_info["bid"]
        self.cancels.append(bid)
        self.order.append(f"cancel {bid}")
        self.status = self.status if self.which == "all" else ""  # cancelled: it shows its real status again
        if bid == "batch-0":
            self.hostile.discard("poll_500")
        return web.json_response({**self.batches[bid], "status": "cancelled", "output_file_id": None})

    async def content(self, request: web.Request) -> web.Response:
        fid = request.match_info["fid"]
        bid = fid[len("out-"):]
        self.downloads[fid] = self.downloads.get(fid, 0) + 1
        if self._hit(bid, self.out_404):
            self._count("content")
            return web.json_response({"error": {"message": "No such File object: " + fid, "type":
                                                "invalid_request_error", "code": "file_not_found"}}, status=404)
        resp: web.Response = await super().content(request)
        if self.bad_lines and bid == "batch-0":
            lines = []
            for raw in resp.body.splitlines():  # type: ignore[union-attr]
                if b'"re:q3"' in raw and "cut" in self.bad_lines:
                    raw = raw[:-5] + b" not json"
                elif b'"re:q4"' in raw and "deep" in self.bad_lines:
                    raw = b"[" * 100_000 + b"]" * 100_000
                lines.append(raw)
            return web.Response(body=b"\n".join(lines) + b"\n", content_type="application/octet-stream")
        return resp


def _ask(server: Any, run_dir: Path, prompts: list[str], batch: dict[str, Any] | None = None,
         fields: list[tuple[str, dict[str, Any]]] | None = None, wait_s: float = 30.0) -> list[Any]:
    """Every prompt through one batch-mode model bound to ``run_dir``: answers or errors (events
    and their fields go to ``fields``)."""

    def emit(event: str, **more: Any) -> None:
        if fields is not None:
            fields.append((event, more))

    async def main() -> list[Any]:
        model = OpenAIAPI(abbr="m", path="test-model", base_url=server.base_url, max_retries=2,
                          batch=dict(size=50, poll_s=0.05, flush_s=0.05, cancel_wait_s=0.5, **(batch or {})))
        model.policy = type(model.policy)(max_retries=2, timeout_s=20, attempt_timeout_s=5, backoff_base_s=0.05)
        model.bind_task(str(run_dir), "task-0", emit)

        async def one(i: int, prompt: str) -> str:
            current_sample.set(SampleTag(i))
            return await model.generate(GenRequest(prompt))

        try:
            return await asyncio.wait_for(asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)),
                                                         return_exceptions=True), wait_s)
        finally:
            await model.aclose()

    return asyncio.run(main())


# -- an output file that cannot be read ---------------------------------------------------------
def test_an_output_file_that_is_never_readable_is_given_up_after_max_retries(tmp_path: Path) -> None:
    """The first batch completes, but its output file answers 404 every time: it is downloaded
    ``max_retries + 1`` times (max_retries=2), then given up, its rows sent again in one later batch,
    which answers.  Before: each successful poll reset the count, and the task downloaded the file
    every poll, forever."""
    server = Edges(out_404="yes")
    events: list[tuple[str, dict[str, Any]]] = []
    try:
        answers = _ask(server, tmp_path / "run", PROMPTS, fields=events, wait_s=20)
    finally:
        server.close()
    assert answers == [f"re:{p}" for p in PROMPTS], answers
    assert server.downloads["out-batch-0"] == 3 and server.calls["create"] == 2
    assert [e for e, _ in events].count("batch_read_failed") == 3


def test_output_files_that_are_never_readable_fail_each_sample_with_one_line(tmp_path: Path) -> None:
    """Every batch's output answers 404: each sample fails after ``max_retries`` batches, with one
    line naming the file's failure; every file was downloaded a bounded number of times."""
    server = Edges(out_404="yes", which="all")
    try:
        answers = _ask(server, tmp_path / "run", PROMPTS, wait_s=20)
    finally:
        server.close()
    for a in answers:
        assert isinstance(a, ModelError) and "\n" not in str(a), a
        assert "gave up after 3 batches" in str(a) and "could not be read" in str(a) and "404" in str(a), a
    assert server.calls["create"] == 3 and set(server.downloads.values()) == {3}, server.downloads


@pytest.mark.parametrize("bad", ["cut", "deep", "cut+deep"])
def test_lines_not_json_or_nested_too_deep_send_only_their_own_requests_again(tmp_path: Path, bad: str) -> None:
    """Every download of the first output file has q3's line cut (not JSON) and/or q4's line
    nested deeper than Python parses: the good rows are kept from one download, and only the
    spoiled lines' requests go into a second batch.  Before: a cut line failed the whole file
    every poll (136 downloads in 10 s, forever), and a deep line stopped batch mode with
    ``RecursionError`` for every request of the task."""
    server = Edges(bad_lines=frozenset(bad.split("+")))
    try:
        answers = _ask(server, tmp_path / "run", PROMPTS, wait_s=20)
    finally:
        server.close()
    assert answers == [f"re:{p}" for p in PROMPTS], answers
    assert server.downloads == {"out-batch-0": 1, "out-batch-1": 1}
    second = [json.loads(line)["body"]["messages"][-1]["content"] for line in server.files["file-1"].splitlines()]
    assert sorted(second) == [{"cut": "q3", "deep": "q4"}[b] for b in sorted(bad.split("+"))]


# -- statuses that never end ----------------------------------------------------------------------
def test_an_unknown_status_is_an_event_and_a_warning_and_the_window_ends_the_wait(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``batch-0`` shows ``done`` (not a documented status) forever: one ``batch_status_unknown``
    event and one warning on stderr; once ``window_s`` passed, the batch is cancelled and then
    its rows go into a later batch, which answers."""
    server = Edges(status="done")
    events: list[tuple[str, dict[str, Any]]] = []
    try:
        answers = _ask(server, tmp_path / "run", PROMPTS, batch=dict(window_s=0.5), fields=events, wait_s=20)
    finally:
        server.close()
    assert answers == [f"re:{p}" for p in PROMPTS], answers
    unknown = [f for e, f in events if e == "batch_status_unknown"]
    assert len(unknown) == 1 and unknown[0]["status"] == "done" and unknown[0]["batch_id"] == "batch-0"
    warned = [line for line in capsys.readouterr().err.splitlines() if "batch-0" in line]
    assert len(warned) == 1 and "'done'" in warned[0], warned
    assert server.order == ["create batch-0", "cancel batch-0", "create batch-1"]
    over = [f for e, f in events if e == "batch_window_over"]
    assert [f["batch_id"] for f in over] == ["batch-0"]
    ledger = [json.loads(line) for line in (tmp_path / "run" / "batches" / "m.jsonl").read_text().splitlines()]
    assert [ln["state"] for ln in ledger if ln.get("batch_id") == "batch-0"][:2] == ["created", "cancel_sent"]


def test_batches_in_progress_forever_end_with_one_line_each_cancelled(tmp_path: Path) -> None:
    """Every batch stays ``in_progress``: each is cancelled when its window ends, its rows go into
    a later batch, and after ``max_retries`` of them each sample fails with one line."""
    server = Edges(status="in_progress", which="all")
    try:
        answers = _ask(server, tmp_path / "run", PROMPTS, batch=dict(window_s=0.3), wait_s=20)
    finally:
        server.close()
    for a in answers:
        assert isinstance(a, ModelError) and "\n" not in str(a), a
        assert "gave up after 3 batches" in str(a) and "did not end within 0.3 s" in str(a), a
    assert sorted(server.cancels) == ["batch-0", "batch-1", "batch-2"]
    assert server.order.index("cancel batch-0") < server.order.index("create batch-1")


def test_a_batch_abandoned_after_failed_polls_is_cancelled_before_its_rows_go_again(tmp_path: Path) -> None:
    """Every poll of ``batch-0`` fails: it is given up after ``max_retries`` failed polls, and
    cancelled (it may still run, and be paid for) before its rows go into ``batch-1``."""
    server = Edges(poll_500=True)
    try:
        answers = _ask(server, tmp_path / "run", PROMPTS, wait_s=20)
    finally:
        server.close()
    assert answers == [f"re:{p}" for p in PROMPTS], answers
    assert server.order == ["create batch-0", "cancel batch-0", "create batch-1"]


def test_window_s_is_validated_in_one_line() -> None:
    for bad in (0, -1, "1", float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match=r"^batch\.window_s must be a number of seconds > 0 .*got") as err:
            OpenAIAPI(abbr="m", path="p", base_url="http://127.0.0.1:9/v1", batch=dict(window_s=bad))
        assert "\n" not in str(err.value)


# -- a spoiled ledger ---------------------------------------------------------------------------------
def test_a_spoiled_ledger_line_names_the_file_the_line_and_what_to_do(tmp_path: Path) -> None:
    """A hand edit left ``"ts": "yesterday"`` on line 2 of the ledger: every request fails with one
    line naming the file, the line and what to do, and nothing is sent.  Before: a bare
    ``ValueError: could not convert string to float: 'yesterday'``."""
    ledger = tmp_path / "run" / "batches" / "m.jsonl"
    ledger.parent.mkdir(parents=True)
    ledger.write_text(json.dumps({"ts": 1.0, "state": "submitting", "key": "k1", "custom_ids": ["x"]}) + "\n"
                      + json.dumps({"ts": "yesterday", "state": "created", "key": "k1", "batch_id": "b"}) + "\n")
    server = Edges()
    try:
        answers = _ask(server, tmp_path / "run", PROMPTS, wait_s=20)
    finally:
        server.close()
    for a in answers:
        assert isinstance(a, ModelError) and "\n" not in str(a), a
        assert f"{ledger}, line 2" in str(a) and "'yesterday'" in str(a) and "ts" in str(a), a
        assert "fix or delete that line" in str(a), a
    assert server.calls.get("create", 0) == 0 and server.calls.get("upload", 0) == 0


def test_a_ledger_ts_too_large_for_a_float_is_the_same_one_line(tmp_path: Path) -> None:
    """A hand edit left ``"ts": 1000...0`` (400 digits, JSON's integer, which no float holds) on
    line 2: the same one line naming the file, the line and what to do.  Before: a bare
    ``OverflowError: int too large to convert to float`` from the finite check itself."""
    ledger = tmp_path / "run" / "batches" / "m.jsonl"
    ledger.parent.mkdir(parents=True)
    ledger.write_text(json.dumps({"ts": 1.0, "state": "submitting", "key": "k1", "custom_ids": ["x"]}) + "\n"
                      + json.dumps({"ts": 10**400, "state": "created", "key": "k1", "batch_id": "b"}) + "\n")
    server = Edges()
    try:
        answers = _ask(server, tmp_path / "run", PROMPTS, wait_s=20)
    finally:
        server.close()
    for a in answers:
        assert isinstance(a, ModelError) and "\n" not in str(a), a
        assert f"{ledger}, line 2" in str(a) and "'ts' must be a number" in str(a), a
        assert "fix or delete that line" in str(a), a
    assert server.calls.get("create", 0) == 0 and server.calls.get("upload", 0) == 0
