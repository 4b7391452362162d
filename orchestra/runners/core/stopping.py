"""Stopping jobs off the loop (the stop itself: ``orchestra.cluster.confirm.stop_and_confirm``).

``Session.cancel`` returns at once, ``poll`` reports the end.

Stopping a job is often a bounded wait (SIGTERM, a grace period, SIGKILL; ``scancel`` until
``squeue`` agrees; ``dlc stop`` until ``dlc get`` shows the job over).  A session hands such a wait
to ``BackgroundStops.start``, which runs it in a thread of its own, and reports the jobs from
``ended`` once it returned, so that the loop keeps polling every other job meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from orchestra.runners.core.contract import Exit, Job


class BackgroundStops:
    """Blocking stops of groups of jobs, each in a daemon thread; which jobs they have ended."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._stopping: dict[Job, str | None] = {}  # job -> None while its stop runs, else its outcome
        self._threads: list[threading.Thread] = []

    def start(self, jobs: Sequence[Job], stop: Callable[[list[Job]], None]) -> None:
        """Run ``stop(jobs)`` in the background; an error it raises is named in the jobs' Exit."""
        group = [job for job in jobs if job not in self._stopping]
        if not group:
            return
        with self._lock:
            self._stopping.update(dict.fromkeys(group))

        def run() -> None:
            outcome = "cancelled"
            try:
                stop(group)
            except Exception as exc:  # noqa: BLE001 - reported through poll, not lost in a thread
                outcome = f"cancelled; stopping it failed: {type(exc).__name__}: {exc}"
            with self._lock:
                self._stopping.update(dict.fromkeys(group, outcome))

        thread = threading.Thread(target=run, name=f"{self.name}-stop", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def stopping(self, job: Job) -> bool:
        """True once a stop of ``job`` was started (and until ``ended`` reported it)."""
        return job in self._stopping

    def ended(self, jobs: Sequence[Job]) -> dict[Job, Exit]:
        """The jobs among ``jobs`` whose stop is over, each with its Exit (reported once)."""
        out: dict[Job, Exit] = {}
        with self._lock:
            for job in jobs:
                outcome = self._stopping.get(job)
                if outcome is not None:
                    out[job] = Exit(-1, outcome)
                    del self._stopping[job]
        return out

    def poll_each(self, jobs: Sequence[Job], poll_one: Callable[[Job], Exit | None]) -> dict[Job, Exit]:
        """A ``poll`` answer for sessions that look at each job on its own (a local process, an
        srun): the stops that are over, then ``poll_one`` of every job not being stopped."""
        ended = self.ended(jobs)
        for job in jobs:
            if job not in ended and not self.stopping(job) and (exit_ := poll_one(job)) is not None:
                ended[job] = exit_
        return ended

    def wait(self, timeout_s: float) -> None:
        """Wait for the stops in progress (``close``: nothing may outlive the launch)."""
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads = [t for t in self._threads if t.is_alive()]
