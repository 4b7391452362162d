"""The adaptive request rate: unit behaviour, and learning a real server's limit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orchestra.inference.engine import run_samples
from orchestra.limits.ratelimit import AdaptiveRate
from orchestra.models.openai_api import OpenAIAPI
from orchestra.requests import GenRequest, Sample


def test_unlimited_until_a_429_then_paced() -> None:
    async def main() -> None:
        rate = AdaptiveRate()
        loop = asyncio.get_running_loop()
        tickets = [await rate.acquire() for _ in range(20)]
        assert rate._dispatcher is None  # no request ever queued: no pacing before any 429
        assert rate.rate(loop.time()) is None
        rate.on_rate_limited(tickets[-1])
        rate.on_rate_limited(tickets[-2])  # same epoch: one adjustment only
        assert rate.adjustments == 1 and rate.rejects == 2
        paced = rate.rate(loop.time())
        assert paced is not None and paced < 25
        t1 = loop.time()
        for _ in range(5):
            await rate.acquire()
        assert loop.time() - t1 >= 3.5 / paced  # spaced by the pace, not sent at once

    asyncio.run(main())


def test_a_known_limit_is_never_exceeded() -> None:
    async def main() -> None:
        rate = AdaptiveRate(max_rate=50.0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for _ in range(11):
            await rate.acquire()
        assert loop.time() - t0 >= 0.18  # 10 intervals of 20 ms, less timer slack

    asyncio.run(main())


def test_ramp_spreads_the_first_wave() -> None:
    async def main() -> None:
        rate = AdaptiveRate(ramp_requests=10, ramp_s=0.1)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(*(rate.acquire() for _ in range(10)))
        assert loop.time() - t0 >= 0.07
        assert rate.rate(loop.time()) is None  # after the ramp: free again

    asyncio.run(main())


@pytest.mark.slow
def test_learns_a_servers_limit(server: Any) -> None:
    server.configure(rate=20.0, burst=10.0, latency_s=0.02)
    model = OpenAIAPI(abbr="m", path="test-model", base_url=server.base_url, key_env=None, max_connections=20)
    samples = [Sample(id=i, kind="gen", gold=None, gen=GenRequest(prompt=f"#{i}: {i} + 0")) for i in range(60)]
    records: list[dict[str, Any]] = []

    async def main() -> None:
        try:
            await run_samples(model, samples, records.append)
        finally:
            await model.aclose()

    asyncio.run(main())
    assert sorted(r["prediction"] for r in records) == sorted(str(i) for i in range(60))
    st = server.stats()
    assert st["by_status"]["200"] == 60
    assert model.stats.rate_limited == st["by_status"].get("429", 0)
    assert st["by_status"].get("429", 0) < 30  # retrying alone would bounce off the limit far more
    learned = model.rate.learned_rate()
    assert learned is not None and 8.0 <= learned <= 40.0


def test_a_cancelled_waiter_does_not_use_up_a_send() -> None:
    """At 10 requests/s, three callers queue behind the first send; the second is cancelled (its
    sample timed out, or Ctrl-C): the third goes at the next tick, not one tick later, and
    a 429 then sets a pace under ``max_rate``."""
    rate = AdaptiveRate(max_rate=10.0)

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        first = await rate.acquire()
        second = asyncio.ensure_future(rate.acquire())
        third = asyncio.ensure_future(rate.acquire())
        await asyncio.sleep(0.01)
        second.cancel()
        ticket = await third
        rate.on_rate_limited(ticket)  # a 429: the pace drops to what was accepted, under max_rate
        return [first.sent_at - t0, ticket.sent_at - t0, rate.rate(loop.time()) or 0.0]

    first, third, pace = asyncio.run(main())
    assert first < 0.02 and 0.08 <= third < 0.15 and rate.sends == 2  # the cancelled one sent nothing
    assert 0 < pace < 10.0 and rate.adjustments == 1
