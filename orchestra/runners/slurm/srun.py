"""``SlurmRunner(launcher='srun')``: each attempt is a local ``srun ... <task argv>`` process.

srun runs in its own process group (Ctrl-C is the orchestrator's to handle), its output (the
task's, plus srun's and slurmstepd's messages) is appended to the task log, and its exit code
is the task's.  A non-zero exit is explained from what Slurm wrote to the log (time limit,
scancel, preemption, allocation errors).  Cancelling finds the jobs by their unique names and
hands them to ``slurm_state.cancel_and_wait``, the one cancel path of the Slurm backend.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestra.runners.core.contract import Exit, Job, cannot_start
from orchestra.runners.core.proc import signal_group, start_group
from orchestra.runners.core.run import log_size, read_log
from orchestra.runners.slurm.common import SlurmLauncher
from orchestra.runners.slurm.state import (
    HEADER_JOB,
    TERMINAL_STATES,
    SlurmCommandError,
    cancel_and_wait,
    exit_of,
    squeue,
    squeue_by_name,
    srun_exit,
)


@dataclass
class SrunHandle:
    """One attempt run by a local ``srun`` process."""

    proc: subprocess.Popen[bytes]
    name: str
    log_offset: int


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

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        return self.stops.poll_each(jobs, self._poll_one)

    def _poll_one(self, job: Job) -> Exit | None:
        handle: SrunHandle = job.handle
        code = handle.proc.poll()
        if code is None:
            return None
        if code == 0:
            return Exit(0)
        tail = read_log(job.log_path, handle.log_offset, limit=65536)
        ended = srun_exit(code, tail, self.options.time_limit)
        header = HEADER_JOB.search(tail)
        if header and ended.reason.startswith("exit code"):
            # srun can exit before slurmstepd's "CANCELLED AT ..." line reaches the log: ask
            # Slurm how the job ended (finished jobs stay in squeue for MinJobAge).
            try:
                info = squeue([header.group(1)]).get(header.group(1))
            except SlurmCommandError:
                info = None
            if info is not None and info.state in ("CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
                                                   "OUT_OF_MEMORY"):
                return exit_of(info, self.options.time_limit, self.options.mem_gb)
        return ended

    def cancel(self, jobs: Sequence[Job]) -> None:
        self.stops.start(jobs, self._stop)

    def _stop(self, jobs: list[Job]) -> None:
        """scancel the jobs (SIGTERM an srun still waiting for its allocation), wait for squeue to
        agree and the srun processes to exit (bounded), then SIGKILL whatever is left."""
        handles = [job.handle for job in jobs if isinstance(job.handle, SrunHandle)]
        if not handles:
            return
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
        for h in handles:
            if h.proc.poll() is None:
                signal_group(h.proc.pid, signal.SIGKILL)
            try:
                h.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        self.stops.wait(self.options.cancel_timeout_s + 10)
