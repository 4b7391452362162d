"""The live progress of a stage: samples done out of the stage's samples, with tasks, rate,
ETA and the counters that matter for the models and runner in use.

Running infer tasks report live counters as ``progress`` events in ``events.jsonl``; the
loop's own events say which tasks ended and which GPUs they held.  On a terminal this is
one tqdm bar per stage; without one (CI, nohup, a file) it is one line every
``ORCHESTRA_PROGRESS_INTERVAL_S`` seconds (default 30).  :meth:`StageProgress.close` reads
every event once more, so the last display shows the final counts exactly.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import deque
from collections.abc import Iterable
from typing import IO, Any

from orchestra.errors import UserError
from orchestra.models.base import BatchedModel
from orchestra.registry import MODELS
from orchestra.tasks.spec import TaskSpec
from orchestra.terminal import printable

_ENDED = ("done", "failed", "cancelled", "skipped")
#: seconds of history the sample rate (and so the ETA) is measured over
RATE_WINDOW_S = 60.0
#: the terminal bar is redrawn at most this often (tqdm shows at most every 0.5 s anyway)
BAR_REDRAW_S = 0.25
DEFAULT_LINE_INTERVAL_S = 30.0


def api_model_abbrs(models: Iterable[dict[str, Any]]) -> set[str]:
    """Abbrs of the models that call an API (not a local ``BatchedModel``): only their
    tasks have 429s and retries worth showing."""
    out = set()
    for m in models:
        try:
            cls = MODELS.resolve(m.get("type"), f"model {m.get('abbr')}")
        except Exception:  # an unresolvable type was refused by validation long before
            continue
        if not issubclass(cls, BatchedModel):
            out.add(str(m.get("abbr")))
    return out


def line_interval_s() -> float:
    """Seconds between progress lines when stderr is not a terminal (at least 0.1): the value of
    ``ORCHESTRA_PROGRESS_INTERVAL_S``, else 30.  A value that is not a positive number of seconds
    is a :class:`UserError` (``orchestra.api`` asks before a run, so it is one line and exit 2)."""
    raw = os.environ.get("ORCHESTRA_PROGRESS_INTERVAL_S", "")
    if not raw:
        return DEFAULT_LINE_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"ORCHESTRA_PROGRESS_INTERVAL_S={raw!r}: expected a positive number of seconds between "
                        "progress lines, such as 30 (unset: 30)")
    return max(0.1, value)


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class StageProgress:
    """Progress of one stage's tasks, shown as samples.

    Args:
        stage: ``infer`` or ``eval``.
        tasks: the stage's tasks (their sample counts are the total).
        events_path: the run's ``events.jsonl``.
        api_models: abbrs of API models: request counters (in flight, 429s, retries) are
            shown only for their tasks.
        gpu_slots: GPUs the runner hands out (0: none; busy GPUs are shown when > 0).
        stream: where to draw (default stderr); a bar on a terminal, lines otherwise.
        interval_s: seconds between lines when ``stream`` is not a terminal.
    """

    def __init__(self, stage: str, tasks: list[TaskSpec], events_path: str, api_models: Iterable[str] = (),
                 gpu_slots: int = 0, stream: IO[str] | None = None, interval_s: float | None = None) -> None:
        self.stage = stage
        self.planned = {t.task_id: t.num_samples for t in tasks}
        self.models = {t.task_id: t.model_abbr for t in tasks}
        self.total = sum(self.planned.values())
        self.events_path = events_path
        self.api_models = set(api_models)
        self.gpu_slots = gpu_slots if any(t.num_gpus for t in tasks) else 0
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = line_interval_s() if interval_s is None else interval_s
        self.last_state: tuple[Any, ...] = ()
        self.offset = os.path.getsize(events_path) if os.path.exists(events_path) else 0
        self.latest: dict[str, dict[str, Any]] = {}  # task -> its latest progress event
        self.spent: dict[tuple[str, Any], dict[str, Any]] = {}  # (task, attempt) -> its latest one
        self.ended: dict[str, str] = {}  # task -> done | failed | cancelled | skipped
        self.gpus: dict[str, list[str]] = {}  # running task -> GPU ids it holds
        self.counts: dict[str, int] = {}
        self.t0 = time.monotonic()
        self.history: deque[tuple[float, int]] = deque()  # (time, samples done in this run)
        self.last_read = 0.0
        self.last_line = self.t0
        self.last_bar = float("-inf")
        self.closed = False
        self.bar: Any = None
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if tty:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc=f"[{stage}]", file=self.stream, dynamic_ncols=True,
                            mininterval=0.5, leave=True,
                            bar_format="{desc} {percentage:3.0f}%|{bar}| {n}/{total} samples{postfix}")

    # -- reading ----------------------------------------------------------------------------
    def _read_events(self) -> None:
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
            task = str(ev.get("task_id"))
            if not isinstance(ev, dict) or task not in self.planned:
                continue
            kind = ev.get("event")
            if kind == "progress":
                self.latest[task] = ev
                self.spent[(task, ev.get("attempt"))] = ev
            elif kind == "started":
                self.ended.pop(task, None)
                self.gpus[task] = list((ev.get("resources") or {}).get("gpu_ids") or [])
            elif kind in _ENDED or kind == "retry":
                self.gpus.pop(task, None)
                if kind != "retry":
                    self.ended[task] = kind

    # -- counting ---------------------------------------------------------------------------
    def samples(self) -> dict[str, int]:
        """Samples done, failed and resumed from checkpoints so far, and those that can
        still be done (tasks that have not ended).  A task that ended done counts all its samples
        as done, and those that failed within its ``error_tolerance`` as failed too."""
        done = failed = resumed = remaining = 0
        for task, planned in self.planned.items():
            ev = self.latest.get(task, {})
            resumed += int(ev.get("samples_resumed") or 0)
            if self.ended.get(task) == "done":  # every sample has its record: failed ones within error_tolerance
                done += planned
                failed += int(ev.get("samples_failed") or 0)
                continue
            task_done = min(int(ev.get("samples_done") or 0), planned)
            task_failed = int(ev.get("samples_failed") or 0)
            done += task_done
            failed += task_failed
            if task not in self.ended:
                remaining += max(planned - task_done - task_failed, 0)
        return {"done": done, "failed": failed, "resumed": resumed, "remaining": remaining}

    def rate(self, now: float, fresh: int) -> float | None:
        """Samples per second (checkpointed ones left out) over the last
        :data:`RATE_WINDOW_S`, or over the whole stage once it is closed; None before a second."""
        if self.closed:
            return fresh / (now - self.t0) if now - self.t0 >= 1.0 else None
        self.history.append((now, fresh))
        while len(self.history) > 2 and now - self.history[1][0] >= RATE_WINDOW_S:
            self.history.popleft()
        t_first, n_first = self.history[0]
        return (fresh - n_first) / (now - t_first) if now - t_first >= 1.0 else None

    def task_counts(self) -> dict[str, int]:
        """Tasks by end state (from the events), and running ones (from the loop)."""
        out = {key: 0 for key in _ENDED}
        for state in self.ended.values():
            out[state] += 1
        out["running"] = 0 if self.closed else self.counts.get("running", 0)
        return out

    def postfix(self, now: float) -> tuple[dict[str, int], str]:
        """The sample counts and the text after them: rate, ETA, tasks, counters."""
        s = self.samples()
        rate = self.rate(now, s["done"] - s["resumed"])
        parts = []
        if s["failed"] and self.bar is not None:  # next to the count (a line puts it there itself)
            parts.append(f"{s['failed']} failed")
        if rate is not None:
            parts.append(f"{rate:.1f} samples/s")
            if s["remaining"] and not self.closed:
                parts.append(f"ETA {_duration(s['remaining'] / rate)}" if rate > 0 else "ETA ?")
        if s["resumed"]:
            parts.append(f"{s['resumed']} from checkpoints")
        c = self.task_counts()
        tasks = f"tasks {c['done']}/{len(self.planned)} done"
        if c["running"]:
            tasks += f", {c['running']} running"
        for key in ("failed", "cancelled", "skipped"):
            if c[key]:
                tasks += f", {c[key]} {key}"
        parts.append(tasks)
        api = [ev for (task, _), ev in self.spent.items() if self.models.get(task) in self.api_models]
        if api:  # every attempt's requests count, not only the latest attempt's
            limited = sum(int(ev.get("rate_limited") or 0) for ev in api)
            retries = sum(int(ev.get("retries") or 0) for ev in api)
            api_part = f"requests: {limited} answered 429, {retries} retries"
            if not self.closed:
                in_flight = sum(int(ev.get("in_flight") or 0) for task, ev in self.latest.items()
                                if self.models.get(task) in self.api_models and task not in self.ended)
                api_part = f"requests: {in_flight} in flight, {limited} answered 429, {retries} retries"
            parts.append(api_part)
            batched = [ev for ev in api if "batches_submitted" in ev]
            if batched:  # batch mode: the provider's batches of these tasks
                sums = {k: sum(int(ev.get(f"batches_{k}") or 0) for ev in batched)
                        for k in ("submitted", "in_progress", "completed")}
                parts.append(f"batches: {sums['submitted']} submitted, {sums['in_progress']} in progress, "
                             f"{sums['completed']} completed")
        if self.gpu_slots and not self.closed:
            busy = len({g for ids in self.gpus.values() for g in ids})
            parts.append(f"GPUs {busy}/{self.gpu_slots} busy")
        return s, "; ".join(parts)

    # -- drawing ----------------------------------------------------------------------------
    def __call__(self, counts: dict[str, int]) -> None:
        """The loop's hook: called every round with the stage's task counts."""
        if self.closed:
            return
        now = time.monotonic()
        if counts == self.counts and now - self.last_read < 1.0:
            return
        self.counts = dict(counts)
        if now - self.last_read >= 0.5:
            self.last_read = now
            self._read_events()
        self._draw(now)

    def _draw(self, now: float, final: bool = False) -> None:
        # Counting walks every task: with 10,000 tasks it is done when something may be shown,
        # not on every round of the loop (a line is never due before its interval anyway).
        if not final:
            since = now - (self.last_bar if self.bar is not None else self.last_line)
            if since < (BAR_REDRAW_S if self.bar is not None else self.interval_s):
                return
        if self.bar is not None:
            self.last_bar = now
        s, text = self.postfix(now)
        text = printable(text)  # counts today, but it is shown raw on a terminal
        if self.bar is not None:
            self.bar.n = s["done"]
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.refresh()
            return
        # A line when the interval has passed and something moved (a stage waiting for its
        # inputs stays quiet), and at least every ten intervals as a sign of life.
        state = (s["done"], s["failed"], tuple(sorted(self.counts.items())))
        due = now - self.last_line >= self.interval_s and state != self.last_state
        if final or due or now - self.last_line >= 10 * self.interval_s:
            self.last_line, self.last_state = now, state
            pct = 100.0 * s["done"] / self.total if self.total else 100.0
            failed = f", {s['failed']} failed" if s["failed"] else ""
            print(f"[{self.stage}] {s['done']}/{self.total} samples ({pct:.0f}%){failed}, "
                  f"{_duration(now - self.t0)} elapsed; {text}", file=self.stream, flush=True)

    def close(self, counts: dict[str, int] | None = None) -> None:
        """Read every event once more and show the final counts (call after ``launch``)."""
        if self.closed:
            return
        if counts is not None:
            self.counts = dict(counts)
        self._read_events()
        self.closed = True
        self._draw(time.monotonic(), final=True)
        if self.bar is not None:
            self.bar.close()
