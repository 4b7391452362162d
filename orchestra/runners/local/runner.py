"""Run tasks as subprocesses on this machine, with GPU slots."""

from __future__ import annotations

import os
import re
import select
import shutil
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Unpack

from orchestra.runners.core import checks
from orchestra.runners.core.contract import Exit, Job, Resources, Session, cannot_start
from orchestra.runners.core.host import HostCapacity, usable_cores
from orchestra.runners.core.loop import BaseRunner
from orchestra.runners.core.options import CommandLoopOptions, LoopOptions, with_defaults
from orchestra.runners.core.proc import reap_group, signal_name, start_group, stop_groups
from orchestra.runners.core.run import RunContext
from orchestra.runners.core.stopping import BackgroundStops
from orchestra.runners.core.warm import Worker
from orchestra.runners.local import gpumon
from orchestra.runners.local.warm import PipePool
from orchestra.tasks.spec import TaskSpec

_HOST = socket.gethostname()
_GPU_LINE = re.compile(r"GPU (\d+): ")


def detect_gpus() -> list[str]:
    """GPU ids from ``CUDA_VISIBLE_DEVICES``, else from ``nvidia-smi -L``, else none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    # one "GPU <n>: ..." line per GPU, each followed by its MIG devices (indented) if it has any
    return [m.group(1) for line in out.splitlines() if (m := _GPU_LINE.match(line))]


#: tasks at once when ``max_num_workers`` is not given and there are fewer GPU slots
DEFAULT_WORKERS = 4


def cpu_share(workers: int) -> int | None:
    """Cores each of ``workers`` concurrent tasks gets (None: one task, all of them)."""
    if workers <= 1:
        return None
    return max(1, usable_cores() // workers)


class LocalRunner(BaseRunner, Resources):
    """One subprocess per task attempt, each in its own process group.

    Args:
        gpus: GPU ids to hand out, a list or ``'0,1'`` (default: detected); ``[]`` means no GPUs.
        max_workers_per_gpu: tasks that may share one GPU.
        reuse_workers: keep warm worker processes that run task after task, so a model is
            loaded once per worker instead of once per task (no ``template`` then).
        kill_grace_s: how long a cancelled task gets after SIGTERM before SIGKILL.
        gpu_sample_s: while a launch hands out GPUs, sample their utilisation with
            ``nvidia-smi`` this often into ``gpu.jsonl`` (0: off; nothing without the tool).
        **loop: the loop's options (``BaseRunner``): ``max_num_workers`` tasks running at once
            (default: one per GPU slot, i.e. GPUs x ``max_workers_per_gpu``, and at least 4, so a
            GPU box is used whole); ``timeout_s`` kills the task's process group; ``poll_interval_s``
            default 0.02 s; ``template`` a wrapper command around ``{task_cmd}``.
    """

    template_fields = (*BaseRunner.template_fields, "gpu_ids")
    refill_at_once = True  # polling a local process or a warm worker's pipe costs nothing
    serves_locally = True  # managed servers (server=dict(...)) run on this machine beside its tasks
    gpus: list[str]  # always a list here: this machine's GPUs it hands out ([]: none)
    loop_defaults: ClassVar[LoopOptions] = {"poll_interval_s": 0.02}

    def __init__(
        self,
        gpus: list[int | str] | str | None = None,
        max_workers_per_gpu: int = 1,
        reuse_workers: bool = False,
        kill_grace_s: float = 3.0,
        gpu_sample_s: float = 1.0,
        **loop: Unpack[CommandLoopOptions],
    ) -> None:
        checks.count("max_workers_per_gpu", max_workers_per_gpu, 1)
        if isinstance(gpus, str):  # '0,1' as CUDA_VISIBLE_DEVICES writes it
            gpus = [g.strip() for g in gpus.split(",") if g.strip()]
        self.gpus = [str(g) for g in gpus] if gpus is not None else detect_gpus()
        if loop.get("max_num_workers") is None:
            loop["max_num_workers"] = max(DEFAULT_WORKERS, len(self.gpus) * max_workers_per_gpu)
        super().__init__(**with_defaults(loop, self.loop_defaults))
        checks.amount("kill_grace_s", kill_grace_s, zero=True)
        self.max_workers_per_gpu = max_workers_per_gpu
        self.kill_grace_s = kill_grace_s
        self._host: HostCapacity | None = None  # the run's (shared by its stages), set by launch
        if reuse_workers and self.template is not None:
            raise ValueError("reuse_workers=True cannot be combined with a template")
        self.reuse_workers = reuse_workers
        self.shares_warm_workers = reuse_workers  # one PipePool for both stages (local/warm.py)
        self.carries_exit_codes = not reuse_workers  # a warm worker answers done (0) or failed (1)
        self.gpu_sample_s = gpumon.check_period(gpu_sample_s)

    def open(self, ctx: RunContext, tasks: Sequence[TaskSpec]) -> Session:
        self._host = ctx.host or HostCapacity()
        pool = None
        if self.reuse_workers and ctx.shared is not None:  # the run's pool, which its other stage may use too
            pool = ctx.shared.get(("local-warm", self.kill_grace_s, ctx.paths.worker_logs),
                                  lambda: PipePool(0, self.kill_grace_s, ctx.paths.worker_logs))
            pool.join(self.max_num_workers, [t.worker_key for t in tasks])
        elif self.reuse_workers:
            pool = PipePool(self.max_num_workers, self.kill_grace_s, ctx.paths.worker_logs)
        hands_out_gpus = any(t.num_gpus > 0 and self.unfit(t) is None for t in tasks)
        sampler = gpumon.acquire(ctx.paths, self.gpus, self.gpu_sample_s) if hands_out_gpus else None
        shared = [t.worker_key for t in tasks] if pool is not None and ctx.shared is not None else None
        return LocalSession(self, pool, sampler, shared)

    # -- resources ---------------------------------------------------------------------------
    def unfit(self, task: TaskSpec) -> str | None:
        if task.num_gpus > len(self.gpus):
            return (
                f"needs {task.num_gpus} GPU(s) but this runner has {len(self.gpus)} "
                "(set CUDA_VISIBLE_DEVICES or the runner's gpus=[...])"
            )
        return None

    def acquire(self, task: TaskSpec) -> dict[str, Any] | None:
        host = self._host or HostCapacity()
        self._host = host
        gpu_ids = host.take(task.stage, task.num_procs, self.gpus, task.num_gpus, self.max_workers_per_gpu)
        if gpu_ids is None:
            return None
        return {"gpu_ids": gpu_ids, "cores": task.num_procs}

    def release(self, job: Job, ended: Exit | None) -> None:
        if self._host is not None and "cores" in job.resources:
            self._host.give(job.task.stage, job.resources["cores"], job.resources["gpu_ids"])

    def command_fields(self, task: TaskSpec, resources: dict[str, Any], log_path: str) -> dict[str, Any]:
        return {**super().command_fields(task, resources, log_path),
                "gpu_ids": ",".join(resources.get("gpu_ids", []))}

    def task_env(self, task: TaskSpec, resources: dict[str, Any], attempt: int) -> dict[str, str]:
        env = super().task_env(task, resources, attempt)
        # A task without GPUs must not grab one by accident: hide them all.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(resources.get("gpu_ids", []))
        # CPU tasks sharing the machine each get their share of the cores, through the
        # variable torch and BLAS libraries read (a user's own setting wins).
        share = cpu_share(self.max_num_workers)
        if share is not None and task.num_gpus == 0 and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(share)
        return env



class LocalSession(Session):
    """One launch of a LocalRunner: its processes (or warm workers), and those being stopped."""

    def __init__(self, runner: LocalRunner, pool: PipePool | None, sampler: str | None = None,
                 shared: list[str] | None = None) -> None:
        self.runner = runner
        self.resources = runner
        self.pool = pool
        self.shared = shared  # the worker keys of its tasks when the pool is the run's (closed by the run)
        self.sampler = sampler  # this launch's share of the run's GPU sampler (gpumon.acquire)
        self.stops = BackgroundStops("local")

    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        refused: dict[Job, Exit] = {}
        for job in jobs:
            try:
                if self.pool is not None:
                    key = f"{job.task.worker_key}|{job.command.env.get('CUDA_VISIBLE_DEVICES', '')}"
                    job.handle = self.pool.run(job, key)
                else:
                    job.handle = start_group(job.command.argv, job.command.env, job.log_path)
            except OSError as exc:
                refused.update(cannot_start([job], exc))
        return refused

    def placement(self, job: Job) -> dict[str, Any]:
        if isinstance(job.handle, Worker):
            return {"host": _HOST, "pid": job.handle.handle.proc.pid, "warm_worker": True}
        pid = getattr(job.handle, "pid", None)
        return {"host": _HOST, "pid": pid} if pid is not None else {"host": _HOST}

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        return self.stops.poll_each(jobs, self._poll_one)

    def _poll_one(self, job: Job) -> Exit | None:
        if isinstance(job.handle, Worker):
            assert self.pool is not None
            return self.pool.poll(job.handle)
        code = reap_group(job.handle)
        if code is None:
            return None
        if code < 0:
            return Exit(code, f"killed by signal {signal_name(-code)}")
        return Exit(code)

    def cancel(self, jobs: Sequence[Job]) -> None:
        if self.pool is not None:
            procs = self.pool.detach([job.handle for job in jobs if isinstance(job.handle, Worker)])
        else:
            procs = [job.handle for job in jobs if job.handle is not None]
        grace = self.runner.kill_grace_s
        self.stops.start(jobs, lambda _: stop_groups(procs, grace))

    def wait(self, jobs: Sequence[Job], timeout_s: float, stop: threading.Event) -> None:
        # a job being stopped has its pipe closed already (-1): the plain wait then, or select() fails at once
        fds = [job.handle.handle.reply_fd for job in jobs
               if isinstance(job.handle, Worker) and job.handle.handle.reply_fd >= 0]
        if not fds or len(fds) < len(jobs) or any(job.handle.handle.buffer for job in jobs):
            super().wait(jobs, timeout_s, stop)
            return
        # Warm workers answer on a pipe: wake when one does, so a task of a few milliseconds
        # does not wait out the poll interval (which still bounds how late ``stop`` is seen).
        try:
            select.select(fds, [], [], timeout_s)
        except (OSError, ValueError):  # a pipe closed under us: the next poll tells what happened
            pass

    def close(self) -> None:
        try:
            self.stops.wait(self.runner.kill_grace_s + 10)
            if self.pool is not None and self.shared is not None:
                self.pool.leave(self.runner.max_num_workers, self.shared)
            elif self.pool is not None:
                self.pool.close()
            self.pool = None
        finally:
            gpumon.release(self.sampler)
            self.sampler = None
