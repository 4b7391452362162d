"""What a batch job submitted by ``SlurmRunner(launcher='sbatch')`` runs on the compute node.

submitit unpickles ``run_command`` with its arguments and calls it inside the job.  It runs the
task's argv (never a shell string) with the task's output appended to the task log in the run
folder, and leaves with the task's own exit status, so that Slurm's job state (``COMPLETED``,
``FAILED`` with that exit code, ``TIMEOUT``, ``CANCELLED``) is the whole answer.  Standard
library only: it starts in every job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import FrameType


def _log_line(log_path: str, text: str) -> None:
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(text + "\n")


def _ignore_usr2() -> None:
    """In the task, before exec: the pre-time-limit USR2 is for the wrapper, not the task."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def run_command(argv: list[str], env: dict[str, str], log_path: str) -> int:
    """Run ``argv`` with ``env`` added, its output appended to ``log_path``; exit with its status.

    Returns 0 when the task succeeded (submitit then writes its result file and the job ends
    ``COMPLETED``); otherwise the process exits at once with the task's exit code (128 + signal
    for a task killed by a signal), so the job ends ``FAILED`` with that code in ``squeue``.
    """
    # submitit's USR2 handler (sent --signal seconds before the time limit) would requeue or
    # raise; orchestra lets Slurm's time limit end the job as TIMEOUT and retries it itself.
    def note_usr2(signum: int, frame: FrameType | None) -> None:
        _log_line(log_path, "===== slurm: the job's time limit is near (SIGUSR2)")

    signal.signal(signal.SIGUSR2, note_usr2)
    _log_line(
        log_path,
        f"===== slurm: job {_job_id()} on {os.environ.get('SLURMD_NODENAME', '?')}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}, started {time.time():.6f}",
    )
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **env}, preexec_fn=_ignore_usr2)
    code = proc.wait()
    if code == 0:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if code > 0 else 128 - code)


def _job_id() -> str:
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array:
        return f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID', '?')}"
    return os.environ.get("SLURM_JOB_ID", "?")
