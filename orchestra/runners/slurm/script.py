"""What ``SlurmRunner(launcher='sbatch')`` hands to Slurm: the batch script of a round's jobs, the
``sbatch`` call and what it answers, and the footer the script leaves in each task log.

The script (``job_script``) picks its array index's task, appends a header (``core/shell.py``) to
the task log, runs the task's argv (quoted with ``shlex.quote``, never re-parsed) with its output
appended to that log, appends a footer with its exit code and leaves with that code.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence

from orchestra.envfile import source_lines
from orchestra.runners.core.cli import CallError, CallTimeout, call
from orchestra.runners.core.contract import Job
from orchestra.runners.core.run import read_log
from orchestra.runners.core.shell import NOW, RC, exports, printf, task_lines
from orchestra.runners.slurm.common import job_header
from orchestra.runners.slurm.state import SLURM_CALL_TIMEOUT_S

#: a script on its way to sbatch is named ``submit-<orchestrator pid>-<token>.sh`` until sbatch took it
PENDING = "submit-"


def clear_pending(folder: str) -> list[str]:
    """Remove the scripts (and their temporary files) that sbatch calls of an earlier orchestrator of
    this run folder, killed before sbatch took them, left; one of this process's may be in use."""
    mine, removed = f"{PENDING}{os.getpid()}-", list[str]()
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return removed
    for name in names:
        if not (name.startswith((PENDING, ".tmp-")) and PENDING in name and name.endswith(".sh")):
            continue
        if name[name.index(PENDING):].startswith(mine):
            continue
        try:
            os.unlink(os.path.join(folder, name))
            removed.append(name)
        except FileNotFoundError:
            continue
    return removed


_FOOTER = re.compile(r"===== slurm: job (\S+) ended with exit code (\d+)")


class SbatchError(RuntimeError):
    """sbatch refused a submission, or answered something that is not a job id."""


def sbatch_long_options(extra_args: Sequence[str]) -> list[str]:
    """``['--account=x', '--exclusive', '--constraint', 'a100']`` as one argument per option
    (``['--account=x', '--exclusive', '--constraint=a100']``); anything but a long option is refused."""
    options: list[str] = []
    i = 0
    while i < len(extra_args):
        arg = extra_args[i]
        if not arg.startswith("--") or len(arg) < 3:
            raise ValueError(
                f"extra_args {arg!r}: with launcher='sbatch' give sbatch options in long form "
                "('--account=x', '--exclusive')"
            )
        if "=" not in arg and i + 1 < len(extra_args) and not extra_args[i + 1].startswith("-"):
            options.append(f"{arg}={extra_args[i + 1]}")
            i += 1
        else:
            options.append(arg)
        i += 1
    return options


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


def job_script(jobs: list[Job], sbatch_args: Sequence[str] = (), env_file: str | None = None) -> str:
    """The batch script that runs array index ``i`` (0 for a single job) as ``jobs[i]``'s command.

    ``sbatch_args`` are recorded in a comment (they are passed on sbatch's command line).
    ``env_file``: the private file of ``forward_env``'s values (``orchestra.envfile``) the job sources
    first (it exits 97 naming the file when it cannot read it).
    """
    lines = ["#!/bin/bash", f"# submitted by orchestra: sbatch {shlex.join(sbatch_args)} <this script>"]
    if env_file:
        lines += source_lines(env_file, "forward_env; the orchestrator deletes it when the launch ends")
    lines.append('case "${SLURM_ARRAY_TASK_ID:-0}" in')
    for i, job in enumerate(jobs):
        lines.append(f"  {i})")
        lines += [f"    {line}" for line in exports(job.command.env)]
        lines.append(f"    orc_log={shlex.quote(job.log_path)}")
        lines.append(f"    set -- {shlex.join(job.command.argv)} ;;")
    lines += [
        '  *) echo "orchestra: no task for array index ${SLURM_ARRAY_TASK_ID-}" >&2; exit 1 ;;',
        "esac",
        'orc_job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}',
        'orc_job=${orc_job:-${SLURM_JOB_ID-?}}',
        *task_lines('"$@"', job_header('"$orc_job"'),
                    printf("===== slurm: job %s ended with exit code %s at %s", '"$orc_job"', RC, NOW),
                    log='"$orc_log"'),
    ]
    return "\n".join(lines) + "\n"


def footer_code(log_path: str, offset: int, job_id: str) -> int | None:
    """The exit code the job script wrote at the end of this attempt's log, if it did."""
    for m in _FOOTER.finditer(read_log(log_path, offset)):
        if m.group(1) == job_id:
            return int(m.group(2))
    return None


def job_output(slurm_log: str) -> str:
    """The lines a failed job's task log gets from the batch job's own output (``--output``: e.g.
    slurmstepd's ``CANCELLED ... DUE TO TIME LIMIT``), or ``""`` when there are none."""
    text = read_log(slurm_log, 0, limit=20000)
    return f"===== slurm: the batch job's own output ({slurm_log}):\n{text.rstrip()}\n" if text.strip() else ""
