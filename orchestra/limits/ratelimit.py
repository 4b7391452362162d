"""A client-side request rate that learns an endpoint's limit from its 429 answers.

Requests pass through :meth:`AdaptiveRate.acquire` before they are sent.  Until the endpoint
has answered 429 the rate is free (only the first wave is spread over ``ramp_s`` rather than
sent in one instant, since an instant burst is exactly what trips burst limits).  On a 429:

* the pace drops at once to an estimate of the server's rate.  A 429 means the server's
  bucket is empty; between two such moments the server accepted its rate times the time
  between them, so ``accepted sends / elapsed`` between two 429s measures the limit.  It
  is trusted once two measurements agree; one that keeps rising means the bucket filled up
  and overflowed while we were slow, so it was only a lower bound.  The first 429 has no
  earlier one, so the accepted sends of the last second stand in, untrusted;
* sends are paced a little under that estimate, then the pace creeps up again: along a
  cubic curve after a trusted estimate (flat at first, steeper the longer no 429 comes),
  doubling every ``probe_growth_s`` after an untrusted one, so that an underestimate or a
  raised limit is found;
* 429s of requests sent before the last adjustment do not adjust again (``epoch``).

Retries wait in a queue that is served before new requests.  With paced sends a 429 costs
about one rejected request, so the endpoint is used near its limit with few 429s.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

_TICK_S = 0.001  # the event loop's timer resolution
_WINDOW_S = 3.0  # how long send times are kept for the estimates


@dataclass(frozen=True)
class Ticket:
    """Handed out when a request may go: the rate epoch it was sent in."""

    epoch: int
    sent_at: float


class AdaptiveRate:
    """Paces request sends; learns the endpoint's rate limit from 429 answers.

    Args:
        max_rate: a known limit in requests per second; the pace never exceeds it (None: none).
        ramp_requests: how many first requests are spread over ``ramp_s`` (0: no ramp).
        ramp_s: the time the first wave is spread over.
        margin: how far under the estimated limit sends are paced after a 429.
        growth_s: after a trusted estimate the pace doubles after this long without a 429
            (cubic curve: flat at first, then steeper).
        probe_growth_s: after an untrusted estimate the pace doubles every this long
            (exponential), so an underestimate is corrected in logarithmic time.
        adaptive: learn from 429s (False: pace only at ``max_rate``).
    """

    min_rate = 0.05  # requests per second: never stall completely

    def __init__(
        self,
        max_rate: float | None = None,
        ramp_requests: int = 0,
        ramp_s: float = 0.05,
        margin: float = 0.03,
        growth_s: float = 5.0,
        probe_growth_s: float = 0.5,
        adaptive: bool = True,
    ) -> None:
        if max_rate is not None and max_rate <= 0:
            raise ValueError(f"rate limit must be > 0 requests/s, got {max_rate}")
        self.max_rate = max_rate
        self.margin = margin
        self.growth_s = growth_s
        self.probe_growth_s = probe_growth_s
        self.adaptive = adaptive
        self._ramp_left = ramp_requests
        self._ramp_rate = ramp_requests / ramp_s if ramp_requests and ramp_s > 0 else None
        self.epoch = 0
        self.sends = 0
        self.rejects = 0
        self.adjustments = 0
        self._first_send: float | None = None
        self._anchor: float | None = None  # time of the last 429 that an estimate was made at
        self._base_rate: float | None = None  # pace set at the last 429
        self._base_t = 0.0
        self._trusted = False
        self._last_estimate: float | None = None
        # send times of the last few seconds, and send times of those answered 429
        self._send_times: deque[float] = deque()
        self._reject_times: deque[float] = deque()
        self._next_t = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._retries: deque[asyncio.Future[Ticket]] = deque()
        self._fresh: deque[asyncio.Future[Ticket]] = deque()
        self._dispatcher: asyncio.Task[None] | None = None
        self._answers: deque[bool] = deque(maxlen=50)  # the last answers: True for a transient error

    def note_answer(self, failed: bool) -> None:
        """Record one answer (``failed``: a transient error such as a 5xx or a timeout)."""
        self._answers.append(failed)

    def healthy(self) -> bool:
        """Whether the endpoint answers most requests: fewer than 10 answers so far, or at most
        a fifth of its last 50 were transient errors (the HTTP retry loop retries at once then,
        and backs off otherwise)."""
        return len(self._answers) < 10 or sum(self._answers) * 5 <= len(self._answers)

    # -- the current pace ---------------------------------------------------------------
    def rate(self, now: float) -> float | None:
        """Requests per second allowed at ``now`` (None: not limited)."""
        if self._base_rate is not None:
            if self._trusted:
                tau = (now - self._base_t) / self.growth_s
                r = self._base_rate * (1.0 + tau * tau * tau)
            else:
                r = self._base_rate * 2.0 ** min((now - self._base_t) / self.probe_growth_s, 60.0)
        elif self._ramp_left > 0:
            r = self._ramp_rate  # type: ignore[assignment]
        else:
            return self.max_rate
        return r if self.max_rate is None else min(r, self.max_rate)

    def learned_rate(self) -> float | None:
        """The pace set from 429s (None until the endpoint has answered 429)."""
        if self._base_rate is None:
            return None
        loop = self._loop
        return self.rate(loop.time()) if loop is not None and not loop.is_closed() else self._base_rate

    # -- sending ------------------------------------------------------------------------
    def _sent(self, now: float) -> Ticket:
        self.sends += 1
        if self._first_send is None:
            self._first_send = now
        times = self._send_times
        times.append(now)
        while times[0] < now - _WINDOW_S:
            times.popleft()
        if self._ramp_left > 0:
            self._ramp_left -= 1
        return Ticket(self.epoch, now)

    def _advance(self, now: float, rate: float | None) -> None:
        if rate is None:
            self._next_t = now
            return
        interval = 1.0 / rate
        # Keep to the schedule when a timer fired a little late; start afresh after idling.
        base = self._next_t if now - self._next_t < max(interval, 0.02) else now
        self._next_t = max(base, now - interval) + interval

    async def acquire(self, retry: bool = False) -> Ticket:
        """Wait until a request may be sent; retries go before new requests."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (a warm worker's next task)
            self._loop = loop
            self._retries.clear()
            self._fresh.clear()
            self._dispatcher = None
            self._next_t = 0.0
        now = loop.time()
        if not self._retries and not self._fresh:
            rate = self.rate(now)
            if rate is None or now + _TICK_S >= self._next_t:
                self._advance(now, rate)
                return self._sent(now)
        fut: asyncio.Future[Ticket] = loop.create_future()
        (self._retries if retry else self._fresh).append(fut)
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = loop.create_task(self._dispatch())
        return await fut

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._retries or self._fresh:
            now = loop.time()
            rate = self.rate(now)
            # Timers fire with ~1 ms resolution: release everything due within it in one go.
            if rate is not None and now + _TICK_S < self._next_t:
                await asyncio.sleep(self._next_t - now)
                continue
            queue = self._retries or self._fresh
            fut = queue.popleft()
            if fut.done():  # its caller was cancelled
                continue
            self._advance(now, rate)
            fut.set_result(self._sent(now))

    # -- feedback -----------------------------------------------------------------------
    def _accepted_since(self, t: float) -> int:
        sent = sum(1 for x in reversed(self._send_times) if x >= t) if self._send_times else 0
        rejected = sum(1 for x in reversed(self._reject_times) if x >= t) if self._reject_times else 0
        return sent - rejected

    def on_rate_limited(self, ticket: Ticket) -> None:
        """A request sent with ``ticket`` was answered 429: slow down to the learned rate."""
        self.rejects += 1
        rejects = self._reject_times
        rejects.append(ticket.sent_at)
        while rejects[0] < ticket.sent_at - _WINDOW_S:
            rejects.popleft()
        if not self.adaptive or ticket.epoch != self.epoch:
            return  # sent before the last adjustment, which already accounts for it
        loop = self._loop or asyncio.get_running_loop()
        now = loop.time()
        current = self.rate(now)
        if self._anchor is None:  # the first 429: the last second's accepted sends
            estimate = self._accepted_since(now - 1.0) / 1.0
            self._anchor = now
            self._trusted = False
        else:
            elapsed = now - self._anchor
            accepted = self._accepted_since(self._anchor)
            if elapsed >= 0.25 or accepted >= 10:
                estimate = accepted / max(elapsed, 1e-3)
                self._anchor = now
                # Trusted once two measurements agree: an estimate that keeps rising means the
                # bucket filled up and overflowed while we were slow (a lower bound only).
                last = self._last_estimate
                trusted = last is not None and abs(estimate - last) <= 0.1 * last
                self._last_estimate = estimate
                self._trusted = trusted
            else:  # too soon to measure: back off, and measure from the same anchor next time
                estimate = 0.8 * (current if current is not None else self.min_rate)
        new = max(self.min_rate, estimate * (1.0 - self.margin))
        if self.max_rate is not None:
            new = min(new, self.max_rate)
        self._base_rate = new
        self._base_t = now
        self._ramp_left = 0
        self.epoch += 1
        self.adjustments += 1
        self._next_t = max(self._next_t, now + 1.0 / new)
