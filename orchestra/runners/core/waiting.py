"""A launch's waiting tasks: queued at its start, released when their inputs exist, skipped when
their inputs can no longer come; and their ``queued`` lines, written after the first round.

A launch of 100,000 tasks would otherwise format and append 100,000 ``queued`` lines before its
first task starts (about a second of one core).  :class:`Announcements` keeps the promise that
readers of ``events.jsonl`` rely on, that a task's ``queued`` line comes before any other line
about it (the run log and the summary take a task's latest line for its state): the loop says the
lines of the tasks its first round may start in one append before that round, any other task's
just before it says anything else of it, and every line still unsaid at once after the first
round.  Each line carries the time the task was queued.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from orchestra.events import EventLog
from orchestra.runners.core.contract import Resources
from orchestra.runners.core.run import PendingTask, RunContext, TaskResult, TaskState
from orchestra.tasks.spec import TaskSpec

Event = tuple[str, dict[str, Any]]


def queued_event(task: TaskSpec) -> Event:
    """The ``queued`` event of ``task``."""
    return ("queued", dict(task_id=task.task_id, stage=task.stage, cost=task.cost, name=task.display_name,
                           model=task.model_abbr, samples=task.num_samples, num_gpus=task.num_gpus))


class Announcements:
    """The ``queued`` lines of one launch's first attempts (the entries with ``said=False``)."""

    def __init__(self, events: EventLog) -> None:
        self.events = events
        self.ts = time.time()  # when the launch queued its tasks: the time every line carries
        self.all_said = False  # after the first round: every entry still queued has its line

    def say(self, entries: Iterable[PendingTask]) -> None:
        """Write the ``queued`` line of each of ``entries`` not said yet (one append for all)."""
        self.events.emit_many(self._unsaid(entries), ts=self.ts)

    def say_first(self, pending: Iterable[PendingTask], room: int, now: float) -> None:
        """Before the first round: the lines of the (at most ``room``) entries it may start, in one append."""
        if not self.all_said:
            self.say(itertools.islice((e for e in pending if e.inputs_ready and e.not_before <= now), room))

    def say_rest(self, pending: Iterable[PendingTask]) -> None:
        """After the first round: the lines of every entry still unsaid."""
        self.say(pending)
        self.all_said = True

    @staticmethod
    def _unsaid(entries: Iterable[PendingTask]) -> Iterator[Event]:
        for entry in entries:
            if not entry.said:
                entry.said = True
                yield queued_event(entry.task)


def queue_tasks(tasks: list[TaskSpec], resources: Resources, results: dict[str, TaskResult],
                ctx: RunContext) -> deque[PendingTask]:
    """The launch's queue (``queued`` lines unsaid); the tasks that end here (skipped for missing
    inputs that cannot come, unfit for the runner) are recorded, their lines appended together."""
    pending: deque[PendingTask] = deque()
    said: list[Event] = []
    may_come = ctx.inputs_may_come()
    now = time.monotonic()
    for task in tasks:
        missing = task.missing_inputs()
        waits = bool(missing) and may_come
        if missing and not waits:  # a stage waits for its inputs: an eval task whose predictions failed
            said.append(skip(task, missing, results, ctx, emit=False))
            continue
        if unfit := resources.unfit(task):
            log_path = ctx.paths.task_log(task.stage, task.task_id)
            results[task.task_id] = TaskResult(task.task_id, task.stage, TaskState.FAILED, 0, log_path, unfit)
            said.append(("failed", dict(task_id=task.task_id, stage=task.stage, reason=unfit,
                                        name=task.display_name, model=task.model_abbr)))
            continue
        pending.append(PendingTask(task, 1, inputs_ready=not waits, inputs_checked=now, said=False))
    ctx.events.emit_many(said)
    return pending


def skip(task: TaskSpec, missing: list[str], results: dict[str, TaskResult], ctx: RunContext,
         emit: bool = True) -> Event:
    """Record ``task`` skipped for its missing inputs; its event (emitted unless ``emit=False``)."""
    why = f"predictions missing: {os.path.relpath(missing[0], ctx.paths.root)}"
    log_path = ctx.paths.task_log(task.stage, task.task_id)
    results[task.task_id] = TaskResult(task.task_id, task.stage, TaskState.SKIPPED, 0, log_path, why)
    event = ("skipped", dict(task_id=task.task_id, stage=task.stage, reason=why, name=task.display_name,
                             model=task.model_abbr))
    if emit:
        ctx.events.emit(event[0], **event[1])
    return event


def look_for_inputs(pending: deque[PendingTask], results: dict[str, TaskResult], ctx: RunContext, now: float,
                    announce: Announcements, every_s: float) -> None:
    """Release waiting tasks whose inputs now exist (each looked for at most every ``every_s``); skip
    those whose inputs can no longer come."""
    may_come = ctx.inputs_may_come()
    for entry in [e for e in pending if not e.inputs_ready]:
        if may_come and now - entry.inputs_checked < every_s:
            continue
        entry.inputs_checked = now
        missing = entry.first_missing()
        if missing is None:
            entry.inputs_ready = True
        elif not may_come:
            pending.remove(entry)
            announce.say([entry])
            skip(entry.task, [missing], results, ctx)
