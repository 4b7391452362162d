"""The retry classifier and backoff policy (pure functions), and the retry loop with a
scripted attempt (what any HTTP model plugs in; OpenAIAPI runs it against a real server)."""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from orchestra.errors import ModelError
from orchestra.limits.concurrency import ProcessSlots
from orchestra.limits.ratelimit import AdaptiveRate
from orchestra.limits.retry import (
    Outcome,
    RetryDecision,
    RetryPolicy,
    classify_exception,
    classify_status,
    parse_retry_after,
    send_with_retries,
    server_message,
)
from orchestra.models.base import ModelStats


def test_statuses_are_classified_once() -> None:
    limited = classify_status(429, {"retry-after": "2"}, b'{"error": {"message": "slow down"}}')
    assert limited.retry and limited.rate_limited and limited.retry_after_s == 2.0
    assert limited.reason == "HTTP 429: slow down"
    for status in (500, 502, 503, 504, 408, 409):
        d = classify_status(status, {}, b"oops")
        assert d.retry and not d.rate_limited, status
    for status in (400, 401, 403, 404, 422):
        d = classify_status(status, {}, b'{"error": {"message": "bad model"}}')
        assert not d.retry and d.reason == f"HTTP {status}: bad model"


def test_exceptions_are_classified() -> None:
    assert classify_exception(asyncio.TimeoutError()).retry
    assert classify_exception(aiohttp.ServerDisconnectedError()).retry
    assert classify_exception(ConnectionResetError("reset")).retry
    assert not classify_exception(ValueError("a bug")).retry


def test_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (parse_retry_after({"retry-after": date}) or 0) <= 31
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_server_message_forms() -> None:
    assert server_message(b'{"error": {"message": "m1"}}') == "m1"
    assert server_message(b'{"detail": "m2"}') == "m2"
    assert server_message(b"plain text") == "plain text"


def test_backoff_is_jittered_exponential_and_honours_retry_after() -> None:
    policy = RetryPolicy(backoff_base_s=1.0, backoff_max_s=8.0)
    rng = random.Random(0)
    for retry in range(1, 8):
        delays = [policy.backoff_s(retry, rng=rng) for _ in range(50)]
        cap = min(8.0, 2.0 ** (retry - 1))
        assert all(cap * 0.5 <= d <= cap for d in delays)
        assert len(set(delays)) > 1  # jittered, so callers do not retry in lockstep
    assert all(5.0 <= policy.backoff_s(1, retry_after_s=5.0, rng=rng) <= 5.5 for _ in range(20))
    assert all(0.1 <= policy.backoff_s(1, 0.1, rate_limited=True, rng=rng) <= 0.11 for _ in range(20))


def test_policy_validates() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)
    with pytest.raises(ValueError):
        RetryPolicy(attempt_timeout_s=0)


def _scripted(outcomes: list[Outcome], slots: ProcessSlots,
              seen: list[tuple[float, int]]) -> Callable[[float], Awaitable[Outcome]]:
    """An attempt that answers from a script and records its budget and the slots in use."""

    async def attempt(budget_s: float) -> Outcome:
        seen.append((budget_s, slots.in_use()))
        return outcomes.pop(0)

    return attempt


def test_the_loop_retries_backs_off_without_the_slot_and_counts() -> None:
    slots, stats = ProcessSlots("scripted", 1), ModelStats()
    seen: list[tuple[float, int]] = []
    script = [Outcome(500, None, RetryDecision.transient("HTTP 500")),
              Outcome(429, None, RetryDecision.rate_limit("HTTP 429", retry_after_s=0.01)),
              Outcome(200, {"ok": True})]
    policy = RetryPolicy(max_retries=1, timeout_s=5.0, attempt_timeout_s=2.0, backoff_base_s=0.01)

    async def main() -> object:
        return await send_with_retries(_scripted(script, slots, seen), policy, slots, AdaptiveRate(), stats)

    assert asyncio.run(main()) == {"ok": True}
    assert [n for _, n in seen] == [1, 1, 1] and slots.in_use() == 0  # held while sending only
    assert all(0 < b <= 2.0 for b, _ in seen)
    assert (stats.done, stats.retries, stats.rate_limited, stats.errors, stats.in_flight) == (1, 2, 1, 0, 0)


def test_the_loop_gives_up_with_an_explained_reason() -> None:
    slots, stats = ProcessSlots("scripted-final", 2), ModelStats()
    policy = RetryPolicy(max_retries=1, backoff_base_s=0.01)

    async def main(script: list[Outcome]) -> None:
        await send_with_retries(_scripted(script, slots, []), policy, slots, AdaptiveRate(), stats,
                                explain=lambda status, reason: f"{reason} [status {status}]")

    with pytest.raises(ModelError, match=r"^HTTP 400 \[status 400\]$"):
        asyncio.run(main([Outcome(400, None, RetryDecision.no("HTTP 400"))]))
    with pytest.raises(ModelError, match="gave up after 2 attempts"):
        asyncio.run(main([Outcome(0, None, RetryDecision.transient("timed out"))] * 2))
    assert (stats.errors, stats.retries, stats.done) == (2, 1, 0) and slots.in_use() == 0
