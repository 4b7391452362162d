"""Cutting ``range(n)`` into contiguous, near-equal parts: dataset shards, replica batches.

A bottom-layer module: pure functions, no imports from the rest of orchestra.
"""

from __future__ import annotations

Range = tuple[int, int]


def even_ranges(n: int, parts: int, *, nonempty: bool = False) -> list[Range]:
    """``parts`` contiguous ``[start, end)`` ranges covering ``range(n)``, in order, whose
    lengths differ by at most one (the longer ones first).

    ``nonempty``: make fewer ranges when there are fewer items than ``parts``, so that none
    is empty (``n == 0`` still gives one, empty, range).  Otherwise the trailing ranges are
    empty when ``parts > n``.

    >>> even_ranges(5, 2)
    [(0, 3), (3, 5)]
    >>> even_ranges(1, 3), even_ranges(1, 3, nonempty=True)
    ([(0, 1), (1, 1), (1, 1)], [(0, 1)])
    """
    if nonempty:
        parts = max(1, min(parts, n)) if n else 1
    elif parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out
