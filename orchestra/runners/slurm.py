"""Run tasks on a Slurm cluster: one ``srun`` per task, or sbatch job arrays through submitit.

The scheduling loop (queue, ``max_num_workers``, retries, timeouts, cancellation, events) is the
runner base's; this module only turns a task into a Slurm job and watches it.  Two launchers:

* ``launcher='srun'`` (default): each attempt is a local ``srun ... <task argv>`` process in its
  own process group (``slurm_srun.py``); its output streams into the task log and its exit code
  is the task's.
* ``launcher='sbatch'``: the attempts of one scheduling round that need the same resources are
  submitted as one job array through submitit (``slurm_batch.py``); one ``squeue`` call per poll
  round tells every job's state, so a job that dies without a result (hard exit, ``scancel``,
  time limit) is seen without an accounting database.

Either way every job is named ``orc-<run tag>-<task_id>-a<attempt>`` (arrays:
``orc-<run tag>-<stage>``), ``CUDA_VISIBLE_DEVICES`` is left to Slurm (``--gres``), and
cancelling returns only once ``squeue`` shows none of the jobs alive.
"""

from __future__ import annotations

import abc
import hashlib
import os
import re
import shlex
import shutil
from typing import Any

from orchestra.runners.base import BaseRunner, Exit, Job, RunContext, TaskResult
from orchestra.runners.command import Command, fill_template
from orchestra.tasks.kinds import task_argv
from orchestra.tasks.spec import TaskSpec

LAUNCHERS = ("srun", "sbatch")
_TIME_LIMIT = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


def job_header(job_id: str) -> str:
    """The bash that prints, inside a job, the header a task log gets for each attempt: which
    job, node and GPUs it got and when it started (``job_id`` is a shell expression)."""
    return ('printf "===== slurm: job %s on %s, CUDA_VISIBLE_DEVICES=%s, started %s\\n" '
            f'"{job_id}" "${{SLURMD_NODENAME-?}}" "${{CUDA_VISIBLE_DEVICES-<unset>}}" "${{EPOCHREALTIME-?}}"')


# srun: print the header, then exec the task; "$@" is the task's argv, never parsed by the shell.
_SRUN_WRAPPER = job_header("${SLURM_JOB_ID-?}") + '; exec "$@"'


def run_tag(root: str) -> str:
    """Eight hex digits naming one run folder in job names (``orc-<tag>-...``)."""
    return hashlib.sha1(os.path.normpath(os.path.abspath(root)).encode()).hexdigest()[:8]


def job_name(tag: str, task_id: str, attempt: int) -> str:
    """The Slurm job name of one attempt of one task: unique, so ``squeue --name`` finds it."""
    return f"orc-{tag}-{_NAME_UNSAFE.sub('_', task_id)}-a{attempt}"


def time_limit_minutes(spec: int | str) -> int:
    """Slurm's ``--time`` formats (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``) in
    whole minutes, rounded up as Slurm does."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"time_limit must be >= 1 minute, got {spec}")
        return spec
    m = _TIME_LIMIT.fullmatch(str(spec).strip())
    if not m:
        raise ValueError(
            f"time_limit {spec!r}: expected minutes (int) or a Slurm time such as '30', '1:30:00', "
            "'2-00:00:00'"
        )
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-H[:M[:S]]
        h, mi, s = (parts + [0, 0])[:3]
        seconds = ((int(days) * 24 + h) * 60 + mi) * 60 + s
    elif len(parts) == 1:
        seconds = parts[0] * 60
    elif len(parts) == 2:  # M:S
        seconds = parts[0] * 60 + parts[1]
    else:
        seconds = (parts[0] * 60 + parts[1]) * 60 + parts[2]
    if seconds < 1:
        raise ValueError(f"time_limit {spec!r} must be at least one second")
    return -(-seconds // 60)


def _mem_arg(mem_gb: float) -> str:
    return f"{int(mem_gb)}G" if float(mem_gb).is_integer() else f"{int(mem_gb * 1024)}M"


class SlurmRunner(BaseRunner):
    """Run each task as a Slurm job, through ``srun`` or sbatch job arrays (submitit).

    Args:
        partition: ``--partition`` (None: the cluster's default partition).
        qos: ``--qos``.
        gres: the ``--gres`` of a task that needs GPUs, with ``{num_gpus}`` filled from the task
            (default ``'gpu:{num_gpus}'``; e.g. ``'gpu:a100:{num_gpus}'``).  Tasks without GPUs
            request none, so Slurm hides every GPU from them.
        cpus_per_task: ``--cpus-per-task`` (None: the cluster's default).
        mem_gb: ``--mem`` in GB (None: the cluster's default).
        time_limit: ``--time``: minutes, or a Slurm time string (``'1:30:00'``).  A job over it
            ends ``TIMEOUT``; the task is retried (``retry``) and reported with that reason.
        extra_args: more srun/sbatch options (a list, or a string split with shlex); for
            ``launcher='sbatch'`` long options only (``--account=x``, ``--exclusive``).
        launcher: ``'srun'`` (one local srun process per task) or ``'sbatch'`` (batch jobs
            through submitit; the run folder must be on a filesystem the nodes share).
        array: with ``launcher='sbatch'``, submit the jobs of one scheduling round that need the
            same resources as one job array (False: one sbatch per job).
        max_num_workers: jobs in flight (pending or running) at once.
        retry: extra attempts for a task whose job failed, timed out, was cancelled or
            preempted, or that did not write its outputs.
        retry_backoff_s: first retry delay (doubles, with jitter).
        timeout_s: wall-clock limit of one attempt as seen from here, queueing included
            (prefer ``time_limit``).
        poll_interval_s: how often jobs are checked (None: 0.1 s for srun, where it is a local
            process check; 1 s for sbatch, where each check is one ``squeue`` call).
        cancel_timeout_s: how long cancelling waits for ``squeue`` to show the jobs gone.
        template: a command around ``{task_cmd}``.  One that starts with ``srun``
            (``'srun -p {partition} --gres=gpu:{num_gpus} {task_cmd}'``) replaces the runner's
            own srun line (launcher='srun' only; keep ``--job-name`` out of it); any other
            (``'apptainer exec img.sif {task_cmd}'``) runs inside the job.
    """

    template_fields = (
        *BaseRunner.template_fields,
        "partition", "qos", "gres", "cpus_per_task", "mem_gb", "time_limit", "job_name",
    )

    def __init__(
        self,
        partition: str | None = None,
        qos: str | None = None,
        gres: str | None = None,
        cpus_per_task: int | None = None,
        mem_gb: float | None = None,
        time_limit: int | str | None = None,
        extra_args: list[str] | str | None = None,
        launcher: str = "srun",
        array: bool = True,
        max_num_workers: int = 32,
        retry: int = 0,
        retry_backoff_s: float = 1.0,
        timeout_s: float | None = None,
        poll_interval_s: float | None = None,
        cancel_timeout_s: float = 60.0,
        template: str | list[str] | None = None,
    ) -> None:
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(map(repr, LAUNCHERS))}, got {launcher!r}")
        if poll_interval_s is None:
            poll_interval_s = 0.1 if launcher == "srun" else 1.0
        super().__init__(max_num_workers, retry, retry_backoff_s, timeout_s, poll_interval_s, template)
        for name, value in (("partition", partition), ("qos", qos)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if cpus_per_task is not None and (not isinstance(cpus_per_task, int) or cpus_per_task < 1):
            raise ValueError(f"cpus_per_task must be an integer >= 1, got {cpus_per_task!r}")
        if mem_gb is not None and mem_gb <= 0:
            raise ValueError(f"mem_gb must be > 0, got {mem_gb!r}")
        if cancel_timeout_s <= 0:
            raise ValueError(f"cancel_timeout_s must be > 0, got {cancel_timeout_s}")
        self.time_minutes = time_limit_minutes(time_limit) if time_limit is not None else None
        self.partition = partition
        self.qos = qos
        self.gres = gres if gres is not None else "gpu:{num_gpus}"
        try:
            self.gres.format(num_gpus=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"gres {gres!r}: only the field {{num_gpus}} may be used ({exc})") from None
        self.cpus_per_task = cpus_per_task
        self.mem_gb = mem_gb
        self.time_limit = str(time_limit) if time_limit is not None else None
        if isinstance(extra_args, str):
            extra_args = shlex.split(extra_args)
        if extra_args is not None and not all(isinstance(a, str) for a in extra_args):
            raise ValueError(f"extra_args must be a list of strings, got {extra_args!r}")
        self.extra_args = list(extra_args or [])
        self.launcher = launcher
        self.array = array
        self.cancel_timeout_s = cancel_timeout_s
        self._template_runs_srun = False
        if template is not None:
            probe = fill_template(template, ["true"], {k: "x" for k in self.template_fields})
            self._template_runs_srun = os.path.basename(probe[0]) == "srun"
            if self._template_runs_srun and launcher != "srun":
                raise ValueError(
                    "a template that starts with srun needs launcher='srun'; with launcher='sbatch' the "
                    "template wraps the task inside the batch job (e.g. 'apptainer exec img.sif {task_cmd}')"
                )
        if launcher == "sbatch":
            from orchestra.runners.slurm_batch import extra_sbatch_parameters

            extra_sbatch_parameters(self.extra_args)  # validates now, not at the first submission
        self._tag = ""
        self._launcher: SlurmLauncher | None = None
        self._unfit: str | None = None

    # -- what a job asks for ---------------------------------------------------------------------
    def gres_for(self, task: TaskSpec) -> str | None:
        """The ``--gres`` value of ``task``, or None when it needs no GPU."""
        return self.gres.format(num_gpus=task.num_gpus) if task.num_gpus > 0 else None

    def command_fields(self, task: TaskSpec, resources: dict[str, Any], log_path: str) -> dict[str, Any]:
        return {
            **super().command_fields(task, resources, log_path),
            "partition": self.partition or "",
            "qos": self.qos or "",
            "gres": self.gres_for(task) or "",
            "cpus_per_task": self.cpus_per_task or "",
            "mem_gb": self.mem_gb or "",
            "time_limit": self.time_limit or "",
        }

    def task_env(self, task: TaskSpec, resources: dict[str, Any], attempt: int) -> dict[str, str]:
        env = super().task_env(task, resources, attempt)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm sets it from --gres; never override it
        return env

    def srun_args(self, task: TaskSpec, name: str) -> list[str]:
        """The runner's own ``srun`` line for ``task`` (without the command)."""
        args = ["srun", f"--job-name={name}", "--nodes=1", "--ntasks=1", "--unbuffered"]
        if self.partition:
            args.append(f"--partition={self.partition}")
        if self.qos:
            args.append(f"--qos={self.qos}")
        gres = self.gres_for(task)
        if gres:
            args.append(f"--gres={gres}")
        if self.cpus_per_task:
            args.append(f"--cpus-per-task={self.cpus_per_task}")
        if self.mem_gb:
            args.append(f"--mem={_mem_arg(self.mem_gb)}")
        if self.time_limit:
            args.append(f"--time={self.time_limit}")
        return [*args, *self.extra_args]

    def get_command(self, task: TaskSpec, spec_path: str, resources: dict[str, Any], attempt: int = 1,
                    log_path: str = "") -> Command:
        tag = self._tag or run_tag(os.path.dirname(os.path.dirname(spec_path)))
        name = job_name(tag, task.task_id, attempt)
        argv = task_argv(task.stage, spec_path)
        if self.template is not None:
            argv = fill_template(self.template, argv,
                                 {**self.command_fields(task, resources, log_path), "job_name": name})
        env = self.task_env(task, resources, attempt)
        if self.launcher == "srun":
            if self._template_runs_srun:
                env["SLURM_JOB_NAME"] = name  # srun's input variable for --job-name: cancel finds the job
            else:
                argv = [*self.srun_args(task, name), "bash", "-c", _SRUN_WRAPPER, "orchestra-task", *argv]
        return Command(tuple(argv), env)

    # -- the backend ---------------------------------------------------------------------------------
    def launch(self, tasks: list[TaskSpec], ctx: RunContext) -> list[TaskResult]:
        self._tag = run_tag(ctx.paths.root)
        self._unfit = self._check_tools()
        if self._unfit is None:
            if self.launcher == "sbatch":
                from orchestra.runners.slurm_batch import SbatchLauncher

                self._launcher = SbatchLauncher(self, os.path.join(ctx.paths.root, "slurm"))
            else:
                from orchestra.runners.slurm_srun import SrunLauncher

                self._launcher = SrunLauncher(self)
        return super().launch(tasks, ctx)

    def _check_tools(self) -> str | None:
        needed = ["srun" if self.launcher == "srun" else "sbatch", "squeue", "scancel"]
        missing = [tool for tool in needed if shutil.which(tool) is None]
        if missing:
            return f"{', '.join(missing)} not found in PATH: SlurmRunner must run where Slurm's commands are"
        if self.launcher == "sbatch":
            try:
                import submitit  # noqa: F401
            except ImportError:
                return "launcher='sbatch' needs submitit (pip install submitit)"
        return None

    def unfit_reason(self, task: TaskSpec) -> str | None:
        return self._unfit

    def acquire(self, task: TaskSpec) -> dict[str, Any] | None:
        return {"num_gpus": task.num_gpus}

    def name_of(self, job: Job) -> str:
        """The Slurm job name of ``job`` (see ``job_name``)."""
        return job_name(self._tag, job.task.task_id, job.attempt)

    def _active(self) -> SlurmLauncher:
        if self._launcher is None:
            raise RuntimeError("SlurmRunner: submit/poll/cancel called outside launch()")
        return self._launcher

    def submit(self, job: Job) -> None:
        self._active().submit(job)

    def flush(self) -> None:
        self._active().flush()

    def poll(self, job: Job) -> Exit | None:
        return self._active().poll(job)

    def cancel(self, jobs: list[Job]) -> None:
        self._active().cancel(jobs)

    def close(self) -> None:
        if self._launcher is not None:
            self._launcher.close()
        self._launcher = None


class SlurmLauncher(abc.ABC):
    """How jobs reach Slurm (srun processes or sbatch arrays): the runner's submit/poll/cancel."""

    def __init__(self, runner: SlurmRunner) -> None:
        self.runner = runner

    @abc.abstractmethod
    def submit(self, job: Job) -> None:
        """Start (or queue, until ``flush``) one attempt."""

    def flush(self) -> None:
        """Called once per scheduling round, after its submissions."""

    @abc.abstractmethod
    def poll(self, job: Job) -> Exit | None:
        """``None`` while the job is alive, else how it ended."""

    @abc.abstractmethod
    def cancel(self, jobs: list[Job]) -> None:
        """scancel these jobs; return once squeue shows none of them alive (bounded wait)."""

    def close(self) -> None:
        """The launch is over; nothing of it may be left running."""


__all__ = ["LAUNCHERS", "SlurmLauncher", "SlurmRunner", "job_header", "job_name", "run_tag"]
