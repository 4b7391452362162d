"""The wait before a retry: exponential backoff with jitter, written once.

A bottom-layer module (pure, no imports from the rest of orchestra) used by the HTTP retry
policy (:class:`orchestra.limits.retry.RetryPolicy`) and meant for the runner's task
retries too.
"""

from __future__ import annotations

import random

#: Exponents above this give a wait far beyond any cap; it keeps ``2 ** k`` a finite float.
_MAX_DOUBLINGS = 1000


def exponential_backoff(
    retry: int,
    base_s: float,
    max_s: float,
    rng: random.Random | None = None,
    jitter: tuple[float, float] = (0.5, 1.0),
) -> float:
    """Seconds to wait before retry number ``retry`` (1-based).

    ``min(max_s, base_s * 2 ** (retry - 1))`` times a factor drawn uniformly from
    ``jitter``, so that callers that failed together do not come back in lockstep.  The
    default ``(0.5, 1.0)`` ("equal jitter") spreads waits out but never near zero.

    >>> exponential_backoff(3, 1.0, 60.0, jitter=(1.0, 1.0))
    4.0
    >>> exponential_backoff(10, 1.0, 60.0, jitter=(1.0, 1.0))
    60.0
    """
    if retry < 1:
        raise ValueError(f"retry must be >= 1, got {retry}")
    lo, hi = jitter
    if not 0 <= lo <= hi:
        raise ValueError(f"jitter must be (lo, hi) with 0 <= lo <= hi, got {jitter}")
    exp = min(max_s, base_s * 2.0 ** min(retry - 1, _MAX_DOUBLINGS))
    return exp * (rng or random).uniform(lo, hi)
