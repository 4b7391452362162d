"""Whether a run folder's report already shows everything a ``-r`` that ran nothing would draw.

Rebuilding ``report.html`` and ``trace.json`` reads the whole event log, every task's log and
the predictions (3 of the 3.2-3.6 s a ``-r`` of a finished 10,000-task run took).  When that
``-r`` finds every output done, nothing it would draw has changed since the last report: only
its own ``run_started`` (no tasks) and ``run_finished`` (nothing failed) lines were appended.
So each report is written with a stamp (the event log's size when it was read, the prices it
used, its format), and a run's end keeps the report when the events after that size are all
such lines.  ``--mode viz`` always rebuilds.
"""

from __future__ import annotations

import json
import os
from typing import Any

from orchestra.fileio import atomic_write_text, stable_hash
from orchestra.paths import RunPaths

#: bump when the report's content changes shape, so that an older report is rebuilt
REPORT_FORMAT = 1
#: the most bytes of events after a stamp worth reading to decide (a few idle ``-r`` runs fit)
_MAX_TAIL = 1 << 20


def stamp_path(paths: RunPaths) -> str:
    """``summary/.report-stamp.json``: what the report in ``summary/`` was built from."""
    return os.path.join(paths.summary_dir, ".report-stamp.json")


def events_size(paths: RunPaths) -> int:
    """The event log's size now (0 when there is none): take it before the report reads the log."""
    try:
        return os.path.getsize(paths.events)
    except OSError:
        return 0


def write_stamp(paths: RunPaths, prices: dict[str, Any], size: int) -> None:
    """Record that the report now in ``summary/`` drew the first ``size`` bytes of events."""
    atomic_write_text(stamp_path(paths), json.dumps(
        {"format": REPORT_FORMAT, "events_size": size, "prices": stable_hash(prices)}))


def report_is_current(paths: RunPaths, prices: dict[str, Any]) -> bool:
    """True when the report and trace exist, were built with these ``prices`` in this format,
    and only idle runs (no task planned, none failed, not interrupted) left events since."""
    try:
        with open(stamp_path(paths), encoding="utf-8") as text:
            stamp = json.load(text)
        offset = int(stamp["events_size"])
        if stamp.get("format") != REPORT_FORMAT or stamp.get("prices") != stable_hash(prices):
            return False
        if not all(os.path.isfile(os.path.join(paths.summary_dir, f)) for f in ("report.html", "trace.json")):
            return False
        size = os.path.getsize(paths.events)
        if not offset <= size <= offset + _MAX_TAIL:
            return False
        with open(paths.events, "rb") as f:
            f.seek(offset)
            tail = f.read(size - offset)
        return all(_idle(json.loads(line)) for line in tail.splitlines() if line.strip())
    except (OSError, ValueError, KeyError, TypeError):  # no stamp, a damaged one, a torn event line
        return False


def _idle(event: Any) -> bool:
    """An event a ``-r`` that ran nothing appends."""
    if not isinstance(event, dict):
        return False
    if event.get("event") == "run_started":
        tasks = event.get("tasks")
        return isinstance(tasks, dict) and not any(tasks.values())
    if event.get("event") == "run_finished":
        return event.get("interrupted") is False and event.get("failed") == []
    return False
