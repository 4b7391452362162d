"""What a batch row is, for any provider: the ``batch`` option, stable ``custom_id`` values, and
what one result row means (an answer, a failure worth another batch, or a final failure).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from typing import Any

from orchestra.errors import check_known_keys
from orchestra.fileio import stable_hash
from orchestra.models.base import current_sample

#: row statuses worth another batch (as for direct calls: rate limits, server errors)
RETRY_STATUSES = frozenset({408, 409, 425, 429})


@dataclass(frozen=True)
class BatchOptions:
    """The ``batch`` option of an API model.

    Args:
        size: most requests in one batch (the provider's limit is 50,000).
        max_bytes: most bytes of one batch's input file (the provider's limit is 200 MB).
        poll_s: seconds between two status checks of a batch.
        flush_s: how long requests gather before a batch smaller than ``size`` is sent.
        max_requests_in_flight: requests in batches (or waiting for one) at once.
        cancel_wait_s: on Ctrl-C, how long cancelled batches are watched for ``cancelled``.
        window_s: how long a batch is waited for, from its creation, before it is cancelled
            and its rows go into a later batch (the provider's own window is 24 h; 25 h leaves
            it an hour to finish and report).
    """

    size: int = 50_000
    max_bytes: int = 190 * 1024 * 1024
    poll_s: float = 30.0
    flush_s: float = 2.0
    max_requests_in_flight: int = 100_000
    cancel_wait_s: float = 2.0
    window_s: float = 25 * 3600.0

    @classmethod
    def parse(cls, value: Any) -> BatchOptions | None:
        """``False``/``None``: no batch mode; ``True``: defaults; a dict: these settings."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        valid = [f.name for f in fields(cls)]
        if not isinstance(value, dict):
            raise ValueError(f"batch must be True, False or a dict with keys {', '.join(valid)}; got {value!r}")
        check_known_keys(sorted(value), valid, "batch", error=ValueError)
        opts = cls(**value)
        limits = {"size": (1, 50_000), "max_bytes": (1, 200 * 1024 * 1024), "max_requests_in_flight": (1, None)}
        for name, (low, high) in limits.items():
            v = getattr(opts, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low or (high is not None and v > high):
                raise ValueError(f"batch.{name} must be an integer in [{low}, {high or 'inf'}], got {v!r}")
        for name in ("poll_s", "flush_s", "cancel_wait_s"):
            v = getattr(opts, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (name == "poll_s" and v == 0):
                raise ValueError(f"batch.{name} must be a number of seconds > 0, got {v!r}")
        w = opts.window_s  # a batch that never ends must end the wait: a finite window
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not 0 < w < math.inf:
            raise ValueError(f"batch.window_s must be a number of seconds > 0 (finite), got {w!r}")
        return opts


def custom_id(path: str, body: dict[str, Any]) -> str:
    """A stable ``custom_id``: the request's hash, its sample and its number among the sample's
    identical calls, so that a resumed run finds the row an earlier run already paid for."""
    digest = stable_hash({"url": path, "body": body}, 20)
    tag = current_sample.get()
    if tag is None:
        return f"o{digest}"
    n = tag.seen.get(digest, 0)
    tag.seen[digest] = n + 1
    return f"o{digest}-s{tag.id}-{n}"


def message(body: Any) -> str:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return json.dumps(body)[:300]


def errors_of(obj: dict[str, Any]) -> list[dict[str, Any]]:
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
