"""What a Slurm launcher knows about its jobs, learnt off the scheduling loop (sbatch: every live
job; srun: a job whose srun exited with a plain non-zero code, until Slurm says how it ended).

A look is one ``squeue`` for every watched job, ``sacct`` for those it forgot, then the footer the
job left in its log; it runs in one background thread, one look at a time, so that a slow or hung
``slurmctld`` (each call is bounded by ``SLURM_CALL_TIMEOUT_S``) never holds up the loop.
``refresh`` takes in the look that finished, starts the next and waits for it only
``FRESH_WAIT_S``: with a controller that answers at once every round sees what Slurm says now,
with a slow one it sees the last answer.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from orchestra.cluster.slurm import SlurmCommandError, SlurmJobState, sacct, squeue
from orchestra.runners.core.contract import Job

FRESH_WAIT_S = 0.2  # how long a round waits for the look it just started
LOST_AFTER_MISSES = 3  # looks in which neither squeue, sacct nor its log knows a job
LOST = "LOST"  # the state ``ended`` gives a job counted lost

#: the exit code a job left at the end of its log (log path, offset of this attempt, job id), or None
Footer = Callable[[str, int, str], "int | None"]
#: what one look was asked (job id -> its log and the offset of this attempt) and what it answered
Answer = tuple[dict[str, tuple[str, int]], dict[str, SlurmJobState] | None]


def look(asked: dict[str, tuple[str, int]], footer: Footer | None) -> Answer:
    """One look at the ``asked`` jobs (in the watcher's thread: it reads no shared state); jobs
    nothing knows are absent from the answer, which is None when squeue gave none (a restarting
    controller)."""
    try:
        states = squeue(asked)
    except SlurmCommandError:
        return asked, None
    missing = [job_id for job_id in asked if job_id not in states]
    if missing:
        states.update(sacct(missing))
    for job_id in missing:
        if job_id not in states and footer is not None and (code := footer(*asked[job_id], job_id)) is not None:
            states[job_id] = SlurmJobState(job_id, "COMPLETED" if code == 0 else "FAILED", code << 8)
    return asked, states


class Watch:
    """The watched jobs by Slurm job id, their last known states, and the look in flight.

    Args:
        footer: reads the exit code a job script leaves in its log (None: jobs leave none).
    """

    def __init__(self, footer: Footer | None = None) -> None:
        self.footer = footer
        self.live: dict[str, Job] = {}
        self.states: dict[str, SlurmJobState] = {}
        self.misses: dict[str, int] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="slurm-look")
        self._looking: Future[Answer] | None = None

    def refresh(self) -> None:
        """Take in the look that finished; start one at the live jobs if none is in flight."""
        self._take()
        if self._looking is None and self.live:
            asked = {job_id: (job.log_path, job.handle.log_offset) for job_id, job in self.live.items()}
            self._looking = self._pool.submit(look, asked, self.footer)
            wait([self._looking], FRESH_WAIT_S)
            self._take()

    def _take(self) -> None:
        if self._looking is None or not self._looking.done():
            return
        asked, states = self._looking.result()  # an error of the look (a bug) is raised here, on the loop
        self._looking = None
        if states is None:
            return  # the controller may be restarting: keep the last answer, look again next round
        for job_id in asked.keys() - states.keys():
            if job_id in self.live:  # neither squeue, sacct nor its log knows it
                self.misses[job_id] = self.misses.get(job_id, 0) + 1
        # only jobs still watched: one cancelled (or ended) while the look ran is forgotten for good
        self.states.update({job_id: s for job_id, s in states.items() if job_id in self.live})

    def ended(self, job_id: str) -> SlurmJobState | None:
        """How this job ended (state ``LOST`` after ``LOST_AFTER_MISSES`` looks that found nothing of
        it), forgetting it; None while it is alive, or not known yet."""
        info = self.states.get(job_id)
        if info is None and self.misses.get(job_id, 0) >= LOST_AFTER_MISSES:
            info = SlurmJobState(job_id, LOST)
        elif info is None or not info.terminal:
            return None
        self.forget(job_id)
        return info

    def forget(self, job_id: str) -> None:
        self.live.pop(job_id, None)
        self.states.pop(job_id, None)
        self.misses.pop(job_id, None)

    def close(self) -> None:
        """Wait for the look in flight (bounded by the Slurm call timeout) and end the thread."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._looking = None
        self.live.clear()
        self.states.clear()
        self.misses.clear()
