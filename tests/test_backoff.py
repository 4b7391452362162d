"""exponential_backoff: the one jittered exponential wait (HTTP retries, task retries)."""

from __future__ import annotations

import random

import pytest

from orchestra.backoff import exponential_backoff


def test_doubles_up_to_the_cap_within_the_jitter() -> None:
    rng = random.Random(0)
    for retry in range(1, 12):
        waits = [exponential_backoff(retry, 0.5, 30.0, rng) for _ in range(50)]
        cap = min(30.0, 0.5 * 2 ** (retry - 1))
        assert all(cap * 0.5 <= w <= cap for w in waits)
        assert len(set(waits)) > 1


def test_same_numbers_as_the_runners_task_retry_formula() -> None:
    """BaseRunner._backoff: ``min(base * 2 ** (attempt - 1), 60) * uniform(0.8, 1.2)``."""
    for base in (0.0, 0.1, 1.0, 7.5):
        for attempt in range(1, 10):
            mine, theirs = random.Random(attempt), random.Random(attempt)
            expected = min(base * (2 ** (attempt - 1)), 60.0) * theirs.uniform(0.8, 1.2)
            assert exponential_backoff(attempt, base, 60.0, mine, jitter=(0.8, 1.2)) == expected


def test_huge_retry_numbers_stay_at_the_cap() -> None:
    assert exponential_backoff(5000, 0.5, 30.0, jitter=(1.0, 1.0)) == 30.0
    assert exponential_backoff(5000, 0.0, 30.0) == 0.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        exponential_backoff(0, 1.0, 2.0)
    with pytest.raises(ValueError):
        exponential_backoff(1, 1.0, 2.0, jitter=(1.2, 0.8))
