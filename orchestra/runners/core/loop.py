"""The one scheduling loop every runner shares.

``BaseRunner.launch`` owns the queue, ``max_num_workers``, resource slots, retries (a task's own,
and infrastructure retries that do not spend it), timeouts, cancellation and the event log.  It
drives a backend only through ``core/hooks.py`` (the runner's hooks) and ``core/contract.py``:
``open(ctx, tasks)`` gives a ``Session``; each round submits the ready jobs together, polls every
job in flight in one call, and cancels without waiting (a cancelled job stays polled until its
session reports it gone).  Managed servers: served.py.
"""

from __future__ import annotations

import heapq
import os
import time
from collections import deque
from typing import Any, ClassVar

from orchestra.backoff import exponential_backoff
from orchestra.fileio import append_line
from orchestra.runners.core import checks
from orchestra.runners.core.command import Command, fill_template
from orchestra.runners.core.contract import CannotStart, Exit, Job, Session
from orchestra.runners.core.hooks import RunnerHooks
from orchestra.runners.core.options import LoopOptions
from orchestra.runners.core.run import InFlight, PendingTask, Results, RunContext, TaskResult, TaskState
from orchestra.runners.core.served import attach_servers, close_launch, with_server_env
from orchestra.runners.core.waiting import Announcements, look_for_inputs, queue_tasks
from orchestra.tasks.kinds import task_argv
from orchestra.tasks.spec import TaskSpec, output_done

DRAIN_LIMIT_S = 300.0  #: the longest a stop waits for cancelled jobs reported gone (a net: backends bound their own)


class BaseRunner(RunnerHooks):
    """Run tasks through a backend with limits, retries, timeouts and clean cancellation.

    Args (the loop's options, ``LoopOptions``; a runner's ``loop_defaults`` may change a default):
        max_num_workers: tasks running (or jobs in flight) at once (None: the runner's default).
        retry: extra attempts for a task that fails (0: run once).
        retry_backoff_s: wait before the first retry; doubles each time, with jitter.
        timeout_s: wall-clock limit of one attempt (None: no limit).
        poll_interval_s: how often running jobs are checked (None: the runner's default).
        template: optional wrapper command, e.g. ``'numactl -N 0 {task_cmd}'``.
        infra_retry: attempts per task that may end ``Exit(infra=True)`` and be retried without
            spending ``retry`` (0 unless the backend reports infrastructure failures).
    """

    #: this backend's defaults for the loop's options where the ones below do not fit it (a value
    #: given as None takes the default too, for the keys listed here)
    loop_defaults: ClassVar[LoopOptions] = {}

    def __init__(self, max_num_workers: int | None = 4, retry: int = 0, retry_backoff_s: float = 1.0,
                 timeout_s: float | None = None, poll_interval_s: float | None = 0.05,
                 template: str | list[str] | None = None, infra_retry: int = 0) -> None:
        if max_num_workers is None:
            max_num_workers = 4
        if poll_interval_s is None:
            poll_interval_s = 0.05
        checks.count("max_num_workers", max_num_workers, 1)
        checks.count("retry", retry, 0)
        checks.count("infra_retry", infra_retry, 0)
        checks.amount("retry_backoff_s", retry_backoff_s, zero=True)
        checks.optional_amount("timeout_s", timeout_s)
        checks.amount("poll_interval_s", poll_interval_s)
        self.max_num_workers = max_num_workers
        self.retry = retry
        self.retry_backoff_s = retry_backoff_s
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        self.template = template
        self.max_infra_retries = infra_retry
        if template is not None:
            self.check_template(template)

    @classmethod
    def check_template(cls, template: str | list[str]) -> None:
        """Raise ``ConfigError`` if ``template`` cannot be filled with this runner's fields."""
        fill_template(template, ["true"], {k: "" for k in cls.template_fields})

    # -- the command ---------------------------------------------------------------------------
    def log_attempt(self, job: Job, text: str) -> None:
        """Append the loop's own lines (attempt header, failure reason) to the task's log."""
        os.makedirs(os.path.dirname(job.log_path), exist_ok=True)
        append_line(job.log_path, text.encode("utf-8", "replace"))

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
        session = self.open(ctx, tasks)
        self._servers = attach_servers(session, tasks, ctx, self)
        results = Results(session.resources.ended)  # served models: their replicas stop
        flight, pending = InFlight({}, {}), deque[PendingTask]()
        self._announce = Announcements(ctx.events)
        first_round = True
        try:
            pending.extend(queue_tasks(tasks, session.resources, results, ctx))
            self._free_slots = list(range(self.max_num_workers))  # a heap: the lowest free slot first
            while (pending or flight.running or flight.stopping) and not ctx.stop.is_set():
                now = time.monotonic()
                look_for_inputs(pending, results, ctx, now, self._announce, self.INPUT_CHECK_S)
                self._start_ready(session, pending, flight, results, ctx, now)
                if first_round:  # the first tasks are on their way: now the queued lines of the rest
                    first_round = False
                    self._announce.say_rest(pending)
                    if ctx.begun is not None:
                        ctx.begun.set()
                ended_any = self._poll(session, pending, flight, results, ctx)
                self._report(ctx, pending, flight, results)
                if (pending or flight.running or flight.stopping) and not (
                        ended_any and pending and self.refill_at_once):
                    session.wait([*flight.running, *flight.stopping], self.poll_interval_s, ctx.stop)
        except BaseException:
            try:
                self._stop_all(session, pending, flight, results, ctx, drain=False)
            finally:
                self._close(session, ctx)
            raise
        try:
            if flight.running or flight.stopping or (ctx.stop.is_set() and pending):
                self._stop_all(session, pending, flight, results, ctx, drain=True)
        finally:
            self._close(session, ctx)  # whatever the clean-up met
        return [results[t.task_id] for t in tasks if t.task_id in results]

    def _close(self, session: Session, ctx: RunContext) -> None:
        """The end of a launch, however it ends: nothing it started outlives it, and a stage that
        waits for its first round (``ctx.begun``) waits no more."""
        try:
            close_launch(session, self._servers)
        finally:
            if ctx.begun is not None:
                ctx.begun.set()

    INPUT_CHECK_S = 0.5  #: how often a task waiting for its inputs looks for them (a look reads files)

    def _start_ready(self, session: Session, pending: deque[PendingTask], flight: InFlight,
                     results: dict[str, TaskResult], ctx: RunContext, now: float) -> None:
        """Reserve and prepare every job that may start now, then submit them in one call."""
        batch: dict[Job, PendingTask] = {}
        busy = len(flight.running) + len(flight.stopping)
        self._announce.say_first(pending, self.max_num_workers - busy, now)
        for entry in list(pending):
            if busy + len(batch) >= self.max_num_workers or ctx.stop.is_set():
                break
            if entry.not_before > now or not entry.inputs_ready:
                continue
            if not entry.said:  # its queued line before any other line of it (say_first said most)
                self._announce.say([entry])
            try:
                resources = session.resources.acquire(entry.task)
            except CannotStart as exc:
                pending.remove(entry)
                job = self._job(entry, {}, ctx)
                self._finish(job, entry, Exit(-1, str(exc)), pending, results, ctx)
                heapq.heappush(self._free_slots, job.slot)
                continue
            if resources is None:
                continue
            pending.remove(entry)
            job = self._job(entry, resources, ctx)
            batch[job] = entry
            try:
                task = entry.task
                spec_path = ctx.paths.task_spec(task.task_id)
                if entry.attempt == 1:  # the one place a spec is written: what every attempt runs
                    task.dump(spec_path)
                job.command = with_server_env(self.get_command(task, spec_path, resources, entry.attempt,
                                                               job.log_path), task, self._servers, ctx.paths)
                self.log_attempt(job, f"===== orchestra: attempt {entry.attempt} of {task.task_id} "
                                      f"({task.display_name}) at {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                                      f"===== command: {job.command.display()}\n")
            except OSError as exc:
                del batch[job]
                self._end_attempt(session, job, entry, Exit(-1, f"could not start: {exc}"), pending, results, ctx)
            except BaseException:
                del batch[job]
                self._give_back(session, job, None)
                raise
        if not batch:
            return
        for job in batch:
            job.started = time.monotonic()
        try:
            refused = session.submit(list(batch))
        except BaseException:
            # The error ends the launch: whatever of the batch did start is cancelled with the rest.
            flight.running.update(batch)
            raise
        for job, entry in batch.items():
            if job in refused:
                self._end_attempt(session, job, entry, refused[job], pending, results, ctx)
                continue
            flight.running[job] = entry
            task = job.task
            ctx.events.emit("started", task_id=task.task_id, stage=task.stage, attempt=entry.attempt,
                            resources=job.resources, log=job.log_path, name=task.display_name, slot=job.slot,
                            runner=type(self).__name__, where=session.placement(job))

    def _job(self, entry: PendingTask, resources: dict[str, Any], ctx: RunContext) -> Job:
        job = Job(entry.task, entry.attempt, Command(()), ctx.paths.task_log(entry.task.stage, entry.task.task_id),
                  resources, slot=heapq.heappop(self._free_slots))
        job.started = time.monotonic()  # set again at the submit: a timeout counts from there
        if not entry.first_started:
            entry.first_started = job.started
        return job

    def _give_back(self, session: Session, job: Job, ended: Exit | None) -> None:
        try:
            session.resources.release(job, ended)
        finally:
            heapq.heappush(self._free_slots, job.slot)

    def _end_attempt(self, session: Session, job: Job, entry: PendingTask, ended: Exit, pending: deque[PendingTask],
               results: dict[str, TaskResult], ctx: RunContext) -> None:
        self._give_back(session, job, ended)
        self._finish(job, entry, ended, pending, results, ctx)

    def _poll(self, session: Session, pending: deque[PendingTask], flight: InFlight,
              results: dict[str, TaskResult], ctx: RunContext) -> bool:
        """One poll of every job in flight (made even with none: a session may keep house there, e.g.
        a warm pool that grows for the tasks waiting); time out the overdue, finish the ended."""
        answers = session.poll([*flight.running, *flight.stopping])
        now = time.monotonic()
        overdue = [job for job in flight.running if job not in answers and self.timeout_s is not None
                   and now - job.started > self.timeout_s]
        if overdue:
            for job in overdue:
                job.timed_out = True
                flight.stopping[job] = flight.running.pop(job)
            session.cancel(overdue)
        for job, ended in answers.items():
            if job in flight.running:
                entry = flight.running.pop(job)
            elif job in flight.stopping:  # a timed-out job is gone: its attempt failed as timed out
                entry = flight.stopping.pop(job)
                ended = Exit(-1, f"timed out after {self.timeout_s:g} s")
            else:
                continue
            self._end_attempt(session, job, entry, ended, pending, results, ctx)
        return bool(answers)

    def _stop_all(self, session: Session, pending: deque[PendingTask], flight: InFlight,
                  results: dict[str, TaskResult], ctx: RunContext, drain: bool) -> None:
        """Cancel every running job (one ``cancel`` call), record running and pending tasks as
        cancelled, and (``drain``) keep polling until the session reports every stopped job gone."""
        jobs = list(flight.running)
        flight.stopping.update(flight.running)
        flight.running.clear()
        try:
            if jobs:
                session.cancel(jobs)
            deadline = time.monotonic() + DRAIN_LIMIT_S
            while drain and flight.stopping and time.monotonic() < deadline:
                for job in session.poll(list(flight.stopping)):
                    if job in flight.stopping:
                        self._cancelled(session, job, flight.stopping.pop(job), results, ctx)
                if flight.stopping:
                    time.sleep(min(self.poll_interval_s, 0.05))
        finally:
            self._announce.say(pending)  # a stop within the first round: their queued lines first
            for job, entry in list(flight.stopping.items()):
                self._cancelled(session, job, entry, results, ctx)
            flight.stopping.clear()
            said: list[tuple[str, dict[str, Any]]] = []  # appended together: 100,000 queued tasks stop at once
            for entry in pending:
                log_path = ctx.paths.task_log(entry.task.stage, entry.task.task_id)
                results[entry.task.task_id] = TaskResult(
                    entry.task.task_id, entry.task.stage, TaskState.CANCELLED, entry.attempt - 1, log_path,
                    "cancelled before it started")
                said.append(("cancelled", {"task_id": entry.task.task_id, "stage": entry.task.stage}))
            pending.clear()
            ctx.events.emit_many(said)

    def _cancelled(self, session: Session, job: Job, entry: PendingTask, results: dict[str, TaskResult],
                   ctx: RunContext) -> None:
        try:
            self._give_back(session, job, None)
        finally:
            results[job.task.task_id] = TaskResult(
                job.task.task_id, job.task.stage, TaskState.CANCELLED, job.attempt, job.log_path,
                "cancelled", time.monotonic() - entry.first_started,
            )
            ctx.events.emit("cancelled", task_id=job.task.task_id, stage=job.task.stage, attempt=job.attempt,
                            slot=job.slot, duration_s=round(time.monotonic() - job.started, 3))

    def _finish(self, job: Job, entry: PendingTask, ended: Exit, pending: deque[PendingTask],
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
        try:
            self.log_attempt(job, f"===== orchestra: attempt {job.attempt} failed{kind}: {reason}\n")
        except OSError:  # a log that cannot take this line (full disk, a path taken) must not stop the run
            pass
        how = {"exit_code": ended.code, "timed_out": job.timed_out, "slot": job.slot,
               "duration_s": round(time.monotonic() - job.started, 3)}
        if infra and entry.infra_retries < self.max_infra_retries and not ctx.stop.is_set():
            # The platform failed, not the task: retried without spending the task's own retries.
            delay = 0.0 if self.infra_retry_at_once else self._backoff(entry.infra_retries + 1)
            ctx.events.emit("retry", task_id=task.task_id, stage=task.stage, attempt=job.attempt,
                            reason=reason, delay_s=round(delay, 3), infra=True,
                            infra_retries=entry.infra_retries + 1, **how)
            again = PendingTask(task, job.attempt + 1, time.monotonic() + delay, entry.first_started,
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
            pending.append(PendingTask(task, job.attempt + 1, time.monotonic() + delay, entry.first_started,
                                    entry.infra_retries))
            return
        results[task.task_id] = TaskResult(task.task_id, task.stage, TaskState.FAILED, job.attempt,
                                           job.log_path, reason, time.monotonic() - entry.first_started)
        ctx.events.emit("failed", task_id=task.task_id, stage=task.stage, attempt=job.attempt, reason=reason,
                        log=job.log_path, **how)

    def _report(self, ctx: RunContext, pending: deque[PendingTask], flight: InFlight, results: Results) -> None:
        if ctx.on_change is None:
            return
        counts = {"pending": len(pending), "running": len(flight.running) + len(flight.stopping)}
        counts.update((state, n) for state, n in results.counts.items() if n)
        ctx.on_change(counts)
