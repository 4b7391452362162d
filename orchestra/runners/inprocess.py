"""Run tasks inside the orchestrator's own process, one after another (``--debug``).

The same scheduling loop as every other runner, over a backend that runs a task's function
directly instead of starting a command: a crash shows its traceback where the user is
looking, a debugger can step into the task, and nothing but the task's own outputs is
written (no task log: there is no process whose output to keep).  Ctrl-C interrupts the task
itself; the loop then records it as cancelled.
"""

from __future__ import annotations

import signal
from typing import Any

from orchestra.runners.base import BaseRunner, Exit, Job, RunContext, TaskResult
from orchestra.tasks.kinds import run_task
from orchestra.tasks.spec import TaskSpec


class InProcessRunner(BaseRunner):
    """Run each task in this process, in order, once; exceptions propagate with their traceback."""

    def __init__(self) -> None:
        super().__init__(max_num_workers=1, retry=0, poll_interval_s=0.001)
        self._ctx: RunContext | None = None

    def launch(self, tasks: list[TaskSpec], ctx: RunContext) -> list[TaskResult]:
        self._ctx = ctx
        try:
            return super().launch(tasks, ctx)
        finally:
            self._ctx = None

    def log_attempt(self, job: Job, text: str) -> None:
        """No task log: the task writes to this terminal."""

    def submit(self, job: Job) -> None:
        # Ctrl-C must reach the task as KeyboardInterrupt: there is no child to signal.
        handler = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            run_task(job.task)
            job.handle = Exit(0)
        except KeyboardInterrupt:
            assert self._ctx is not None
            self._ctx.stop.set()  # the loop stops and records this job as cancelled
            job.handle = None
        except Exception as exc:  # noqa: BLE001 - kept, and raised from poll with its traceback
            # Raised here, an OSError would read as "could not start"; from poll it ends the launch.
            job.handle = exc
        finally:
            signal.signal(signal.SIGINT, handler)

    def poll(self, job: Job) -> Exit | None:
        ended: Any = job.handle
        if isinstance(ended, Exception):
            raise ended
        return ended if isinstance(ended, Exit) else None

    def cancel(self, jobs: list[Job]) -> None:
        """Nothing runs in the background: a job has ended by the time ``submit`` returns."""
