"""Tasks of balanced estimated cost: large datasets are sharded, small ones packed."""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestra.datasets.info import DatasetInfo
from orchestra.partitioners.base import BasePartitioner, Shard, balanced_bins, even_shards, num_bins_for


class SizePartitioner(BasePartitioner):
    """Cut work so that every task costs about ``max_task_size``.

    Cost of a dataset = rows x cost per row (``gen_task_coef`` for generation, the number of
    choices for log-likelihood, or ``dataset_coef[abbr]``).  A dataset costing more than
    ``max_task_size`` is split into equal shards; then all units of a model are packed into
    ``ceil(total / max_task_size)`` tasks with longest-processing-time first plus local
    search, so the largest task is close to the lower bound.

    Args:
        max_task_size: target cost of one task.
        gen_task_coef: cost of one generation row.
        dataset_coef: per-dataset cost per row, by abbr.
    """

    def __init__(
        self,
        max_task_size: float = 40000,
        gen_task_coef: float = 20.0,
        dataset_coef: dict[str, float] | None = None,
    ) -> None:
        super().__init__(gen_task_coef, dataset_coef)
        if max_task_size <= 0:
            raise ValueError(f"max_task_size must be > 0, got {max_task_size}")
        self.max_task_size = float(max_task_size)

    def split(self, info: DatasetInfo) -> list[Shard]:
        cost = info.size * self.row_cost(info)
        return even_shards(info.size, math.ceil(cost / self.max_task_size) if cost else 1)

    def pack(self, costs: Sequence[float]) -> list[list[int]]:
        return balanced_bins(costs, num_bins_for(costs, self.max_task_size))
