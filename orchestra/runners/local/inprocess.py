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


_SUBMITTED = object()  #: a job's handle from its submit until the poll that runs it


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while a task runs in this process: a KeyboardInterrupt where the task is, at once."""
    raise KeyboardInterrupt


class InProcessSession(Session):
    """Runs a job to its end inside the first ``poll`` after its ``submit`` (so its ``started``
    event comes before it runs, as a process's does); that ``poll`` reports it (or raises its
    exception)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        for job in jobs:
            job.handle = _SUBMITTED
        return {}

    def _run(self, job: Job) -> None:
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
        except Exception as exc:  # noqa: BLE001 - kept, and raised below with its traceback
            job.handle = exc  # from poll an OSError ends the launch (from submit: "could not start")
        finally:
            signal.signal(signal.SIGINT, handler)

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        for job in jobs:
            if job.handle is _SUBMITTED:
                self._run(job)
            if isinstance(job.handle, Exception):
                raise job.handle
        return {job: job.handle for job in jobs if isinstance(job.handle, Exit)}

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Nothing runs in the background: an interrupted job, or one not run yet, is over."""
        for job in jobs:
            if job.handle is None or job.handle is _SUBMITTED:
                job.handle = Exit(-1, "cancelled")
