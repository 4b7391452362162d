"""Datasets read from a JSON-lines file."""

from __future__ import annotations

import json
import os
from typing import Any

from orchestra.datasets.base import BaseDataset
from orchestra.errors import ConfigError


class JsonlDataset(BaseDataset):
    """One JSON object per line; each object is a row.

    Args:
        abbr: short name.
        path: the ``.jsonl`` file.
        reader_cfg: ``input_columns``, ``output_column``, ``test_range``.
        infer_cfg: ``prompt_template``, ``inferencer``, optional ``fewshot``.
        eval_cfg: ``evaluator``.
    """

    def __init__(
        self,
        abbr: str,
        path: str,
        reader_cfg: dict[str, Any],
        infer_cfg: dict[str, Any],
        eval_cfg: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(abbr, path, reader_cfg, infer_cfg, eval_cfg)

    def load_rows(self) -> list[dict[str, Any]]:
        if not os.path.isfile(self.path):
            raise ConfigError(f"dataset {self.abbr}: path {self.path!r} does not exist")
        rows = []
        with open(self.path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise ConfigError(f"{self.path}:{lineno}: not valid JSON: {exc}") from None
                if not isinstance(row, dict):
                    raise ConfigError(f"{self.path}:{lineno}: a row must be a JSON object")
                rows.append(row)
        return rows
