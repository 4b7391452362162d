"""How many samples a dataset needs: the power line of ``--dry-run``.

Before a run there is no discordance to measure, so the plan states, per dataset, the smallest
difference its n samples can detect at 80% power and 5% significance for a score near 0.5
(:func:`orchestra.stats.mde_single`, the widest case): 100 questions cannot tell 0.52 from 0.50.
A comparison of two runs states the paired one, from the discordance it observed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from orchestra import stats


def dataset_sizes(units: Iterable[tuple[str, Any]]) -> dict[str, int]:
    """Samples per dataset from a plan's infer units ``(model, unit)`` (the most any model has)."""
    per: dict[str, dict[str, int]] = {}  # model -> dataset -> samples
    last, mine = None, {}
    for model, unit in units:  # 100,000 of them at sweep scale, model by model: one dict per model
        if model != last:
            last, mine = model, per.setdefault(model, {})
        n = unit.end - unit.start
        abbr = unit.dataset_abbr
        mine[abbr] = mine.get(abbr, 0) + (n if n > 0 else 0)
    sizes: dict[str, int] = {}
    for counts in per.values():
        for dataset, n in counts.items():
            if n >= sizes.get(dataset, 0):
                sizes[dataset] = n
    return sizes


def power_lines(units: Iterable[tuple[str, Any]], limit: int | None = None) -> Iterator[str]:
    """The plan's power lines: one per dataset, with its n and its smallest detectable difference
    (the first ``limit`` datasets, then how many more)."""
    sizes = dataset_sizes(units)
    if not sizes:
        return
    yield ("\n[power] the smallest difference each dataset's n samples can detect at 80% power and 5% "
           "significance, for scores near 0.5 (a paired comparison of two models detects smaller ones when "
           "they disagree on few samples: orchestra compare states it)")
    width = max(len(d) for d in sizes)
    shown = sorted(sizes.items())
    if limit is not None and len(shown) > limit:
        width = max(len(d) for d, _ in shown[:limit])
    for k, (dataset, n) in enumerate(shown):
        if limit is not None and k == limit:
            yield f"  ... {len(shown) - k} more dataset(s) (--dry-run --list shows all)"
            break
        yield f"  {dataset.ljust(width)}  n = {n}: " + (f"{stats.mde_single(0.5, n):.3f}" if n > 0 else "no sample")
