"""What ``SlurmRunner(launcher='sbatch')`` hands to Slurm: the batch script of a round's jobs and
the footer the script leaves in each task log (the ``sbatch`` call and what it answers are the
Slurm client's: ``orchestra.cluster.slurm.submit_batch``).

The script (``job_script``) picks its array index's task, appends a header (``core/shell.py``) to
the task log, runs the task's argv (quoted with ``shlex.quote``, never re-parsed) with its output
appended to that log, appends a footer with its exit code and leaves with that code.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence

from orchestra.envfile import source_lines
from orchestra.runners.core.contract import Job
from orchestra.runners.core.run import read_log
from orchestra.runners.core.shell import NOW, RC, exports, printf, task_lines
from orchestra.runners.slurm.common import job_header

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
