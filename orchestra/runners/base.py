"""The one scheduling loop every runner shares.

``BaseRunner.launch`` owns the queue, the ``max_num_workers`` limit, resource slots, retries
with backoff, per-task timeouts, cancellation and the event log.  A backend implements
``submit`` (start a job's command), ``poll`` (has it ended, and how) and ``cancel`` (stop
these jobs now), plus optional resource hooks.  Nothing else.
"""

from __future__ import annotations

import abc
import enum
import heapq
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestra.backoff import exponential_backoff
from orchestra.events import EventLog
from orchestra.paths import RunPaths
from orchestra.runners.command import Command, fill_template
from orchestra.runners.host import HostSlots
from orchestra.tasks.kinds import task_argv
from orchestra.tasks.spec import TaskSpec, output_done


class TaskState(str, enum.Enum):
    """Where a task ended up."""

    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class Exit:
    """How a job ended: its exit code and, when the backend knows more, why.

    ``infra=True`` (with a non-zero code) says the platform failed, not the task: the job never
    got to run it to an end (a submission refused or garbled, a job stuck in a queue, a node
    lost, a preemption).  The loop retries such an attempt without spending the task's own
    ``retry``, at most ``BaseRunner.max_infra_retries`` times per task (with the same backoff,
    or at once and ahead of the queue where the backend sets ``BaseRunner.infra_retry_at_once``);
    after that an infrastructure failure counts like any other.
    """

    code: int
    reason: str = ""
    infra: bool = False


@dataclass
class Job:
    """One attempt of one task, as a backend sees it."""

    task: TaskSpec
    attempt: int
    command: Command
    log_path: str
    resources: dict[str, Any]
    started: float = 0.0
    handle: Any = None  # the backend's own state (a Popen, a Slurm job id, ...)
    timed_out: bool = False
    slot: int = 0  # the loop's worker slot (0 .. max_num_workers-1) this attempt holds


@dataclass
class TaskResult:
    """The outcome of a task after all its attempts."""

    task_id: str
    stage: str
    state: TaskState
    attempts: int
    log_path: str
    reason: str = ""
    duration_s: float = 0.0


class _Results(dict[str, TaskResult]):
    """Results by task id, with a running count per end state: the progress hook gets the
    counts every round, and counting 10,000 results each round would make the loop quadratic."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __setitem__(self, task_id: str, result: TaskResult) -> None:
        old = self.get(task_id)
        if old is not None:
            self.counts[old.state.value] -= 1
        super().__setitem__(task_id, result)
        self.counts[result.state.value] = self.counts.get(result.state.value, 0) + 1


@dataclass
class RunContext:
    """What a runner needs from the run: its folder, its event log, and the stop flag."""

    paths: RunPaths
    events: EventLog
    stop: threading.Event = field(default_factory=threading.Event)
    on_change: Callable[[dict[str, int]], None] | None = None  # progress display hook
    #: set while an upstream stage still runs and may write this launch's inputs: a task
    #: whose inputs are missing then waits (the eval of a (model, dataset) starts as soon as
    #: its predictions are done); once cleared, a task still missing inputs is skipped
    upstream: threading.Event | None = None
    #: this machine's GPUs and cores as the run's local runners hand them out (the stages
    #: share one when they run side by side); None: each local runner keeps its own
    host: HostSlots | None = None

    def inputs_may_come(self) -> bool:
        return self.upstream is not None and self.upstream.is_set()


@dataclass
class _Pending:
    task: TaskSpec
    attempt: int
    not_before: float = 0.0
    first_started: float = 0.0
    infra_retries: int = 0  # attempts retried as infrastructure failures: they do not count against ``retry``
    inputs_ready: bool = True  # False until its inputs (an upstream stage's outputs) exist
    inputs_checked: float = 0.0  # when they were last looked for
    inputs_seen: int = 0  # its first inputs_seen inputs were found done (they stay done during a launch)


class BaseRunner(abc.ABC):
    """Run tasks through a backend with limits, retries, timeouts and clean cancellation.

    Args:
        max_num_workers: tasks running at once.
        retry: extra attempts for a task that fails (0: run once).
        retry_backoff_s: wait before the first retry; doubles each time, with jitter.
        timeout_s: wall-clock limit of one attempt (None: no limit).
        poll_interval_s: how often running jobs are checked.
        template: optional wrapper command, e.g. ``'numactl -N 0 {task_cmd}'``.
    """

    #: names this backend adds to the template's fields (for error messages and docs)
    template_fields: tuple[str, ...] = ("task_id", "stage", "num_gpus", "num_procs", "log_path")
    #: attempts per task that may end ``Exit(infra=True)`` and be retried without spending ``retry``
    #: (a backend that reports infrastructure failures sets it, e.g. from a constructor argument)
    max_infra_retries: int = 0
    #: rerun such an attempt at once, ahead of the queue, instead of after the backoff: for a
    #: backend whose other workers are ready to take it (a warm pool that replaces a dead worker)
    infra_retry_at_once: bool = False
    #: start the next round at once when a job ended and tasks wait, instead of after a wait:
    #: for a backend whose ``poll`` costs nothing (local processes); one that asks a scheduler
    #: (``squeue``, a cloud API) keeps one poll per interval
    refill_at_once: bool = False

    def __init__(
        self,
        max_num_workers: int = 4,
        retry: int = 0,
        retry_backoff_s: float = 1.0,
        timeout_s: float | None = None,
        poll_interval_s: float = 0.05,
        template: str | list[str] | None = None,
    ) -> None:
        if not isinstance(max_num_workers, int) or max_num_workers < 1:
            raise ValueError(f"max_num_workers must be an integer >= 1, got {max_num_workers!r}")
        if not isinstance(retry, int) or retry < 0:
            raise ValueError(f"retry must be an integer >= 0, got {retry!r}")
        if retry_backoff_s < 0:
            raise ValueError(f"retry_backoff_s must be >= 0, got {retry_backoff_s}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self.max_num_workers = max_num_workers
        self.retry = retry
        self.retry_backoff_s = retry_backoff_s
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        self.template = template
        if template is not None:
            self.check_template(template)

    @classmethod
    def check_template(cls, template: str | list[str]) -> None:
        """Raise ``ConfigError`` if ``template`` cannot be filled with this runner's fields."""
        fill_template(template, ["true"], {k: "" for k in cls.template_fields})

    # -- the backend's hooks ---------------------------------------------------------------
    @abc.abstractmethod
    def submit(self, job: Job) -> None:
        """Start ``job.command``, its output appended to ``job.log_path``; set ``job.handle``."""

    @abc.abstractmethod
    def poll(self, job: Job) -> Exit | None:
        """``None`` while the job runs, else how it ended."""

    @abc.abstractmethod
    def cancel(self, jobs: list[Job]) -> None:
        """Stop these jobs and everything they started; return once they are gone."""

    def unfit_reason(self, task: TaskSpec) -> str | None:
        """Why this backend can never run ``task`` (e.g. more GPUs than exist), or None."""
        return None

    def acquire(self, task: TaskSpec) -> dict[str, Any] | None:
        """Reserve what ``task`` needs; ``None`` if it must wait.  Default: nothing to reserve."""
        return {}

    def release(self, job: Job) -> None:
        """Give back what ``acquire`` reserved."""

    def placement(self, job: Job) -> dict[str, Any]:
        """Where a submitted attempt runs, as this backend knows it (host, pid, job id, node),
        recorded in its ``started`` event for the report's timeline.  Default: nothing known."""
        return {}

    def close(self) -> None:
        """Called once after ``launch`` (e.g. to stop warm workers)."""

    def wait(self, jobs: list[Job], timeout_s: float, stop: threading.Event) -> None:
        """Block between two rounds of the loop: until ``timeout_s`` has passed or ``stop`` is set.

        A backend that can tell when one of ``jobs`` ends (a pipe it reads, say) may return as
        soon as that happens, so that short tasks do not each wait out ``poll_interval_s``.
        """
        stop.wait(timeout_s)

    def flush(self) -> None:
        """Called after each round of ``submit`` calls; a backend that batches submissions
        (e.g. one Slurm job array for every job submitted in the round) sends them here."""

    def log_attempt(self, job: Job, text: str) -> None:
        """Append the loop's own lines (attempt header, failure reason) to the task's log."""
        os.makedirs(os.path.dirname(job.log_path), exist_ok=True)
        with open(job.log_path, "a", encoding="utf-8") as log:
            log.write(text)

    def command_fields(self, task: TaskSpec, resources: dict[str, Any], log_path: str) -> dict[str, Any]:
        return {
            "task_id": task.task_id,
            "stage": task.stage,
            "num_gpus": task.num_gpus,
            "num_procs": task.num_procs,
            "log_path": log_path,
        }

    def task_env(self, task: TaskSpec, resources: dict[str, Any], attempt: int) -> dict[str, str]:
        return {
            "ORCHESTRA_TASK_ID": task.task_id,
            "ORCHESTRA_ATTEMPT": str(attempt),
            "PYTHONUNBUFFERED": "1",
        }

    def get_command(self, task: TaskSpec, spec_path: str, resources: dict[str, Any], attempt: int = 1,
                    log_path: str = "") -> Command:
        """The Command that runs ``task``: its script, wrapped in ``template`` if there is one."""
        argv = task_argv(task.stage, spec_path)
        if self.template is not None:
            argv = fill_template(self.template, argv, self.command_fields(task, resources, log_path))
        return Command(tuple(argv), self.task_env(task, resources, attempt))

    # -- the loop ----------------------------------------------------------------------------
    def _backoff(self, attempt: int) -> float:
        return exponential_backoff(attempt, self.retry_backoff_s, 60.0, jitter=(0.8, 1.2))

    def launch(self, tasks: list[TaskSpec], ctx: RunContext) -> list[TaskResult]:
        """Run every task to an end state; stops early (cancelling) when ``ctx.stop`` is set."""
        results = _Results()
        pending: deque[_Pending] = deque()
        self._free_slots = list(range(self.max_num_workers))  # a heap: the lowest free slot first
        for task in tasks:
            log_path = ctx.paths.task_log(task.stage, task.task_id)
            missing = task.missing_inputs()
            waits = bool(missing) and ctx.inputs_may_come()
            if missing and not waits:  # a stage waits for its inputs: an eval task whose predictions failed
                self._skip(task, missing, results, ctx)
                continue
            unfit = self.unfit_reason(task)
            if unfit:
                results[task.task_id] = TaskResult(task.task_id, task.stage, TaskState.FAILED, 0, log_path, unfit)
                ctx.events.emit("failed", task_id=task.task_id, stage=task.stage, reason=unfit, name=task.display_name,
                                model=task.model_abbr)
                continue
            pending.append(_Pending(task, 1, inputs_ready=not waits, inputs_checked=time.monotonic()))
            ctx.events.emit("queued", task_id=task.task_id, stage=task.stage, cost=task.cost, name=task.display_name,
                            model=task.model_abbr, samples=task.num_samples, num_gpus=task.num_gpus)
        running: list[tuple[Job, _Pending]] = []
        try:
            while pending or running:
                if ctx.stop.is_set():
                    break
                now = time.monotonic()
                self._look_for_inputs(pending, results, ctx, now)
                self._start_ready(pending, running, results, ctx, now)
                self.flush()
                ended_any = False
                for job, entry in list(running):
                    ended = self.poll(job)
                    if ended is None:
                        if self.timeout_s is not None and now - job.started > self.timeout_s:
                            job.timed_out = True
                            self.cancel([job])
                            ended = Exit(-1, f"timed out after {self.timeout_s:g} s")
                        else:
                            continue
                    ended_any = True
                    running.remove((job, entry))
                    self.release(job)
                    heapq.heappush(self._free_slots, job.slot)
                    self._finish(job, entry, ended, pending, results, ctx)
                self._report(ctx, pending, running, results)
                if (pending or running) and not (ended_any and pending and self.refill_at_once):
                    self.wait([job for job, _ in running], self.poll_interval_s, ctx.stop)
        finally:
            try:
                if running or (ctx.stop.is_set() and pending):
                    self._cancel_all(running, pending, results, ctx)
            finally:
                self.close()  # whatever the clean-up met: nothing the backend started may outlive the launch
        return [results[t.task_id] for t in tasks if t.task_id in results]

    def _skip(self, task: TaskSpec, missing: list[str], results: dict[str, TaskResult], ctx: RunContext) -> None:
        why = f"predictions missing: {os.path.relpath(missing[0], ctx.paths.root)}"
        log_path = ctx.paths.task_log(task.stage, task.task_id)
        results[task.task_id] = TaskResult(task.task_id, task.stage, TaskState.SKIPPED, 0, log_path, why)
        ctx.events.emit("skipped", task_id=task.task_id, stage=task.stage, reason=why, name=task.display_name,
                        model=task.model_abbr)

    #: how often a task waiting for its inputs looks for them (each look reads and checks files)
    INPUT_CHECK_S = 0.5

    def _look_for_inputs(self, pending: deque[_Pending], results: dict[str, TaskResult], ctx: RunContext,
                         now: float) -> None:
        """Release waiting tasks whose inputs now exist; skip those whose inputs can no longer come."""
        may_come = ctx.inputs_may_come()
        for entry in [e for e in pending if not e.inputs_ready]:
            if may_come and now - entry.inputs_checked < self.INPUT_CHECK_S:
                continue
            entry.inputs_checked = now
            missing = self._first_missing(entry)
            if missing is None:
                entry.inputs_ready = True
            elif not may_come:
                pending.remove(entry)
                self._skip(entry.task, [missing], results, ctx)

    @staticmethod
    def _first_missing(entry: _Pending) -> str | None:
        """The first input of a waiting task that is not done yet, or None.  Inputs found done
        are not read again: an eval task over 10,000 predictions looks at each file once, not
        at every one of them every :attr:`INPUT_CHECK_S`."""
        inputs = [pair for unit in entry.task.units for pair in unit.inputs]
        while entry.inputs_seen < len(inputs):
            path, expected = inputs[entry.inputs_seen]
            if not output_done(path, expected):
                return path
            entry.inputs_seen += 1
        return None

    def _cancel_all(self, running: list[tuple[Job, _Pending]], pending: deque[_Pending],
                    results: dict[str, TaskResult], ctx: RunContext) -> None:
        """Stop every running job (one ``cancel`` call) and record running and pending tasks as cancelled."""
        try:
            jobs = [job for job, _ in running]
            if jobs:
                self.cancel(jobs)
        finally:
            for job, entry in running:
                try:
                    self.release(job)
                finally:
                    results[job.task.task_id] = TaskResult(
                        job.task.task_id, job.task.stage, TaskState.CANCELLED, job.attempt, job.log_path,
                        "cancelled", time.monotonic() - entry.first_started,
                    )
                    ctx.events.emit("cancelled", task_id=job.task.task_id, stage=job.task.stage, attempt=job.attempt,
                                    slot=job.slot, duration_s=round(time.monotonic() - job.started, 3))
            for entry in pending:
                log_path = ctx.paths.task_log(entry.task.stage, entry.task.task_id)
                results[entry.task.task_id] = TaskResult(
                    entry.task.task_id, entry.task.stage, TaskState.CANCELLED, entry.attempt - 1, log_path,
                    "cancelled before it started",
                )
                ctx.events.emit("cancelled", task_id=entry.task.task_id, stage=entry.task.stage)

    def _start_ready(self, pending: deque[_Pending], running: list[tuple[Job, _Pending]],
                     results: dict[str, TaskResult], ctx: RunContext, now: float) -> None:
        for entry in list(pending):
            if len(running) >= self.max_num_workers or ctx.stop.is_set():
                return  # a stop that came during the last submit launches nothing more
            if entry.not_before > now or not entry.inputs_ready:
                continue
            resources = self.acquire(entry.task)
            if resources is None:
                continue
            pending.remove(entry)
            task = entry.task
            log_path = ctx.paths.task_log(task.stage, task.task_id)
            job = Job(task, entry.attempt, Command(()), log_path, resources, slot=heapq.heappop(self._free_slots))
            job.started = time.monotonic()  # set again at the submit: a timeout counts from there
            if not entry.first_started:
                entry.first_started = job.started
            try:
                spec_path = ctx.paths.task_spec(task.task_id)
                if entry.attempt == 1:  # the one place a spec is written: what every attempt runs
                    task.dump(spec_path)
                job.command = self.get_command(task, spec_path, resources, entry.attempt, log_path)
                self.log_attempt(job, f"===== orchestra: attempt {entry.attempt} of {task.task_id} "
                                      f"({task.display_name}) at {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                                      f"===== command: {job.command.display()}\n")
                job.started = time.monotonic()
                self.submit(job)
            except OSError as exc:
                self.release(job)
                heapq.heappush(self._free_slots, job.slot)
                self._finish(job, entry, Exit(-1, f"could not start: {exc}"), pending, results, ctx)
                continue
            except BaseException:
                self.release(job)  # its slot comes back; the error ends the launch (cancelling the rest)
                heapq.heappush(self._free_slots, job.slot)
                raise
            running.append((job, entry))
            ctx.events.emit("started", task_id=task.task_id, stage=task.stage, attempt=entry.attempt,
                            resources=resources, log=log_path, name=task.display_name, slot=job.slot,
                            runner=type(self).__name__, where=self.placement(job))

    def _finish(self, job: Job, entry: _Pending, ended: Exit, pending: deque[_Pending],
                results: dict[str, TaskResult], ctx: RunContext) -> None:
        task = job.task
        if ended.code == 0:
            missing = [path for path, h in task.outputs if not output_done(path, h)]
            if not missing:
                results[task.task_id] = TaskResult(task.task_id, task.stage, TaskState.DONE, job.attempt,
                                                   job.log_path, "", time.monotonic() - entry.first_started)
                ctx.events.emit("done", task_id=task.task_id, stage=task.stage, attempt=job.attempt,
                                duration_s=round(time.monotonic() - job.started, 3), exit_code=0, slot=job.slot)
                return
            reason = f"exited 0 but did not write {os.path.relpath(missing[0], ctx.paths.root)}"
        else:
            reason = ended.reason or f"exit code {ended.code}"
        infra = ended.infra and ended.code != 0
        kind = " (infrastructure)" if infra else ""
        self.log_attempt(job, f"===== orchestra: attempt {job.attempt} failed{kind}: {reason}\n")
        how = {"exit_code": ended.code, "timed_out": job.timed_out, "slot": job.slot,
               "duration_s": round(time.monotonic() - job.started, 3)}
        if infra and entry.infra_retries < self.max_infra_retries and not ctx.stop.is_set():
            # The platform failed, not the task: retried without spending the task's own retries.
            delay = 0.0 if self.infra_retry_at_once else self._backoff(entry.infra_retries + 1)
            ctx.events.emit("retry", task_id=task.task_id, stage=task.stage, attempt=job.attempt,
                            reason=reason, delay_s=round(delay, 3), infra=True,
                            infra_retries=entry.infra_retries + 1, **how)
            again = _Pending(task, job.attempt + 1, time.monotonic() + delay, entry.first_started,
                             entry.infra_retries + 1)
            if self.infra_retry_at_once:
                pending.appendleft(again)  # it had started: it goes before tasks that have not
            else:
                pending.append(again)
            return
        counted = job.attempt - entry.infra_retries  # attempts that spent the task's own retries
        if counted <= self.retry and not ctx.stop.is_set():
            delay = self._backoff(counted)
            ctx.events.emit("retry", task_id=task.task_id, stage=task.stage, attempt=job.attempt,
                            reason=reason, delay_s=round(delay, 3), **how)
            pending.append(_Pending(task, job.attempt + 1, time.monotonic() + delay, entry.first_started,
                                    entry.infra_retries))
            return
        results[task.task_id] = TaskResult(task.task_id, task.stage, TaskState.FAILED, job.attempt,
                                           job.log_path, reason, time.monotonic() - entry.first_started)
        ctx.events.emit("failed", task_id=task.task_id, stage=task.stage, attempt=job.attempt, reason=reason,
                        log=job.log_path, **how)

    def _report(self, ctx: RunContext, pending: deque[_Pending], running: list[tuple[Job, _Pending]],
                results: _Results) -> None:
        if ctx.on_change is None:
            return
        counts = {"pending": len(pending), "running": len(running)}
        counts.update((state, n) for state, n in results.counts.items() if n)
        ctx.on_change(counts)
