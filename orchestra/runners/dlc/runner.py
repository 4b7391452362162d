"""Run tasks as Alibaba Cloud PAI-DLC jobs, through the one scheduling loop; never leave one behind.

Each attempt of a task is one DLC job (``dlc submit pytorchjob``, one worker) that runs the task's
command from the shared file system (the run folder and the code on storage the container mounts,
``data_sources``, as with OpenCompass).  This module is the runner's configuration and what a job
runs (``get_command``); ``open`` starts a ``DLCSession`` (``session.py``: the verbs), whose jobs
``track.py`` submits, watches and stops one by one, each step recorded in the run folder's ledger
(``<run>/dlc/jobs.jsonl``) before anything relies on it.  Imports run one way: this module ->
``session`` -> ``track`` -> ``job``/``logs`` -> ``config``/``cli`` (and ``core``).  See docs/dlc.md.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Any, ClassVar, Unpack

from orchestra.envfile import write_env_file
from orchestra.paths import RunPaths
from orchestra.runners.core import checks
from orchestra.runners.core.command import Command, fill_template, forward_env_names
from orchestra.runners.core.contract import Session
from orchestra.runners.core.ledger import spec_digest
from orchestra.runners.core.loop import BaseRunner
from orchestra.runners.core.options import CommandLoopOptions, LoopOptions, with_defaults
from orchestra.runners.core.run import RunContext
from orchestra.runners.dlc.cli import DLCClient
from orchestra.runners.dlc.config import AliyunConfig, container_command, load_aliyun_file, submit_argv
from orchestra.runners.dlc.job import DLCJob, JobNumbers, Timings, dlc_job_name
from orchestra.runners.dlc.session import DLCSession
from orchestra.tasks.kinds import TASK_MODULES
from orchestra.tasks.spec import TaskSpec


class DLCRunner(BaseRunner):
    """Run each task attempt as one Alibaba Cloud PAI-DLC job (see docs/dlc.md).

    Args:
        aliyun_cfg: OpenCompass's ``aliyun_cfg`` dict (``workspace_id``, ``resource_id``,
            ``worker_image``, ``bashrc_path`` + ``conda_env_name`` or ``python_env_path``, ...), or
            the path of an aliyun config file.
        queue_timeout_s: a job still waiting for resources (Creating/Queuing/Bidding) after this
            long is stopped and submitted again (None: wait as long as it takes).
        max_poll_interval_s: the interval grows 1.5x per unchanged answer up to this.
        max_calls_per_s: ``dlc`` calls per second over all jobs (stops are never held back).
        cli_concurrency: ``dlc`` calls in flight at once.
        cli_timeout_s: the longest one ``dlc`` call may take.
        cancel_timeout_s: how long a stop waits for the service to show the jobs over.
        log_settle_s: how far behind the service's clock log windows are read (its ingestion delay).
        lost_after_s: ``dlc get job`` failing this long makes the job count as lost (stopped, retried).
        dlc_bin: the ``dlc`` client (a path, or a name on PATH).
        forward_env: names of environment variables of the orchestrator that every container
            gets (e.g. ``['HF_TOKEN']``): their values go into a 0600 file in the run folder that
            the job's command sources, never into the ``dlc submit`` argv, config.py or the logs
            (``orchestra.envfile``, at :func:`env_file_path`); the file is deleted when the launch ends.
        **loop: the loop's options (``BaseRunner``): ``max_num_workers`` jobs in flight (queued on
            DLC or running; default 32); ``retry`` (infrastructure failures do not count; its
            backoff ``retry_backoff_s`` default 10 s); ``timeout_s`` one attempt, queueing
            included, the job stopped after it; ``infra_retry`` (default 3) attempts that may fail
            for the platform's sake without spending ``retry``; ``template`` a command around
            ``{task_cmd}`` inside the container; ``poll_interval_s`` here the first interval
            between two ``dlc get job`` of one job (None: the ``aliyun_cfg`` key
            ``dlc_sleep_time``, else 10 s; the loop itself goes round every 0.05 s at most).
    """

    #: managed servers need a place that holds GPUs for the whole stage and an address the tasks reach:
    #: a DLC job is one task in a container whose network address nothing here can learn or reach
    outlives_orchestrator = True  # cloud jobs; -r adopts the ones running a task's spec, stops the rest
    reports_infra_loss = True  # refused, stuck in a queue, preempted, lost
    loop_defaults: ClassVar[LoopOptions] = {"max_num_workers": 32, "retry_backoff_s": 10.0, "infra_retry": 3}
    serves_nowhere = ("managed servers (server=dict(...)) cannot run on DLC: a DLC job cannot host a replica "
                      "that other jobs reach (use LocalRunner, SlurmRunner or RayRunner for served models)")

    def __init__(
        self,
        aliyun_cfg: dict | str,
        queue_timeout_s: float | None = None,
        max_poll_interval_s: float = 60.0,
        max_calls_per_s: float = 10.0,
        cli_concurrency: int = 8,
        cli_timeout_s: float = 60.0,
        cancel_timeout_s: float = 30.0,
        log_settle_s: float = 10.0,
        lost_after_s: float = 600.0,
        dlc_bin: str = "dlc",
        forward_env: list[str] | tuple[str, ...] = (),
        **loop: Unpack[CommandLoopOptions],
    ) -> None:
        self.forward_env = forward_env_names(forward_env)
        cfg = AliyunConfig.create(load_aliyun_file(aliyun_cfg) if isinstance(aliyun_cfg, str) else aliyun_cfg)
        given = loop.get("poll_interval_s")
        interval = given if given is not None else (cfg.dlc_sleep_time or 10.0)
        for name, value in (("poll_interval_s", interval), ("max_poll_interval_s", max_poll_interval_s),
                            ("max_calls_per_s", max_calls_per_s), ("cli_timeout_s", cli_timeout_s),
                            ("cancel_timeout_s", cancel_timeout_s), ("lost_after_s", lost_after_s)):
            checks.amount(name, value)
        checks.optional_amount("queue_timeout_s", queue_timeout_s)  # None: no limit
        checks.count("cli_concurrency", cli_concurrency, 1)
        checks.amount("log_settle_s", log_settle_s, zero=True)
        # The loop itself only reads what the threads found: it may go round often and cheaply.
        loop["poll_interval_s"] = min(0.05, interval)
        super().__init__(**with_defaults(loop, self.loop_defaults))
        self.cfg = cfg
        self.dlc_bin = dlc_bin
        self.timings = Timings(interval, max(max_poll_interval_s, interval), queue_timeout_s, log_settle_s,
                               lost_after_s, cancel_timeout_s)
        self.max_calls_per_s = max_calls_per_s
        self.cli_concurrency = cli_concurrency
        self.cli_timeout_s = cli_timeout_s
        self.client: DLCClient | None = None  # the last launch's (its call counts stay readable)
        self.numbers = JobNumbers()  # the number in each attempt's job name

    # -- what a job runs ---------------------------------------------------------------------------
    def get_command(self, task: TaskSpec, spec_path: str, resources: dict[str, Any], attempt: int = 1,
                    log_path: str = "") -> Command:
        """The ``dlc submit`` argv of one attempt (what ``--dry-run`` prints and the log records)."""
        argv = [self.cfg.python(), "-m", TASK_MODULES[task.stage], spec_path]
        if self.template is not None:
            argv = fill_template(self.template, argv, self.command_fields(task, resources, log_path))
        name = dlc_job_name(task, self.numbers.seq(task, attempt))
        exit_file = os.path.join(RunPaths(task.run_dir).dlc_dir, "exit", name)
        env_file = env_file_path(RunPaths(task.run_dir).dlc_dir, task.stage) if self.forward_env else None
        command = container_command(self.cfg, argv, self.task_env(task, resources, attempt), os.getcwd(),
                                    exit_file, name, env_file)
        return Command(tuple(submit_argv(self.dlc_bin, self.cfg, name, command, task.num_gpus)))

    # -- the launch ----------------------------------------------------------------------------------
    def open(self, ctx: RunContext, tasks: Sequence[TaskSpec]) -> Session:
        unfit = self._check_tools()
        config = os.path.expanduser(self.cfg.dlc_config_path) if self.cfg.dlc_config_path else None
        self.client = DLCClient(self.dlc_bin, config, self.cli_timeout_s, self.max_calls_per_s, abort=ctx.stop)
        session = DLCSession(ctx, self.client, unfit, self.numbers, self.timings, self.cfg.workspace_id,
                             self.cli_concurrency, self.cli_timeout_s)
        try:
            if self.forward_env and tasks:  # before any job can start: each one sources it
                path = env_file_path(ctx.paths.dlc_dir, tasks[0].stage)
                session.env_files.add(path)
                write_env_file(path, self.forward_env)
            if unfit is None:
                for rec in session.track.ledger.jobs().values():  # job names count on from every earlier one
                    self.numbers.seen(rec.task_id, rec.seq)
                session.recover(list(tasks), tasks[0].stage if tasks else None)
        except BaseException:
            session.close()
            raise
        return session

    def settle_left(self, ctx: RunContext, stage: str) -> None:
        """DLC jobs outlive their orchestrator: those an earlier one left, whose outputs this run
        reuses, are recorded as ended or stopped (a launch of no task: its ``open`` and ``close``
        look at what no launch of this process took, of every stage)."""
        self.open(ctx, []).close()

    def _check_tools(self) -> str | None:
        if shutil.which(self.dlc_bin) is None:
            return (f"{self.dlc_bin!r} not found or not executable: DLCRunner needs Alibaba's dlc client "
                    "(set dlc_bin or PATH)")
        config = self.cfg.dlc_config_path
        if config and not os.path.isfile(os.path.expanduser(config)):
            return f"aliyun_cfg.dlc_config_path {config!r} does not exist on this machine"
        return None


def env_file_path(dlc_dir: str, stage: str) -> str:
    """Where the forwarded variables of one stage's jobs are (``<run>/dlc/private/<stage>.env``)."""
    return os.path.join(dlc_dir, "private", f"{stage}.env")


__all__ = ["AliyunConfig", "DLCJob", "DLCRunner", "dlc_job_name", "spec_digest"]
