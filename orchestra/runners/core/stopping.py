"""Stopping jobs: stop-and-confirm, once for every backend, and off the loop.

``stop_and_confirm`` is the one algorithm by which a backend stops jobs of an external service
(``scancel`` until ``squeue`` agrees, ``dlc stop`` until ``dlc get`` shows the job over): send the
stop, look until the service shows every job gone, send it again to a job that still runs a while
later, give up at a deadline and say which jobs were not seen gone.

``Session.cancel`` returns at once, ``poll`` reports the end.

Stopping a job is often a bounded wait (SIGTERM, a grace period, SIGKILL; ``scancel`` until
``squeue`` agrees; ``dlc stop`` until ``dlc get`` shows the job over).  A session hands such a wait
to ``BackgroundStops.start``, which runs it in a thread of its own, and reports the jobs from
``ended`` once it returned, so that the loop keeps polling every other job meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence

from orchestra.runners.core.contract import Exit, Job

#: what ``stop_and_confirm``'s ``look`` answers: the state of each job still alive (new ones too),
#: or None when the service gave no answer this time
Look = Callable[[list[str]], "dict[str, str] | None"]


def stop_and_confirm(ids: Iterable[str], send: Callable[[list[str]], None], look: Look, *, timeout_s: float,
                     resend_after_s: float, poll_s: float, ending: Collection[str] = (),
                     busy: Callable[[], bool] | None = None) -> dict[str, str] | None:
    """Stop jobs and wait until the service shows them gone; the jobs still alive at the deadline.

    Args:
        ids: the jobs to stop now (``send(ids)`` at once).
        send: sends the stop to these jobs (errors are the caller's: the looks decide).
        look: given the jobs believed alive, the state of each one still alive; a job absent from
            the answer is gone.  It may add jobs found otherwise (by name), which are stopped too.
        timeout_s: the longest this waits.
        resend_after_s: a job still alive this long after its stop was sent gets another one,
            unless its state is in ``ending`` (already on its way out).
        poll_s: the pause between two looks.
        busy: while it returns True the wait goes on (local processes of the jobs not yet exited).

    Returns:
        ``{}`` when every job was seen gone (and ``busy`` was False) in time; else the jobs last
        seen alive with their state, or None when the service never answered.
    """
    alive: dict[str, str] | None = None
    pending = list(dict.fromkeys(ids))
    deadline = time.monotonic() + timeout_s
    sent: dict[str, float] = {}  # job id -> when its last stop was sent
    if pending:
        send(pending)
        sent.update(dict.fromkeys(pending, time.monotonic()))
    while True:
        seen = look(list(alive) if alive is not None else pending)
        if seen is not None:
            alive, now = seen, time.monotonic()
            again = [j for j, state in alive.items()
                     if j not in sent or (now - sent[j] > resend_after_s and state not in ending)]
            if again:
                send(again)
                sent.update(dict.fromkeys(again, now))
            if not alive and not (busy is not None and busy()):
                return {}
        if time.monotonic() >= deadline:
            return alive
        time.sleep(poll_s)


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
