"""``SlurmRunner(launcher='sbatch')``: batch jobs and job arrays, submitted through submitit.

submitit's ``SlurmExecutor`` writes the sbatch script (every flag ``shlex.quote``d at the edge,
its option names validated with the list of valid ones), submits it and parses the job id; a
round's jobs that need the same resources go as one job array (``--array=0-N``, one sbatch call).
What runs in the job is orchestra's own few lines of bash (``job_script``): pick this array
index's task, append a header to ``logs/<stage>/<task_id>.log``, run the task's argv (quoted
with ``shlex.quote``, never re-parsed) with its output appended to that log, append a footer
with its exit code and leave with that code.  No Python wrapper runs in the job: submitit's
pickled-function runner would add ~0.25 s of CPU per job (it imports numpy and submitit) and
its ``result()`` needs ``sacct`` to learn that a job died.

State: one ``squeue -t all -j IDS`` per poll round for every live job; a job squeue forgot is
looked up in ``sacct`` (clusters with accounting), then in the footer of its task log, and is
counted lost after a few rounds.  A failed job's Slurm-side output (submitit's ``*_log.out`` in
``<run>/slurm/``, e.g. slurmstepd's ``CANCELLED ... DUE TO TIME LIMIT``) is appended to the log.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Any

from orchestra.runners.base import Exit, Job
from orchestra.runners.slurm import SlurmLauncher, SlurmRunner, _mem_arg, job_header
from orchestra.runners.slurm_state import JobInfo, SlurmCommandError, exit_of, sacct, scancel, squeue

MAX_ARRAY_SIZE = 1000  # Slurm's default MaxArraySize is 1001
LOST_AFTER_MISSES = 3  # poll rounds in which neither squeue nor sacct knows a job
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FOOTER = re.compile(r"===== slurm: job (\S+) ended with exit code (\d+)")


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


def job_script(jobs: list[Job]) -> str:
    """The bash that runs array index ``i`` (0 for a single job) as ``jobs[i]``'s command."""
    lines = ['case "${SLURM_ARRAY_TASK_ID:-0}" in']
    for i, job in enumerate(jobs):
        bad = [name for name in job.command.env if not _ENV_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"task environment variable names must be identifiers, got {bad}")
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(job.command.env.items()))
        lines.append(f"  {i})")
        if exports:
            lines.append(f"    export {exports}")
        lines.append(f"    orc_log={shlex.quote(job.log_path)}")
        lines.append(f"    set -- {shlex.join(job.command.argv)} ;;")
    lines += [
        '  *) echo "orchestra: no task for array index ${SLURM_ARRAY_TASK_ID-}" >&2; exit 1 ;;',
        "esac",
        'orc_job=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}',
        'orc_job=${orc_job:-${SLURM_JOB_ID-?}}',
        f'{job_header("$orc_job")} >>"$orc_log"',
        '"$@" >>"$orc_log" 2>&1 </dev/null',
        "orc_code=$?",
        'printf "===== slurm: job %s ended with exit code %s at %s\\n" "$orc_job" "$orc_code" '
        '"${EPOCHREALTIME-?}" >>"$orc_log"',
        'exit "$orc_code"',
    ]
    return "\n".join(lines)


@dataclass
class BatchHandle:
    """One attempt submitted (or about to be) as a batch job."""

    name: str
    log_offset: int
    job_id: str | None = None
    submit_error: str | None = None
    slurm_log: str = ""  # the job's sbatch --output (the batch shell's own messages)
    misses: int = 0


class SbatchLauncher(SlurmLauncher):
    """Queue a round's jobs, submit them in ``flush`` (arrays by resources), watch them with squeue."""

    def __init__(self, runner: SlurmRunner, folder: str) -> None:
        super().__init__(runner)
        import submitit

        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.executor = submitit.SlurmExecutor(folder=folder, python=shlex.quote(sys.executable))
        self.extra = extra_sbatch_parameters(runner.extra_args)
        self.queued: list[Job] = []
        self.live: dict[str, Job] = {}
        self.states: dict[str, JobInfo] = {}

    # -- submitting -----------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        offset = os.path.getsize(job.log_path) if os.path.exists(job.log_path) else 0
        job.handle = BatchHandle(self.runner.name_of(job), offset)
        self.queued.append(job)

    def flush(self) -> None:
        if self.queued:
            batch, self.queued = self.queued, []
            groups: dict[str | None, list[Job]] = {}
            for job in batch:
                groups.setdefault(self.runner.gres_for(job.task), []).append(job)
            for group in groups.values():
                size = MAX_ARRAY_SIZE if self.runner.array else 1
                for start in range(0, len(group), size):
                    self._send(group[start : start + size])
        self._refresh()

    def parameters(self, job: Job, count: int) -> dict[str, Any]:
        """submitit ``SlurmExecutor`` parameters for ``count`` jobs like ``job`` (one array)."""
        runner = self.runner
        return {
            "job_name": job.handle.name if count == 1 else f"orc-{runner._tag}-{job.task.stage}",
            "partition": runner.partition,
            "qos": runner.qos,
            "gres": runner.gres_for(job.task),
            "cpus_per_task": runner.cpus_per_task,
            "mem": _mem_arg(runner.mem_gb) if runner.mem_gb else None,
            "time": runner.time_minutes,  # None: no --time line, the partition's default applies
            "nodes": 1,
            "use_srun": False,  # the batch step runs the task: no srun step per job
            "stderr_to_stdout": True,
            "wckey": None,
            "array_parallelism": MAX_ARRAY_SIZE,  # max_num_workers already caps jobs in flight
            # submitit always asks for a pre-timeout signal (USR2 by default, to every process of
            # the job: it would kill a task).  SIGURG to the batch shell only is ignored.
            "additional_parameters": {"signal": "B:URG@60", **self.extra},
        }

    def _send(self, jobs: list[Job]) -> None:
        params = self.parameters(jobs[0], len(jobs))
        try:
            self.executor.update_parameters(**params)
            # submitit's own array path pickles Python calls; ours is the script above.  Like
            # that path, set the array size directly (it is not a user parameter).
            if len(jobs) > 1:
                self.executor.parameters["map_count"] = len(jobs)
            else:
                self.executor.parameters.pop("map_count", None)
            sjob = self.executor._submit_command(job_script(jobs))
        except Exception as exc:  # submitit raises FailedJobError (sbatch's stderr), ValueError, OSError...
            message = " ".join(str(exc).split())[:500]
            for job in jobs:
                job.handle.submit_error = f"sbatch failed: {message}"
            return
        from submitit.core.utils import JobPaths

        for i, job in enumerate(jobs):
            handle: BatchHandle = job.handle
            handle.job_id = f"{sjob.job_id}_{i}" if len(jobs) > 1 else str(sjob.job_id)
            handle.slurm_log = str(JobPaths(self.folder, handle.job_id, 0).stdout)
            self.live[handle.job_id] = job
            kind = f"array of {len(jobs)}" if len(jobs) > 1 else "single job"
            script = JobPaths(self.folder, handle.job_id).submission_file
            _append(job.log_path, f"===== slurm: submitted as job {handle.job_id} ({kind}, name "
                                  f"{params['job_name']}, script {script})\n")

    # -- watching -------------------------------------------------------------------------------
    def _refresh(self) -> None:
        """One squeue call for every live job; sacct and log footers for those it forgot."""
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
            footer = _footer(job.log_path, job.handle.log_offset, job_id)
            if footer is not None:
                states[job_id] = JobInfo(job_id, "COMPLETED" if footer == 0 else "FAILED", footer << 8)
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
                                "and its log has no end")
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
            if time.monotonic() - last_scancel > 2.0:
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


def _footer(log_path: str, offset: int, job_id: str) -> int | None:
    """The exit code the job script wrote at the end of this attempt's log, if it did."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    for m in _FOOTER.finditer(text):
        if m.group(1) == job_id:
            return int(m.group(2))
    return None
