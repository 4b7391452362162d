"""The contract between the one scheduling loop and a backend.

A runner (``BaseRunner`` subclass) is a backend's configuration; ``open(ctx)`` starts one launch's
``Session``, which the loop drives in rounds:

* ``submit(jobs)`` starts this round's attempts together (a backend may batch them, e.g. one Slurm
  job array) and returns those that could not start, with why;
* ``poll(jobs)`` answers for every job in flight at once (one ``squeue``, one ``ray.wait``), with
  the ``Exit`` of each that ended;
* ``cancel(jobs)`` starts stopping jobs and returns at once: the loop keeps polling, and ``poll``
  reports each cancelled job once it is gone;
* ``close()`` ends the launch: nothing it started may be left running.

What a job needs (GPU slots, a warm Ray actor) goes through the session's ``resources``
(``Resources``): ``unfit`` (never runnable here), ``acquire`` (reserve, or wait),
``release(job, exit)``, which sees how the attempt ended (a worker lost under it is not reused),
and ``ended(task_id)`` once no attempt of a task follows.  The runner's own hooks are in ``hooks.py``.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestra.runners.core.command import Command
from orchestra.tasks.spec import TaskSpec


@dataclass(frozen=True)
class Exit:
    """How a job ended: its exit code and, when the backend knows more, why.

    ``infra=True`` (with a non-zero code) says the platform failed, not the task: the job never
    got to run it to an end (a submission refused or garbled, a job stuck in a queue, a node
    lost, a preemption).  The loop retries such an attempt without spending the task's own
    ``retry``, at most ``infra_retry`` times per task (the runner's constructor argument); after
    that an infrastructure failure counts like any other.
    """

    code: int
    reason: str = ""
    infra: bool = False


@dataclass(eq=False)
class Job:
    """One attempt of one task, as a backend sees it (hashed by identity: a key of ``poll``'s answer)."""

    task: TaskSpec
    attempt: int
    command: Command
    log_path: str
    resources: dict[str, Any]
    started: float = 0.0
    handle: Any = None  # the backend's own state (a Popen, a Slurm job id, ...)
    timed_out: bool = False
    slot: int = 0  # the loop's worker slot (0 .. max_num_workers-1) this attempt holds


class CannotStart(Exception):
    """Raised by ``Resources.acquire``: this attempt cannot start now (e.g. its worker cannot be
    created); the loop records it as a failed attempt with this message, the launch goes on."""


class Resources:
    """What a task needs, reserved before its job starts and given back after it ended.  The
    defaults reserve nothing (a cluster schedules the job); a backend overrides what it holds."""

    def unfit(self, task: TaskSpec) -> str | None:
        """Why ``task`` can never run here (more GPUs than exist, a tool missing), or None."""
        return None

    def acquire(self, task: TaskSpec) -> dict[str, Any] | None:
        """Reserve what ``task`` needs (recorded in its ``started`` event); None: it must wait.

        Raises ``CannotStart`` when this attempt cannot start at all."""
        return {}

    def release(self, job: Job, ended: Exit | None) -> None:
        """Give back what ``acquire`` reserved; ``ended`` is how the attempt ended (None: cancelled,
        or it never started)."""

    def ended(self, task_id: str) -> None:
        """``task_id`` reached an end state (done, failed for good, skipped, cancelled): no attempt
        of it follows, so what was held for it alone may go (managed servers' replicas)."""


class NoResources(Resources):
    """A backend whose jobs reserve nothing here (the cluster schedules them), or none can run
    (``unfit``: why, e.g. the cluster's client is missing)."""

    def __init__(self, unfit: str | None = None) -> None:
        self._unfit = unfit

    def unfit(self, task: TaskSpec) -> str | None:
        return self._unfit


class Session(abc.ABC):
    """One launch of a backend: the jobs it started and the state it needs to watch them."""

    #: what the loop reserves through before a submit (replace it with the backend's own)
    resources: Resources = NoResources()

    @abc.abstractmethod
    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        """Start these attempts (``job.command``, output appended to ``job.log_path``; set each
        ``job.handle``).  Returns the jobs that could not start, with why; the rest are in flight."""

    @abc.abstractmethod
    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        """One look at every job in flight (cancelled ones included): the ``Exit`` of each that
        ended since; a job absent from the answer is still alive.  Called once per round, with no
        jobs too, so that a session can keep house (a warm pool grows for waiting tasks)."""

    @abc.abstractmethod
    def cancel(self, jobs: Sequence[Job]) -> None:
        """Start stopping these jobs and everything they started; return at once.  ``poll``
        reports each one once it is gone (within the backend's own bounded wait)."""

    def wait(self, jobs: Sequence[Job], timeout_s: float, stop: threading.Event) -> None:
        """Block between two rounds: until ``timeout_s`` has passed or ``stop`` is set.  A session
        that can tell when one of ``jobs`` ends (a pipe it reads) may return as soon as it does."""
        stop.wait(timeout_s)

    def placement(self, job: Job) -> dict[str, Any]:
        """Where a submitted attempt runs (host, pid, job id, node), for its ``started`` event."""
        return {}

    def close(self) -> None:
        """The launch is over: stop whatever of it is still running, give back what it holds."""


def cannot_start(jobs: Sequence[Job], exc: BaseException) -> dict[Job, Exit]:
    """The answer of a ``submit`` whose start failed for all of ``jobs`` (e.g. an ``OSError``)."""
    return {job: Exit(-1, f"could not start: {exc}") for job in jobs}
