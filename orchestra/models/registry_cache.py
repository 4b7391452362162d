"""Build models from config dicts, once per process (warm workers reuse them across tasks)."""

from __future__ import annotations

from typing import Any

from orchestra.models.base import BaseModel
from orchestra.registry import MODELS

_LOADED: dict[str, BaseModel] = {}


def get_model(cfg: dict[str, Any]) -> BaseModel:
    """The model a config describes, built and loaded on first use, kept for this process.

    Keyed by the model class's :meth:`~BaseModel.instance_key`, the same key the planner gives
    warm workers, so a worker chosen for a task finds that task's model already loaded.
    """
    cls = MODELS.resolve(cfg["type"], f"model {cfg.get('abbr')}")
    assert issubclass(cls, BaseModel)
    key = cls.instance_key(cfg)
    model = _LOADED.get(key)
    if model is None:
        model = cls(**{k: v for k, v in cfg.items() if k not in ("type", "run_cfg")})
        model.load()
        _LOADED[key] = model
    return model
