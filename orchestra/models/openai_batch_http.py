"""The HTTP calls of OpenAI's Files + Batches API, each through the one retry loop.

Upload a JSONL file (``purpose=batch``, a name ending ``.jsonl``), create, get, list and cancel
batches, and read a file's content.  Every call goes through
:func:`orchestra.limits.retry.send_with_retries` on the model's own HTTP session, with its own
counters (``calls``), so that these control calls never count as the model's requests.

What the provider sends back is read with a bound, as a model call's answer is
(:mod:`orchestra.models.http_body`): 64 MiB for the JSON of a control call, and
:data:`MAX_FILE_BYTES` for a batch's output file, which legitimately holds up to 50,000 answers.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Callable
from typing import Any

from orchestra.errors import ModelError
from orchestra.limits.concurrency import concurrency
from orchestra.limits.ratelimit import AdaptiveRate
from orchestra.limits.retry import (
    Outcome,
    RetryDecision,
    RetryPolicy,
    classify_exception,
    classify_status,
    send_with_retries,
)
from orchestra.models.base import ModelStats
from orchestra.models.batch_ledger import BatchRecord
from orchestra.models.batch_rows import batch_reason, errors_of, row_outcome
from orchestra.models.http_body import MAX_BODY_BYTES, read_capped

#: the largest batch output (or error) file read: 50,000 answers of ~20 KiB each
MAX_FILE_BYTES = 1 << 30
#: pages of the provider's batch list (100 batches each) read at most when a batch whose create
#: answer was lost is looked for: a list that pages on forever (``has_more`` always true, its
#: cursor ignored, creation times in the future) must not hold the batcher
MAX_LIST_PAGES = 20


def json_lines(blob: bytes) -> list[Any]:
    """The lines of a result file that parse; a line that is not JSON (or is nested deeper than
    Python parses) answers no request, so only the request whose row it was goes again."""
    out = []
    for line in blob.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except (ValueError, RecursionError):
                continue
    return out


class BatchHTTP:
    """Files + Batches calls against ``base_url``, sent with the session ``client()`` returns.

    Args:
        base_url: the API root (``.../v1``).
        client: the model's aiohttp session (its headers carry the key).
        proxy: ``(proxy, proxy_auth)`` the model found for the endpoint.
        policy: retries of one call.
        explain: turns a failure's reason into its error text (scrubs the key).
        scope_name: name of the concurrency scope of control calls.
    """

    def __init__(self, base_url: str, client: Callable[[], Any], proxy: Callable[[], tuple[Any, Any]],
                 policy: RetryPolicy, explain: Callable[[int, str], str], scope_name: str) -> None:
        self.base_url = base_url
        self._client = client
        self._proxy = proxy
        self.policy = policy
        self._explain = explain
        self.stats = ModelStats()  # control calls: stats.done is the number of calls answered
        self._slots = concurrency(scope_name + "|batch-control", 8)
        self._rate = AdaptiveRate(max_rate=None, ramp_requests=8)
        self.file_limit = MAX_FILE_BYTES  # bytes of a file's content (``raw`` calls) read at most

    #: every status the provider documents (another one is an event and a warning)
    statuses = frozenset({"validating", "in_progress", "finalizing", "completed", "expired", "cancelling",
                          "cancelled", "failed"})

    @property
    def calls(self) -> int:
        return self.stats.done + self.stats.retries + self.stats.rate_limited + self.stats.errors

    async def _attempt(self, method: str, path: str, data: bytes | None, headers: dict[str, str] | None,
                       raw: bool, budget_s: float) -> Outcome:
        import aiohttp

        session = self._client()
        proxy, auth = self._proxy()
        try:
            async with session.request(method, self.base_url + path, data=data, headers=headers,
                                              proxy=proxy, proxy_auth=auth,
                                              timeout=aiohttp.ClientTimeout(total=max(budget_s, 0.001))) as resp:
                limit = self.file_limit if raw else MAX_BODY_BYTES
                body = await read_capped(resp, limit)
                if body is None:
                    return Outcome(resp.status, None, RetryDecision.no(
                        f"HTTP {resp.status} with a response body over {limit >> 20} MiB (refused)"))
                if resp.status != 200:
                    return Outcome(resp.status, None, classify_status(resp.status, resp.headers, body))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return Outcome(0, None, classify_exception(exc))
        if raw:
            return Outcome(200, body)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, or nested deeper than Python parses
            return Outcome(200, None, RetryDecision.transient(f"HTTP 200 with a body that is not JSON: {body[:200]!r}"))
        if not isinstance(data, dict):  # every control call answers an object
            return Outcome(200, None, RetryDecision.transient(f"HTTP 200 with JSON that is not an object: "
                                                              f"{body[:200]!r}"))
        return Outcome(200, data)

    async def call(self, method: str, path: str, body: Any = None, *, data: bytes | None = None,
                   headers: dict[str, str] | None = None, raw: bool = False, retries: bool = True) -> Any:
        """One API call, retried as the policy says (``retries=False``: one attempt)."""
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            headers = {"Content-Type": "application/json"}
        policy = self.policy if retries else RetryPolicy(max_retries=0, timeout_s=self.policy.timeout_s,
                                                         attempt_timeout_s=self.policy.attempt_timeout_s)
        attempt = functools.partial(self._attempt, method, path, data, headers, raw)
        return await send_with_retries(attempt, policy, self._slots, self._rate, self.stats, self._explain)

    # -- what the batcher asks of a provider (AnthropicBatchHTTP answers the same) --------------
    @staticmethod
    def line(cid: str, path: str, body: dict[str, Any]) -> bytes:
        """One request as a line of the batch input (the provider's JSONL row)."""
        row = {"custom_id": cid, "method": "POST", "url": "/v1" + path, "body": body}
        return (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")

    async def prepare(self, key: str, content: bytes) -> str:
        """Make the batch's input available before it is recorded: the uploaded file's id."""
        file = await self.upload(f"orchestra-{key}.jsonl", content)
        fid = file.get("id")
        if not isinstance(fid, str) or not fid:
            raise ModelError(self._explain(200, f"the file upload was answered without a file id: {str(file)[:200]}"))
        return fid

    async def create_batch(self, handle: str, path: str, content: bytes, meta: dict[str, str]) -> dict[str, Any]:
        return await self.create(handle, "/v1" + path, "24h", meta)

    async def rows(self, obj: dict[str, Any]) -> dict[str, tuple[str, Any]]:
        """Each row of a finished batch by ``custom_id``: ``(kind, value)`` of
        :func:`~orchestra.models.batch_rows.row_outcome` (output rows win over error rows)."""
        rows: dict[str, dict[str, Any]] = {}
        for fid in (obj.get("error_file_id"), obj.get("output_file_id")):
            if fid:
                for row in json_lines(await self.content(str(fid))):
                    if isinstance(row, dict):  # any other line answers no request: its rows go again
                        rows[str(row.get("custom_id"))] = row
        reason = self.reason(obj)
        return {cid: row_outcome(row, reason) for cid, row in rows.items()}

    @staticmethod
    def reason(obj: dict[str, Any]) -> str:
        return batch_reason(obj)

    @staticmethod
    def errors(obj: dict[str, Any]) -> list[dict[str, Any]]:
        return errors_of(obj)

    # -- OpenAI's calls ----------------------------------------------------------------------------
    async def upload(self, name: str, content: bytes) -> dict[str, Any]:
        """Upload a batch input file (multipart, ``purpose=batch``); the File object."""
        boundary = uuid.uuid4().hex
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                f"Content-Type: application/jsonl\r\n\r\n").encode()
        data = head + content + f"\r\n--{boundary}--\r\n".encode()
        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        out: dict[str, Any] = await self.call("POST", "/files", data=data, headers=headers)
        return out

    async def create(self, file_id: str, endpoint: str, window: str, metadata: dict[str, str]) -> dict[str, Any]:
        """Create a batch; one attempt (a retried create could start the batch twice)."""
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window, "metadata": metadata}
        out: dict[str, Any] = await self.call("POST", "/batches", body, retries=False)
        return out

    async def get(self, batch_id: str) -> dict[str, Any]:
        out: dict[str, Any] = await self.call("GET", f"/batches/{batch_id}")
        return out

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        out: dict[str, Any] = await self.call("POST", f"/batches/{batch_id}/cancel", retries=False)
        return out

    async def content(self, file_id: str) -> bytes:
        out: bytes = await self.call("GET", f"/files/{file_id}/content", raw=True)
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
            page = await self.call("GET", "/batches?limit=100" + (f"&after={after}" if after else ""))
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
