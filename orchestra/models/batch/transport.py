"""The HTTP calls of batch mode (either provider's), each through the one retry loop.

Every control call (upload, create, get, list, cancel, a result file's content) goes through
:func:`orchestra.limits.retry.send_with_retries` on the model's own HTTP session, with its own
counters (``calls``), so that these calls never count as the model's requests; what each
provider sends where is :mod:`.openai` and :mod:`.anthropic`.

What the provider sends back is read with a bound, as a model call's answer is
(:mod:`orchestra.models.http_body`): 64 MiB for the JSON of a control call, and
:data:`MAX_FILE_BYTES` for a batch's result file, which legitimately holds up to 50,000 answers.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from typing import Any

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
from orchestra.models.http_body import MAX_BODY_BYTES, is_redirect, read_capped, redirect_reason

#: the largest batch output (or error) file read: 50,000 answers of ~20 KiB each
MAX_FILE_BYTES = 1 << 30


class BatchTransport:
    """Control calls against ``base_url``, sent with the session ``client()`` returns.

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
        self.explain = explain
        self.stats = ModelStats()  # control calls: stats.done is the number of calls answered
        self._slots = concurrency(scope_name + "|batch-control", 8)
        self._rate = AdaptiveRate(max_rate=None, ramp_requests=8)
        self.file_limit = MAX_FILE_BYTES  # bytes of a file's content (``raw`` calls) read at most

    @property
    def calls(self) -> int:
        """Control calls sent so far (answered, retried, rate-limited or failed)."""
        return self.stats.done + self.stats.retries + self.stats.rate_limited + self.stats.errors

    async def _attempt(self, method: str, path: str, data: bytes | None, headers: dict[str, str] | None,
                       raw: bool, budget_s: float) -> Outcome:
        import aiohttp

        session = self._client()
        proxy, auth = self._proxy()
        try:
            async with session.request(method, self.base_url + path, data=data, headers=headers,
                                       proxy=proxy, proxy_auth=auth, allow_redirects=False,
                                       timeout=aiohttp.ClientTimeout(total=max(budget_s, 0.001))) as resp:
                if is_redirect(resp.status):  # never followed: the key would go along
                    reason = redirect_reason(resp.status, resp.headers, self.base_url + path)
                    return Outcome(resp.status, None, RetryDecision.no(reason))
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
        return await send_with_retries(attempt, policy, self._slots, self._rate, self.stats, self.explain)
