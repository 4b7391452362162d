"""``SlurmRunner(launcher='sbatch')``: batch jobs and job arrays, submitted with plain ``sbatch``.

A round's jobs that need the same resources go as one job array (``script.py`` writes the script
and makes the sbatch call); every job is in the run folder's ledger before its id is relied on.
The watcher (``watch.py``) tells their states off the loop; a failed job's Slurm-side output
(``<run>/slurm/<job id>.out``, e.g. slurmstepd's ``CANCELLED ... DUE TO TIME LIMIT``) is appended
to its log.  A submission the cluster refuses for now waits, with every job submitted after it,
in ``core.refused``'s queue, the tasks' ``retry`` unspent; a permanent refusal (a bad partition,
an invalid option) fails the tasks at once with sbatch's reason in one line.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestra.cluster.slurm import SbatchError, SbatchRefused, output_pattern, submit_batch
from orchestra.envfile import remove_env_file, write_env_file
from orchestra.events import EventLog
from orchestra.fileio import atomic_write_text
from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.core.ledger import JobRecord, Ledger, spec_digest
from orchestra.runners.core.refused import SUBMIT_BACKOFF_S, SUBMIT_WAIT_S, RefusedQueue, Waiting
from orchestra.runners.core.run import log_size, note
from orchestra.runners.slurm.common import SlurmLauncher, SlurmOptions
from orchestra.runners.slurm.recover import cancel_records
from orchestra.runners.slurm.script import PENDING, footer_code, job_output, job_script, sbatch_long_options
from orchestra.runners.slurm.state import exit_of
from orchestra.runners.slurm.watch import LOST
from orchestra.tasks.spec import TaskSpec

MAX_ARRAY_SIZE = 1000  # Slurm's default MaxArraySize is 1001


@dataclass
class BatchHandle:
    """One attempt submitted (or about to be) as a batch job."""

    name: str
    log_offset: int
    job_id: str | None = None
    slurm_log: str = ""  # the job's sbatch --output (the batch shell's own messages)


class SbatchLauncher(SlurmLauncher):
    """Submit a round's jobs (arrays by resources), watch them all with one squeue per poll.

    Args:
        options: what every job asks for.
        tag: the run tag (``run_tag``) in every job name.
        folder: where job scripts and Slurm's own job output go (``RunPaths.slurm_dir``).
        array: submit a round's jobs with the same resources as one job array (False: one by one).
        ledger: where every job is recorded before its id is relied on (None: nowhere).
        adopt: jobs an earlier orchestrator left running, by task id, for its first attempt.
        events: the run's event log (``slurm_adopted``, ``slurm_submit_refused``).
        submit_wait_s: how long jobs the cluster keeps refusing for now wait before they end.
        submit_backoff_s: the waits after 1, 2, ... such refusals in a row (then the last, again).
        forward_env: variables every job gets privately (``SlurmRunner.private_variables``: its
            ``forward_env`` and secret-looking variables): their values are written to ``env_file``
            (``orchestra.envfile``: 0600 in a 0700 folder) that the job script sources, and taken out
            of sbatch's own environment, so that Slurm never stores them with the job (slurmctld
            saves the environment of every batch job it holds); the file is deleted on ``close``.
        env_file: where (``<run>/slurm/private/<stage>.env``); needed with ``forward_env``; deleted on
            ``close`` also without it (the file a SIGKILLed launch of the stage left).
    """

    def __init__(self, options: SlurmOptions, tag: str, folder: str, array: bool = True,
                 unfit: str | None = None, ledger: Ledger | None = None,
                 adopt: dict[str, JobRecord] | None = None, events: EventLog | None = None,
                 submit_wait_s: float = SUBMIT_WAIT_S,
                 submit_backoff_s: Sequence[float] = SUBMIT_BACKOFF_S, forward_env: Sequence[str] = (),
                 env_file: str | None = None) -> None:
        if forward_env and not env_file:
            raise ValueError("forward_env needs an env_file")
        self.env_file = env_file if forward_env else None
        self.old_env_file = env_file  # deleted on close even unwritten: a SIGKILLed launch's, whose jobs are over then
        if self.env_file:  # before any job exists: every one sources it
            write_env_file(self.env_file, forward_env)
        hidden = set(forward_env)
        self.sbatch_env = {k: v for k, v in os.environ.items() if k not in hidden} if hidden else None
        super().__init__(options, tag, unfit, footer_code)
        self.ledger = ledger
        self.adopt = dict(adopt or {})
        self.events = events
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.array = array
        self.extra = sbatch_long_options(options.extra_args)
        self.waiting = RefusedQueue("slurm", "the Slurm cluster", submit_wait_s, submit_backoff_s, events)

    # -- submitting -----------------------------------------------------------------------------
    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        refused: dict[Job, Exit] = {}
        groups: dict[str | None, list[Job]] = {}
        for job in jobs:
            job.handle = BatchHandle(self.name_of(job), log_size(job.log_path))
            record = self.adopt.pop(job.task.task_id, None) if job.attempt == 1 else None
            if record is not None:
                self._adopt(job, record)
                continue
            groups.setdefault(self.options.gres_for(job.task), []).append(job)
        for group in groups.values():
            size = MAX_ARRAY_SIZE if self.array else 1
            for start in range(0, len(group), size):
                refused.update(self.waiting.submit(group[start : start + size], self._send))
        return refused

    def _record(self, state: str, job: Job, **fields: object) -> None:
        if self.ledger is not None:
            self.ledger.record(state, job.handle.name, **fields)

    def _adopt(self, job: Job, record: JobRecord) -> None:
        """Let ``job`` be the job an earlier orchestrator submitted for its task (still alive)."""
        handle: BatchHandle = job.handle
        handle.name, handle.job_id, handle.log_offset = record.name, record.job_id, 0
        handle.slurm_log = os.path.join(self.folder, f"{record.job_id}.out")
        self.watch.live[record.job_id] = job
        if self.ledger is not None:
            self.ledger.record("adopted", record.name, job_id=record.job_id, by_attempt=job.attempt)
        if self.events is not None:
            self.events.emit("slurm_adopted", task_id=job.task.task_id, stage=job.task.stage, job_id=record.job_id,
                             name=record.name)
        note(job.log_path, f"===== slurm: adopted job {record.job_id} ({record.name}), submitted by an earlier "
                              "orchestrator of this run folder\n")

    def sbatch_args(self, task: TaskSpec, name: str, count: int) -> list[str]:
        """sbatch's options (without the script) for ``count`` jobs like ``task``, as one array if > 1."""
        args = ["--parsable", f"--job-name={name}", "--nodes=1", "--open-mode=append",
                f"--output={output_pattern(self.folder, count > 1)}"]
        if count > 1:
            args.append(f"--array=0-{count - 1}")
        # No --signal: Slurm sends nothing before the time limit, so an over-limit job ends TIMEOUT.
        return [*args, *self.options.resource_args(task), *self.extra]

    def _send(self, jobs: list[Job], waited: Waiting | None = None) -> dict[Job, Exit]:
        """Submit ``jobs`` (one array, or one job); the failures of a permanent refusal, else ``{}``
        (a refusal for now puts them first in ``waiting``)."""
        first, token = jobs[0], uuid.uuid4().hex[:12]
        # an array's name is its own (-r finds an array whose sbatch call a SIGKILL cut short by it)
        name = first.handle.name if len(jobs) == 1 else f"orc-{self.tag}-{first.task.stage}-{token[:8]}"
        args = self.sbatch_args(first.task, name, len(jobs))
        pending = os.path.join(self.folder, f"{PENDING}{os.getpid()}-{token}.sh")
        for job in jobs:  # recorded before the call: a SIGKILL inside it leaves a trace
            self._record("submitting", job, task_id=job.task.task_id, stage=job.task.stage, attempt=job.attempt,
                         digest=spec_digest(job.task), **({"submitted_as": name} if len(jobs) > 1 else {}))
        try:
            atomic_write_text(pending, job_script(jobs, args, self.env_file))
            job_id, _ = submit_batch(["sbatch", *args, pending], env=self.sbatch_env)
        except (SbatchError, OSError, ValueError) as exc:
            message = " ".join(str(exc).split())[:500]
            for job in jobs:
                self._record("submit_failed", job, error=message)
            if isinstance(exc, SbatchRefused) and exc.transient:
                self.waiting.refused(jobs, message, waited)
                return {}
            for job in jobs:
                note(job.log_path, f"===== slurm: sbatch did not take {pending}: {message}\n")
            if isinstance(exc, SbatchRefused):
                asked = " ".join([*self.options.resource_args(first.task), *self.extra])
                return {job: Exit(-1, f"sbatch refused the job: {message}" + (f" (asked: {asked})" if asked else ""))
                        for job in jobs}
            return {job: Exit(-1, f"sbatch failed: {message}") for job in jobs}
        self.waiting.taken()
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
            self.watch.live[handle.job_id] = job
            note(job.log_path, f"===== slurm: submitted as job {handle.job_id} ({kind}, name {name}, "
                                  f"script {script})\n")
        return {}

    # -- watching -------------------------------------------------------------------------------
    def _prepare(self, jobs: Sequence[Job]) -> dict[Job, Exit]:
        return self.waiting.resubmit(set(jobs), self._send)  # what waits is due, or waited too long

    def _poll_one(self, job: Job) -> Exit | None:
        handle: BatchHandle = job.handle
        info = self.watch.ended(handle.job_id) if handle.job_id else None
        if info is None:
            return None
        self._record("ended", job, job_id=handle.job_id, slurm_state=info.state)
        if info.state == LOST:
            return Exit(-1, f"Slurm job {handle.job_id} was lost: squeue and sacct no longer know it "
                            "and its log has no end")
        ended = exit_of(info, self.options.time_limit, self.options.mem_gb)
        if ended.code != 0:
            note(job.log_path, job_output(job.handle.slurm_log))
        return ended

    def cancel(self, jobs: Sequence[Job]) -> None:
        records = [JobRecord(job.handle.name, job_id=job.handle.job_id) for job in jobs
                   if isinstance(job.handle, BatchHandle) and job.handle.job_id]
        self.waiting.drop(set(jobs))  # jobs still waiting to be submitted are simply never submitted
        for rec in records:
            self.watch.forget(rec.job_id)
        self.stops.start(jobs, lambda _: cancel_records(records, self.ledger, self.options.cancel_timeout_s,
                                                        "cancelled"))

    def close(self) -> None:
        # Every job ended or was cancelled by the loop; this is the net under an unexpected exit,
        # and for jobs kept for adoption by a task that never started.  The loop's stops are waited
        # for after it, in ``super().close()``, whose watcher ends even when that wait is interrupted.
        leftover = [JobRecord(job.handle.name, job_id=job_id) for job_id, job in self.watch.live.items()]
        try:
            cancel_records(leftover + list(self.adopt.values()), self.ledger, self.options.cancel_timeout_s,
                           "the launch ended")
        finally:
            try:
                super().close()
            finally:
                if self.old_env_file:  # every job of this launch (and adopted ones) is over or cancelled
                    remove_env_file(self.old_env_file)
        self.adopt.clear()
        self.waiting.groups.clear()

