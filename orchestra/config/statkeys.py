"""The config keys of the statistics: ``summarizer=dict(baseline=...)`` and ``eval_cfg.cluster_key``.

``summarizer.baseline`` names the model every other model of the run is compared with, per
dataset and metric (paired differences, docs/statistics.md); without it, the first model.
``eval_cfg.cluster_key`` names a column of the dataset's rows whose equal values form a
cluster (MMLU's subject, a passage shared by several questions): the standard errors of the
dataset's metrics are then cluster-robust.
"""

from __future__ import annotations

from typing import Any

from orchestra.errors import ConfigError, check_known_keys

SUMMARIZER_KEYS = ("baseline",)


def check_summarizer(raw: Any, models: list[str], source: str) -> dict[str, Any]:
    """The checked ``summarizer`` dict (empty when not given)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: summarizer: expected a dict such as dict(baseline='{models[0]}'), got {raw!r}")
    check_known_keys(raw, SUMMARIZER_KEYS, f"{source}: summarizer")
    baseline = raw.get("baseline")
    if baseline is not None and baseline not in models:
        raise ConfigError(f"{source}: summarizer.baseline={baseline!r} is not a model of this config; "
                          f"valid: {', '.join(models)}")
    return dict(raw)


def check_cluster_key(cfg: dict[str, Any], own_scorer: bool, where: str) -> None:
    """``eval_cfg.cluster_key``: a column name, for a dataset orchestra scores (an lm-eval
    dataset keeps lm-eval's own standard errors).  That the column exists is checked against
    the data with the other columns (``BaseDataset.check``)."""
    key = (cfg.get("eval_cfg") or {}).get("cluster_key")
    if key is None:
        return
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{where}.eval_cfg.cluster_key: expected a column name such as 'subject', got {key!r}")
    if own_scorer:
        raise ConfigError(f"{where}.eval_cfg.cluster_key: this dataset is scored by its own library, which reports "
                          "its own standard errors; remove cluster_key")
