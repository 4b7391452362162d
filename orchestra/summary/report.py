"""``summary/report.html``: one self-contained page that shows a run.

Failures first (each with the line of its log that explains it), then the results table
(sortable, a bar in each cell, a small chart per dataset, per-sample drill-down), the
timeline (one row per worker slot, one bar per attempt, coloured by outcome) and what each
model cost.  The page is rendered with Jinja2 from ``report_assets/``; its CSS and JS are
inlined and it loads nothing from the network, so it works offline and as a mail
attachment.  The table, charts, failures and costs are plain HTML (readable even where
scripts are blocked); the timeline, sorting and the drill-down need JavaScript.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any

from orchestra.fileio import atomic_write_text
from orchestra.paths import RunPaths
from orchestra.summary.costs import cost_of
from orchestra.summary.gpu import gpu_report
from orchestra.summary.runlog import OUTCOMES, RunLog, read_run
from orchestra.summary.samples import DEFAULT_BUDGET_BYTES, SampleIndex, build_samples, pack_json
from orchestra.summary.table import Summary
from orchestra.summary.trace import write_trace
from orchestra.tasks.spec import Unit

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report_assets")
_BAD_STATES = ("failed", "cancelled", "skipped")


def _version() -> str:
    """orchestra's installed version (not ``orchestra.__version__``: importing the package
    root reaches the API layer above this one)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("orchestra")
    except PackageNotFoundError:
        return "?"


@dataclass
class ReportFiles:
    """What :func:`write_report` wrote."""

    report: str
    trace: str


def _finite(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None (``JSON.parse`` refuses them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def script_json(obj: Any) -> str:
    """JSON to put inside a ``<script>`` element: ``<`` escaped, so no text closes it."""
    text = json.dumps(_finite(obj), ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{seconds:.1f} s"


def _results(summary: Summary, samples: SampleIndex) -> dict[str, Any]:
    pair_ids = {key: n for n, key in enumerate(samples.pairs)}
    missing = {(m["model"], m["dataset"]): m["reason"] for m in summary.missing}
    rows: list[dict[str, Any]] = []
    charts: list[dict[str, Any]] = []
    seen: set[str] = set()
    for row in summary.rows:
        values: list[float | None] = []
        for m in summary.models:
            v = row.get(m)
            values.append(float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None)
        finite = [v for v in values if v is not None]
        scale = max(finite) if finite and max(finite) > 1 else 1.0
        best = max(finite) if finite else None
        cells = []
        for model, value in zip(summary.models, values):
            frac = max(value, 0.0) / scale if value is not None else 0.0
            cells.append({"model": model, "value": value,
                          "text": summary.cell(row, model) if value is not None else "-",
                          "pct": round(100 * frac, 1), "frac": frac,
                          "best": value is not None and len(finite) > 1 and value == best,
                          "why": missing.get((model, row["dataset"]), "" if value is not None else "no value"),
                          "pair": pair_ids.get(f"{model}\u0000{row['dataset']}"),
                          **_interval(summary.estimate(row, model) if value is not None else None, scale)})
        rows.append({"dataset": row["dataset"], "metric": row["metric"], "cells": cells})
        if row["dataset"] not in seen:  # the first metric of a dataset is its headline
            seen.add(row["dataset"])
            charts.append({"dataset": row["dataset"], "metric": row["metric"], "bars": cells})
    return {"models": summary.models, "rows": rows, "charts": charts, "missing": summary.missing}


def _interval(est: dict[str, Any] | None, scale: float) -> dict[str, Any]:
    """A cell's 95% interval for drawing (``lo``/``hi``: fractions of the bar's scale, clipped
    to it) and its words for the tooltip; empty without an interval."""
    if est is None or not est.get("ci"):
        return {"ci": None, "ci_text": est.get("note", "") if est else ""}
    lo, hi = (float(x) for x in est["ci"])
    method = {"clt": "standard error", "clustered": f"clustered standard error, {est.get('clusters')} clusters",
              "bootstrap": "bootstrap", "lm-eval": "lm-eval's standard error"}.get(est["method"], est["method"])
    return {"ci": [lo, hi], "lo": min(max(lo / scale, 0.0), 1.0), "hi": min(max(hi / scale, 0.0), 1.0),
            "ci_text": f"95% interval [{lo:.3f}, {hi:.3f}], n = {est.get('n')} ({method})"}


def _comparison(comparison: Any) -> dict[str, Any] | None:
    """The paired differences for the page: rows with their interval placed on one axis
    symmetric around 0 (``x0``, ``x1``, ``xd``: fractions of its width)."""
    if comparison is None or not comparison.pairs:
        return None
    from orchestra.summary.paired import PAIR_HEADER, pair_cells

    reach = max([abs(v) for p in comparison.pairs for v in (p["ci"] or [p["diff"] or 0.0])] + [1e-9]) * 1.1
    rows = []

    def pos(v: float) -> float:
        return 0.5 + 0.5 * float(v) / reach

    for p in comparison.pairs:
        rows.append({"cells": pair_cells(p), "note": p.get("note", ""), "diff": p["diff"],
                     "xd": pos(p["diff"]) if p["diff"] is not None else None,
                     "x0": pos(p["ci"][0]) if p["ci"] else None, "x1": pos(p["ci"][1]) if p["ci"] else None,
                     "significant": p["p_holm"] is not None and p["p_holm"] < 0.05})
    return {"baseline": comparison.baseline, "tests": comparison.tests, "header": PAIR_HEADER, "rows": rows,
            "reach": reach}


def _failures(run: RunLog, report_dir: str) -> list[dict[str, Any]]:
    out = []
    for rec in run.tasks.values():
        if rec.state not in _BAD_STATES:
            continue
        last = rec.attempts[-1] if rec.attempts else None
        reason = rec.reason
        if last is not None and last.explanation and last.explanation not in reason:
            reason = f"{reason}; {last.explanation}" if reason else last.explanation
        out.append({"name": rec.name or rec.task_id, "task_id": rec.task_id, "stage": rec.stage,
                    "state": rec.state, "reason": reason or rec.state, "attempts": len(rec.attempts),
                    "log": rec.log, "log_rel": os.path.relpath(rec.log, report_dir) if rec.log else "",
                    "tail": last.tail if last is not None else ""})
    order = {"failed": 0, "cancelled": 1, "skipped": 2}
    return sorted(out, key=lambda f: (order[f["state"]], f["stage"] != "infer", f["name"]))


def _costs(run: RunLog, models: list[str], prices: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    totals: dict[str, float] = {}
    counted = False
    for model in models:
        u = run.usage.get(model)
        if u is None:
            continue
        counted |= u.prompt_tokens is not None
        cost = cost_of(u, prices.get(model))
        if cost is not None:
            totals[cost["currency"]] = totals.get(cost["currency"], 0.0) + cost["amount"]
        rows.append({"model": model, "kind": "API" if u.api else "local", "u": u, "cost": cost,
                     "task_time": _duration(u.task_s), "gpu_hours": u.gpu_s / 3600})
    return {"rows": rows, "totals": totals, "priced": bool(prices),
            "tokens_counted": counted}


def _timeline(run: RunLog, report_dir: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The timeline's payload, in two parts: what drawing needs (arrays of numbers and indexes
    into short lists: 10,000 attempts take ~0.4 MB) and what only a hover shows (task names, log
    paths, each attempt's reason and log tail), which the page gets compressed and inflates on
    the first visit to the timeline."""
    attempts = run.attempts
    t0 = min([a.start for a in attempts] + [i.started for i in run.invocations] or [time.time()])
    names: dict[str, list[str]] = {"stages": [], "models": [], "hosts": [], "runners": []}
    index: dict[tuple[str, str], int] = {}

    def num(kind: str, value: str) -> int:
        key = (kind, value)
        if key not in index:
            index[key] = len(names[kind])
            names[kind].append(value)
        return index[key]

    tasks: list[list[int]] = []
    task_details: list[list[str]] = []
    task_index: dict[str, int] = {}
    rows: list[list[Any]] = []
    tails: list[list[Any]] = []
    rel_dirs: dict[str, str] = {}  # log folder -> relative to the report (relpath per log is slow at 10,000)
    for a in attempts:
        if a.task_id not in task_index:
            rec = run.tasks[a.task_id]
            task_index[a.task_id] = len(tasks)
            log = ""
            if rec.log:
                folder, name = os.path.split(rec.log)
                if folder not in rel_dirs:
                    rel_dirs[folder] = os.path.relpath(folder or ".", report_dir)
                log = os.path.join(rel_dirs[folder], name)
            tasks.append([num("stages", rec.stage), num("models", rec.model)])
            task_details.append([rec.name or a.task_id, a.task_id, log])
        rows.append([task_index[a.task_id], a.attempt, round(a.start - t0, 3), round(a.duration_s, 3),
                     OUTCOMES.index(a.outcome), a.exit_code, a.slot, num("hosts", a.host or a.runner or ""),
                     ",".join(a.gpu_ids), a.invocation, num("runners", a.runner or "")])
        tails.append([a.reason, a.explanation, a.tail, {k: v for k, v in a.where.items() if k != "host"}])
    invocations = [{"index": i.index, "start": round(i.started - t0, 3),
                    "end": round((i.finished or i.started) - t0, 3), "mode": i.mode, "interrupted": i.interrupted}
                   for i in run.invocations]
    return ({"t0": t0, "outcomes": list(OUTCOMES), **names, "tasks": tasks, "attempts": rows,
             "invocations": invocations}, {"tasks": task_details, "tails": tails})


def _overview(run: RunLog, summary: Summary, costs: dict[str, Any]) -> dict[str, Any]:
    states: dict[str, int] = {}
    for rec in run.tasks.values():
        states[rec.state] = states.get(rec.state, 0) + 1
    attempts = run.attempts
    wall = sum((i.finished or i.started) - i.started for i in run.invocations)
    return {"tasks": len(run.tasks), "states": states, "attempts": len(attempts),
            "retried": sum(1 for a in attempts if a.outcome in ("retried", "timed_out") and a.end is not None
                           and any(b.attempt > a.attempt for b in run.tasks[a.task_id].attempts)),
            "samples": sum(u.samples_done for u in run.usage.values()),
            "samples_failed": sum(u.samples_failed for u in run.usage.values()),
            "wall": _duration(wall), "invocations": len(run.invocations),
            "results": sum(1 for row in summary.rows for m in summary.models if row.get(m) is not None),
            "missing": len(summary.missing), "costs": costs["totals"]}


def render_report(paths: RunPaths, summary: Summary, eval_units: list[tuple[str, Unit]], run: RunLog,
                  prices: dict[str, dict[str, Any]] | None = None,
                  sample_budget_bytes: int = DEFAULT_BUDGET_BYTES, comparison: Any = None) -> str:
    """The report's HTML."""
    import jinja2

    report_dir = paths.summary_dir
    headline: dict[str, str] = {}
    for row in summary.rows:
        headline.setdefault(row["dataset"], row["metric"])
    samples = build_samples(paths, eval_units, headline, sample_budget_bytes)
    costs = _costs(run, summary.models, prices or {})
    timeline, details = _timeline(run, report_dir)
    overview = _overview(run, summary, costs)
    timeline["gpu"], overview["gpu_busy"] = gpu_report(paths, run, timeline["t0"])  # None, [] unsampled
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ASSETS), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    with open(os.path.join(ASSETS, "report.css"), encoding="utf-8") as f:
        css = f.read()
    js = ""
    for script in ("report.js", "timeline.js"):
        with open(os.path.join(ASSETS, script), encoding="utf-8") as f:
            js += f.read()
    return env.get_template("report.html.j2").render(
        title=os.path.basename(paths.root.rstrip(os.sep)), root=paths.root, version=_version(),
        generated=time.strftime("%Y-%m-%d %H:%M:%S"), overview=overview,
        results=_results(summary, samples), comparison=_comparison(comparison), legend=summary.legend(),
        prediction_errors=summary.error_lines(),
        failures=_failures(run, report_dir), costs=costs,
        prices=prices or {}, samples=samples, css=css, js=js.replace("</", "<\\/"),
        timeline_json=script_json(timeline), timeline_details=pack_json(_finite(details)),
        pairs_json=script_json(list(samples.pairs.values())),
    )


def write_report(paths: RunPaths, summary: Summary, eval_units: list[tuple[str, Unit]],
                 api_models: set[str] | None = None, prices: dict[str, dict[str, Any]] | None = None,
                 trace_path: str | None = None, comparison: Any = None) -> ReportFiles:
    """Write ``summary/report.html`` and the Chrome trace (``summary/trace.json``, or
    ``trace_path`` as well when given) for the run in ``paths``."""
    run = read_run(paths, api_models or set())
    os.makedirs(paths.summary_dir, exist_ok=True)
    report = os.path.join(paths.summary_dir, "report.html")
    atomic_write_text(report, render_report(paths, summary, eval_units, run, prices, comparison=comparison))
    trace = os.path.join(paths.summary_dir, "trace.json")
    write_trace(run, paths, trace)
    if trace_path and os.path.abspath(trace_path) != trace:
        write_trace(run, paths, trace_path)
    return ReportFiles(report, trace)
