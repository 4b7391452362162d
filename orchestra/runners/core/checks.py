"""The checks every runner's constructor makes of its numbers and names, worded once.

Each returns the value it accepted or raises ``ValueError`` naming the argument, what is valid and
what it got (the config layer turns that into one line naming the file and key, exit 2).
"""

from __future__ import annotations

import math


def count(name: str, value: object, low: int) -> int:
    """An integer (not a bool) of at least ``low``: ``max_num_workers``, ``retry``, ``cli_concurrency``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def amount(name: str, value: object, *, zero: bool = False) -> float:
    """A finite number above 0 (``zero``: at least 0), e.g. seconds or GB (no limit is None, never inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not zero):
        raise ValueError(f"{name} must be {'>=' if zero else '>'} 0, got {value!r}")
    if not math.isfinite(value):  # nan passes ``< 0``; a limit that can be lifted takes None
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def optional_amount(name: str, value: object) -> float | None:
    """None (the default of whatever runs the job), or a number above 0."""
    return None if value is None else amount(name, value)


def text(name: str, value: object) -> str | None:
    """None, or a string with something in it."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value
