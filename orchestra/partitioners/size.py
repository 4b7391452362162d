"""Tasks of balanced estimated cost: large datasets are sharded, small ones packed."""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestra.datasets.info import DatasetInfo
from orchestra.partitioners.base import BasePartitioner, Shard, balanced_bins, num_bins_for
from orchestra.ranges import even_ranges


class SizePartitioner(BasePartitioner):
    """Cut work so that every task costs about ``max_task_size``.

    Cost of a dataset = rows x cost per row (``gen_task_coef`` for generation, the number of
    choices for log-likelihood, or ``dataset_coef[abbr]``).  A dataset costing more than
    ``max_task_size / granularity`` is split into equal contiguous shards of about that cost
    (boundaries depend on the dataset and these settings only, never on other datasets, so
    adding a dataset does not invalidate another's predictions); then all units of a model are
    packed with longest-processing-time first plus local search into the fewest tasks (at
    least ``ceil(total / max_task_size)``) whose largest task is within ``balance_tolerance``
    of the lower bound ``max(total / tasks, largest unit)``.  Lumpy units (say three shards of 60%
    of ``max_task_size``) get one more task rather than one task twice the size of the others.

    Args:
        max_task_size: target cost of one task.
        gen_task_coef: cost of one generation row.
        dataset_coef: per-dataset cost per row, by abbr.
        granularity: shards per ``max_task_size`` of cost; finer shards pack closer to
            ``total / tasks`` but make more prediction files (1: split only what exceeds a task).
    """

    #: how far the largest task may exceed ``max(total / tasks, largest unit)`` (0.1: 10%)
    balance_tolerance = 0.1

    def __init__(
        self,
        max_task_size: float = 40000,
        gen_task_coef: float = 20.0,
        dataset_coef: dict[str, float] | None = None,
        granularity: int = 8,
    ) -> None:
        super().__init__(gen_task_coef, dataset_coef)
        if not max_task_size > 0:  # NaN too; infinite: one task per model
            raise ValueError(f"max_task_size must be > 0, got {max_task_size}")
        if not isinstance(granularity, int) or granularity < 1:
            raise ValueError(f"granularity must be an integer >= 1, got {granularity!r}")
        self.max_task_size = float(max_task_size)
        self.granularity = granularity

    def split(self, info: DatasetInfo) -> list[Shard]:
        shards = info.size * self.row_cost(info) / (self.max_task_size / self.granularity)
        # more shards than rows (or a cost too large for a float) is one row per shard
        return even_ranges(info.size, math.ceil(shards) if shards < info.size else info.size, nonempty=True)

    def pack(self, costs: Sequence[float]) -> list[list[int]]:
        if not costs:
            return []
        n = len(costs)
        lo = num_bins_for(costs, self.max_task_size)
        groups = self._balanced(costs, lo)
        if groups is not None:
            return groups
        # Too lumpy for this many tasks: gallop up to a task count that balances (one unit
        # per task always does), then bisect back to the fewest tasks that still balance.
        step, hi = 1, lo
        while True:
            hi = min(n, lo + step)
            groups = self._balanced(costs, hi)
            if groups is not None:
                break
            lo, step = hi, step * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            found = self._balanced(costs, mid)
            if found is None:
                lo = mid
            else:
                hi, groups = mid, found
        return groups

    def _balanced(self, costs: Sequence[float], bins: int) -> list[list[int]] | None:
        """``bins`` groups if their largest cost is within tolerance of the bound, else None."""
        groups = balanced_bins(costs, bins)
        largest = max(sum(costs[i] for i in g) for g in groups)
        bound = max(sum(costs) / len(groups), max(costs))
        if largest <= bound * (1 + self.balance_tolerance) + 1e-9 or len(groups) >= len(costs):
            return groups
        return None
