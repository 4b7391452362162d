"""Reduce a sweep to one table: base model x base dataset x metric, one column per setting.

The summary table has one column per model variant and one row per dataset variant; a
sweep's reader wants the swept settings side by side instead.  Each variant carries its
labels (``{'temperature': 'temperature=0.7', 'prompt_template': 'cot'}``); a cell's column is
the combination of its model's and its dataset's labels.  With a baseline
(``sweep.baseline``), every other column of a row also gets its difference to the baseline.
A cell shows its standard error where its result states one (``0.500 ± 0.035``).
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from typing import Any

from orchestra.fileio import atomic_write_json, atomic_write_text
from orchestra.paths import RunPaths
from orchestra.summary.table import Summary, md_row, metric_text


@dataclass
class Pivot:
    """Rows of (model, dataset, metric) with one value per setting column, and deltas."""

    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)  # model, dataset, metric, values, deltas
    baseline: str | None = None  # the baseline's value names, for the caption
    delta_columns: list[str] = field(default_factory=list)  # columns with a difference to their baseline


def _column(labels: dict[str, str], axes: list[str]) -> str:
    return ", ".join(labels[a] for a in axes if a in labels) or "-"


def build_pivot(summary: Summary, sweep: dict[str, Any]) -> Pivot:
    """The pivot of ``summary`` by a sweep's expansion (``SweepInfo.to_dict()``: ``axes``,
    ``variants``, ``baseline``; a plain dict, as the run folder's config.py keeps it)."""
    axes: list[str] = list(sweep.get("axes", []))
    chosen: dict[str, str] = dict(sweep.get("baseline") or {})
    variants = sweep.get("variants", {})
    models = variants.get("models", {})
    datasets = variants.get("datasets", {})
    cells: dict[tuple[str, str, str], dict[str, Any]] = {}
    errors: dict[tuple[str, str, str], dict[str, float]] = {}  # standard errors, where stated
    columns: list[str] = []
    labels_of: dict[str, dict[str, str]] = {}
    for row in summary.rows:
        dvar = datasets.get(row["dataset"], {"base": row["dataset"], "labels": {}})
        for model in summary.models:
            mvar = models.get(model, {"base": model, "labels": {}})
            labels = {**mvar["labels"], **dvar["labels"]}
            column = _column(labels, axes)
            if column not in columns:
                columns.append(column)
                labels_of[column] = labels
            cells.setdefault((mvar["base"], dvar["base"], row["metric"]), {})[column] = row.get(model)
            est = summary.estimate(row, model)
            if est is not None and est.get("stderr") is not None:
                errors.setdefault((mvar["base"], dvar["base"], row["metric"]), {})[column] = est["stderr"]
    # Each column's baseline: the same settings with the baseline's values on its axes
    # (so a baseline over some axes compares like with like on the others).
    against = {c: _column({**labels_of[c], **chosen}, axes) for c in columns} if chosen else {}
    pivot = Pivot(columns, baseline=", ".join(chosen.values()) if chosen else None)
    pivot.delta_columns = [c for c in columns if against.get(c, c) != c and against[c] in columns]
    for (model, dataset, metric), values in cells.items():
        deltas = {}
        for c in pivot.delta_columns:
            v, b = values.get(c), values.get(against[c])
            deltas[c] = v - b if isinstance(v, (int, float)) and isinstance(b, (int, float)) else None
        pivot.rows.append({"model": model, "dataset": dataset, "metric": metric, "values": values, "deltas": deltas,
                           "stderr": errors.get((model, dataset, metric), {})})
    return pivot


_cell = metric_text


def _pm(value: Any, stderr: float | None) -> str:
    """``0.500 ± 0.035`` where a standard error is stated, else the value as the table shows it."""
    if isinstance(value, (int, float)) and stderr is not None:
        return f"{value:.3f} ± {stderr:.3f}"
    return _cell(value)


def _table(pivot: Pivot) -> tuple[list[str], list[list[str]]]:
    header = ["model", "dataset", "metric", *pivot.columns]
    header += [f"Δ {c}" for c in pivot.delta_columns]
    body = []
    for row in pivot.rows:
        cells = [row["model"], row["dataset"], row["metric"],
                 *(_pm(row["values"].get(c), row.get("stderr", {}).get(c)) for c in pivot.columns)]
        cells += [_cell(row["deltas"].get(c), signed=True) for c in pivot.delta_columns]
        body.append(cells)
    return header, body


def render_pivot(pivot: Pivot) -> str:
    """The pivot as aligned text (``Δ`` columns: difference to the baseline column)."""
    header, body = _table(pivot)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in body)]
    if pivot.baseline:
        lines.append(f"(Δ: difference to the same settings with {pivot.baseline})")
    return "\n".join(lines) + "\n"


def write_pivot(pivot: Pivot, paths: RunPaths) -> None:
    """``summary/pivot.{md,csv,json}``, written atomically."""
    header, body = _table(pivot)
    folder = paths.summary_dir
    os.makedirs(folder, exist_ok=True)
    md = [md_row(header), "|" + "---|" * len(header), *(md_row(r) for r in body)]
    atomic_write_text(os.path.join(folder, "pivot.md"), "\n".join(md) + "\n")
    buf = io.StringIO()
    csv.writer(buf).writerows([header, *body])
    atomic_write_text(os.path.join(folder, "pivot.csv"), buf.getvalue())
    atomic_write_json(os.path.join(folder, "pivot.json"),
                      {"columns": pivot.columns, "baseline": pivot.baseline, "delta_columns": pivot.delta_columns,
                       "rows": pivot.rows})
