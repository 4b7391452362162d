"""Build models from config dicts, once per process (warm workers reuse them across tasks)."""

from __future__ import annotations

from typing import Any

from orchestra.fileio import stable_hash
from orchestra.models.base import BaseModel
from orchestra.registry import MODELS

_LOADED: dict[str, BaseModel] = {}


def get_model(cfg: dict[str, Any]) -> BaseModel:
    """The model a config describes, built and loaded on first use, kept for this process."""
    key = stable_hash(cfg)
    model = _LOADED.get(key)
    if model is None:
        cls = MODELS.resolve(cfg["type"], f"model {cfg.get('abbr')}")
        kwargs = {k: v for k, v in cfg.items() if k not in ("type", "run_cfg")}
        model = cls(**kwargs)
        assert isinstance(model, BaseModel)
        model.load()
        _LOADED[key] = model
    return model
