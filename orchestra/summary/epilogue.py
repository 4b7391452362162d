"""The end of every run, written once: the results table, the paired differences between its
models, a sweep's pivot, what failed, the report.

``orchestra.run`` calls it after its stages, ``orchestra.viz`` (``--mode viz``) on a finished run
folder; both print the same lines in the same order and leave the same files in ``summary/``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from orchestra.fileio import writers_lock
from orchestra.paths import RunPaths
from orchestra.summary.logs import with_excerpt
from orchestra.summary.table import Summary, build_summary, render_text, write_summary
from orchestra.terminal import say


@dataclass
class Ending:
    """What the epilogue built: the summary, a sweep's pivot, the report (None if not written), and
    the results of the tasks that did not end done."""

    summary: Summary
    pivot: Any = None
    report: str | None = None
    bad: list[Any] = field(default_factory=list)
    comparison: Any = None  # paired differences against the baseline (summary/paired.py); None: one model


def epilogue(paths: RunPaths, cfg: Any, made: Any, results: list[Any], prices: dict[str, Any], trace: str | None,
             quiet: bool, debug: bool = False, keep_current: bool = False) -> Ending:
    """Build and write the summary of ``paths`` (``cfg``: the validated config, ``made``: its plan),
    print it, name each task of ``results`` (``TaskResult``) that did not end done, then write the
    report; the last lines name the run folder and the report.  ``keep_current``: keep a report
    that already shows everything (:mod:`orchestra.summary.fresh`: a ``-r`` that ran nothing)."""
    os.makedirs(paths.summary_dir, exist_ok=True)
    with writers_lock(paths.summary_lock):  # a -r starting now leaves our temporary files alone
        return _write(paths, cfg, made, results, prices, trace, quiet, debug, keep_current)


def _write(paths: RunPaths, cfg: Any, made: Any, results: list[Any], prices: dict[str, Any], trace: str | None,
           quiet: bool, debug: bool, keep_current: bool = False) -> Ending:
    """The epilogue's work, under the summary folder's writers lock."""
    summary = build_summary(paths, [m["abbr"] for m in cfg.models], made.all_units["eval"])
    write_summary(summary, paths)
    say(render_text(summary), quiet=quiet)
    comparison = _comparison(paths, cfg, made, quiet)
    pivot = _pivot(cfg, summary, paths, quiet)
    bad = [r for r in results if r.state.value != "done"]
    for r in bad:
        log = f"; log: {r.log_path}" if os.path.exists(r.log_path) else ""
        reason = with_excerpt(r.reason, r.log_path) if r.state.value == "failed" else r.reason
        say(f"{r.state.value.upper()}: {r.stage} task {r.task_id} ({reason}){log}", file=sys.stderr, quiet=quiet)
    say(f"run folder: {paths.root}", file=sys.stderr, quiet=quiet)
    report = _report(paths, cfg, summary, made, prices, trace, quiet, debug, comparison,
                     keep_current and trace is None)
    return Ending(summary, pivot, report, bad, comparison)


def _report(paths: RunPaths, cfg: Any, summary: Summary, made: Any, prices: dict[str, Any], trace: str | None,
            quiet: bool, debug: bool, comparison: Any = None, keep_current: bool = False) -> str | None:
    """Write the HTML report and the trace and name them on the last line (``keep_current``: not
    if the ones there are current); a report that cannot be written is a warning (the run's
    results and exit code stand)."""
    from orchestra.summary import fresh
    from orchestra.summary.costs import load_prices, save_prices

    try:
        if prices:
            save_prices(paths, prices)  # a later viz finds them: the saved config.py leaves them out
        else:
            prices = load_prices(paths)
        if keep_current and fresh.report_is_current(paths, prices):
            report = os.path.join(paths.summary_dir, "report.html")
            say(f"report: {report}", file=sys.stderr, quiet=quiet)  # the line a rebuild prints
            return report
        from orchestra.summary.progress import api_model_abbrs
        from orchestra.summary.report import write_report

        size = fresh.events_size(paths)  # before the report reads the log: what it draws at least
        files = write_report(paths, summary, made.all_units["eval"], api_model_abbrs(cfg.models), prices, trace,
                             comparison)
        fresh.write_stamp(paths, prices, size)
    except Exception as exc:  # a bug here must not hide the run's own outcome
        if debug:
            raise
        say(f"orchestra: warning: could not write the report: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    say(f"report: {files.report}{f' (trace: {trace})' if trace else ''}", file=sys.stderr, quiet=quiet)
    return files.report


def _comparison(paths: RunPaths, cfg: Any, made: Any, quiet: bool) -> Any:
    """Each model against the baseline (``summarizer.baseline``, else the first model), written to
    ``summary/comparison.json`` and printed; None for a run of one model."""
    from orchestra.summary.paired import build_comparison, render_comparison, write_comparison

    models = [m["abbr"] for m in cfg.models]
    comparison = build_comparison(paths, models, made.all_units["eval"], getattr(cfg, "summarizer", {}).get("baseline"))
    if comparison is None:
        return None
    write_comparison(comparison, paths)
    text = render_comparison(comparison)
    if text:
        say(text, quiet=quiet)
    return comparison


def _pivot(cfg: Any, summary: Summary, paths: RunPaths, quiet: bool) -> Any:
    """A sweep's pivot table, written and printed; None for a run without a sweep."""
    if cfg.sweep is None:
        return None
    from orchestra.summary.pivot import build_pivot, render_pivot, write_pivot

    pivot = build_pivot(summary, cfg.sweep.to_dict())
    write_pivot(pivot, paths)
    say(render_pivot(pivot), quiet=quiet)
    return pivot
