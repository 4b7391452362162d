"""Anthropic's Message Batches API, as the batcher asks for it (:class:`~.provider.BatchProvider`).

A batch is created in one call with its requests inline (``{"requests": [{custom_id, params}]}``,
at most 100,000 requests and 256 MB); its ``processing_status`` goes ``in_progress`` ->
``canceling`` -> ``ended``; its results (JSONL, any order) say per ``custom_id`` ``succeeded``,
``errored`` (with the error's type), ``canceled`` or ``expired``.  Message batches carry no
metadata: a batch whose create answer was lost (a client timeout, a process that died) is found
again on the list by what it shows, :meth:`find`.
"""

from __future__ import annotations

import datetime
import json
from collections import Counter
from typing import Any

from orchestra.fileio import json_lines
from orchestra.models.batch.ledger import BatchRecord
from orchestra.models.batch.provider import MAX_LIST_PAGES
from orchestra.models.batch.rows import keep
from orchestra.models.batch.transport import BatchTransport

#: error types of a result worth another batch (as a 429 or 5xx would be for a direct call)
RETRY_ERRORS = frozenset({"api_error", "overloaded_error", "rate_limit_error", "timeout_error"})
_STATUS = {"in_progress": "in_progress", "canceling": "cancelling", "ended": "ended"}
#: how far the provider's clock may be from ours, in seconds, when a batch's creation time is matched
CLOCK_SKEW_S = 60.0


def _epoch(value: Any) -> float | None:
    """An RFC 3339 time of the API (``2024-09-24T18:37:24.100435Z``) in seconds, or None."""
    try:
        t = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t.timestamp() if t.tzinfo is not None else None


def _size(batch: dict[str, Any]) -> int:
    """How many requests a message batch holds (the sum of its ``request_counts``)."""
    counts = batch.get("request_counts")
    if not isinstance(counts, dict):
        return -1
    return sum(v for v in counts.values() if isinstance(v, int) and not isinstance(v, bool))


class AnthropicBatches:
    """Message Batches calls over ``transport``; statuses come back in the batcher's words (``status``)."""

    statuses = frozenset(_STATUS.values())

    def __init__(self, transport: BatchTransport) -> None:
        self.transport = transport

    @staticmethod
    def line(cid: str, path: str, body: dict[str, Any]) -> bytes:
        return (json.dumps({"custom_id": cid, "params": body}, ensure_ascii=False) + "\n").encode("utf-8")

    async def prepare(self, key: str, content: bytes) -> str:
        return ""  # the requests travel inside the create call

    async def create_batch(self, handle: str, path: str, content: bytes, meta: dict[str, str]) -> dict[str, Any]:
        requests = [json.loads(line) for line in content.splitlines() if line.strip()]
        created = await self.transport.call("POST", "/messages/batches", {"requests": requests}, retries=False)
        return self._normal(created)

    async def get(self, batch_id: str) -> dict[str, Any]:
        obj = await self.transport.call("GET", f"/messages/batches/{batch_id}")
        return self._normal({**obj, "id": batch_id})  # its results are read by the id asked for

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return self._normal(await self.transport.call("POST", f"/messages/batches/{batch_id}/cancel", retries=False))

    @staticmethod
    def _normal(obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "status": _STATUS.get(str(obj.get("processing_status")), str(obj.get("processing_status")))}

    async def rows(self, obj: dict[str, Any]) -> dict[str, tuple[str, Any]]:
        raw: bytes = await self.transport.call("GET", f"/messages/batches/{obj['id']}/results", raw=True)
        out: dict[str, tuple[str, Any]] = {}
        for row in json_lines(raw):
            if not isinstance(row, dict):
                continue  # answers no request: its rows go into a later batch
            cid = str(row.get("custom_id"))
            result = row.get("result")
            result = result if isinstance(result, dict) else {}
            kind = result.get("type")
            if kind == "succeeded" and isinstance(result.get("message"), dict):
                keep(out, cid, ("ok", result["message"]))
            elif kind == "errored":
                outer = result.get("error")
                err = outer.get("error") if isinstance(outer, dict) else None
                err = err if isinstance(err, dict) else {}
                text = f"{err.get('type')}: {err.get('message')}"
                keep(out, cid, ("retry" if err.get("type") in RETRY_ERRORS else "fail", text))
            else:  # canceled, expired
                keep(out, cid, ("retry", f"batch_{kind}: the batch ended before this request ran"))
        return out

    @staticmethod
    def reason(obj: dict[str, Any]) -> str:
        return f"message batch {obj.get('id')} ended without a result for this request"

    @staticmethod
    def errors(obj: dict[str, Any]) -> list[dict[str, Any]]:
        return []

    async def find(self, wanted: list[BatchRecord], taken: set[str]) -> dict[str, dict[str, Any]]:
        """The batches of ``wanted`` (records whose create answer was lost) found on the list of
        message batches, which carry no metadata: by what a batch shows, as many requests as the
        record holds, created after the record was written (less :data:`CLOCK_SKEW_S`) and
        before its create call could have ended; never a batch another record holds (``taken``).
        Only a record with exactly one such batch is answered (two would be a guess: its
        requests are sent again, as before)."""
        if not wanted:
            return {}
        since = min(r.ts for r in wanted) - CLOCK_SKEW_S
        seen: list[tuple[float, int, dict[str, Any]]] = []
        after = ""
        for _ in range(MAX_LIST_PAGES):  # a list that pages on forever is read this far
            page = await self.transport.call("GET", "/messages/batches?limit=100"
                                             + (f"&after_id={after}" if after else ""))
            data = page.get("data")
            data = [b for b in data if isinstance(b, dict)] if isinstance(data, list) else []
            for batch in data:
                created = _epoch(batch.get("created_at"))
                if isinstance(batch.get("id"), str) and batch["id"] and batch["id"] not in taken and created:
                    seen.append((created, _size(batch), batch))
            oldest = _epoch(data[-1].get("created_at")) if data else None
            if not page.get("has_more") or not data or not isinstance(data[-1].get("id"), str) \
                    or oldest is None or oldest < since:
                break
            after = data[-1]["id"]
        longest = self.transport.policy.attempt_timeout_s + CLOCK_SKEW_S  # a create call is one attempt
        matches = {rec.key: [b for created, size, b in seen if size == len(rec.custom_ids)
                             and rec.ts - CLOCK_SKEW_S <= created <= rec.ts + longest] for rec in wanted}
        sole = Counter(m[0]["id"] for m in matches.values() if len(m) == 1)
        return {key: {**self._normal(m[0]), "found_by": "listing"} for key, m in matches.items()
                if len(m) == 1 and sole[m[0]["id"]] == 1}
