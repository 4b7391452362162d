"""OpenAI's Files + Batches API, as the batcher asks for it (:class:`~.provider.BatchProvider`).

A batch's requests are uploaded as a JSONL file (``purpose=batch``, a name ending ``.jsonl``,
one ``{custom_id, method, url, body}`` row a line), then the batch is created on that file with
the run, the task and its ledger key in its metadata (:meth:`OpenAIBatches.find` looks for that
key when a create answer was lost).  A finished batch names an output file and an error file;
each row of either is an answer, a failure worth another batch, or a final failure
(:func:`row_outcome`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from orchestra.errors import ModelError
from orchestra.fileio import json_lines
from orchestra.models.batch.ledger import BatchRecord
from orchestra.models.batch.provider import MAX_LIST_PAGES
from orchestra.models.batch.rows import keep
from orchestra.models.batch.transport import BatchTransport

#: row statuses worth another batch (as for direct calls: rate limits, server errors)
RETRY_STATUSES = frozenset({408, 409, 425, 429})


def message(body: Any) -> str:
    """A failed row's error message (its ``error.message``, or the start of its body)."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return json.dumps(body)[:300]


def errors_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The errors a batch object lists (``errors.data``; validation, token limit)."""
    errors = obj.get("errors")
    data = errors.get("data") if isinstance(errors, dict) else None
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def batch_reason(obj: dict[str, Any]) -> str:
    """Why a batch's rows got no answer: its errors (validation, token limit) or its status."""
    errors = errors_of(obj)
    if errors:
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors[:3])
    return f"batch {obj.get('id')} ended {obj.get('status')} without an answer for this request"


def row_outcome(row: Any, reason: str) -> tuple[str, Any]:
    """What one result row of OpenAI's output or error file means: ``("ok", body)``, ``("retry",
    text)`` (429 and other passing statuses, 5xx, an expired or cancelled batch; ``reason`` when
    the batch left no row, as a failed batch does) or ``("fail", text)`` (any other status)."""
    if not isinstance(row, dict):
        return "retry", reason
    resp = row.get("response")
    if not isinstance(resp, dict):  # null for a failed row; anything else is not an answer either
        resp = {}
    status = resp.get("status_code")
    if status == 200 and isinstance(resp.get("body"), dict):
        return "ok", resp["body"]
    if isinstance(status, int) and not isinstance(status, bool) and status:
        text = f"HTTP {status}: {message(resp.get('body'))}"
        return ("retry" if status >= 500 or status in RETRY_STATUSES else "fail"), text
    err = row.get("error")
    return "retry", (f"{err.get('code')}: {err.get('message')}" if isinstance(err, dict) and err else reason)


class OpenAIBatches:
    """OpenAI's Files + Batches calls, over ``transport``."""

    #: every status the provider documents (another one is an event and a warning)
    statuses = frozenset({"validating", "in_progress", "finalizing", "completed", "expired", "cancelling",
                          "cancelled", "failed"})

    def __init__(self, transport: BatchTransport) -> None:
        self.transport = transport

    @staticmethod
    def line(cid: str, path: str, body: dict[str, Any]) -> bytes:
        row = {"custom_id": cid, "method": "POST", "url": "/v1" + path, "body": body}
        return (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")

    async def prepare(self, key: str, content: bytes) -> str:
        file = await self.upload(f"orchestra-{key}.jsonl", content)
        fid = file.get("id")
        if not isinstance(fid, str) or not fid:
            raise ModelError(self.transport.explain(
                200, f"the file upload was answered without a file id: {str(file)[:200]}"))
        return fid

    async def create_batch(self, handle: str, path: str, content: bytes, meta: dict[str, str]) -> dict[str, Any]:
        return await self.create(handle, "/v1" + path, "24h", meta)

    async def rows(self, obj: dict[str, Any]) -> dict[str, tuple[str, Any]]:
        """Each row of a finished batch by ``custom_id``: ``(kind, value)`` of
        :func:`row_outcome` (output rows win over error rows; an answer over any other line
        for its row, see :func:`.rows.keep`)."""
        rows: dict[str, tuple[str, Any]] = {}
        reason = self.reason(obj)
        for fid in (obj.get("error_file_id"), obj.get("output_file_id")):
            if fid:
                for row in json_lines(await self.content(str(fid))):
                    if isinstance(row, dict):  # any other line answers no request: its rows go again
                        keep(rows, str(row.get("custom_id")), row_outcome(row, reason))
        return rows

    @staticmethod
    def reason(obj: dict[str, Any]) -> str:
        return batch_reason(obj)

    @staticmethod
    def errors(obj: dict[str, Any]) -> list[dict[str, Any]]:
        return errors_of(obj)

    # -- the endpoints -----------------------------------------------------------------------------
    async def upload(self, name: str, content: bytes) -> dict[str, Any]:
        """Upload a batch input file (multipart, ``purpose=batch``); the File object."""
        boundary = uuid.uuid4().hex
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                f"Content-Type: application/jsonl\r\n\r\n").encode()
        data = head + content + f"\r\n--{boundary}--\r\n".encode()
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        out: dict[str, Any] = await self.transport.call("POST", "/files", data=data, headers=headers)
        return out

    async def create(self, file_id: str, endpoint: str, window: str, metadata: dict[str, str]) -> dict[str, Any]:
        """Create a batch; one attempt (a retried create could start the batch twice)."""
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window, "metadata": metadata}
        out: dict[str, Any] = await self.transport.call("POST", "/batches", body, retries=False)
        return out

    async def get(self, batch_id: str) -> dict[str, Any]:
        out: dict[str, Any] = await self.transport.call("GET", f"/batches/{batch_id}")
        return out

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        out: dict[str, Any] = await self.transport.call("POST", f"/batches/{batch_id}/cancel", retries=False)
        return out

    async def content(self, file_id: str) -> bytes:
        """A file's content (a batch's output or error file), read up to the transport's ``file_limit``."""
        out: bytes = await self.transport.call("GET", f"/files/{file_id}/content", raw=True)
        return out

    async def find(self, wanted: list[BatchRecord], taken: set[str]) -> dict[str, dict[str, Any]]:
        """The batches of ``wanted`` (ledger records whose create answer was lost) by their key:
        those whose metadata ``orchestra_key`` is a wanted key, listing newest first and stopping
        at batches created an hour before the oldest record (``taken`` is not needed: the key
        is unique)."""
        keys = {r.key for r in wanted}
        since = min((r.ts for r in wanted), default=0.0) - 3600
        found: dict[str, dict[str, Any]] = {}
        after = ""
        for _ in range(MAX_LIST_PAGES):
            if not keys - set(found):
                break
            page = await self.transport.call("GET", "/batches?limit=100" + (f"&after={after}" if after else ""))
            data = page.get("data")
            data = [b for b in data if isinstance(b, dict)] if isinstance(data, list) else []
            for batch in data:
                meta = batch.get("metadata")
                key = meta.get("orchestra_key") if isinstance(meta, dict) else None
                if key in keys and batch.get("id"):
                    found[key] = batch
            created = data[-1].get("created_at") if data else None
            if (not page.get("has_more") or not data or not data[-1].get("id")
                    or not isinstance(created, (int, float)) or created < since):
                break
            after = str(data[-1]["id"])
        return found
