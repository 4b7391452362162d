"""Paired differences inside a run: each model against the baseline, on the same samples.

For every dataset and every metric that is a mean of per-sample scores (the eval task writes
them into each details line, :mod:`orchestra.tasks.errorbars`), each model's scores are paired
with the baseline's by sample id, and :func:`orchestra.stats.paired` gives the difference
(model minus baseline), its paired standard error and 95% interval, a p-value (McNemar's exact
test for 0/1 scores, else the paired t-test; a clustered t when the dataset declares
clusters) and the discordant counts.  Holm's correction runs over every pair of the run that
has a p-value.  The baseline is ``summarizer=dict(baseline='<abbr>')``, else the first model.
The result goes to the printed table (a compact section), ``summary/comparison.json`` and
the report.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from orchestra.fileio import atomic_write_json
from orchestra.paths import RunPaths
from orchestra.stats import holm, paired
from orchestra.tasks.spec import Unit, output_done

DIRECTION = "model minus baseline, on the samples both scored"
TESTS = "McNemar's exact test for 0/1 scores, the paired t-test otherwise (clustered t with clusters)"


@dataclass
class Comparison:
    """Every model against the baseline, per dataset and metric (rows: ``Paired.to_json()`` plus
    dataset, metric, model, baseline and the baseline's and the model's means)."""

    baseline: str
    pairs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tests(self) -> int:
        """How many p-values Holm's correction ran over."""
        return sum(1 for p in self.pairs if p["p_value"] is not None)

    def to_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "direction": DIRECTION, "tests": TESTS,
                "correction": {"method": "holm", "family_size": self.tests,
                               "family": "every (dataset, metric, model) pair of this run with a p-value"},
                "pairs": self.pairs}


def _scores(paths: RunPaths, model: str, dataset: str) -> tuple[dict[int, dict[str, Any]], dict[int, Any]]:
    """Per sample id: its metric scores, and its cluster (from the details file)."""
    scores: dict[int, dict[str, Any]] = {}
    clusters: dict[int, Any] = {}
    path = paths.details(model, dataset)
    if not os.path.exists(path):
        return scores, clusters
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if not isinstance(d, dict) or not isinstance(d.get("id"), int) or not isinstance(d.get("scores"), dict):
                continue
            scores.setdefault(d["id"], {}).update(d["scores"])
            if "cluster" in d:
                clusters[d["id"]] = d["cluster"]
    return scores, clusters


def _mean(xs: list[Any]) -> float | None:
    vals = [float(x) for x in xs if isinstance(x, (int, float)) and x == x]
    return sum(vals) / len(vals) if vals else None


def build_comparison(paths: RunPaths, models: list[str], eval_units: list[tuple[str, Unit]],
                     baseline: str | None) -> Comparison | None:
    """The paired differences of a run with two models or more (None with one)."""
    if len(models) < 2:
        return None
    base = baseline if baseline in models else models[0]
    done: dict[str, set[str]] = {}
    order: list[str] = []
    for model, unit in eval_units:
        if unit.dataset_abbr not in done:
            done[unit.dataset_abbr] = set()
            order.append(unit.dataset_abbr)
        if output_done(unit.output, unit.hash):
            done[unit.dataset_abbr].add(model)
    comparison = Comparison(base)
    for dataset in order:
        if base not in done[dataset]:
            continue
        b_scores, b_clusters = _scores(paths, base, dataset)
        metrics: list[str] = []
        for per in b_scores.values():
            metrics += [m for m in per if m not in metrics]
        for model in models:
            if model == base or model not in done[dataset]:
                continue
            a_scores, _ = _scores(paths, model, dataset)
            for metric in metrics:
                ids = sorted(i for i in b_scores if metric in b_scores[i] and metric in a_scores.get(i, {}))
                if not ids:
                    continue
                a = [a_scores[i][metric] for i in ids]
                b = [b_scores[i][metric] for i in ids]
                clusters = [b_clusters.get(i) for i in ids] if b_clusters else None
                result = paired(a, b, clusters).to_json()
                unpaired = len({i for i in b_scores if metric in b_scores[i]} ^ {
                    i for i in a_scores if metric in a_scores[i]})
                if unpaired:
                    result["note"] = "; ".join(x for x in (result["note"], f"samples scored by one model only: "
                                                           f"{unpaired}") if x)
                comparison.pairs.append({"dataset": dataset, "metric": metric, "model": model, "baseline": base,
                                         "model_mean": _mean(a), "baseline_mean": _mean(b), **result})
    adjusted = holm([p["p_value"] for p in comparison.pairs])
    for p, adj in zip(comparison.pairs, adjusted, strict=True):
        p["p_holm"] = adj
    return comparison


def p_text(p: float | None) -> str:
    """A p-value as the table shows it."""
    if p is None:
        return "-"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def pair_cells(p: dict[str, Any]) -> list[str]:
    """One pair's cells: dataset, metric, model, diff ± stderr, 95% CI, p, p (Holm), +/-."""
    diff = "n/a" if p["diff"] is None else f"{p['diff']:+.3f}"
    if p["diff"] is not None and p["stderr"] is not None:
        diff += f" ± {p['stderr']:.3f}"
    ci = "-" if p["ci"] is None else f"[{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}]"
    flips = "-" if p["a_only"] is None else f"{p['a_only']}/{p['b_only']}"
    return [p["dataset"], p["metric"], p["model"], diff, ci, p_text(p["p_value"]), p_text(p["p_holm"]), flips]


PAIR_HEADER = ["dataset", "metric", "model", "diff ± se", "95% CI", "p", "p (Holm)", "+/-"]


def render_comparison(comparison: Comparison) -> str:
    """The compact section under the results table."""
    if not comparison.pairs:
        return ""
    rows = [PAIR_HEADER, *(pair_cells(p) for p in comparison.pairs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(PAIR_HEADER))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [f"Paired differences against {comparison.baseline} (model minus baseline on the same samples; "
             f"p: McNemar exact for 0/1 scores, else paired t; Holm over {comparison.tests} tests; "
             "+/-: samples only the model got right / only the baseline):",
             fmt.format(*rows[0]), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in rows[1:])]
    return "\n".join(lines) + "\n"


def write_comparison(comparison: Comparison, paths: RunPaths) -> str:
    """``summary/comparison.json``, written atomically; its path."""
    path = os.path.join(paths.summary_dir, "comparison.json")
    atomic_write_json(path, comparison.to_json())
    return path
