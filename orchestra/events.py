"""The run's append-only event log, ``<run>/events.jsonl``.

The orchestrator and the task processes both append to it; each event is one line written
with a single ``write`` on a file opened in append mode, so lines from several processes
never interleave.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from orchestra.fileio import append_line, utf8


class EventLog:
    """Append events (``{"ts": ..., "event": ..., ...}``) to one JSON-lines file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._lost = 0  # events a full disk (or a file size limit) refused
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def emit(self, event: str, **fields: Any) -> None:
        """Append one event.  A write the disk refuses is a warning, once, not an exception: the
        log is a record of the run (the timeline, the reasons), never what decides that a task
        is done, and the loop that emits must go on to stop or finish its tasks."""
        self.emit_many([(event, fields)])

    #: the most bytes :meth:`emit_many` hands to one ``write``
    CHUNK_BYTES = 1 << 20

    def emit_many(self, events: Iterable[tuple[str, dict[str, Any]]], ts: float | None = None) -> None:
        """Append several events, in order, as :meth:`emit` would one by one, with one ``write``
        per megabyte of lines (each line whole in one write): 100,000 tasks queued are a few
        dozen appends, not 100,000 opens and writes.  ``events`` may be a generator (the lines
        are made as they are written, never all held); ``ts``: when they happened (default now)."""
        ts = round(time.time() if ts is None else ts, 3)
        chunk: list[str] = []
        size = 0
        for event, fields in events:
            text = json.dumps({"ts": ts, "event": event, **fields}, ensure_ascii=False, default=str) + "\n"
            chunk.append(text)
            size += len(text)
            if size >= self.CHUNK_BYTES:
                self._append(utf8("".join(chunk)))
                chunk, size = [], 0
        if chunk:
            self._append(utf8("".join(chunk)))  # a lone surrogate: U+FFFD

    def _append(self, lines: bytes) -> None:
        with self._lock:
            try:
                append_line(self.path, lines)
            except OSError as exc:
                self._lost += 1
                if self._lost == 1:
                    print(f"orchestra: warning: cannot append to {self.path}: {exc.strerror or exc}; the run goes "
                          "on, and its report will miss the events from here", file=sys.stderr, flush=True)


def read_events(path: str) -> list[dict[str, Any]]:
    """All events of a run, oldest first; lines torn by a crash or a full disk are skipped
    with one warning on stderr."""
    return list(iter_events(path))


def iter_events(path: str) -> Iterator[dict[str, Any]]:
    """:func:`read_events` one event at a time: a run of 100,000 tasks is read in one pass
    without holding its events."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    damaged: list[int] = []
    with f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                damaged.append(lineno)
                continue
            if isinstance(ev, dict):
                yield ev
    if damaged:
        print(f"orchestra: warning: {path}: skipped {len(damaged)} damaged line(s) "
              f"(first: line {damaged[0]}), left by a crash or a full disk", file=sys.stderr)
