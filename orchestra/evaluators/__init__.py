"""Evaluators turn prediction records into metrics."""

from __future__ import annotations

from typing import Any

from orchestra.evaluators.basic import (
    AccuracyEvaluator,
    BaseEvaluator,
    ExactMatchEvaluator,
    NumericMatchEvaluator,
)
from orchestra.registry import EVALUATORS

__all__ = ["AccuracyEvaluator", "BaseEvaluator", "ExactMatchEvaluator", "NumericMatchEvaluator", "build_evaluator"]


def build_evaluator(cfg: Any) -> BaseEvaluator:
    """An evaluator from ``'accuracy'`` or ``dict(type=..., **kwargs)``."""
    cfg = cfg if isinstance(cfg, dict) else {"type": cfg}
    cls = EVALUATORS.resolve(cfg["type"], "eval_cfg.evaluator")
    ev = cls(**{k: v for k, v in cfg.items() if k != "type"})
    assert isinstance(ev, BaseEvaluator)
    return ev
