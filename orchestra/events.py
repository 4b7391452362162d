"""The run's append-only event log, ``<run>/events.jsonl``.

The orchestrator and the task processes both append to it; each event is one line written
with a single ``write`` on a file opened in append mode, so lines from several processes
never interleave.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any


class EventLog:
    """Append events (``{"ts": ..., "event": ..., ...}``) to one JSON-lines file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def emit(self, event: str, **fields: Any) -> None:
        record = {"ts": round(time.time(), 3), "event": event, **fields}
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)


def read_events(path: str) -> list[dict[str, Any]]:
    """All events of a run, oldest first (a torn last line is ignored)."""
    from orchestra.fileio import read_jsonl

    if not os.path.exists(path):
        return []
    return read_jsonl(path)
