"""A fixed number of tasks per model, for a fixed number of workers."""

from __future__ import annotations

from collections.abc import Sequence

from orchestra.datasets.info import DatasetInfo
from orchestra.partitioners.base import BasePartitioner, Shard, balanced_bins
from orchestra.ranges import even_ranges


class NumWorkerPartitioner(BasePartitioner):
    """Split every dataset into ``num_split`` shards and pack them into ``num_worker`` tasks.

    Args:
        num_worker: tasks per model (one per worker).
        num_split: shards per dataset (default: ``num_worker``).
    """

    def __init__(
        self,
        num_worker: int = 8,
        num_split: int | None = None,
        gen_task_coef: float = 20.0,
        dataset_coef: dict[str, float] | None = None,
    ) -> None:
        super().__init__(gen_task_coef, dataset_coef)
        if not isinstance(num_worker, int) or num_worker < 1:
            raise ValueError(f"num_worker must be an integer >= 1, got {num_worker!r}")
        if num_split is not None and (not isinstance(num_split, int) or num_split < 1):
            raise ValueError(f"num_split must be an integer >= 1, got {num_split!r}")
        self.num_worker = num_worker
        self.num_split = num_split or num_worker

    def split(self, info: DatasetInfo) -> list[Shard]:
        return even_ranges(info.size, self.num_split, nonempty=True)

    def pack(self, costs: Sequence[float]) -> list[list[int]]:
        return balanced_bins(costs, self.num_worker)
