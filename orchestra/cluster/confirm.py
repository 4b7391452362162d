"""Stop-and-confirm, once for every client of an external service.

``stop_and_confirm`` is the one algorithm by which orchestra stops jobs of an external service
(``scancel`` until ``squeue`` agrees, ``dlc stop`` until ``dlc get`` shows the job over): send the
stop, look until the service shows every job gone, send it again to a job that still runs a while
later, give up at a deadline and say which jobs were not seen gone.  It knows no job type: the
runner backends and Slurm-placed replicas (``orchestra.cluster.slurm.cancel_and_wait``) use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable

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
