"""Run tasks as Alibaba Cloud PAI-DLC jobs, through the one scheduling loop; never leave one behind.

Each attempt of a task is one DLC job (``dlc submit pytorchjob``, one worker) that runs the task's
command from the shared file system: the run folder and the code must be on storage the container
mounts (``data_sources``), as with OpenCompass.  The pieces, imported one way (this module ->
``dlc_worker`` -> ``dlc_job``/``dlc_logs``/``dlc_stop`` -> ``core.ledger``/``dlc_config``/``dlc_cli``):

* ``submit`` only queues the job; ``flush`` hands every job that is due to a few threads
  (``cli_concurrency``), where ``JobWorker.step`` submits it, checks it (``dlc get job``, backing
  off), copies its log into the task log while it runs and to the very end once it is over, and
  decides how the attempt ended (``dlc_job.attempt_exit``).  ``poll`` reports what was decided.
  All ``dlc`` calls but stops share one rate (``max_calls_per_s``).
* The run folder's ledger (``<run>/dlc/jobs.jsonl``) records each submission before the call and
  the job id before anything relies on it.  Failures of the platform (a refused or garbled
  submission, a job stuck waiting longer than ``queue_timeout_s``, a node lost or a preemption
  before the task finished) are ``Exit(infra=True)``: retried without spending ``retry``, up to
  ``infra_retry`` times.
* ``cancel`` (Ctrl-C, SIGTERM, ``timeout_s``, an orchestrator error) and ``close`` stop every job
  (``dlc stop job --force``, in parallel, then ``get job`` until each is over), recorded in the
  ledger and the events.  On ``-r``, jobs the ledger shows possibly alive (an orchestrator killed
  by SIGKILL) are looked up: one still running the same task spec is adopted by that task's first
  attempt, any other is stopped.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestra.paths import RunPaths
from orchestra.runners.core.command import Command, fill_template, forward_env_names
from orchestra.runners.core.contract import Exit, Job, NoResources, Session
from orchestra.runners.core.ledger import JobRecord, Ledger, Seen, spec_digest, triage
from orchestra.runners.core.loop import BaseRunner
from orchestra.runners.core.run import RunContext
from orchestra.runners.core.stopping import BackgroundStops
from orchestra.runners.dlc.cli import DLCClient, DLCError, JobInfo
from orchestra.runners.dlc.config import AliyunConfig, container_command, load_aliyun_file, submit_argv
from orchestra.runners.dlc.job import DLCJob, dlc_job_name, orphan
from orchestra.runners.dlc.secrets import env_file_path, remove_env_file, write_env_file
from orchestra.runners.dlc.worker import JobWorker, Timings
from orchestra.tasks.kinds import TASK_MODULES
from orchestra.tasks.spec import TaskSpec

EXIT_SCAN_S = 0.25  # how often the exit code files of running jobs are looked for


class DLCRunner(BaseRunner):
    """Run each task attempt as one Alibaba Cloud PAI-DLC job (see docs/dlc.md).

    Args:
        aliyun_cfg: OpenCompass's ``aliyun_cfg`` dict (``workspace_id``, ``resource_id``,
            ``worker_image``, ``bashrc_path`` + ``conda_env_name`` or ``python_env_path``, ...), or
            the path of an aliyun config file.
        max_num_workers: jobs in flight (queued on DLC or running) at once.
        retry: extra attempts for a task that failed (infrastructure failures do not count).
        retry_backoff_s: first retry delay (doubles, with jitter).
        timeout_s: wall-clock limit of one attempt, queueing included; the job is stopped after it.
        queue_timeout_s: a job still waiting for resources (Creating/Queuing/Bidding) after this
            long is stopped and submitted again (None: wait as long as it takes).
        poll_interval_s: first interval between two ``dlc get job`` of one job (None: the
            ``aliyun_cfg`` key ``dlc_sleep_time``, else 10 s).
        max_poll_interval_s: the interval grows 1.5x per unchanged answer up to this.
        max_calls_per_s: ``dlc`` calls per second over all jobs (stops are never held back).
        cli_concurrency: ``dlc`` calls in flight at once.
        cli_timeout_s: the longest one ``dlc`` call may take.
        infra_retry: attempts per task that may fail for the platform's sake and be retried
            without spending ``retry``.
        cancel_timeout_s: how long a stop waits for the service to show the jobs over.
        log_settle_s: how far behind the service's clock log windows are read (its ingestion delay).
        lost_after_s: ``dlc get job`` failing this long makes the job count as lost (stopped, retried).
        dlc_bin: the ``dlc`` client (a path, or a name on PATH).
        template: a command around ``{task_cmd}`` inside the container.
        forward_env: names of environment variables of the orchestrator that every container
            gets (e.g. ``['HF_TOKEN']``): their values go into a 0600 file in the run folder that
            the job's command sources, never into the ``dlc submit`` argv, config.py or the logs
            (``dlc_secrets.py``); the file is deleted when the launch ends.
    """

    def __init__(
        self,
        aliyun_cfg: dict | str,
        max_num_workers: int = 32,
        retry: int = 0,
        retry_backoff_s: float = 10.0,
        timeout_s: float | None = None,
        queue_timeout_s: float | None = None,
        poll_interval_s: float | None = None,
        max_poll_interval_s: float = 60.0,
        max_calls_per_s: float = 10.0,
        cli_concurrency: int = 8,
        cli_timeout_s: float = 60.0,
        infra_retry: int = 3,
        cancel_timeout_s: float = 30.0,
        log_settle_s: float = 10.0,
        lost_after_s: float = 600.0,
        dlc_bin: str = "dlc",
        template: str | list[str] | None = None,
        forward_env: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.forward_env = forward_env_names(forward_env)
        cfg = AliyunConfig.create(load_aliyun_file(aliyun_cfg) if isinstance(aliyun_cfg, str) else aliyun_cfg)
        interval = poll_interval_s if poll_interval_s is not None else (cfg.dlc_sleep_time or 10.0)
        for name, value in (("poll_interval_s", interval), ("max_poll_interval_s", max_poll_interval_s),
                            ("max_calls_per_s", max_calls_per_s), ("cli_timeout_s", cli_timeout_s),
                            ("cancel_timeout_s", cancel_timeout_s), ("lost_after_s", lost_after_s)):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if queue_timeout_s is not None and queue_timeout_s <= 0:
            raise ValueError(f"queue_timeout_s must be > 0 (or None: no limit), got {queue_timeout_s}")
        for name, count, low in (("cli_concurrency", cli_concurrency, 1), ("infra_retry", infra_retry, 0)):
            if not isinstance(count, int) or count < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {count!r}")
        if log_settle_s < 0:
            raise ValueError(f"log_settle_s must be >= 0, got {log_settle_s}")
        # The loop itself only reads what the threads found: it may go round often and cheaply.
        super().__init__(max_num_workers, retry, retry_backoff_s, timeout_s, min(0.05, interval), template,
                         infra_retry)
        self.cfg = cfg
        self.dlc_bin = dlc_bin
        self.timings = Timings(interval, max(max_poll_interval_s, interval), queue_timeout_s, log_settle_s,
                               lost_after_s, cancel_timeout_s)
        self.max_calls_per_s = max_calls_per_s
        self.cli_concurrency = cli_concurrency
        self.cli_timeout_s = cli_timeout_s
        self.client: DLCClient | None = None  # the last launch's (its call counts stay readable)
        self._worker: JobWorker | None = None
        self._ctx: RunContext | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._live: dict[str, DLCJob] = {}
        self._adopt: dict[str, tuple[JobRecord, JobInfo]] = {}
        self._name_base: dict[str, int] = {}  # task id -> the highest job name number in the ledger
        self._unfit: str | None = None
        self._last_exit_scan = 0.0
        self._env_files: set[str] = set()

    # -- what a job runs ---------------------------------------------------------------------------
    def get_command(self, task: TaskSpec, spec_path: str, resources: dict[str, Any], attempt: int = 1,
                    log_path: str = "") -> Command:
        """The ``dlc submit`` argv of one attempt (what ``--dry-run`` prints and the log records)."""
        argv = [self.cfg.python(), "-m", TASK_MODULES[task.stage], spec_path]
        if self.template is not None:
            argv = fill_template(self.template, argv, self.command_fields(task, resources, log_path))
        name = dlc_job_name(task, self._seq(task, attempt))
        exit_file = os.path.join(RunPaths(task.run_dir).dlc_dir, "exit", name)
        env_file = env_file_path(RunPaths(task.run_dir).dlc_dir, task.stage) if self.forward_env else None
        command = container_command(self.cfg, argv, self.task_env(task, resources, attempt), os.getcwd(),
                                    exit_file, name, env_file)
        return Command(tuple(submit_argv(self.dlc_bin, self.cfg, name, command, task.num_gpus)))

    def _seq(self, task: TaskSpec, attempt: int) -> int:
        return self._name_base.get(task.task_id, 0) + attempt

    # -- the launch ----------------------------------------------------------------------------------
    def open(self, ctx: RunContext, tasks: Sequence[TaskSpec]) -> Session:
        self._ctx = ctx
        self._unfit = self._check_tools()
        config = os.path.expanduser(self.cfg.dlc_config_path) if self.cfg.dlc_config_path else None
        self.client = DLCClient(self.dlc_bin, config, self.cli_timeout_s, self.max_calls_per_s, abort=ctx.stop)
        self._worker = JobWorker(self.client, Ledger(ctx.paths.dlc_dir), ctx.events, self.timings)
        self._pool = ThreadPoolExecutor(self.cli_concurrency, thread_name_prefix="dlc")
        try:
            if self.forward_env and tasks:  # before any job can start: each one sources it
                path = env_file_path(ctx.paths.dlc_dir, tasks[0].stage)
                self._env_files.add(path)
                write_env_file(path, self.forward_env)
            if self._unfit is None:
                for rec in self._active().ledger.jobs().values():  # job names count on from every earlier one
                    self._name_base[rec.task_id] = max(self._name_base.get(rec.task_id, 0), rec.seq)
                self._recover(list(tasks), tasks[0].stage if tasks else None)
        except BaseException:
            self.close()
            raise
        return DLCSession(self)

    def _check_tools(self) -> str | None:
        if shutil.which(self.dlc_bin) is None:
            return (f"{self.dlc_bin!r} not found or not executable: DLCRunner needs Alibaba's dlc client "
                    "(set dlc_bin or PATH)")
        config = self.cfg.dlc_config_path
        if config and not os.path.isfile(os.path.expanduser(config)):
            return f"aliyun_cfg.dlc_config_path {config!r} does not exist on this machine"
        return None

    def submit(self, job: Job) -> None:
        task = job.task
        seq = self._seq(task, job.attempt)
        name = dlc_job_name(task, seq)
        handle = DLCJob(name, task.task_id, task.stage, job.attempt, spec_digest(task), job.log_path,
                        os.path.join(RunPaths(task.run_dir).dlc_dir, "exit", name), list(job.command.argv), seq)
        adopt = self._adopt.pop(task.task_id, None) if job.attempt == 1 else None
        if adopt is not None:
            record, info = adopt
            handle.name, handle.job_id, handle.adopted, handle.info = record.name, record.job_id, True, info
            handle.seq = record.seq
            handle.exit_file = os.path.join(RunPaths(task.run_dir).dlc_dir, "exit", record.name)
            handle.interval = self.timings.poll_interval_s
            worker = self._active()
            worker.record("adopted", handle, by_attempt=job.attempt)
            worker.emit("dlc_adopted", handle, job_id=record.job_id, status=info.status)
            worker.log(handle, [f"===== dlc: adopted job {record.job_id} ({record.name}, {info.status}), submitted "
                                "by an earlier orchestrator of this run folder; its log from the start follows"])
        job.handle = handle
        self._live[handle.name] = handle

    def placement(self, job: Job) -> dict[str, Any]:
        handle: DLCJob = job.handle
        where: dict[str, Any] = {"dlc_job_name": handle.name, "workspace_id": self.cfg.workspace_id}
        if handle.job_id:  # an adopted job (a new one gets its id once its submission went through)
            where["dlc_job_id"] = handle.job_id
        return where

    def flush(self) -> None:
        """Hand every job that is due (a submission, a check, a last log read) to the threads."""
        assert self._pool is not None
        now = time.monotonic()
        if now - self._last_exit_scan >= max(EXIT_SCAN_S, 0.001 * len(self._live)):  # ~1,000 files/s at most
            # A task that ended wrote its exit code to the shared file system: no need to wait for the
            # next scheduled check (a file check costs no dlc call).
            self._last_exit_scan = now
            for h in self._live.values():
                if h.job_id and not h.exit_seen and h.drain_at is None and os.path.exists(h.exit_file):
                    h.exit_seen = True
                    h.next_check = min(h.next_check, now)
        due = [h for h in self._live.values()
               if not h.busy and h.result is None and not h.cancelled and h.next_check <= now]
        for handle in sorted(due, key=lambda h: (not h.exit_seen, h.next_check)):
            handle.busy = True
            self._pool.submit(self._active().step, handle)

    def poll(self, job: Job) -> Exit | None:
        handle: DLCJob = job.handle
        if handle.result is None:
            return None
        self._live.pop(handle.name, None)
        return handle.result

    # -- stopping --------------------------------------------------------------------------------------
    def cancel(self, jobs: Sequence[Job], stops: BackgroundStops) -> None:
        """Mark the jobs cancelled here, then stop them (``dlc stop``, confirmed) in the background."""
        handles = [job.handle for job in jobs if isinstance(job.handle, DLCJob)]
        why = {id(job.handle): ("timeout_s" if job.timed_out else self._stop_cause()) for job in jobs}
        for h in handles:
            h.cancelled = True
            self._live.pop(h.name, None)
        worker = self._active()

        def stop(_: list[Job]) -> None:
            self._settle(handles)
            groups: dict[str, list[DLCJob]] = {}
            for h in handles:
                if h.job_id and not h.over:
                    groups.setdefault(why[id(h)], []).append(h)
            for reason, group in groups.items():
                worker.stop(group, reason)

        stops.start(jobs, stop)

    def _settle(self, handles: list[DLCJob]) -> None:
        """Mark these jobs cancelled and wait for their submissions in flight: a job created meanwhile
        must be stopped, not left without an owner (bounded by one call's timeout)."""
        for h in handles:
            h.cancelled = True
        deadline = time.monotonic() + self.cli_timeout_s + 5
        while any(h.busy and h.job_id is None for h in handles) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _stop_cause(self) -> str:
        if self._ctx is not None and self._ctx.stop.is_set():
            return "the run was stopped (Ctrl-C, SIGTERM or SIGHUP)"
        if sys.exc_info()[0] is not None:
            return f"orchestrator error: {sys.exc_info()[0].__name__}"  # type: ignore[union-attr]
        return "orchestrator shutdown"

    def close(self, stops: BackgroundStops | None = None) -> None:
        if stops is not None:
            stops.wait(self.cli_timeout_s + self.timings.cancel_timeout_s + 10)
        # The loop stopped or finished every job it knows; this is the net under an unexpected exit.
        try:
            self._settle(list(self._live.values()))
            leftover = [h for h in self._live.values() if h.job_id and not h.over]
            # kept for a task that never started (skipped, stopped): stopped, not left running
            leftover += [orphan(record) for record, _ in self._adopt.values()]
            if leftover and self._worker is not None:
                self._worker.stop(leftover, self._stop_cause())
            if self._worker is not None and self._unfit is None and self._pool is not None:
                self._recover([], None)  # what earlier orchestrators left of a stage no launch here took
        finally:
            for path in self._env_files:  # every job of this launch is over (or stopped)
                remove_env_file(path)
            self._env_files.clear()
            self._live.clear()
            self._adopt.clear()
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _active(self) -> JobWorker:
        if self._worker is None:
            raise RuntimeError("DLCRunner: submit/poll/cancel called outside launch()")
        return self._worker

    # -- what an earlier orchestrator left (-r) -----------------------------------------------------------
    def _recover(self, tasks: list[TaskSpec], stage: str | None) -> None:
        """Adopt or stop the jobs of ``stage`` (None: of every stage) that the ledger shows possibly
        alive and no launch of this process handles: an earlier orchestrator's.  A job still running
        the spec of one of ``tasks`` is kept for that task's first attempt; any other is stopped."""
        assert self.client is not None and self._pool is not None
        worker = self._active()
        interrupted, alive = worker.ledger.left_behind(stage)
        for rec in interrupted:  # killed inside dlc submit: the id is unknown
            worker.ledger.record("submit_unknown", rec.name, task_id=rec.task_id, stage=rec.stage)
            print(f"orchestra: warning: the submission of DLC job {rec.name} was interrupted before its id "
                  "was known; if DLC created it, stop it in the console", file=sys.stderr)
        if not alive:
            return
        client = self.client

        def look(rec: JobRecord) -> JobInfo | None:
            try:
                return client.get(rec.job_id)
            except DLCError:
                return None

        infos = dict(zip((r.name for r in alive), self._pool.map(look, alive)))
        seen: dict[str, Seen] = {name: None if info is None else "over" if info.terminal else
                                 "ending" if info.status == "Stopping" else "alive" for name, info in infos.items()}
        over, adopt, to_stop = triage(alive, seen, {t.task_id: spec_digest(t) for t in tasks})
        for rec in over:
            info = infos[rec.name]
            assert info is not None
            worker.record("ended", orphan(rec), status=info.status, reason_code=info.reason_code)
        self._adopt.update({rec.task_id: (rec, info) for rec in adopt if (info := infos[rec.name]) is not None})
        if to_stop:
            worker.stop([orphan(r) for r in to_stop], "left by an earlier orchestrator of this run folder, not needed")


class DLCSession(Session):
    """One launch of a DLCRunner: the loop's batched calls over the runner's job threads."""

    def __init__(self, runner: DLCRunner) -> None:
        self.runner = runner
        self.resources = NoResources(runner._unfit)
        self.stops = BackgroundStops("dlc")

    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        for job in jobs:
            self.runner.submit(job)
        self.runner.flush()
        return {}

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        self.runner.flush()
        ended: dict[Job, Exit] = self.stops.ended(jobs)
        for job in jobs:
            if job not in ended and not self.stops.stopping(job):
                exit_ = self.runner.poll(job)
                if exit_ is not None:
                    ended[job] = exit_
        return ended

    def cancel(self, jobs: Sequence[Job]) -> None:
        self.runner.cancel(jobs, self.stops)

    def placement(self, job: Job) -> dict[str, Any]:
        return self.runner.placement(job)

    def close(self) -> None:
        self.runner.close(self.stops)


__all__ = ["AliyunConfig", "DLCJob", "DLCRunner", "dlc_job_name", "spec_digest"]
