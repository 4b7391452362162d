"""Evaluators turn prediction records into metrics.

The light ones (``accuracy``, ``exact_match``, ``numeric_match``) judge each record in
place.  Heavy ones (:class:`~orchestra.evaluators.heavy.HeavyEvaluator`) await a verdict per
sample and are checkpointed by the eval task: ``code_exec`` runs completions in a sandbox,
``judge`` asks a model.
"""

from __future__ import annotations

from typing import Any

from orchestra.evaluators.basic import (
    AccuracyEvaluator,
    BaseEvaluator,
    ExactMatchEvaluator,
    NumericMatchEvaluator,
)
from orchestra.evaluators.heavy import HeavyEvaluator
from orchestra.registry import EVALUATORS

__all__ = [
    "AccuracyEvaluator",
    "BaseEvaluator",
    "CodeExecEvaluator",
    "ExactMatchEvaluator",
    "HeavyEvaluator",
    "JudgeEvaluator",
    "NumericMatchEvaluator",
    "build_evaluator",
    "evaluator_identity",
    "evaluator_resources",
]

_LAZY = {"CodeExecEvaluator": "orchestra.evaluators.code", "JudgeEvaluator": "orchestra.evaluators.judge"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'orchestra.evaluators' has no attribute {name!r}")


def _as_dict(cfg: Any) -> dict[str, Any]:
    return dict(cfg) if isinstance(cfg, dict) else {"type": cfg}


def build_evaluator(cfg: Any) -> BaseEvaluator:
    """An evaluator from ``'accuracy'`` or ``dict(type=..., **kwargs)``."""
    cfg = _as_dict(cfg)
    cls = EVALUATORS.resolve(cfg["type"], "eval_cfg.evaluator")
    ev = cls(**{k: v for k, v in cfg.items() if k != "type"})
    assert isinstance(ev, BaseEvaluator)
    return ev


def evaluator_identity(eval_cfg: dict[str, Any]) -> Any:
    """What a result's content hash covers of a dataset's ``eval_cfg``: the config as written,
    or, for an evaluator that says more (a judge's model identity and resolved prompt, the
    post-processing version of code execution), that instead of its ``evaluator`` entry."""
    raw = eval_cfg.get("evaluator")
    if raw is None:
        return eval_cfg
    cfg = _as_dict(raw)
    cls = EVALUATORS.resolve(cfg.get("type"), "eval_cfg.evaluator")
    ident = cls.identity(cfg) if issubclass(cls, BaseEvaluator) else None
    return eval_cfg if ident is None else {**eval_cfg, "evaluator": ident}


def evaluator_resources(eval_cfg: dict[str, Any]) -> dict[str, int]:
    """What scoring a dataset with its ``eval_cfg`` occupies (see :meth:`BaseEvaluator.resources`)."""
    raw = eval_cfg.get("evaluator")
    if raw is None:
        return BaseEvaluator.resources({})
    cfg = _as_dict(raw)
    cls = EVALUATORS.resolve(cfg.get("type"), "eval_cfg.evaluator")
    assert issubclass(cls, BaseEvaluator)
    return cls.resources({k: v for k, v in cfg.items() if k != "type"})
