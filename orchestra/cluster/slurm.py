"""The one Slurm client of orchestra: how the runner's launchers and Slurm-placed replicas
(``orchestra.serving.slurm_place``) talk to Slurm.

- **States**: ``TERMINAL_STATES`` (after which a job never runs again) and ``INFRA_STATES`` (the
  cluster, not the task, ended it), one table for every user.
- **Looks**: one ``squeue -h -t all -j IDS`` call answers for many jobs (finished jobs stay visible
  for ``MinJobAge`` seconds); ``sacct``'s failure ("accounting storage is disabled") is an answer,
  not an error; ``squeue_by_name`` finds jobs by their (unique) names, ``job_state`` one job's
  name, owner and state.
- **Submit**: ``submit_batch`` runs ``sbatch --parsable`` (an argv, never a shell) and tells a
  refusal for now (the cluster's job limits, a busy or drained controller: ``SbatchRefused``,
  ``transient``) from a permanent one; an sbatch about to sleep and ask again by itself is killed
  in its sleep.  What a caller does with a refusal for now is its own (the runner's
  ``core.refused`` queue, a replica's own wait), on one schedule: ``orchestra.cluster.refusal``.
- **Stop**: ``cancel_and_wait``, ``scancel`` until ``squeue`` agrees (``confirm.stop_and_confirm``).
- **Output**: ``output_pattern`` / ``output_arg``, sbatch's ``--output`` with its ``%`` patterns escaped.

Every squeue / sacct / scancel call goes through ``CLIENT`` (``client.CLIClient``: bounded, its
process group killed on the deadline, counted by verb, each failure one ``SlurmCommandError``);
sbatch goes through ``cli.call`` directly (it needs ``stop_on``).  It sits below the runners and
serving (``.importlinter``), so that both may use it; it knows neither.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from orchestra.cluster.cli import CallError, CallTimeout, call
from orchestra.cluster.client import CLIClient
from orchestra.cluster.confirm import stop_and_confirm

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


def squeue_by_name(names: Iterable[str], user: str | None = None) -> dict[str, tuple[str, str]]:
    """Jobs with one of these names (of ``user`` only, when given): ``{job_id: (name, state)}``
    (every state, one call)."""
    wanted = sorted(set(names))
    mine = ["-u", user] if user is not None else []
    out = {}
    for line in _squeue(["--name", ",".join(wanted), *mine, "-o", "%i|%j|%T"]).splitlines() if wanted else []:
        parts = line.strip().split("|")
        if len(parts) == 3:
            out.update(dict.fromkeys(_expand_pending(parts[0]), (parts[1], parts[2])))
    return out


def job_state(job_id: str) -> tuple[str, str, str] | None:
    """(name, user, state) of a job squeue knows; None: unknown (gone) or squeue cannot answer."""
    try:
        parts = _squeue(["-j", job_id, "-o", "%j|%u|%T"]).strip().split("|")
    except SlurmCommandError:
        return None
    return (parts[0], parts[1], parts[2].split()[0]) if len(parts) == 3 and parts[2].strip() else None


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


class SbatchError(RuntimeError):
    """sbatch refused a submission, or answered something that is not a job id."""


def parse_parsable(stdout: str) -> tuple[str, str | None]:
    """``sbatch --parsable``'s answer as ``(job id, cluster or None)``: ``"123"`` or ``"123;c1"``.

    Raises ``SbatchError`` when the last line is not a job id.
    """
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    job_id, sep, cluster = (lines[-1] if lines else "").partition(";")
    if not job_id.isdigit() or (sep and not cluster):
        raise SbatchError(f"unexpected sbatch --parsable output {stdout.strip()[:200]!r}")
    return job_id, cluster or None


def output_pattern(folder: str, array: bool) -> str:
    """sbatch's ``--output`` for a job's own output: ``<folder>/<job id>.out`` with ``<job id>``
    ``A_i`` for array task ``i`` of array ``A``.  A ``%`` in ``folder`` is escaped (``%%``)."""
    # (A backslash anywhere turns every replacement off in Slurm: the jobs then share one file.)
    return os.path.join(folder.replace("%", "%%"), "%A_%a.out" if array else "%j.out")


def output_arg(path: str) -> str:
    """``sbatch --output`` for exactly ``path`` (one job's file, no pattern): sbatch reads ``%j``,
    ``%u``... in it as patterns (a run folder named ``a%jb`` sent the log to a folder that does not
    exist, and the job failed); ``%%`` is a plain ``%``, except in a name with a backslash, which
    Slurm expands its own way: then /dev/null (the caller's script logs by its own redirection)."""
    return "--output=/dev/null" if "\\" in path else f"--output={path.replace('%', '%%')}"


#: What sbatch prints on stderr (sbatch.c, Slurm 22.05) before it sleeps 1, 2, ... 15 s and asks again,
#: for up to 120 s in all: the controller refused the job for now (EAGAIN, e.g. MaxJobCount reached; a
#: job record it could not create; nodes powering up).  ``submit_batch`` stops sbatch right there.
SBATCH_RETRYING = ("sleeping and retrying", "temporarily disabled, retrying")
#: ``Batch job submission failed: <reason>`` reasons (slurm_errno.c) that a later submission may not
#: get: the cluster's job limits and a controller that is busy, drained or unreachable.  Any other
#: reason (a bad partition, an invalid option, an impossible request) is permanent.
SBATCH_TRANSIENT = (
    "Resource temporarily unavailable",  # EAGAIN: MaxJobCount reached, or slurmctld too busy
    "Unable to create job record, try again",  # ESLURM_ERROR_ON_DESC_TO_RECORD_COPY
    "Job violates accounting/QOS policy (job submit limit",  # ESLURM_ACCOUNTING_POLICY: MaxSubmitJobs
    "Required partition not available (inactive or drain)",  # ESLURM_PARTITION_NOT_AVAIL
    "Unable to contact slurm controller (connect failure)",  # nothing reached the controller
)
_SUBMIT_FAILED = re.compile(r"Batch job submission failed:\s*(.+)")


class SbatchRefused(SbatchError):
    """sbatch answered that the cluster did not take the job: ``transient`` when a later try may
    succeed (the cluster's job limits, a busy or drained controller), else permanent.  The message
    is one line: sbatch's reason."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def refusal(stderr: str) -> SbatchRefused:
    """What sbatch's ``stderr`` says of a refused submission: its reason, transient or not."""
    lines = [" ".join(line.split()) for line in stderr.splitlines()
             if line.strip() and not line.startswith('Try "sbatch --help"')]
    if any(marker in line for line in lines for marker in SBATCH_RETRYING):
        reason = next(line for line in lines if any(m in line for m in SBATCH_RETRYING))
        return SbatchRefused(reason.removeprefix("sbatch: error: ").removeprefix("sbatch: "), True)
    failed = [m.group(1) for line in lines if (m := _SUBMIT_FAILED.search(line))]
    errors = [line.removeprefix("sbatch: error: ") for line in lines if line.startswith("sbatch: error: ")]
    reason = (failed or errors or lines or ["no message"])[-1]
    return SbatchRefused(reason, any(marker in reason for marker in SBATCH_TRANSIENT))


def submit_batch(argv: list[str], timeout_s: float = SLURM_CALL_TIMEOUT_S,
                 env: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """Run ``sbatch --parsable ...`` (argv) and return the job id (and cluster) it printed.

    ``env``: sbatch's whole environment (None: ours); Slurm saves what it exports with the job.

    Raises ``SbatchRefused`` when sbatch says the cluster did not take the job; when its stderr says
    it is about to sleep and ask again (the controller refused it for now), sbatch is killed at
    once, while it sleeps (its first sleep is 1 s), so no job can come of it, and the refusal is
    transient.  ``SbatchError`` when sbatch cannot start, does not end within ``timeout_s`` (then
    whether a job was created is unknown), or answers something that is not a job id.
    """
    try:
        res = call(argv, timeout_s, stop_on=SBATCH_RETRYING, env=env)
    except CallError as exc:
        raise SbatchError(str(exc)) from None
    except CallTimeout:
        raise SbatchError(f"{argv[0]}: no answer within {timeout_s:g} s (whether it created a job is unknown)") \
            from None
    if res.returncode == 0:  # (also when sbatch's retry got the job in before the kill landed)
        return parse_parsable(res.stdout)
    raise refusal(res.stderr or res.stdout or f"exit code {res.returncode}")


