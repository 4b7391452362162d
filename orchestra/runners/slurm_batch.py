"""``SlurmRunner(launcher='sbatch')``: batch jobs and job arrays submitted through submitit.

submitit writes the sbatch script (every value ``shlex.quote``d at the edge), pickles what each
job runs and submits it; a round's jobs that need the same resources go as one job array
(``executor.submit_array``: one sbatch call).  Each job runs ``slurm_job.run_command``: the
task's argv, output appended to ``logs/<stage>/<task_id>.log``, exit status passed on.

submitit is used to submit, never to wait: its state comes from ``sacct`` and its
``result()`` waits forever for a job that died without writing a result when there is no
accounting database.  Instead, one ``squeue -t all -j IDS`` per poll round gives every job's
state; a job squeue forgot is looked up in ``sacct`` and then in its result file, and counted
lost after a few rounds.  submitit's files live in ``<run>/slurm/``; a failed job's Slurm-side
output (e.g. slurmstepd's ``CANCELLED ... DUE TO TIME LIMIT``) is appended to the task log.
"""

from __future__ import annotations

import functools
import os
import pickle
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Any

from orchestra.runners.base import Exit, Job
from orchestra.runners.slurm import SlurmLauncher, SlurmRunner, _mem_arg
from orchestra.runners.slurm_job import run_command
from orchestra.runners.slurm_state import JobInfo, SlurmCommandError, exit_of, sacct, scancel, squeue

MAX_ARRAY_SIZE = 1000  # Slurm's default MaxArraySize is 1001
LOST_AFTER_MISSES = 3  # poll rounds in which neither squeue nor sacct knows a job


def extra_sbatch_parameters(extra_args: list[str]) -> dict[str, Any]:
    """``['--account=x', '--exclusive', '--constraint', 'a100']`` as submitit's
    ``additional_parameters`` (``{'account': 'x', 'exclusive': True, 'constraint': 'a100'}``)."""
    params: dict[str, Any] = {}
    i = 0
    while i < len(extra_args):
        arg = extra_args[i]
        if not arg.startswith("--") or len(arg) < 3:
            raise ValueError(
                f"extra_args {arg!r}: with launcher='sbatch' give sbatch options in long form "
                "('--account=x', '--exclusive')"
            )
        key, eq, value = arg[2:].partition("=")
        if eq:
            params[key] = value
        elif i + 1 < len(extra_args) and not extra_args[i + 1].startswith("-"):
            params[key] = extra_args[i + 1]
            i += 1
        else:
            params[key] = True
        i += 1
    return params


@dataclass
class BatchHandle:
    """One attempt submitted (or about to be) as a batch job."""

    name: str
    job_id: str | None = None
    submit_error: str | None = None
    slurm_log: str = ""  # the job's sbatch --output (submitit's log file)
    result_file: str = ""
    misses: int = 0


class SbatchLauncher(SlurmLauncher):
    """Queue a round's jobs, submit them in ``flush`` (arrays by resources), watch them with squeue."""

    def __init__(self, runner: SlurmRunner, folder: str) -> None:
        super().__init__(runner)
        import submitit

        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.executor = submitit.SlurmExecutor(folder=folder, python=shlex.quote(sys.executable))
        # submitit sleeps 0.2 s between single submissions; the base loop already paces them.
        self.executor._throttling = 0.0
        self.extra = extra_sbatch_parameters(runner.extra_args)
        self.queued: list[Job] = []
        self.live: dict[str, Job] = {}
        self.states: dict[str, JobInfo] = {}

    # -- submitting -----------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        job.handle = BatchHandle(self.runner.name_of(job))
        self.queued.append(job)

    def flush(self) -> None:
        if self.queued:
            batch, self.queued = self.queued, []
            groups: dict[tuple[str | None], list[Job]] = {}
            for job in batch:
                groups.setdefault((self.runner.gres_for(job.task),), []).append(job)
            for group in groups.values():
                if not self.runner.array:
                    for job in group:
                        self._send([job])
                    continue
                for start in range(0, len(group), MAX_ARRAY_SIZE):
                    self._send(group[start : start + MAX_ARRAY_SIZE])
        self._refresh()

    def parameters(self, job: Job, count: int) -> dict[str, Any]:
        """submitit's ``SlurmExecutor`` parameters for ``count`` jobs like ``job``."""
        runner = self.runner
        name = job.handle.name if count == 1 else f"orc-{runner._tag}-{job.task.stage}"
        return {
            "job_name": name,
            "partition": runner.partition,
            "qos": runner.qos,
            "gres": runner.gres_for(job.task),
            "cpus_per_task": runner.cpus_per_task,
            "mem": _mem_arg(runner.mem_gb) if runner.mem_gb else None,
            "time": runner.time_minutes,  # None: no --time line, the partition's default applies
            "nodes": 1,
            "use_srun": False,  # the batch step runs the task itself: no extra srun per job
            "stderr_to_stdout": True,
            "wckey": None,
            "array_parallelism": MAX_ARRAY_SIZE,
            # No pre-timeout USR2: submitit's handler would requeue or fail the job instead of
            # letting Slurm end it as TIMEOUT (SIGURG to the batch shell only is ignored).
            "additional_parameters": {"signal": "B:URG@60", **self.extra},
        }

    def _send(self, jobs: list[Job]) -> None:
        fns = [functools.partial(run_command, list(job.command.argv), dict(job.command.env), job.log_path)
               for job in jobs]
        try:
            self.executor.update_parameters(**self.parameters(jobs[0], len(jobs)))
            submitted = self.executor.submit_array(fns)
        except Exception as exc:  # submitit raises FailedJobError, FailedSubmissionError, RuntimeError...
            message = " ".join(str(exc).split())[:500]
            for job in jobs:
                job.handle.submit_error = f"sbatch failed: {message}"
            return
        for job, sjob in zip(jobs, submitted):
            handle: BatchHandle = job.handle
            handle.job_id = str(sjob.job_id)
            handle.slurm_log = str(sjob.paths.stdout)
            handle.result_file = str(sjob.paths.result_pickle)
            self.live[handle.job_id] = job
            kind = f"array of {len(jobs)}" if len(jobs) > 1 else "single job"
            _append(job.log_path, f"===== slurm: submitted as job {handle.job_id} ({kind}, "
                                  f"name {shlex.quote(self.parameters(job, len(jobs))['job_name'])})\n")

    # -- watching -------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """One squeue call for every live job; sacct and result files for those it forgot."""
        if not self.live:
            return
        try:
            states = squeue(self.live)
        except SlurmCommandError:
            return  # the controller may be restarting: keep the last answer, try next round
        missing = [job_id for job_id in self.live if job_id not in states]
        if missing:
            states.update(sacct(missing))
        for job_id in missing:
            if job_id in states:
                continue
            job = self.live[job_id]
            done = _read_result(job.handle.result_file)
            if done is not None:
                states[job_id] = done
            else:
                job.handle.misses += 1
        self.states.update(states)

    def poll(self, job: Job) -> Exit | None:
        handle: BatchHandle = job.handle
        if handle.submit_error:
            return Exit(-1, handle.submit_error)
        if handle.job_id is None:
            return None  # queued; flush submits it this round
        info = self.states.get(handle.job_id)
        if info is None or not info.terminal:
            if info is None and handle.misses >= LOST_AFTER_MISSES:
                self._forget(handle.job_id)
                return Exit(-1, f"Slurm job {handle.job_id} was lost: squeue and sacct no longer know it "
                                "and it left no result")
            return None
        self._forget(handle.job_id)
        ended = exit_of(info, self.runner.time_limit, self.runner.mem_gb)
        if ended.code != 0:
            self._append_slurm_log(job)
        return ended

    def _forget(self, job_id: str) -> None:
        self.live.pop(job_id, None)
        self.states.pop(job_id, None)

    def _append_slurm_log(self, job: Job) -> None:
        handle: BatchHandle = job.handle
        try:
            with open(handle.slurm_log, encoding="utf-8", errors="replace") as f:
                text = f.read()[-20000:]
        except OSError:
            return
        if text.strip():
            _append(job.log_path, f"===== slurm: the batch job's own output ({handle.slurm_log}):\n"
                                  f"{text.rstrip()}\n")

    # -- stopping -------------------------------------------------------------------------------
    def cancel(self, jobs: list[Job]) -> None:
        self.queued = [job for job in self.queued if job not in jobs]  # never submitted
        ids = [job.handle.job_id for job in jobs if isinstance(job.handle, BatchHandle) and job.handle.job_id]
        self._cancel_ids(ids)
        for job_id in ids:
            self._forget(job_id)

    def _cancel_ids(self, ids: list[str]) -> None:
        """scancel ``ids``; wait until squeue shows each of them ended (or forgotten), bounded."""
        if not ids:
            return
        scancel(ids)
        deadline = time.monotonic() + self.runner.cancel_timeout_s
        last_scancel = time.monotonic()
        while time.monotonic() < deadline:
            try:
                states = squeue(ids)  # asks by array id: other tasks of an array may be listed too
            except SlurmCommandError:
                time.sleep(0.2)
                continue
            alive = [job_id for job_id in ids if job_id in states and not states[job_id].terminal]
            if not alive:
                return
            if time.monotonic() - last_scancel > 2.0:  # e.g. a job that was still being submitted
                scancel([job_id for job_id in alive if states[job_id].state != "COMPLETING"])
                last_scancel = time.monotonic()
            time.sleep(0.2)

    def close(self) -> None:
        # Every job ended or was cancelled by the loop; this is the net under an unexpected exit.
        leftover = list(self.live)
        self.queued = []
        self._cancel_ids(leftover)
        self.live.clear()
        self.states.clear()


def _append(path: str, text: str) -> None:
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        pass


def _read_result(path: str) -> JobInfo | None:
    """A job's state from its submitit result file, for a job squeue and sacct forgot."""
    try:
        with open(path, "rb") as f:
            outcome = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None
    job_id = os.path.basename(path).split("_0_result", 1)[0]
    if isinstance(outcome, tuple) and outcome and outcome[0] == "success":
        return JobInfo(job_id, "COMPLETED", 0)
    return JobInfo(job_id, "FAILED", 1 << 8, "submitit wrapper error")
