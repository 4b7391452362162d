"""Datasets: rows, prompts and samples."""

from __future__ import annotations

from typing import Any

from orchestra.datasets.base import BaseDataset
from orchestra.datasets.files import JsonlDataset

_LAZY = {
    "CsvDataset": "orchestra.datasets.tabular",
    "ArrowDataset": "orchestra.datasets.tabular",
    "OlmoEvalDataset": "orchestra.datasets.olmo",
    "LmEvalDataset": "orchestra.datasets.lmeval",
}

__all__ = ["BaseDataset", "JsonlDataset", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'orchestra.datasets' has no attribute {name!r}")
