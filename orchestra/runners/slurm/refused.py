"""Jobs the Slurm cluster refused to take for now, waiting to be submitted again (``sbatch``).

A refusal for now (the cluster's job limits, a busy, drained or unreachable controller; see
``script.SBATCH_TRANSIENT``) is an infrastructure outcome, not a task failure.  The refused jobs,
and every job submitted after them, wait here in order; the next submission is due 5, 10, 20, 40,
then every 60 s after each refusal in a row, and a refused array comes back in two halves, so
that a nearly full cluster takes part of it.  Jobs still refused after ``wait_s`` end
``Exit(infra=True)``, the tasks' ``retry`` unspent.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from orchestra.runners.core.contract import Exit, Job

SUBMIT_BACKOFF_S = (5.0, 10.0, 20.0, 40.0, 60.0)  # waits after 1, 2, ... refusals in a row (then the last)
SUBMIT_WAIT_S = 3600.0  # how long jobs the cluster keeps refusing wait before they end (infra)


@dataclass
class Waiting:
    """Jobs not submitted yet because the cluster refused a submission for now."""

    jobs: list[Job]
    since: float = field(default_factory=time.monotonic)  # when they began to wait
    reason: str = "queued behind a submission the cluster refused"


class RefusedQueue:
    """The groups of jobs waiting for the cluster to take them, oldest first.

    Args:
        wait_s: how long jobs the cluster keeps refusing for now wait before they end.
        backoff_s: the waits after 1, 2, ... refusals in a row (then the last, again).
    """

    def __init__(self, wait_s: float = SUBMIT_WAIT_S, backoff_s: Sequence[float] = SUBMIT_BACKOFF_S) -> None:
        self.wait_s = wait_s
        self.backoff_s = tuple(backoff_s)
        self.groups: list[Waiting] = []
        self.retry_at = 0.0
        self.refusals = 0  # refusals in a row

    def __bool__(self) -> bool:
        return bool(self.groups)

    def count(self) -> int:
        """How many jobs wait for the cluster to take them."""
        return sum(len(w.jobs) for w in self.groups)

    def behind(self, jobs: list[Job]) -> None:
        """``jobs`` wait behind a submission the cluster refused lately (they are not sent first)."""
        self.groups.append(Waiting(jobs))

    def refused(self, jobs: list[Job], reason: str, waited: Waiting | None) -> tuple[float, float]:
        """Put ``jobs``, refused for now, first (an array in two halves); ``(seconds until the next
        try, seconds they have waited so far)``."""
        self.refusals += 1
        delay = self.backoff_s[min(self.refusals, len(self.backoff_s)) - 1]
        self.retry_at = time.monotonic() + delay
        since = waited.since if waited is not None else time.monotonic()
        half = (len(jobs) + 1) // 2
        parts = [jobs[:half], jobs[half:]] if len(jobs) > 1 else [jobs]
        self.groups[0:0] = [Waiting(part, since, reason) for part in parts]
        return delay, time.monotonic() - since

    def taken(self) -> None:
        """The cluster took a submission: the backoff starts again from its first wait."""
        self.refusals = 0

    def expired(self, polled: Collection[Job]) -> dict[Job, Exit]:
        """Take out the groups (of ``polled`` jobs only) that waited ``wait_s``; their Exits."""
        ended: dict[Job, Exit] = {}
        now = time.monotonic()
        for w in [w for w in self.groups if now - w.since >= self.wait_s and all(j in polled for j in w.jobs)]:
            self.groups.remove(w)
            ended.update({job: Exit(-1, f"the Slurm cluster refused the submission for {now - w.since:.0f} s: "
                                        f"{w.reason}", infra=True) for job in w.jobs})
        return ended

    def due(self) -> Waiting | None:
        """The oldest group, taken out, once the next try is due; else None."""
        return self.groups.pop(0) if self.groups and time.monotonic() >= self.retry_at else None

    def drop(self, jobs: Collection[Job]) -> None:
        """Forget these jobs (cancelled before the cluster took them: never submitted)."""
        for w in self.groups:
            w.jobs = [job for job in w.jobs if job not in jobs]
        self.groups = [w for w in self.groups if w.jobs]
