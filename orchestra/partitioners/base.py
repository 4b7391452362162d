"""Partitioners cut a stage's work into tasks.

Planning has two steps.  ``split`` fixes shard boundaries for each dataset (these are part
of every prediction's content hash, so they must depend only on the config).  Shards whose
outputs are already done are then dropped, and ``pack`` groups what is left, model by
model, into tasks.  The eval stage has one unit per model and dataset (all shards scored
together); its partitioner only packs.
"""

from __future__ import annotations

import abc
import heapq
import math
from collections.abc import Sequence

from orchestra.datasets.info import DatasetInfo

Shard = tuple[int, int]


class BasePartitioner(abc.ABC):
    """Shard datasets and pack units into tasks.

    Args:
        gen_task_coef: cost of one generation row, relative to scoring one choice.
        dataset_coef: per-dataset cost per row, by dataset abbr, overriding the default.
    """

    def __init__(self, gen_task_coef: float = 20.0, dataset_coef: dict[str, float] | None = None) -> None:
        if not gen_task_coef > 0 or not math.isfinite(gen_task_coef):  # NaN fails both
            raise ValueError(f"gen_task_coef must be > 0 and finite, got {gen_task_coef}")
        self.gen_task_coef = float(gen_task_coef)
        self.dataset_coef = dict(dataset_coef or {})
        for abbr, coef in self.dataset_coef.items():
            if not isinstance(coef, (int, float)) or not coef > 0 or not math.isfinite(coef):
                raise ValueError(f"dataset_coef[{abbr!r}] must be a number > 0 and finite, got {coef!r}")

    def row_cost(self, info: DatasetInfo) -> float:
        """Estimated cost of one row: generation rows cost ``gen_task_coef``, choices 1 each."""
        if info.abbr in self.dataset_coef:
            return float(self.dataset_coef[info.abbr])
        if info.kind == "loglik":
            return max(info.num_choices, 1.0)
        return self.gen_task_coef

    def split(self, info: DatasetInfo) -> list[Shard]:
        """Shard boundaries ``[(start, end), ...]`` for one dataset; default: one shard."""
        return [(0, info.size)]

    @abc.abstractmethod
    def pack(self, costs: Sequence[float]) -> list[list[int]]:
        """Group unit indices (of one model) into tasks, given each unit's cost."""


def balanced_bins(costs: Sequence[float], bins: int, improve_rounds: int = 200) -> list[list[int]]:
    """Pack items into ``bins`` groups, minimising the largest group's total cost.

    Longest-processing-time first (each item, largest first, goes to the lightest bin),
    then local search: move or swap an item out of the heaviest bin while that lowers it.
    """
    bins = max(1, min(bins, len(costs)))
    if bins == len(costs) and all(c > 0 for c in costs):  # one item each: what LPT would give, at once
        return [[i] for i in sorted(range(len(costs)), key=lambda i: -costs[i])]
    groups: list[list[int]] = [[] for _ in range(bins)]
    loads = [0.0] * bins
    heap = [(0.0, b) for b in range(bins)]
    for idx in sorted(range(len(costs)), key=lambda i: -costs[i]):
        load, b = heapq.heappop(heap)
        groups[b].append(idx)
        loads[b] = load + costs[idx]
        heapq.heappush(heap, (loads[b], b))
    for _ in range(improve_rounds):
        hi = max(range(bins), key=loads.__getitem__)
        best: tuple[float, int, int, int | None] | None = None  # (new max of pair, item, bin, swap item)
        for lo in range(bins):
            if lo == hi:
                continue
            for i in groups[hi]:
                new = max(loads[hi] - costs[i], loads[lo] + costs[i])
                if new < loads[hi] - 1e-9 and (best is None or new < best[0]):
                    best = (new, i, lo, None)
                for j in groups[lo]:
                    delta = costs[i] - costs[j]
                    if delta <= 0:
                        continue
                    new = max(loads[hi] - delta, loads[lo] + delta)
                    if new < loads[hi] - 1e-9 and (best is None or new < best[0]):
                        best = (new, i, lo, j)
        if best is None:
            break
        _, i, lo, swap = best
        groups[hi].remove(i)
        groups[lo].append(i)
        loads[hi] -= costs[i]
        loads[lo] += costs[i]
        if swap is not None:
            groups[lo].remove(swap)
            groups[hi].append(swap)
            loads[lo] -= costs[swap]
            loads[hi] += costs[swap]
    return [sorted(g) for g in groups if g]


def num_bins_for(costs: Sequence[float], max_task_size: float) -> int:
    """The fewest tasks of at most ``max_task_size`` that ``costs`` could fill (never more than
    one per unit: a total too large for a float, from a huge coefficient, is one task per unit)."""
    if not costs:
        return 0
    bins = sum(costs) / max_task_size
    return max(1, math.ceil(bins)) if bins < len(costs) else len(costs)
