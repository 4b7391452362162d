"""One task per model and ``n`` datasets."""

from __future__ import annotations

from collections.abc import Sequence

from orchestra.partitioners.base import BasePartitioner


class NaivePartitioner(BasePartitioner):
    """One task per model and every ``n`` datasets, in config order; datasets are never split.

    Args:
        n: how many datasets one task handles.
    """

    def __init__(self, n: int = 1, gen_task_coef: float = 20.0, dataset_coef: dict[str, float] | None = None) -> None:
        super().__init__(gen_task_coef, dataset_coef)
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        self.n = n

    def pack(self, costs: Sequence[float]) -> list[list[int]]:
        idx = list(range(len(costs)))
        return [idx[i : i + self.n] for i in range(0, len(idx), self.n)]
