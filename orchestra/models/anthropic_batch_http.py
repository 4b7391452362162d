"""Anthropic's Message Batches calls, behind the interface the batcher uses (:class:`BatchHTTP`).

A batch is created in one call with its requests inline (``{"requests": [{custom_id, params}]}``,
at most 100,000 requests and 256 MB); its ``processing_status`` goes ``in_progress`` ->
``canceling`` -> ``ended``; its results (JSONL, any order) say per ``custom_id`` ``succeeded``,
``errored`` (with the error's type), ``canceled`` or ``expired``.  Message batches carry no
metadata, so a batch whose create call was answered after the process died cannot be found
again by :meth:`find` (its requests are sent once more; docs/api.md says so).
"""

from __future__ import annotations

import json
from typing import Any

from orchestra.models.openai_batch_http import BatchHTTP

#: error types of a result worth another batch (as a 429 or 5xx would be for a direct call)
RETRY_ERRORS = frozenset({"api_error", "overloaded_error", "rate_limit_error", "timeout_error"})
_STATUS = {"in_progress": "in_progress", "canceling": "cancelling", "ended": "ended"}


class AnthropicBatchHTTP(BatchHTTP):
    """Message Batches calls; statuses come back in the batcher's words (``status``)."""

    @staticmethod
    def line(cid: str, path: str, body: dict[str, Any]) -> bytes:
        return (json.dumps({"custom_id": cid, "params": body}, ensure_ascii=False) + "\n").encode("utf-8")

    async def prepare(self, key: str, content: bytes) -> str:
        return ""  # the requests travel inside the create call

    async def create_batch(self, handle: str, path: str, content: bytes, meta: dict[str, str]) -> dict[str, Any]:
        requests = [json.loads(line) for line in content.splitlines() if line.strip()]
        return self._normal(await self.call("POST", "/messages/batches", {"requests": requests}, retries=False))

    async def get(self, batch_id: str) -> dict[str, Any]:
        obj = await self.call("GET", f"/messages/batches/{batch_id}")
        return self._normal({**obj, "id": batch_id})  # its results are read by the id asked for

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return self._normal(await self.call("POST", f"/messages/batches/{batch_id}/cancel", retries=False))

    @staticmethod
    def _normal(obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "status": _STATUS.get(str(obj.get("processing_status")), str(obj.get("processing_status")))}

    async def rows(self, obj: dict[str, Any]) -> dict[str, tuple[str, Any]]:
        raw: bytes = await self.call("GET", f"/messages/batches/{obj['id']}/results", raw=True)
        out: dict[str, tuple[str, Any]] = {}
        for line in raw.splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict):
                continue  # answers no request: its rows go into a later batch
            result = row.get("result")
            result = result if isinstance(result, dict) else {}
            kind = result.get("type")
            if kind == "succeeded" and isinstance(result.get("message"), dict):
                out[str(row.get("custom_id"))] = ("ok", result["message"])
            elif kind == "errored":
                outer = result.get("error")
                err = outer.get("error") if isinstance(outer, dict) else None
                err = err if isinstance(err, dict) else {}
                text = f"{err.get('type')}: {err.get('message')}"
                out[str(row.get("custom_id"))] = ("retry" if err.get("type") in RETRY_ERRORS else "fail", text)
            else:  # canceled, expired
                out[str(row.get("custom_id"))] = ("retry", f"batch_{kind}: the batch ended before this request ran")
        return out

    @staticmethod
    def reason(obj: dict[str, Any]) -> str:
        return f"message batch {obj.get('id')} ended without a result for this request"

    @staticmethod
    def errors(obj: dict[str, Any]) -> list[dict[str, Any]]:
        return []

    async def find(self, keys: set[str], since: float) -> dict[str, dict[str, Any]]:
        return {}  # message batches have no metadata to find them by
