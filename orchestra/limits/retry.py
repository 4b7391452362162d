"""Retry policy as data, the one classifier of HTTP outcomes, and the one retry loop.

Every failed attempt is classified once, here: a 429 is a rate limit (retry, and tell the
adaptive rate), 408/409/425 and 5xx, connection errors and timeouts are transient (retry with
backoff), and every other 4xx is final (the sample fails with the server's message).

:func:`send_with_retries` is the loop every HTTP model runs a request through: a model
supplies one attempt (send a body, classify what came back) and gets slots, pacing,
backoff, deadlines and counters from here.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from orchestra.backoff import exponential_backoff
from orchestra.errors import ModelError
from orchestra.limits.concurrency import Slots
from orchestra.limits.ratelimit import AdaptiveRate

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
        quick_retries: how many of a request's errors (a 5xx, a timeout, a dropped connection)
            without a ``Retry-After`` are retried at once, in the connection slot the failed
            attempt held (ahead of requests waiting for one), while the endpoint answers most
            requests (fewer than 10 answers yet, or at most a fifth of its last 50 were such
            errors: :meth:`AdaptiveRate.healthy`); the backoff starts after them, or at once on
            an endpoint that keeps failing.  A lone 500 among many successes then costs one
            more round trip, not a backoff after the last wave.
    """

    max_retries: int = 8
    timeout_s: float | None = 600.0
    attempt_timeout_s: float = 120.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    quick_retries: int = 2

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.quick_retries < 0:
            raise ValueError(f"quick_retries must be >= 0, got {self.quick_retries}")
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


# --------------------------------------------------------------------------------------
# the loop


class Outcome(NamedTuple):
    """What one attempt gave: done (``decision`` is None, the answer in ``data``) or a
    classified failure."""

    status: int  # the HTTP status; 0 when no answer came (connection error, timeout)
    data: Any = None
    decision: RetryDecision | None = None


class RetryStats(Protocol):
    """Counters the loop keeps (:class:`orchestra.models.base.ModelStats` has them all)."""

    in_flight: int
    done: int
    rate_limited: int
    retries: int
    errors: int
    extra: dict[str, float]


def _note_rate(rate: AdaptiveRate, stats: RetryStats) -> None:
    learned = rate.learned_rate()
    if learned is not None:
        stats.extra["rate_limit_rps"] = learned


async def send_with_retries(
    attempt: Callable[[float], Awaitable[Outcome]],
    policy: RetryPolicy,
    slots: Slots,
    rate: AdaptiveRate,
    stats: RetryStats,
    explain: Callable[[int, str], str] | None = None,
) -> Any:
    """Run ``attempt(budget_s)`` until it is done or ``policy`` gives up; its ``data``.

    Each attempt takes a slot of ``slots`` first and then waits for ``rate`` (a request the
    pacer releases goes out at once, so sends really are spaced), runs within
    ``min(attempt_timeout_s, what is left of timeout_s)``.  Then: a 429 tells ``rate`` and
    does not count against ``max_retries``; a final failure, one retry too many, or a wait
    that would end after the deadline raises :class:`ModelError`; otherwise a retry that waits
    gives its slot back first and waits without it, and one that goes at once (a request's
    first errors on a healthy endpoint, ``RetryPolicy.quick_retries``, or a ``Retry-After`` of
    0) keeps the slot it holds, ahead of the requests queued for one.
    ``explain(status, reason)`` turns a failure's reason into the error text (to scrub
    secrets, or add a hint).  ``stats`` counts requests in flight, done, 429s, retries and
    requests that failed for good.
    """
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    errors = 0  # failed attempts that count against max_retries (429s do not)
    n = 0
    slot: int | None = None  # held from an attempt into a retry that does not wait
    try:
        while True:
            n += 1
            if slot is None:
                slot = await slots.acquire()
            ticket = await rate.acquire(retry=n > 1)
            if deadline is None and policy.timeout_s is not None:
                deadline = loop.time() + policy.timeout_s
            budget = policy.attempt_timeout_s
            if deadline is not None:
                budget = min(budget, deadline - loop.time())
            stats.in_flight += 1
            try:
                status, data, decision = await attempt(budget)
            finally:
                stats.in_flight -= 1
            rate.note_answer(failed=decision is not None and decision.retry and not decision.rate_limited)
            if decision is None:
                stats.done += 1
                if rate.adjustments:
                    _note_rate(rate, stats)
                return data
            if decision.rate_limited:
                stats.rate_limited += 1
                rate.on_rate_limited(ticket)
                _note_rate(rate, stats)
            else:
                errors += 1
            delay = _next_delay(policy, decision, n, errors, rate, explain, status, stats)
            if deadline is not None and loop.time() + delay >= deadline:
                stats.errors += 1
                raise ModelError(f"gave up after {n} attempts: timeout_s={policy.timeout_s:g} "
                                 f"would pass before the next one; last error: {_reason(explain, status, decision)}")
            stats.retries += 1
            if delay > 0:  # no slot is held while waiting
                slots.release(slot)
                slot = None
                await asyncio.sleep(delay)
            # A retry at once keeps its slot: it goes before the requests still queued for one
            # (a sample that already waited does not queue again behind new samples).
    finally:
        if slot is not None:
            slots.release(slot)


def _reason(explain: Callable[[int, str], str] | None, status: int, decision: RetryDecision) -> str:
    return explain(status, decision.reason) if explain is not None else decision.reason


def _next_delay(policy: RetryPolicy, decision: RetryDecision, n: int, errors: int, rate: AdaptiveRate,
                explain: Callable[[int, str], str] | None, status: int, stats: RetryStats) -> float:
    """The wait before attempt ``n + 1`` after failed attempt ``n``, or :class:`ModelError` when
    there is none: a final failure, or one error too many."""
    if not decision.retry:
        stats.errors += 1
        raise ModelError(_reason(explain, status, decision))
    if errors > policy.max_retries:
        stats.errors += 1
        raise ModelError(f"gave up after {n} attempts ({policy.max_retries} retries): "
                         f"{_reason(explain, status, decision)}")
    if decision.rate_limited:
        return policy.backoff_s(max(1, n - errors), decision.retry_after_s, True)
    if decision.retry_after_s is None and errors <= policy.quick_retries and rate.healthy():
        return 0.0
    return policy.backoff_s(errors, decision.retry_after_s)
