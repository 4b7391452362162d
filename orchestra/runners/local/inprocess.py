"""Run tasks inside the orchestrator's own process, one after another (``--debug``).

The same scheduling loop as every other runner, over a backend that runs a task's function
directly instead of starting a command: a crash shows its traceback where the user is
looking, a debugger can step into the task, and nothing but the task's own outputs is
written (no task log: there is no process whose output to keep).  Ctrl-C interrupts the task
itself; the loop then records it as cancelled.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from types import FrameType

from orchestra.runners.core.contract import Exit, Job, Session
from orchestra.runners.core.loop import BaseRunner
from orchestra.runners.core.run import RunContext
from orchestra.tasks.kinds import run_task
from orchestra.tasks.spec import TaskSpec


class InProcessRunner(BaseRunner):
    """Run each task in this process, in order, once; exceptions propagate with their traceback."""

    def __init__(self) -> None:
        super().__init__(max_num_workers=1, retry=0, poll_interval_s=0.001)

    def open(self, ctx: RunContext, tasks: Sequence[TaskSpec]) -> Session:
        return InProcessSession(ctx)

    def log_attempt(self, job: Job, text: str) -> None:
        """No task log: the task writes to this terminal."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while a task runs in this process: a KeyboardInterrupt where the task is, at once."""
    raise KeyboardInterrupt


class InProcessSession(Session):
    """Runs a job to its end inside ``submit``; ``poll`` reports it (or raises its exception)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        for job in jobs:
            # Ctrl-C must reach the task as KeyboardInterrupt: there is no child to signal.
            # Not signal.default_int_handler itself: asyncio.run (which a task's engine runs) swaps
            # that one for its own, which only cancels its task at the next await, so a model that
            # loads for minutes would load on to the end.
            handler = signal.signal(signal.SIGINT, _interrupt)
            try:
                run_task(job.task)
                job.handle = Exit(0)
            except KeyboardInterrupt:
                self.ctx.stop.set()  # the loop stops and records this job as cancelled
                job.handle = None  # not ended: cancel (which the stop brings) ends it
            except Exception as exc:  # noqa: BLE001 - kept, and raised from poll with its traceback
                # Raised here, an OSError would read as "could not start"; from poll it ends the launch.
                job.handle = exc
            finally:
                signal.signal(signal.SIGINT, handler)
        return {}

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        for job in jobs:
            if isinstance(job.handle, Exception):
                raise job.handle
        return {job: job.handle for job in jobs if isinstance(job.handle, Exit)}

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Nothing runs in the background: only an interrupted job is left, and it is over."""
        for job in jobs:
            if job.handle is None:
                job.handle = Exit(-1, "cancelled")
