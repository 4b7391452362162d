"""The results table: models x datasets, from a run folder's results and events.

A cell is a metric with its standard error (``0.500 ± 0.035``, where the result states one:
docs/statistics.md), or ``-`` with the reason it is missing (which task failed, was
cancelled or never ran, and its log file).  The same table goes to stdout and to
``summary/summary.{csv,md,json}`` (the numbers of every estimate: ``summary.json`` and
``summary/estimates.csv``); ``--mode viz`` rebuilds it from the folder alone.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from typing import Any

from orchestra.events import iter_events
from orchestra.fileio import atomic_write_json, atomic_write_text
from orchestra.paths import RunPaths
from orchestra.stats import Estimate, format_pm
from orchestra.summary.logs import with_excerpt
from orchestra.tasks.spec import TaskSpec, Unit, output_done
from orchestra.terminal import printable


@dataclass
class Summary:
    """The table's content: rows of (dataset, metric) and one column per model."""

    models: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)  # {"dataset", "metric", model: value|None}
    missing: list[dict[str, str]] = field(default_factory=list)  # {"model", "dataset", "reason"}
    #: (dataset, metric, model) -> the metric's estimate (``Estimate.to_json()``: stderr, ci, n, method)
    estimates: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    #: results scored with prediction errors (``error_tolerance``): {"model", "dataset", "failed", "samples"}
    prediction_errors: list[dict[str, Any]] = field(default_factory=list)

    def error_lines(self) -> list[str]:
        """One line per result whose score counts samples that inference failed as wrong, so a
        tolerated failure is never shown as a whole result."""
        return [f"{e['model']} / {e['dataset']}: {e['failed']} of {e['samples']} samples failed at inference "
                "(within error_tolerance) and are counted as wrong" for e in self.prediction_errors]

    def estimate(self, row: dict[str, Any], model: str) -> dict[str, Any] | None:
        """The estimate of ``row``'s metric for ``model`` (None: the result has none)."""
        return self.estimates.get((row["dataset"], row["metric"], model))

    def cell(self, row: dict[str, Any], model: str) -> str:
        """A table cell: ``0.500 ± 0.035`` (value ± standard error) where the result states a
        standard error, else the value as :func:`metric_text` shows it."""
        value, est = row.get(model), self.estimate(row, model)
        if isinstance(value, (int, float)) and est is not None and est.get("stderr") is not None:
            return format_pm(Estimate.from_json({**est, "value": value}))
        return metric_text(value)

    def legend(self) -> str:
        """What the ``±`` of the table means, and which rows are not plain standard errors
        ('' when no cell shows one)."""
        shown = {(d, m): e["method"] for (d, m, _), e in self.estimates.items() if e.get("stderr") is not None}
        if not shown:
            return ""
        words = {"clustered": "clustered", "bootstrap": "bootstrap", "lm-eval": "lm-eval's own"}
        parts = []
        for method, word in words.items():
            rows = sorted({f"{d}/{m}" for (d, m), meth in shown.items() if meth == method})
            if rows:
                parts.append(f"{word}: {', '.join(rows)}")
        if any(e.get("stderr") is None and e.get("value") is not None for e in self.estimates.values()):
            parts.append("no ±: no standard error (every score equal, n < 2, or a count; the note in summary.json "
                         "says which)")
        return ("± is the standard error (95% intervals: summary/summary.json, the report)"
                + (f"; {'; '.join(parts)}" if parts else ""))


def _task_index(paths: RunPaths) -> dict[str, tuple[str, str]]:
    """Output path -> (task_id, stage), from the task specs written in the run folder."""
    index: dict[str, tuple[str, str]] = {}
    folder = os.path.join(paths.root, "tasks")
    if not os.path.isdir(folder):
        return index
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        try:
            spec = TaskSpec.load(os.path.join(folder, name))
        except (OSError, ValueError, SyntaxError):
            continue
        for unit in spec.units:
            index[unit.output] = (spec.task_id, spec.stage)
    return index


def _last_states(paths: RunPaths) -> dict[str, dict[str, Any]]:
    states: dict[str, dict[str, Any]] = {}
    for ev in iter_events(paths.events):
        if ev.get("event") in ("queued", "started", "retry", "done", "failed", "cancelled", "skipped"):
            states[ev["task_id"]] = ev
    return states


def _why(output: str, index: dict[str, tuple[str, str]], states: dict[str, dict[str, Any]], paths: RunPaths) -> str:
    if output not in index:
        return "not run yet"
    task_id, stage = index[output]
    ev = states.get(task_id)
    log_path = paths.task_log(stage, task_id)
    log = os.path.relpath(log_path, paths.root) if os.path.exists(log_path) else "none (it never started)"
    if ev is None:
        return f"{stage} task {task_id} not run"
    state = ev["event"]
    if state == "failed":
        reason = with_excerpt(str(ev.get("reason", "")), log_path, ev.get("attempt"))
        return f"{stage} task {task_id} failed ({reason}); log: {log}"
    if state == "cancelled":
        return f"{stage} task {task_id} was cancelled; log: {log}"
    if state == "skipped":
        return f"{stage} task {task_id} skipped ({ev.get('reason', '')})"
    return f"{stage} task {task_id} did not finish (last state: {state}); log: {log}"


def build_summary(paths: RunPaths, models: list[str], eval_units: list[tuple[str, Unit]]) -> Summary:
    """Collect every planned (model, dataset) result, or the reason it is missing."""
    index: dict[str, tuple[str, str]] | None = None  # read (every task spec, every event) only if a result is missing
    states: dict[str, dict[str, Any]] = {}
    summary = Summary(models=models)
    by_dataset: dict[str, dict[str, dict[str, float]]] = {}
    order: list[str] = []
    for model, unit in eval_units:
        if unit.dataset_abbr not in by_dataset:
            by_dataset[unit.dataset_abbr] = {}
            order.append(unit.dataset_abbr)
        if output_done(unit.output, unit.hash):
            with open(unit.output, encoding="utf-8") as f:
                result = json.load(f)
            by_dataset[unit.dataset_abbr][model] = result["metrics"]
            failed = result.get("num_failed_samples")
            if isinstance(failed, int) and failed > 0:
                summary.prediction_errors.append({"model": model, "dataset": unit.dataset_abbr, "failed": failed,
                                                  "samples": result.get("num_samples")})
            for metric, est in (result.get("estimates") or {}).items():
                summary.estimates[(unit.dataset_abbr, metric, model)] = est
            continue
        if index is None:
            index, states = _task_index(paths), _last_states(paths)
        reason = ""
        for pred, h in unit.inputs:
            if not output_done(pred, h):
                reason = _why(pred, index, states, paths)
                break
        if not reason:
            reason = _why(unit.output, index, states, paths)
        summary.missing.append({"model": model, "dataset": unit.dataset_abbr, "reason": reason})
    for dataset in order:
        metric_names: list[str] = []
        for metrics in by_dataset[dataset].values():
            metric_names += [m for m in metrics if m not in metric_names]
        # lm-eval's `<metric>_stderr,<filter>` is shown as the ± of `<metric>,<filter>`, not as a row
        metric_names = [m for m in metric_names if not _folded(summary, dataset, m)]
        for metric in metric_names or ["-"]:
            row: dict[str, Any] = {"dataset": dataset, "metric": metric}
            for model in models:
                row[model] = by_dataset[dataset].get(model, {}).get(metric)
            summary.rows.append(row)
    return summary


def _folded(summary: Summary, dataset: str, metric: str) -> bool:
    """Whether ``metric`` is lm-eval's standard error of another metric of ``dataset`` that
    carries it as its estimate (then the table shows it as that metric's ``±``)."""
    name, sep, filt = metric.partition(",")
    if not sep or not name.endswith("_stderr"):
        return False
    base = f"{name[:-len('_stderr')]},{filt}"
    return any(d == dataset and m == base and e.get("method") == "lm-eval"
               for (d, m, _), e in summary.estimates.items())


def metric_text(value: Any, signed: bool = False) -> str:
    """A metric as a table shows it: a number with four decimals (``signed``: with its sign),
    ``-`` for none, and anything else an evaluator of the user's own returned (a grade, a
    list) as short text."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:+.4f}" if signed else f"{value:.4f}"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:59] + "…"


def md_cell(text: Any) -> str:
    """``text`` as one Markdown table cell (or list item): ``|`` and ``\\`` escaped, line breaks
    made spaces, so an abbr such as ``a|b`` can never add a column or shift the row.  Text from
    outside (an endpoint's error quoted as a reason) is made inert: terminal control removed
    (the file is read with ``cat``), ``&``, ``<``, ``>`` written as entities and ``[``, ``]``
    escaped (a Markdown viewer shows them as text, never as HTML, a link or an image to fetch)."""
    flat = " ".join(str(text).replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    flat = printable(flat).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return flat.replace("\\", "\\\\").replace("|", "\\|").replace("[", "\\[").replace("]", "\\]")


def md_row(cells: list[Any]) -> str:
    """One Markdown table row of ``cells``, each escaped with :func:`md_cell`."""
    return "| " + " | ".join(md_cell(c) for c in cells) + " |"


def render_markdown(summary: Summary) -> str:
    header = ["dataset", "metric", *summary.models]
    lines = [md_row(header), "|" + "---|" * len(header)]
    for row in summary.rows:
        lines.append(md_row([row["dataset"], row["metric"], *(summary.cell(row, m) for m in summary.models)]))
    if summary.legend():
        lines += ["", md_cell(f"({summary.legend()})")]
    if summary.prediction_errors:
        lines += ["", "Prediction errors:"] + [f"- {md_cell(text)}" for text in summary.error_lines()]
    if summary.missing:
        lines.append("")
        lines.append("Missing results:")
        for miss in summary.missing:
            lines.append(f"- {md_cell(miss['model'])} / {md_cell(miss['dataset'])}: {md_cell(miss['reason'])}")
    return "\n".join(lines) + "\n"


def render_text(summary: Summary) -> str:
    header = ["dataset", "metric", *summary.models]
    body = [[row["dataset"], row["metric"], *(summary.cell(row, m) for m in summary.models)] for row in summary.rows]
    widths = [max(len(str(r[i])) for r in [header, *body]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in body]
    if summary.legend():
        lines.append(f"({summary.legend()})")
    lines += [f"! {text}" for text in summary.error_lines()]
    for miss in summary.missing:
        lines.append(f"- {miss['model']} / {miss['dataset']}: {miss['reason']}")
    return "\n".join(lines) + "\n"


def write_summary(summary: Summary, paths: RunPaths) -> None:
    """Write ``summary.{md,csv,json}`` atomically into the run's summary folder."""
    folder = paths.summary_dir
    os.makedirs(folder, exist_ok=True)
    atomic_write_text(os.path.join(folder, "summary.md"), render_markdown(summary))
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["dataset", "metric", *summary.models])
    for row in summary.rows:
        writer.writerow([row["dataset"], row["metric"], *("-" if row[m] is None else row[m] for m in summary.models)])
    atomic_write_text(os.path.join(folder, "summary.csv"), buf.getvalue())
    estimates = [{"dataset": d, "metric": m, "model": model, **est}
                 for (d, m, model), est in summary.estimates.items()]
    atomic_write_json(
        os.path.join(folder, "summary.json"),
        {"models": summary.models, "rows": summary.rows, "missing": summary.missing, "estimates": estimates,
         "prediction_errors": summary.prediction_errors},
    )
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow([*ESTIMATE_COLUMNS])
    for e in estimates:
        ci = e.get("ci") or [None, None]
        writer.writerow(["" if v is None else v for v in (
            e["dataset"], e["metric"], e["model"], e.get("value"), e.get("stderr"), ci[0], ci[1], e.get("n"),
            e.get("method"), e.get("clusters"), e.get("note"))])
    atomic_write_text(os.path.join(folder, "estimates.csv"), buf.getvalue())


#: the columns of ``summary/estimates.csv``: one line per (dataset, metric, model)
ESTIMATE_COLUMNS = ("dataset", "metric", "model", "value", "stderr", "ci_low", "ci_high", "n", "method", "clusters",
                    "note")
