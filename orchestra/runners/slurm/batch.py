"""``SlurmRunner(launcher='sbatch')``: batch jobs and job arrays, submitted with plain ``sbatch``.

A round's jobs that need the same resources go as one job array: one
``sbatch --parsable --array=0-N <options> <script>`` call (an argv list, never a shell string;
no value is quoted because none passes through a shell), whose output is the array's job id
(``jobid`` or ``jobid;cluster``).  The script (``job_script``) is written atomically to
``<run>/slurm/`` first and renamed ``<job id>.sh`` once sbatch answered; it picks this array
index's task, appends a header to ``logs/<stage>/<task_id>.log``, runs the task's argv (quoted
with ``shlex.quote``, never re-parsed) with its output appended to that log, appends a footer
with its exit code and leaves with that code.  No Python wrapper runs in the job.

State: one ``squeue -t all -j IDS`` per poll round for every live job; a job squeue forgot is
looked up in ``sacct`` (clusters with accounting), then in the footer of its task log, and is
counted lost after a few rounds.  A failed job's Slurm-side output (``--output``,
``<run>/slurm/<job id>.out``, e.g. slurmstepd's ``CANCELLED ... DUE TO TIME LIMIT``) is
appended to the log.  Cancelling is ``slurm_state.cancel_and_wait``.
"""

from __future__ import annotations

import os
import re
import shlex
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestra.events import EventLog
from orchestra.fileio import append_line, atomic_write_text
from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.core.ledger import JobRecord, Ledger, spec_digest
from orchestra.runners.core.shell import NOW, RC, exports, printf, task_lines
from orchestra.runners.slurm.common import SlurmLauncher, SlurmOptions, job_header, log_offset
from orchestra.runners.slurm.recover import cancel_records
from orchestra.runners.slurm.state import (
    JobInfo,
    SlurmCommandError,
    cancel_and_wait,
    exit_of,
    run_client,
    sacct,
    squeue,
)
from orchestra.tasks.spec import TaskSpec

MAX_ARRAY_SIZE = 1000  # Slurm's default MaxArraySize is 1001
LOST_AFTER_MISSES = 3  # poll rounds in which neither squeue nor sacct knows a job
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


def submit_batch(argv: list[str]) -> tuple[str, str | None]:
    """Run ``sbatch --parsable ...`` (argv) and return the job id (and cluster) it printed."""
    try:
        res = run_client(argv)
    except SlurmCommandError as exc:
        raise SbatchError(str(exc)) from None
    if res.returncode != 0:
        raise SbatchError(" ".join((res.stderr or res.stdout).split()) or f"exit code {res.returncode}")
    return parse_parsable(res.stdout)


def job_script(jobs: list[Job], sbatch_args: Sequence[str] = ()) -> str:
    """The batch script that runs array index ``i`` (0 for a single job) as ``jobs[i]``'s command.

    ``sbatch_args`` are recorded in a comment (they are passed on sbatch's command line).
    """
    lines = ["#!/bin/bash", f"# submitted by orchestra: sbatch {shlex.join(sbatch_args)} <this script>",
             'case "${SLURM_ARRAY_TASK_ID:-0}" in']
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


@dataclass
class BatchHandle:
    """One attempt submitted (or about to be) as a batch job."""

    name: str
    log_offset: int
    job_id: str | None = None
    slurm_log: str = ""  # the job's sbatch --output (the batch shell's own messages)
    misses: int = 0


class SbatchLauncher(SlurmLauncher):
    """Submit a round's jobs (arrays by resources), watch them all with one squeue per poll.

    Args:
        options: what every job asks for.
        tag: the run tag (``run_tag``) in every job name.
        folder: where job scripts and Slurm's own job output go (``RunPaths.slurm_dir``).
        array: submit a round's jobs with the same resources as one job array (False: one by one).
        ledger: where every job is recorded before its id is relied on (None: nowhere).
        adopt: jobs an earlier orchestrator left running, by task id, for its first attempt.
        events: the run's event log (``slurm_adopted``).
    """

    def __init__(self, options: SlurmOptions, tag: str, folder: str, array: bool = True,
                 unfit: str | None = None, ledger: Ledger | None = None,
                 adopt: dict[str, JobRecord] | None = None, events: EventLog | None = None) -> None:
        super().__init__(options, tag, unfit)
        self.ledger = ledger
        self.adopt = dict(adopt or {})
        self.events = events
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.array = array
        self.extra = sbatch_long_options(options.extra_args)
        self.live: dict[str, Job] = {}
        self.states: dict[str, JobInfo] = {}

    # -- submitting -----------------------------------------------------------------------------
    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        refused: dict[Job, Exit] = {}
        groups: dict[str | None, list[Job]] = {}
        for job in jobs:
            job.handle = BatchHandle(self.name_of(job), log_offset(job.log_path))
            record = self.adopt.pop(job.task.task_id, None) if job.attempt == 1 else None
            if record is not None:
                self._adopt(job, record)
                continue
            groups.setdefault(self.options.gres_for(job.task), []).append(job)
        for group in groups.values():
            size = MAX_ARRAY_SIZE if self.array else 1
            for start in range(0, len(group), size):
                refused.update(self._send(group[start : start + size]))
        return refused

    def _record(self, state: str, job: Job, **fields: object) -> None:
        if self.ledger is not None:
            self.ledger.record(state, job.handle.name, **fields)

    def _adopt(self, job: Job, record: JobRecord) -> None:
        """Let ``job`` be the job an earlier orchestrator submitted for its task (still alive)."""
        handle: BatchHandle = job.handle
        handle.name, handle.job_id, handle.log_offset = record.name, record.job_id, 0
        handle.slurm_log = os.path.join(self.folder, f"{record.job_id}.out")
        self.live[record.job_id] = job
        if self.ledger is not None:
            self.ledger.record("adopted", record.name, job_id=record.job_id, by_attempt=job.attempt)
        if self.events is not None:
            self.events.emit("slurm_adopted", task_id=job.task.task_id, stage=job.task.stage, job_id=record.job_id,
                             name=record.name)
        _append(job.log_path, f"===== slurm: adopted job {record.job_id} ({record.name}), submitted by an earlier "
                              "orchestrator of this run folder\n")

    def sbatch_args(self, task: TaskSpec, name: str, count: int) -> list[str]:
        """sbatch's options (without the script) for ``count`` jobs like ``task``, as one array if > 1."""
        args = ["--parsable", f"--job-name={name}", "--nodes=1", "--open-mode=append",
                f"--output={output_pattern(self.folder, count > 1)}"]
        if count > 1:
            args.append(f"--array=0-{count - 1}")
        # No --signal: Slurm sends nothing before the time limit, so an over-limit job ends TIMEOUT.
        return [*args, *self.options.resource_args(task), *self.extra]

    def _send(self, jobs: list[Job]) -> dict[Job, Exit]:
        first = jobs[0]
        name = first.handle.name if len(jobs) == 1 else f"orc-{self.tag}-{first.task.stage}"
        args = self.sbatch_args(first.task, name, len(jobs))
        pending = os.path.join(self.folder, f"submit-{uuid.uuid4().hex[:12]}.sh")
        for job in jobs:  # recorded before the call: a SIGKILL inside it leaves a trace
            self._record("submitting", job, task_id=job.task.task_id, stage=job.task.stage, attempt=job.attempt,
                         digest=spec_digest(job.task))
        try:
            atomic_write_text(pending, job_script(jobs, args))
            job_id, _ = submit_batch(["sbatch", *args, pending])
        except (SbatchError, OSError, ValueError) as exc:
            message = " ".join(str(exc).split())[:500]
            for job in jobs:
                self._record("submit_failed", job)
                _append(job.log_path, f"===== slurm: sbatch did not take {pending}\n")
            return {job: Exit(-1, f"sbatch failed: {message}") for job in jobs}
        script = os.path.join(self.folder, f"{job_id}.sh")
        try:
            os.replace(pending, script)  # sbatch has sent the script to slurmctld: renaming is safe
        except OSError:
            script = pending
        kind = f"array of {len(jobs)}" if len(jobs) > 1 else "single job"
        for i, job in enumerate(jobs):
            handle: BatchHandle = job.handle
            handle.job_id = f"{job_id}_{i}" if len(jobs) > 1 else job_id
            handle.slurm_log = os.path.join(self.folder, f"{handle.job_id}.out")
            self._record("submitted", job, job_id=handle.job_id)
            self.live[handle.job_id] = job
            _append(job.log_path, f"===== slurm: submitted as job {handle.job_id} ({kind}, name {name}, "
                                  f"script {script})\n")
        return {}

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

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        ended: dict[Job, Exit] = self.stops.ended(jobs)
        self._refresh()
        for job in jobs:
            if job not in ended and not self.stops.stopping(job):
                exit_ = self._poll_one(job)
                if exit_ is not None:
                    ended[job] = exit_
        return ended

    def _poll_one(self, job: Job) -> Exit | None:
        handle: BatchHandle = job.handle
        if handle.job_id is None:
            return None
        info = self.states.get(handle.job_id)
        if info is None or not info.terminal:
            if info is None and handle.misses >= LOST_AFTER_MISSES:
                self._forget(handle.job_id)
                self._record("ended", job, job_id=handle.job_id, slurm_state="LOST")
                return Exit(-1, f"Slurm job {handle.job_id} was lost: squeue and sacct no longer know it "
                                "and its log has no end")
            return None
        self._forget(handle.job_id)
        self._record("ended", job, job_id=handle.job_id, slurm_state=info.state)
        ended = exit_of(info, self.options.time_limit, self.options.mem_gb)
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
    def cancel(self, jobs: Sequence[Job]) -> None:
        records = [JobRecord(job.handle.name, job_id=job.handle.job_id) for job in jobs
                   if isinstance(job.handle, BatchHandle) and job.handle.job_id]
        for rec in records:
            self._forget(rec.job_id)
        self.stops.start(jobs, lambda _: self._cancel(records, "cancelled"))

    def _cancel(self, records: list[JobRecord], why: str) -> None:
        if self.ledger is not None:
            cancel_records(records, self.ledger, self.options.cancel_timeout_s, why)
        else:
            cancel_and_wait([r.job_id for r in records], self.options.cancel_timeout_s)

    def close(self) -> None:
        # Every job ended or was cancelled by the loop; this is the net under an unexpected exit,
        # and for jobs kept for adoption by a task that never started.
        self.stops.wait(self.options.cancel_timeout_s + 10)
        leftover = [JobRecord(job.handle.name, job_id=job_id) for job_id, job in self.live.items()]
        self._cancel(leftover + list(self.adopt.values()), "the launch ended")
        self.live.clear()
        self.states.clear()
        self.adopt.clear()


def _append(path: str, text: str) -> None:
    """Append a line of our own to a task log; a log we cannot write must not stop the run."""
    try:
        append_line(path, text.encode("utf-8", "replace"))
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
