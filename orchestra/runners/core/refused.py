"""Jobs a cluster or service refused to take for now, waiting to be submitted again, in order.

A refusal for now (a job limit such as Slurm's ``MaxJobCount``, a busy, drained or unreachable
controller) is an infrastructure outcome, not a task failure.  The refused jobs, and every job
submitted after them, wait here in order; the next submission is due 5, 10, 20, 40, then every
60 s after each refusal in a row (``orchestra.cluster.refusal``: replicas on Slurm wait the same),
and a refused group comes back in two halves, so that a nearly full cluster takes part of it.
Jobs still refused after ``wait_s`` end ``Exit(infra=True)``, the tasks' ``retry`` unspent.  The
backend says what a refusal for now is; this queue only orders, paces and reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from orchestra.cluster.refusal import SUBMIT_BACKOFF_S, SUBMIT_WAIT_S, backoff_after
from orchestra.events import EventLog
from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.core.run import note


@dataclass
class Waiting:
    """Jobs not submitted yet because the cluster refused a submission for now."""

    jobs: list[Job]
    since: float = field(default_factory=time.monotonic)  # when they began to wait
    reason: str = "queued behind a submission the cluster refused"


#: a backend's submission of a group of jobs (``Waiting``: the group, when it waited here): the
#: Exits of a permanent refusal, else ``{}`` (a refusal for now calls ``RefusedQueue.refused``)
Send = Callable[[list[Job], "Waiting | None"], dict[Job, Exit]]


class RefusedQueue:
    """The groups of jobs waiting for the cluster to take them, oldest first.

    Args:
        backend: the backend's name, in log lines (``===== slurm: ...``) and the event
            ``<backend>_submit_refused``.
        service: who refused, in the Exit of jobs that waited too long (``"the Slurm cluster"``).
        wait_s: how long jobs the cluster keeps refusing for now wait before they end.
        backoff_s: the waits after 1, 2, ... refusals in a row (then the last, again).
        events: the run's event log (None: no events).
    """

    def __init__(self, backend: str, service: str, wait_s: float = SUBMIT_WAIT_S,
                 backoff_s: Sequence[float] = SUBMIT_BACKOFF_S, events: EventLog | None = None) -> None:
        self.backend = backend
        self.service = service
        self.wait_s = wait_s
        self.backoff_s = tuple(backoff_s)
        self.events = events
        self.groups: list[Waiting] = []
        self.retry_at = 0.0
        self.refusals = 0  # refusals in a row

    def count(self) -> int:
        """How many jobs wait for the cluster to take them."""
        return sum(len(w.jobs) for w in self.groups)

    def submit(self, jobs: list[Job], send: Send) -> dict[Job, Exit]:
        """``send(jobs)``, unless jobs refused lately wait: then ``jobs`` wait behind them."""
        if self.groups:
            self.groups.append(Waiting(jobs))
            return {}
        return send(jobs, None)

    def refused(self, jobs: list[Job], reason: str, waited: Waiting | None) -> None:
        """Put ``jobs``, refused for now, first (a group in two halves); say so in their logs and
        the events."""
        self.refusals += 1
        delay = backoff_after(self.refusals, self.backoff_s)
        self.retry_at = time.monotonic() + delay
        since = waited.since if waited is not None else time.monotonic()
        half = (len(jobs) + 1) // 2
        parts = [jobs[:half], jobs[half:]] if len(jobs) > 1 else [jobs]
        self.groups[0:0] = [Waiting(part, since, reason) for part in parts]
        so_far = time.monotonic() - since
        for job in jobs:
            note(job.log_path, f"===== {self.backend}: the cluster refused the submission for now ({reason}); "
                               f"submitting again in {delay:g} s (waited {so_far:.0f} s so far; the task's retry "
                               "is not spent)\n")
        if self.events is not None:
            self.events.emit(f"{self.backend}_submit_refused", stage=jobs[0].task.stage, tasks=len(jobs),
                             reason=reason, retry_in_s=delay, waited_s=round(so_far, 1), waiting_tasks=self.count())

    def taken(self) -> None:
        """The cluster took a submission: the backoff starts again from its first wait."""
        self.refusals = 0

    def resubmit(self, polled: Collection[Job], send: Send) -> dict[Job, Exit]:
        """End the groups (of ``polled`` jobs only) that waited ``wait_s``; then, once the next try is
        due, ``send`` the oldest group, and the next while the cluster takes them.  Their Exits."""
        ended: dict[Job, Exit] = {}
        now = time.monotonic()
        for w in [w for w in self.groups if now - w.since >= self.wait_s and all(j in polled for j in w.jobs)]:
            self.groups.remove(w)
            ended.update({job: Exit(-1, f"{self.service} refused the submission for {now - w.since:.0f} s: "
                                        f"{w.reason}", infra=True) for job in w.jobs})
        while self.groups and time.monotonic() >= self.retry_at:
            w = self.groups.pop(0)
            ended.update(send(w.jobs, w))
        return ended

    def drop(self, jobs: Collection[Job]) -> None:
        """Forget these jobs (cancelled before the cluster took them: never submitted)."""
        for w in self.groups:
            w.jobs = [job for job in w.jobs if job not in jobs]
        self.groups = [w for w in self.groups if w.jobs]
