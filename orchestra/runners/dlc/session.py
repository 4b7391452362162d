"""One launch of a ``DLCRunner``: the contract's verbs over DLC jobs, each watched by a few threads.

``submit`` records each attempt as a ``DLCJob`` (or hands it the job an earlier orchestrator left
for it); every round (``submit`` and ``poll``) the jobs that are due go to the threads
(``cli_concurrency``), where ``JobWorker.step`` submits a job, checks it (``dlc get job``, backing
off), copies its log and decides how the attempt ended; ``poll`` reports what was decided.
``cancel`` stops jobs (``dlc stop``, confirmed) off the loop; ``close`` is the net under anything
left, and stops what earlier orchestrators left of a stage no launch here took.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from orchestra.paths import RunPaths
from orchestra.runners.core.contract import Exit, Job, NoResources, Session
from orchestra.runners.core.ledger import JobRecord, Ledger, Seen, spec_digest, triage
from orchestra.runners.core.run import RunContext
from orchestra.runners.core.stopping import BackgroundStops
from orchestra.runners.dlc.cli import DLCClient, DLCError, JobInfo
from orchestra.runners.dlc.job import DLCJob, dlc_job_name, orphan
from orchestra.runners.dlc.secrets import remove_env_file
from orchestra.runners.dlc.worker import JobWorker
from orchestra.tasks.spec import TaskSpec

if TYPE_CHECKING:
    from orchestra.runners.dlc.runner import DLCRunner

EXIT_SCAN_S = 0.25  # how often the exit code files of running jobs are looked for


class DLCSession(Session):
    """One launch of a DLCRunner: its client, its job threads, the jobs it watches."""

    def __init__(self, runner: DLCRunner, ctx: RunContext, client: DLCClient, unfit: str | None) -> None:
        self.runner = runner
        self.ctx = ctx
        self.client = client
        self.unfit = unfit
        self.resources = NoResources(unfit)
        self.worker = JobWorker(client, Ledger(ctx.paths.dlc_dir), ctx.events, runner.timings)
        self.pool: ThreadPoolExecutor | None = ThreadPoolExecutor(runner.cli_concurrency, thread_name_prefix="dlc")
        self.stops = BackgroundStops("dlc")
        self.live: dict[str, DLCJob] = {}
        self.adopt: dict[str, tuple[JobRecord, JobInfo]] = {}
        self.env_files: set[str] = set()
        self._last_exit_scan = 0.0

    # -- the verbs ---------------------------------------------------------------------------------
    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        for job in jobs:
            self._add(job)
        self._hand_out()
        return {}

    def _add(self, job: Job) -> None:
        task = job.task
        seq = self.runner._seq(task, job.attempt)
        name = dlc_job_name(task, seq)
        dlc_dir = RunPaths(task.run_dir).dlc_dir
        handle = DLCJob(name, task.task_id, task.stage, job.attempt, spec_digest(task), job.log_path,
                        os.path.join(dlc_dir, "exit", name), list(job.command.argv), seq)
        adopt = self.adopt.pop(task.task_id, None) if job.attempt == 1 else None
        if adopt is not None:
            record, info = adopt
            handle.name, handle.job_id, handle.adopted, handle.info = record.name, record.job_id, True, info
            handle.seq = record.seq
            handle.exit_file = os.path.join(dlc_dir, "exit", record.name)
            handle.interval = self.runner.timings.poll_interval_s
            self.worker.record("adopted", handle, by_attempt=job.attempt)
            self.worker.emit("dlc_adopted", handle, job_id=record.job_id, status=info.status)
            self.worker.log(handle, [f"===== dlc: adopted job {record.job_id} ({record.name}, {info.status}), "
                                     "submitted by an earlier orchestrator of this run folder; its log from the "
                                     "start follows"])
        job.handle = handle
        self.live[handle.name] = handle

    def placement(self, job: Job) -> dict[str, Any]:
        handle: DLCJob = job.handle
        where: dict[str, Any] = {"dlc_job_name": handle.name, "workspace_id": self.runner.cfg.workspace_id}
        if handle.job_id:  # an adopted job (a new one gets its id once its submission went through)
            where["dlc_job_id"] = handle.job_id
        return where

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        self._hand_out()
        ended: dict[Job, Exit] = self.stops.ended(jobs)
        for job in jobs:
            handle = job.handle
            if job in ended or self.stops.stopping(job) or not isinstance(handle, DLCJob) or handle.result is None:
                continue
            self.live.pop(handle.name, None)
            ended[job] = handle.result
        return ended

    def _hand_out(self) -> None:
        """Hand every job that is due (a submission, a check, a last log read) to the threads."""
        assert self.pool is not None
        now = time.monotonic()
        if now - self._last_exit_scan >= max(EXIT_SCAN_S, 0.001 * len(self.live)):  # ~1,000 files/s at most
            # A task that ended wrote its exit code to the shared file system: no need to wait for the
            # next scheduled check (a file check costs no dlc call).
            self._last_exit_scan = now
            for h in self.live.values():
                if h.job_id and not h.exit_seen and h.drain_at is None and os.path.exists(h.exit_file):
                    h.exit_seen = True
                    h.next_check = min(h.next_check, now)
        due = [h for h in self.live.values()
               if not h.busy and h.result is None and not h.cancelled and h.next_check <= now]
        for handle in sorted(due, key=lambda h: (not h.exit_seen, h.next_check)):
            handle.busy = True
            self.pool.submit(self.worker.step, handle)

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Mark the jobs cancelled here, then stop them (``dlc stop``, confirmed) in the background."""
        handles = [job.handle for job in jobs if isinstance(job.handle, DLCJob)]
        why = {id(job.handle): ("timeout_s" if job.timed_out else self._stop_cause()) for job in jobs}
        for h in handles:
            h.cancelled = True
            self.live.pop(h.name, None)

        def stop(_: list[Job]) -> None:
            self._settle(handles)
            groups: dict[str, list[DLCJob]] = {}
            for h in handles:
                if h.job_id and not h.over:
                    groups.setdefault(why[id(h)], []).append(h)
            for reason, group in groups.items():
                self.worker.stop(group, reason)

        self.stops.start(jobs, stop)

    def _settle(self, handles: list[DLCJob]) -> None:
        """Mark these jobs cancelled and wait for their submissions in flight: a job created meanwhile
        must be stopped, not left without an owner (bounded by one call's timeout)."""
        for h in handles:
            h.cancelled = True
        deadline = time.monotonic() + self.runner.cli_timeout_s + 5
        while any(h.busy and h.job_id is None for h in handles) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _stop_cause(self) -> str:
        if self.ctx.stop.is_set():
            return "the run was stopped (Ctrl-C, SIGTERM or SIGHUP)"
        if sys.exc_info()[0] is not None:
            return f"orchestrator error: {sys.exc_info()[0].__name__}"  # type: ignore[union-attr]
        return "orchestrator shutdown"

    def close(self) -> None:
        self.stops.wait(self.runner.cli_timeout_s + self.runner.timings.cancel_timeout_s + 10)
        # The loop stopped or finished every job it knows; this is the net under an unexpected exit.
        try:
            self._settle(list(self.live.values()))
            leftover = [h for h in self.live.values() if h.job_id and not h.over]
            # kept for a task that never started (skipped, stopped): stopped, not left running
            leftover += [orphan(record) for record, _ in self.adopt.values()]
            if leftover:
                self.worker.stop(leftover, self._stop_cause())
            if self.unfit is None and self.pool is not None:
                self.recover([], None)  # what earlier orchestrators left of a stage no launch here took
        finally:
            for path in self.env_files:  # every job of this launch is over (or stopped)
                remove_env_file(path)
            self.env_files.clear()
            self.live.clear()
            self.adopt.clear()
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    # -- what an earlier orchestrator left (-r) ------------------------------------------------------
    def recover(self, tasks: list[TaskSpec], stage: str | None) -> None:
        """Adopt or stop the jobs of ``stage`` (None: of every stage) that the ledger shows possibly
        alive and no launch of this process handles: an earlier orchestrator's.  A job still running
        the spec of one of ``tasks`` is kept for that task's first attempt; any other is stopped."""
        assert self.pool is not None
        worker, client = self.worker, self.client
        interrupted, alive = worker.ledger.left_behind(stage)
        for rec in interrupted:  # killed inside dlc submit: the id is unknown
            worker.ledger.record("submit_unknown", rec.name, task_id=rec.task_id, stage=rec.stage)
            print(f"orchestra: warning: the submission of DLC job {rec.name} was interrupted before its id "
                  "was known; if DLC created it, stop it in the console", file=sys.stderr)
        if not alive:
            return

        def look(rec: JobRecord) -> JobInfo | None:
            try:
                return client.get(rec.job_id)
            except DLCError:
                return None

        infos = dict(zip((r.name for r in alive), self.pool.map(look, alive)))
        seen: dict[str, Seen] = {name: None if info is None else "over" if info.terminal else
                                 "ending" if info.status == "Stopping" else "alive" for name, info in infos.items()}
        over, adopt, to_stop = triage(alive, seen, {t.task_id: spec_digest(t) for t in tasks})
        for rec in over:
            info = infos[rec.name]
            assert info is not None
            worker.record("ended", orphan(rec), status=info.status, reason_code=info.reason_code)
        self.adopt.update({rec.task_id: (rec, info) for rec in adopt if (info := infos[rec.name]) is not None})
        if to_stop:
            worker.stop([orphan(r) for r in to_stop], "left by an earlier orchestrator of this run folder, not needed")
