"""Stop-and-confirm for a service whose client takes one job per call (``dlc stop job ID``).

``stop_and_confirm`` sends a stop to a list of jobs and looks at a list of jobs; a client that
stops or shows one job per call needs many calls at once, or a Ctrl-C on a big run would stop its
jobs one after the other.  ``stop_each`` runs those calls in a pool (``concurrency`` at once),
every stop sent before the first look, and returns what the service last showed of each job,
which :func:`outcome` turns into the ledger's word for it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor

from orchestra.cluster.confirm import stop_and_confirm

#: the state of a job the service never showed during the stop
UNKNOWN = "unknown"


def stop_each(ids: Sequence[str], stop_one: Callable[[str], object], state_of: Callable[[str], str], *,
              terminal: Collection[str], ending: Collection[str], errors: tuple[type[Exception], ...],
              timeout_s: float, resend_after_s: float, poll_s: float, concurrency: int,
              name: str) -> dict[str, str]:
    """Stop these jobs and wait (at most ``timeout_s``) until the service shows each one over.

    Args:
        ids: the jobs' ids (repeats are stopped once).
        stop_one: sends the stop to one job; an error of ``errors`` is ignored (the looks decide).
        state_of: the service's state of one job; an error of ``errors`` is no answer this time.
        terminal: the states of a job that is over; ``ending``: of one on its way out (no new stop).
        resend_after_s, poll_s: as ``stop_and_confirm``'s.
        concurrency: calls in flight at once; ``name`` names the pool's threads.

    Returns:
        each job's last state seen (``UNKNOWN`` when the service never answered for it).
    """
    ids = list(dict.fromkeys(ids))
    status = dict.fromkeys(ids, UNKNOWN)
    if not ids:
        return status

    def send_one(job_id: str) -> None:
        try:
            stop_one(job_id)
        except errors:
            pass  # the confirmation decides

    def look_one(job_id: str) -> str:
        try:
            return state_of(job_id)
        except errors:
            return UNKNOWN

    with ThreadPoolExecutor(min(concurrency, len(ids)), thread_name_prefix=f"{name}-stop") as pool:

        def send(some: list[str]) -> None:
            list(pool.map(send_one, some))  # every stop sent before the first look

        def alive(waiting: list[str]) -> dict[str, str]:
            for job_id, state in zip(waiting, pool.map(look_one, waiting)):
                status[job_id] = state if state != UNKNOWN else status[job_id]
            return {j: status[j] for j in waiting if status[j] not in terminal}

        stop_and_confirm(ids, send, alive, timeout_s=timeout_s, resend_after_s=resend_after_s, poll_s=poll_s,
                         ending=ending)
    return status


def outcome(state: str, terminal: Collection[str], ending: Collection[str]) -> str:
    """The ledger's word for a stopped job last seen in ``state``: ``stopped`` (over),
    ``stop_acknowledged`` (on its way out) or ``stop_unconfirmed`` (still running, or no answer)."""
    return "stopped" if state in terminal else "stop_acknowledged" if state in ending else "stop_unconfirmed"
