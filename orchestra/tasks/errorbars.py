"""Error bars of one (model, dataset)'s metrics, computed by the eval task beside them.

Every numeric metric gets an :class:`~orchestra.stats.Estimate` (``results/<model>/<dataset>.json``,
key ``estimates``):

- a metric that is the mean of per-sample scores (accuracy, exact / numeric match, pass@k,
  judge scores): the standard error of the mean, clustered when the dataset declares
  ``eval_cfg.cluster_key`` (a column of its rows: MMLU's subject, a shared passage);
- any other numeric metric (a corpus F1, BLEU, a perplexity over tokens: what an evaluator's
  ``score`` computes over all samples at once): a seeded bootstrap over the samples
  (``method='bootstrap'``, seed 0, 1000 resamples);
- a count (``BaseEvaluator.count_metrics``, such as the judge's unparsed answers): no interval;
- an lm-eval dataset: lm-eval's own ``<metric>_stderr,<filter>`` (``method='lm-eval'``,
  interval ``± 1.96 stderr``).

Per-sample scores of the mean metrics go into each details line (``scores``, and ``cluster``
when declared): the summary pairs them by sample id for paired differences between models.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable
from typing import Any

from orchestra.datasets.base import build_dataset
from orchestra.errors import TaskFailedError
from orchestra.evaluators import BaseEvaluator
from orchestra.stats import Estimate, bootstrap_estimate, mean_estimate

#: resamples and seed of the bootstrap of metrics that are not per-sample means
BOOTSTRAP_REPS = 1000
BOOTSTRAP_SEED = 0
#: the two-sided 95% normal quantile, for lm-eval's stderr (lm-eval reports no interval)
Z_95 = 1.959963984540054


def cluster_labels(dataset: dict[str, Any], details: list[dict[str, Any]]) -> list[Hashable] | None:
    """The cluster of each details line (``eval_cfg.cluster_key``'s column of its row), or None
    when the dataset declares none."""
    key = (dataset.get("eval_cfg") or {}).get("cluster_key")
    if not key:
        return None
    rows = build_dataset(dataset).rows()
    labels: list[Hashable] = []
    for d in details:
        i = int(d["id"])
        row = rows[i] if 0 <= i < len(rows) else {}
        if key not in row:
            raise TaskFailedError(f"{dataset.get('abbr')}: row {i} has no column {key!r} (eval_cfg.cluster_key); "
                                  "every row needs its cluster")
        label = row[key]
        labels.append(label if isinstance(label, (str, int, float, bool)) or label is None
                      else json.dumps(label, sort_keys=True, default=str))
    return labels


def _is_mean(scores: list[float | None], value: float) -> bool:
    """Whether ``value`` is the mean of ``scores`` (None and NaN left out)."""
    xs = [x for x in scores if x is not None and not math.isnan(x)]
    if not xs or not math.isfinite(value):
        return False
    return abs(math.fsum(xs) / len(xs) - value) <= 1e-9 * max(1.0, abs(value))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def evaluator_estimates(dataset: dict[str, Any], evaluator: BaseEvaluator, records: list[dict[str, Any]],
                        metrics: dict[str, Any], details: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each numeric metric's estimate (JSON); the per-sample scores of the mean metrics (and
    the clusters) are added to ``details`` in place."""
    clusters = cluster_labels(dataset, details)
    scores = evaluator.sample_scores(records, details)
    out: dict[str, dict[str, Any]] = {}
    kept: dict[str, list[float | None]] = {}
    n = len(details)
    for name, raw in metrics.items():
        value = _number(raw)
        if value is None:
            continue
        per = scores.get(name)
        if name in evaluator.count_metrics:
            est = Estimate(value, None, None, n, "none", note="a count, not an estimate: no interval")
        elif per is not None and len(per) == n and _is_mean(per, value):
            est = mean_estimate(per, clusters)  # type: ignore[arg-type]
            kept[name] = per
        elif math.isfinite(value) and n:
            est = bootstrap_estimate(list(range(n)), _statistic(evaluator, records, details, name),
                                     seed=BOOTSTRAP_SEED, reps=BOOTSTRAP_REPS)
            if clusters is not None and est.method == "bootstrap":
                est = Estimate(est.value, est.stderr, est.ci, est.n, est.method,
                               note="samples resampled one by one (the clusters are not)")
        else:
            est = Estimate(value, None, None, n, "none", note="the metric is not a finite number")
        out[name] = est.to_json()
    for i, d in enumerate(details):
        if kept:
            d["scores"] = {name: per[i] for name, per in kept.items()}
        if clusters is not None:
            d["cluster"] = clusters[i]
    return out


def _statistic(evaluator: BaseEvaluator, records: list[dict[str, Any]], details: list[dict[str, Any]],
               name: str) -> Callable[[Any], float]:
    """The metric ``name`` of a resample of sample indices."""

    def stat(idx: Any) -> float:
        value = evaluator.metrics_of([records[i] for i in idx], [details[i] for i in idx]).get(name)
        return math.nan if _number(value) is None else float(value)  # type: ignore[arg-type]

    return stat


def lmeval_estimates(metrics: dict[str, Any], details: list[dict[str, Any]], n: int) -> dict[str, dict[str, Any]]:
    """lm-eval's own standard errors: ``<metric>,<filter>`` with ``<metric>_stderr,<filter>``
    (interval ``± 1.96 stderr``, ``n`` documents).  Per-document scores (details lines of that
    filter with the metric) go into ``details`` where their mean is the metric, for pairing."""
    out: dict[str, dict[str, Any]] = {}
    for key, raw in metrics.items():
        value = _number(raw)
        name, _, filt = key.partition(",")
        if value is None or name.endswith("_stderr"):
            continue
        se = _number(metrics.get(f"{name}_stderr,{filt}"))
        if se is None or not math.isfinite(se) or not math.isfinite(value):
            est = Estimate(value, None, None, n, "lm-eval", note="lm-eval reports no stderr for it")
        else:
            est = Estimate(value, se, (value - Z_95 * se, value + Z_95 * se), n, "lm-eval")
        out[key] = est.to_json()
        rows = [d for d in details if d.get("filter", "none") == filt and _number(d.get(name)) is not None]
        per: list[float | None] = [float(d[name]) for d in rows]
        if rows and all(d.get("id") is not None for d in rows) and _is_mean(per, value):
            for d in rows:
                d.setdefault("scores", {})[key] = float(d[name])
    return out
