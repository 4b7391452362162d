"""How the Slurm runner reads a job's end: ``exit_of`` turns a terminal state (from the Slurm
client, ``orchestra.cluster.slurm``) into an ``Exit`` the run summary can show, and ``srun_exit``
reads what srun and slurmstepd wrote to an srun's log.  Talking to Slurm (squeue, sacct, scancel,
sbatch, the state table) is the client's.
"""

from __future__ import annotations

import re

from orchestra.cluster.slurm import INFRA_STATES, SlurmJobState
from orchestra.runners.core.contract import Exit
from orchestra.runners.core.proc import describe_status, signal_name


def exit_of(info: SlurmJobState, time_limit: str | None, mem_gb: float | None) -> Exit:
    """How a job in a terminal state ended, with a reason the run summary can show."""
    code, status = describe_status(info.wait_status)
    job = f"Slurm job {info.job_id}"
    if info.state == "COMPLETED":
        return Exit(code if code != 0 else 0, "" if code == 0 else f"{job} completed with {status}")
    if info.state == "TIMEOUT":
        return Exit(-1, f"Slurm time limit (time_limit={time_limit or 'partition default'}) reached by {job}")
    if info.state == "CANCELLED":
        return Exit(-1, f"{job} was cancelled (scancel) after it was submitted")
    if info.state in INFRA_STATES:  # the cluster's doing, not the task's: retried without spending retry
        return Exit(-1, f"{job} {INFRA_STATES[info.state]}", infra=True)
    if info.state == "OUT_OF_MEMORY":
        return Exit(-1, f"{job} ran out of memory (mem_gb={mem_gb if mem_gb is not None else 'default'})")
    if info.state == "FAILED":
        return Exit(code if code else 1, f"{job} failed with {status}")
    return Exit(-1, f"{job} ended {info.state} ({info.reason or status})")


# -- what srun writes to its stderr --------------------------------------------------------------
_STEP_LINE = re.compile(r"\*\*\* (?:STEP|JOB) (\d+)(?:\.\w+)? ON \S+ CANCELLED AT \S+(?: DUE TO ([A-Z ]+?))? \*\*\*")
_ALLOC_ERROR = re.compile(r"srun: error: (?:Unable to allocate resources|.*allocation failure): (.+)")
HEADER_JOB = re.compile(r"===== slurm: job (\d+)")
#: slurmstepd's ``CANCELLED AT ... DUE TO <cause>`` as the state squeue reports for that end
_STEP_CAUSES = {"TIME LIMIT": "TIMEOUT", "PREEMPTION": "PREEMPTED", "NODE FAILURE": "NODE_FAIL"}


def srun_exit(code: int, log_tail: str, time_limit: str | None) -> Exit:
    """How an ``srun`` that exited ``code`` ended, from what srun and slurmstepd wrote to its log."""
    m = _ALLOC_ERROR.search(log_tail)
    if m:
        return Exit(code or 1, f"srun could not allocate the job: {m.group(1).strip()}")
    header = HEADER_JOB.search(log_tail)
    for m in _STEP_LINE.finditer(log_tail):  # slurmstepd's words, read as the job's end state
        state = _STEP_CAUSES.get((m.group(2) or "").strip(), "CANCELLED")
        ended = exit_of(SlurmJobState(m.group(1), state), time_limit, None)
        return Exit(code or -1, ended.reason, ended.infra)
    if "oom-kill" in log_tail or "Exceeded job memory limit" in log_tail:
        return Exit(code, "out of memory (Slurm's memory limit)")
    if code < 0:
        return Exit(code, f"srun killed by signal {signal_name(-code)}")
    where = f" (Slurm job {header.group(1)})" if header else ""
    return Exit(code, f"exit code {code}{where}")
