"""One launch of a ``DLCRunner``: the contract's verbs over DLC jobs, on the one scheduling loop.

``submit`` records and submits this round's attempts together (``dlc submit``, ``cli_concurrency``
calls at once, at the shared rate), or hands an attempt the job an earlier orchestrator left for it.
``poll`` makes one round without waiting on the CLI: it collects the looks that answered since the
last round and starts one, in the pool, at every job that is due (``Tracker.look``: ``dlc get job``,
its log windows, its end).  ``cancel`` starts the stops (``dlc stop``, confirmed) off the
loop and ``poll`` reports them once over; ``close`` is the net under anything left, and stops what
earlier orchestrators left of a stage no launch here took.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from orchestra.envfile import remove_env_file
from orchestra.paths import RunPaths
from orchestra.runners.core.contract import Exit, Job, NoResources, Session
from orchestra.runners.core.ledger import JobRecord, Ledger, Seen, spec_digest
from orchestra.runners.core.recovery import recover_left
from orchestra.runners.core.run import RunContext
from orchestra.runners.core.stopping import BackgroundStops
from orchestra.runners.dlc.cli import DLCClient, DLCError, DLCJobStatus
from orchestra.runners.dlc.job import DLCJob, JobNumbers, Timings, dlc_job_name, orphan
from orchestra.runners.dlc.track import Tracker
from orchestra.tasks.spec import TaskSpec

EXIT_SCAN_S = 0.25  # how often the exit code files of running jobs are looked for


class DLCSession(Session):
    """One launch of a DLCRunner: its client, the jobs it watches, the stops under way.

    Args:
        numbers: the runner's job numbers (names count on across launches and orchestrators).
        timings, workspace_id, cli_concurrency, cli_timeout_s: the runner's settings.
    """

    def __init__(self, ctx: RunContext, client: DLCClient, unfit: str | None, numbers: JobNumbers,
                 timings: Timings, workspace_id: str, cli_concurrency: int, cli_timeout_s: float) -> None:
        self.numbers = numbers
        self.timings = timings
        self.workspace_id = workspace_id
        self.cli_timeout_s = cli_timeout_s
        self.ctx = ctx
        self.client = client
        self.unfit = unfit
        self.resources = NoResources(unfit)
        self.track = Tracker(client, Ledger(ctx.paths.dlc_dir), ctx.events, timings)
        self.pool: ThreadPoolExecutor | None = ThreadPoolExecutor(cli_concurrency, thread_name_prefix="dlc")
        self.stops = BackgroundStops("dlc")
        self.live: dict[Job, DLCJob] = {}  # submitted, neither ended nor being stopped
        self.adopt: dict[str, tuple[JobRecord, DLCJobStatus]] = {}
        self.env_files: set[str] = set()
        self._last_exit_scan = 0.0
        self.looking: dict[Job, Future[Exit | None]] = {}  # looks in flight, started by poll

    # -- the verbs ---------------------------------------------------------------------------------
    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        new = [job for job in jobs if self._add(job)]
        assert self.pool is not None
        answers = self.pool.map(lambda job: self._safely(self.track.submit, job), new)  # cli_concurrency at once
        refused = {job: ended for job, ended in zip(new, answers) if ended is not None}
        self.live.update({job: job.handle for job in jobs if job not in refused})
        return refused

    def _add(self, job: Job) -> bool:
        """Give the attempt its ``DLCJob``; False when it adopts a job an earlier orchestrator left."""
        task = job.task
        seq = self.numbers.seq(task, job.attempt)
        name = dlc_job_name(task, seq)
        dlc_dir = RunPaths(task.run_dir).dlc_dir
        handle = DLCJob(name, task.task_id, task.stage, job.attempt, spec_digest(task), job.log_path,
                        os.path.join(dlc_dir, "exit", name), list(job.command.argv), seq)
        job.handle = handle
        adopt = self.adopt.pop(task.task_id, None) if job.attempt == 1 else None
        if adopt is None:
            return True
        record, info = adopt
        handle.name, handle.job_id, handle.adopted, handle.info = record.name, record.job_id, True, info
        handle.seq = record.seq
        handle.exit_file = os.path.join(dlc_dir, "exit", record.name)
        handle.interval = self.timings.poll_interval_s
        self.track.record("adopted", handle, by_attempt=job.attempt)
        self.track.emit("dlc_adopted", handle, job_id=record.job_id, status=info.status)
        self.track.log(handle, [f"===== dlc: adopted job {record.job_id} ({record.name}, {info.status}), "
                                "submitted by an earlier orchestrator of this run folder; its log from the "
                                "start follows"])
        return False

    def placement(self, job: Job) -> dict[str, Any]:
        handle: DLCJob = job.handle
        where: dict[str, Any] = {"dlc_job_name": handle.name, "workspace_id": self.workspace_id}
        if handle.job_id:
            where["dlc_job_id"] = handle.job_id
        return where

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        """One round, without waiting on the CLI: the stops that are over, the looks that answered
        since the last round, and a look started (off the loop) at every job that is due."""
        ended = {job: job.handle.verdict or stopped for job, stopped in self.stops.ended(jobs).items()}
        for job in [job for job, look in self.looking.items() if look.done()]:
            result = self.looking.pop(job).result()
            h = self.live.get(job)
            if h is None:  # cancelled while its look ran: the stop reports it
                continue
            if h.verdict is not None:  # this runner ends it (queued too long, lost): stop it first
                del self.live[job]
                self.stops.start([job], self._stop_own)
            elif result is not None:
                del self.live[job]
                ended[job] = result
        now = time.monotonic()
        if now - self._last_exit_scan >= max(EXIT_SCAN_S, 0.001 * len(self.live)):  # ~1,000 files/s at most
            # A task that ended wrote its exit code to the shared file system: its job is looked at in
            # this round rather than at its next scheduled look (a file check costs no dlc call).
            self._last_exit_scan = now
            for h in self.live.values():
                if not h.exit_seen and h.drain_at is None and os.path.exists(h.exit_file):
                    h.exit_seen = True
                    h.next_check = min(h.next_check, now)
        for job, h in self.live.items():
            if h.job_id and h.next_check <= now and job not in self.looking and self.pool is not None:
                self.looking[job] = self.pool.submit(self._safely, self.track.look, job)
        return ended

    def _stop_own(self, jobs: list[Job]) -> None:
        for job in jobs:
            self.track.stop([job.handle], job.handle.stop_reason)

    def _safely(self, step: Callable[[DLCJob], Exit | None], job: Job) -> Exit | None:
        """``step`` for the handle of ``job``; an error it raises (a bug, a full disk) ends that
        attempt, and stops its job, rather than the launch.  Once the run is stopped it does nothing
        (nothing more is submitted; the loop cancels every job)."""
        h: DLCJob = job.handle
        if self.ctx.stop.is_set():
            return None
        try:
            return step(h)
        except Exception as exc:
            self.track.log(h, ["===== dlc: internal error", *traceback.format_exc().splitlines()])
            if h.job_id and not h.over:
                try:  # the attempt ends here: so does its job
                    self.track.stop([h], f"internal error: {type(exc).__name__}")
                except Exception:
                    pass
            h.verdict = None
            return Exit(-1, f"DLCRunner internal error: {type(exc).__name__}: {exc}")

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Stop the jobs (``dlc stop``, confirmed) in the background; ``poll`` reports them once over."""
        cause = self._stop_cause()
        for job in jobs:
            self.live.pop(job, None)

        looks = [look for job in jobs if (look := self.looking.pop(job, None)) is not None]

        def stop(group: list[Job]) -> None:
            wait(looks)  # a look still in flight ends first (bounded by cli_timeout_s): one hand on a job
            reasons: dict[str, list[DLCJob]] = {}
            for job in group:
                h = job.handle
                if isinstance(h, DLCJob) and h.job_id and not h.over:
                    reasons.setdefault("timeout_s" if job.timed_out else cause, []).append(h)
            for reason, handles in reasons.items():
                self.track.stop(handles, reason)

        self.stops.start(jobs, stop)

    def _stop_cause(self) -> str:
        if self.ctx.stop.is_set():
            return "the run was stopped (Ctrl-C, SIGTERM or SIGHUP)"
        if sys.exc_info()[0] is not None:
            return f"orchestrator error: {sys.exc_info()[0].__name__}"  # type: ignore[union-attr]
        return "orchestrator shutdown"

    def close(self) -> None:
        wait(list(self.looking.values()))  # looks still in flight end first (bounded by cli_timeout_s)
        self.stops.wait(self.cli_timeout_s + self.timings.cancel_timeout_s + 10)
        # The loop stopped or finished every job it knows; this is the net under an unexpected exit.
        try:
            leftover = [h for h in self.live.values() if h.job_id and not h.over]
            # kept for a task that never started (skipped, stopped): stopped, not left running
            leftover += [orphan(record) for record, _ in self.adopt.values()]
            if leftover:
                self.track.stop(leftover, self._stop_cause())
            if self.unfit is None and self.pool is not None:
                self.recover([], None)  # what earlier orchestrators left of a stage no launch here took
        finally:
            for path in self.env_files:  # every job of this launch is over (or stopped)
                remove_env_file(path)
            self.env_files.clear()
            self.live.clear()
            self.looking.clear()
            self.adopt.clear()
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    # -- what an earlier orchestrator left (-r) ------------------------------------------------------
    def recover(self, tasks: list[TaskSpec], stage: str | None) -> None:
        """Adopt or stop the jobs of ``stage`` (None: of every stage) that the ledger shows possibly
        alive and no launch of this process handles: an earlier orchestrator's (``core.recovery``).
        A job still running the spec of one of ``tasks`` is kept for that task's first attempt; any
        other is stopped."""
        pool, track, client = self.pool, self.track, self.client
        assert pool is not None
        infos: dict[str, DLCJobStatus | None] = {}

        def interrupted(records: list[JobRecord]) -> None:
            for rec in records:  # killed inside dlc submit: the id is unknown
                track.ledger.record("submit_unknown", rec.name, task_id=rec.task_id, stage=rec.stage)
                print(f"orchestra: warning: the submission of DLC job {rec.name} was interrupted before its id "
                      "was known; if DLC created it, stop it in the console", file=sys.stderr)

        def look(rec: JobRecord) -> DLCJobStatus | None:
            try:
                return client.get(rec.job_id)
            except DLCError:
                return None

        def see(known: list[JobRecord]) -> dict[str, Seen]:
            infos.update(zip((r.name for r in known), pool.map(look, known)))
            return {r.name: None if (info := infos[r.name]) is None else "over" if info.terminal else
                    "ending" if info.status == "Stopping" else "alive" for r in known}

        def ended(rec: JobRecord) -> None:
            info = infos[rec.name]
            assert info is not None
            track.record("ended", orphan(rec), status=info.status, reason_code=info.reason_code)

        def keep(adopt: list[JobRecord]) -> None:  # before the stops: close() stops what no attempt takes
            self.adopt.update({rec.task_id: (rec, info) for rec in adopt if (info := infos[rec.name]) is not None})

        recover_left(track.ledger, stage, tasks, see, interrupted=interrupted, ended=ended, keep=keep,
                     stop=lambda records, why: track.stop([orphan(r) for r in records], why))
