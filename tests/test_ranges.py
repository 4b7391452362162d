"""even_ranges: the one way to cut ``range(n)`` (dataset shards, replica batches)."""

from __future__ import annotations

import pytest

from orchestra.ranges import even_ranges


@pytest.mark.parametrize("n", [0, 1, 2, 5, 7, 100])
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
@pytest.mark.parametrize("nonempty", [False, True])
def test_ranges_cover_everything_once_and_evenly(n: int, parts: int, nonempty: bool) -> None:
    got = even_ranges(n, parts, nonempty=nonempty)
    assert got[0][0] == 0 and got[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
    lengths = [e - s for s, e in got]
    assert lengths == sorted(lengths, reverse=True) and max(lengths) - min(lengths) <= 1
    if nonempty:
        assert len(got) == (max(1, min(parts, n)) if n else 1)
        assert n == 0 or min(lengths) >= 1
    else:
        assert len(got) == parts


def test_examples() -> None:
    assert even_ranges(5, 2) == [(0, 3), (3, 5)]
    assert even_ranges(1, 3) == [(0, 1), (1, 1), (1, 1)]
    assert even_ranges(1, 3, nonempty=True) == [(0, 1)]
    assert even_ranges(0, 4, nonempty=True) == [(0, 0)]
    assert even_ranges(10, 0, nonempty=True) == [(0, 10)]
    with pytest.raises(ValueError):
        even_ranges(10, 0)
