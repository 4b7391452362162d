"""Retry policy as data, and the one classifier that decides what an HTTP outcome means.

Every failed attempt is classified once, here: a 429 is a rate limit (retry, and tell the
adaptive rate), 408/409/425 and 5xx, connection errors and timeouts are transient (retry with
backoff), and every other 4xx is final (the sample fails with the server's message).
"""

from __future__ import annotations

import email.utils
import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

from orchestra.backoff import exponential_backoff

#: statuses worth another attempt besides 429 and 5xx
TRANSIENT_STATUSES = frozenset({408, 409, 425})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a request is retried.

    Args:
        max_retries: retries after errors (5xx, connection errors, timeouts).  429 answers do
            not count: the server asked us to wait, and ``timeout_s`` bounds how long we do.
        timeout_s: total time for one request, all attempts and waits included, counted
            from its first send (None: no limit).
        attempt_timeout_s: limit of one attempt.
        backoff_base_s: wait before the first retry (doubles each time, times a random factor
            in [0.5, 1]; :func:`orchestra.backoff.exponential_backoff`).
        backoff_max_s: the longest wait between two attempts (a longer ``Retry-After`` wins).
    """

    max_retries: int = 8
    timeout_s: float | None = 600.0
    attempt_timeout_s: float = 120.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.attempt_timeout_s <= 0:
            raise ValueError(f"attempt_timeout_s must be > 0, got {self.attempt_timeout_s}")

    def backoff_s(self, retry: int, retry_after_s: float | None = None, rate_limited: bool = False,
                  rng: random.Random | None = None) -> float:
        """The wait before retry number ``retry`` (1-based).

        Errors back off exponentially with jitter, never shorter than a ``Retry-After``.  A
        rate-limited request waits exactly what the server asked (plus up to 10% jitter, so
        that callers do not come back in lockstep): the adaptive rate, not this wait, is what
        keeps the whole stream under the limit.
        """
        r = rng or random
        if retry_after_s is not None and rate_limited:
            return retry_after_s * r.uniform(1.0, 1.1)
        delay = exponential_backoff(retry, self.backoff_base_s, self.backoff_max_s, rng, jitter=(0.5, 1.0))
        if retry_after_s is not None:
            delay = max(delay, retry_after_s * r.uniform(1.0, 1.1))
        return delay


@dataclass(frozen=True)
class RetryDecision:
    """What to do after one failed attempt."""

    retry: bool
    rate_limited: bool = False
    retry_after_s: float | None = None
    reason: str = ""

    @classmethod
    def no(cls, reason: str) -> RetryDecision:
        return cls(False, reason=reason)

    @classmethod
    def transient(cls, reason: str, retry_after_s: float | None = None) -> RetryDecision:
        return cls(True, reason=reason, retry_after_s=retry_after_s)

    @classmethod
    def rate_limit(cls, reason: str, retry_after_s: float | None = None) -> RetryDecision:
        return cls(True, rate_limited=True, reason=reason, retry_after_s=retry_after_s)


def parse_retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def server_message(body: bytes, limit: int = 500) -> str:
    """The error message an OpenAI-compatible server put in its answer (or the raw text)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:limit]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data.get("message")))
        if isinstance(err, dict):
            err = err.get("message") or json.dumps(err)
        if err:
            return str(err)[:limit]
    return text[:limit]


def classify_status(status: int, headers: Mapping[str, str], body: bytes) -> RetryDecision:
    """Classify a non-2xx HTTP answer."""
    message = server_message(body)
    reason = f"HTTP {status}: {message}" if message else f"HTTP {status}"
    if status == 429:
        return RetryDecision.rate_limit(reason, parse_retry_after(headers))
    if status >= 500 or status in TRANSIENT_STATUSES:
        return RetryDecision.transient(reason, parse_retry_after(headers))
    return RetryDecision.no(reason)


def classify_exception(exc: BaseException) -> RetryDecision:
    """Classify an exception raised while sending or reading (connection errors, timeouts)."""
    import asyncio

    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return RetryDecision.transient(f"timed out ({type(exc).__name__})")
    text = str(exc).strip()
    reason = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp is a requirement
        aiohttp = None  # type: ignore[assignment]
    if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
        return RetryDecision.transient(reason)
    if isinstance(exc, (ConnectionError, OSError)):
        return RetryDecision.transient(reason)
    return RetryDecision.no(reason)
