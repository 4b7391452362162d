"""The live progress bar of a stage: tasks ended, running and failed, and the request
counters running tasks report as ``progress`` events in ``events.jsonl``."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


class StageProgress:
    """The progress bar of a stage: tasks ended, running, failed, and the live request
    counters (in flight, done, 429s, retries, errors) that running tasks report as
    ``progress`` events."""

    # fields of the infer task's ``progress`` events (see docs/api.md), summed over running tasks
    COUNTERS = ("samples_done", "samples_total", "in_flight", "requests_done", "rate_limited", "retries", "errors")

    def __init__(self, stage: str, total: int, events_path: str) -> None:
        from tqdm import tqdm

        self.total = total
        self.events_path = events_path
        self.offset = os.path.getsize(events_path) if os.path.exists(events_path) else 0
        self.latest: dict[str, dict[str, Any]] = {}
        self.last_read = 0.0
        self.last_counts: dict[str, int] = {}
        self.bar = tqdm(total=total, desc=f"[{stage}]", unit="task", file=sys.stderr, dynamic_ncols=True,
                        mininterval=0.5, leave=True)

    def _read_progress(self) -> None:
        try:
            with open(self.events_path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        for line in chunk[:end].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "progress":
                self.latest[str(ev.get("task_id"))] = ev

    def __call__(self, counts: dict[str, int]) -> None:
        now = time.monotonic()
        ended = sum(v for k, v in counts.items() if k not in ("pending", "running"))
        if counts == self.last_counts and now - self.last_read < 1.0:
            return
        if now - self.last_read >= 1.0:
            self.last_read = now
            self._read_progress()
        self.last_counts = dict(counts)
        self.bar.update(ended - self.bar.n)
        post: dict[str, Any] = {"running": counts.get("running", 0), "failed": counts.get("failed", 0)}
        if self.latest:
            for key in self.COUNTERS:
                post[key] = sum(int(ev.get(key) or 0) for ev in self.latest.values())
        self.bar.set_postfix(post, refresh=False)
        if ended == self.total:
            self.bar.close()
