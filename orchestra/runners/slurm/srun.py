"""``SlurmRunner(launcher='srun')``: each attempt is a local ``srun ... <task argv>`` process.

srun runs in its own process group (Ctrl-C is the orchestrator's to handle), its output (the
task's, plus srun's and slurmstepd's messages) is appended to the task log, and its exit code
is the task's.  A non-zero exit is explained from what Slurm wrote to the log (time limit,
scancel, preemption, allocation errors); where the log says only "exit code N", squeue is asked
off the loop (``watch.py``, as for sbatch jobs), and the job ends once it answers.  Cancelling
finds the jobs by their unique names and hands them to the Slurm client's ``cancel_and_wait``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestra.cluster.slurm import TERMINAL_STATES, SlurmCommandError, cancel_and_wait, squeue_by_name
from orchestra.runners.core.contract import Exit, Job, cannot_start
from orchestra.runners.core.proc import signal_group, start_group, stop_groups
from orchestra.runners.core.run import log_size, read_log
from orchestra.runners.slurm.common import SlurmLauncher
from orchestra.runners.slurm.state import HEADER_JOB, exit_of, srun_exit

#: the ends of a job that only Slurm can tell when srun exited with a plain non-zero code
SLURM_ENDS = frozenset({"CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"})
SLURM_WORD_WAIT_S = 10.0  # the longest an exited srun's job waits for that word; then its log's reading stands


@dataclass
class SrunHandle:
    """One attempt run by a local ``srun`` process."""

    proc: subprocess.Popen[bytes]
    name: str
    log_offset: int
    ended: Exit | None = None  # how srun's exit reads, once it exited
    job_id: str = ""  # set while Slurm's word on how the job ended is awaited (the watcher's)
    asked_at: float = 0.0


class SrunLauncher(SlurmLauncher):
    """Each attempt is ``srun ... <task argv>``, a local process in its own process group."""

    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        refused: dict[Job, Exit] = {}
        for job in jobs:
            offset = log_size(job.log_path)
            # Its own process group (Ctrl-C is the orchestrator's to handle, not srun's); SIGTERM,
            # not SIGKILL, if the orchestrator dies, so that srun cancels its job.
            try:
                proc = start_group(job.command.argv, job.command.env, job.log_path,
                                   parent_death_signal=signal.SIGTERM)
            except OSError as exc:
                refused.update(cannot_start([job], exc))
                continue
            job.handle = SrunHandle(proc, self.name_of(job), offset)
        return refused

    def _prepare(self, jobs: Sequence[Job]) -> dict[Job, Exit]:
        """Read how each job whose srun exited ended; hand its job id to the watcher when only Slurm
        can tell (srun can exit before slurmstepd's "CANCELLED AT ..." line reaches the log)."""
        for job in jobs:
            handle: SrunHandle = job.handle
            if self.stops.stopping(job) or handle.ended is not None or (code := handle.proc.poll()) is None:
                continue
            tail = read_log(job.log_path, handle.log_offset, limit=65536) if code else ""
            handle.ended = srun_exit(code, tail, self.options.time_limit) if code else Exit(0)
            header = HEADER_JOB.search(tail)
            if header and handle.ended.reason.startswith("exit code"):
                handle.job_id, handle.asked_at = header.group(1), time.monotonic()
                self.watch.live[handle.job_id] = job
        return {}

    def _poll_one(self, job: Job) -> Exit | None:
        handle: SrunHandle = job.handle
        if handle.ended is None or not handle.job_id:
            return handle.ended
        info = self.watch.ended(handle.job_id)  # finished jobs stay in squeue for MinJobAge
        if info is None and time.monotonic() - handle.asked_at < SLURM_WORD_WAIT_S:
            return None
        self.watch.forget(handle.job_id)
        if info is not None and info.state in SLURM_ENDS:
            return exit_of(info, self.options.time_limit, self.options.mem_gb)
        return handle.ended

    def cancel(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            if isinstance(job.handle, SrunHandle) and job.handle.job_id:
                self.watch.forget(job.handle.job_id)
        self.stops.start(jobs, self._stop)

    def _stop(self, jobs: list[Job]) -> None:
        """scancel the jobs (SIGTERM an srun still waiting for its allocation), wait for squeue to
        agree and the srun processes to exit (bounded), then SIGKILL whatever is left (an empty
        ``jobs``, e.g. a batch whose submit raised before any srun started, asks Slurm nothing)."""
        handles = [job.handle for job in jobs if isinstance(job.handle, SrunHandle)]
        names = {h.name for h in handles}
        try:
            found = squeue_by_name(names)
        except SlurmCommandError:
            found = {}
        alive = {jid: name for jid, (name, state) in found.items() if state not in TERMINAL_STATES}
        # An srun whose job squeue does not show yet is still asking for an allocation: SIGTERM
        # makes it withdraw the request (and cancel the job, had it just started).  The others'
        # jobs are scancelled, so that Slurm records them CANCELLED.
        for h in handles:
            if h.name not in alive.values() and h.proc.poll() is None:
                signal_group(h.proc.pid, signal.SIGTERM)
        cancel_and_wait(alive, self.options.cancel_timeout_s, names=names,
                        busy=lambda: any(h.proc.poll() is None for h in handles))
        stop_groups([h.proc for h in handles], grace_s=0)  # what outlived the wait, group and all
