"""What Slurm says about jobs, without an accounting database, how they ended, and the one way to
cancel them.

One ``squeue -h -t all -j IDS`` call answers for many jobs (finished jobs stay visible for
``MinJobAge`` seconds); ``sacct``'s failure ("accounting storage is disabled") is an answer, not
an error.  Every client call goes through ``CLIENT`` (``core.client.CLIClient``: bounded, counted by
verb, each failure one ``SlurmCommandError``).  ``cancel_and_wait`` is how both launchers stop
jobs: ``core.stopping.stop_and_confirm`` with ``scancel`` to stop and ``squeue`` to confirm.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from orchestra.runners.core.client import CLIClient
from orchestra.runners.core.contract import Exit
from orchestra.runners.core.proc import describe_status, signal_name
from orchestra.runners.core.stopping import stop_and_confirm

#: states after which a job never runs again (anything else is still alive: PENDING, RUNNING,
#: COMPLETING, CONFIGURING, SUSPENDED, REQUEUED, RESIZING, SIGNALING, STAGE_OUT, ...)
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT",
})

#: terminal states in which the cluster, not the task, ended the job (``Exit.infra``), and the words
INFRA_STATES = {"PREEMPTED": "was preempted", "NODE_FAIL": "failed: its node failed",
                "BOOT_FAIL": "failed: its node did not boot"}

SLURM_CALL_TIMEOUT_S = 60.0
_SQUEUE_FORMAT = "JobArrayID:|,State:|,exit_code:|,Reason:|"
_PENDING_RANGE = re.compile(r"(\d+)_\[([0-9,\-]+)(?:%\d+)?\]")


@dataclass(frozen=True)
class SlurmJobState:
    """One job's state as Slurm reports it.

    Attributes:
        job_id: ``"123"`` or, for an array task, ``"123_4"``.
        state: Slurm's state name (``CANCELLED by 0`` is reduced to ``CANCELLED``).
        wait_status: the raw wait status (``code << 8 | signal``), when known.
        reason: Slurm's reason field (``TimeLimit``, ``NonZeroExitCode``, ...).
    """

    job_id: str
    state: str
    wait_status: int | None = None
    reason: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class SlurmCommandError(RuntimeError):
    """A Slurm client command failed in a way that says nothing about the jobs."""


#: every squeue / sacct / scancel call of this process: unpaced (slurmctld sets no per-user rate),
#: bounded by ``SLURM_CALL_TIMEOUT_S`` (its process group is killed then), counted by verb;
#: ``SlurmCommandError`` when a call cannot start or does not answer in time
CLIENT = CLIClient("slurm", "slurm", SLURM_CALL_TIMEOUT_S, None, None, SlurmCommandError, timeout_name="")


def _expand_pending(line_id: str) -> list[str]:
    """``"12_[3-5,8%2]"`` (array tasks not yet started) -> ``["12_3", "12_4", "12_5", "12_8"]``."""
    m = _PENDING_RANGE.fullmatch(line_id)
    if not m:
        return [line_id]
    base, spec = m.group(1), m.group(2)
    out: list[str] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1))
    return out


def parse_squeue(text: str) -> dict[str, SlurmJobState]:
    """Parse ``squeue -h -O JobArrayID:|,State:|,exit_code:|,Reason:|`` output."""
    infos: dict[str, SlurmJobState] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 2 or not parts[0].strip():
            continue
        state = parts[1].strip().split()[0] if parts[1].strip() else "UNKNOWN"
        status = parts[2].strip() if len(parts) > 2 else ""
        reason = parts[3].strip() if len(parts) > 3 else ""
        for job_id in _expand_pending(parts[0].strip()):
            infos[job_id] = SlurmJobState(job_id, state, int(status) if status.isdigit() else None, reason)
    return infos


def _squeue(args: list[str]) -> str:
    """squeue's output for these selection and format options, every state ("Invalid job id": none)."""
    res = CLIENT.call("squeue", ["squeue", "-h", "-t", "all", *args])
    if res.returncode != 0 and "Invalid job id" not in res.stderr:  # every id asked about is unknown
        raise SlurmCommandError(f"squeue failed (exit {res.returncode}): {res.stderr.strip()}")
    return res.stdout if res.returncode == 0 else ""


def squeue(job_ids: Iterable[str]) -> dict[str, SlurmJobState]:
    """The state of these jobs (array tasks included) in one call; jobs squeue forgot are absent.

    Raises ``SlurmCommandError`` when squeue itself fails (e.g. the controller does not answer).
    """
    bases = sorted({j.split("_", 1)[0] for j in job_ids})
    return parse_squeue(_squeue(["-j", ",".join(bases), "-O", _SQUEUE_FORMAT])) if bases else {}


def squeue_by_name(names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """Jobs with one of these names: ``{job_id: (name, state)}`` (every state, one call)."""
    wanted = sorted(set(names))
    out = {}
    for line in _squeue(["--name", ",".join(wanted), "-o", "%i|%j|%T"]).splitlines() if wanted else []:
        parts = line.strip().split("|")
        if len(parts) == 3:
            out.update(dict.fromkeys(_expand_pending(parts[0]), (parts[1], parts[2])))
    return out


def sacct(job_ids: Iterable[str]) -> dict[str, SlurmJobState]:
    """What accounting knows about jobs squeue forgot; ``{}`` where there is no accounting."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    try:
        res = CLIENT.call("sacct", ["sacct", "-n", "-P", "-X", "-j", ",".join(ids), "-o", "JobID,State,ExitCode"])
    except SlurmCommandError:
        return {}
    if res.returncode != 0:
        return {}  # "Slurm accounting storage is disabled": the caller decides what a gap means
    infos = {}
    for line in res.stdout.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or parts[0] not in ids:
            continue
        code, _, sig = parts[2].partition(":")
        status = (int(code) << 8 | int(sig or 0)) if code.isdigit() and (sig or "0").isdigit() else None
        infos[parts[0]] = SlurmJobState(parts[0], parts[1].split()[0] if parts[1] else "UNKNOWN", status)
    return infos


def scancel(job_ids: Iterable[str]) -> None:
    """Cancel these jobs (one call; ``stop_and_confirm`` never sends an empty stop); jobs that
    already ended are not an error."""
    try:
        CLIENT.call("scancel", ["scancel", *sorted(set(job_ids))])
    except SlurmCommandError:
        pass  # the caller waits and checks squeue; a failed scancel shows there


RESCANCEL_AFTER_S = 2.0  # a job still alive this long after its scancel is sent another one
_CANCEL_POLL_S = 0.2


def _alive(job_ids: set[str], names: set[str]) -> dict[str, str] | None:
    """``{job id: state}`` of the jobs still alive, by name when names are given; None: no answer."""
    try:
        if names:
            found = squeue_by_name(names)
            return {jid: state for jid, (_, state) in found.items() if state not in TERMINAL_STATES}
        states = squeue(job_ids)  # asks by array id: other tasks of an array may be listed too
    except SlurmCommandError:
        return None
    return {jid: states[jid].state for jid in job_ids if jid in states and not states[jid].terminal}


def cancel_and_wait(job_ids: Iterable[str], timeout_s: float, *, names: Iterable[str] = (),
                    busy: Callable[[], bool] | None = None) -> bool:
    """scancel jobs and return once squeue shows none of them alive, or after ``timeout_s``.

    Args:
        job_ids: jobs to cancel now (``"123"``, ``"123_4"``).
        timeout_s: the longest this waits.
        names: also find jobs by these (unique) job names, each round: a job that appears
            under one of them later, e.g. an srun allocation granted meanwhile, is cancelled too.
        busy: while it returns True the wait goes on (e.g. local srun processes not yet exited).

    Returns:
        True when squeue showed every job gone (and ``busy`` was False) in time.
    """
    ids, wanted = set(job_ids), set(names)

    def look(_: list[str]) -> dict[str, str] | None:
        return _alive(ids, wanted) if ids or wanted else {}

    # COMPLETING jobs are already ending: a second scancel would only add noise.
    return stop_and_confirm(ids, scancel, look, timeout_s=timeout_s, resend_after_s=RESCANCEL_AFTER_S,
                            poll_s=_CANCEL_POLL_S, ending={"COMPLETING"}, busy=busy) == {}


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
