"""Run tasks on a Slurm cluster: one ``srun`` per task (``srun.py``), or sbatch job arrays (``batch.py``).

The scheduling loop is the runner base's; this module turns a task into a Slurm job named
``orc-<run tag>-<task_id>-a<attempt>`` (arrays: ``orc-<run tag>-<stage>``), leaves
``CUDA_VISIBLE_DEVICES`` to Slurm (``--gres``) and opens the launcher, which is imported only when
a launch needs it.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Sequence
from typing import Any, ClassVar, Unpack

from orchestra.runners.core.command import Command, fill_template, forward_env_names
from orchestra.runners.core.contract import Session
from orchestra.runners.core.loop import BaseRunner
from orchestra.runners.core.naming import job_name, run_tag
from orchestra.runners.core.options import CommandLoopOptions, LoopOptions, with_defaults
from orchestra.runners.core.run import RunContext
from orchestra.runners.slurm.common import (
    LAUNCHERS,
    SlurmLauncher,
    SlurmOptions,
    job_header,
    time_limit_minutes,
)
from orchestra.secretnames import secret_variables
from orchestra.tasks.kinds import task_argv
from orchestra.tasks.spec import TaskSpec

# srun: print the header, then exec the task; "$@" is the task's argv, never parsed by the shell.
_SRUN_WRAPPER = job_header('"${SLURM_JOB_ID-?}"') + '; exec "$@"'


class SlurmRunner(BaseRunner):
    """Run each task as a Slurm job, through ``srun`` or sbatch job arrays.

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
        launcher: ``'srun'`` (one local srun process per task) or ``'sbatch'`` (batch jobs; the
            run folder must be on a filesystem the nodes share).
        array: with ``launcher='sbatch'``, submit the jobs of one scheduling round that need the
            same resources as one job array (False: one sbatch per job).
        cancel_timeout_s: how long cancelling waits for ``squeue`` to show the jobs gone.
        forward_env: names of the orchestrator's environment variables the job must get (e.g.
            ``['HF_TOKEN']``); each must be set when the runner is built.  Never in argv, the job
            script or the logs.  ``launcher='srun'``: in srun's own environment, with
            ``--export=ALL`` made explicit.  ``launcher='sbatch'``: in a private file of the run
            folder (``<run>/slurm/private/<stage>.env``, 0600 in a 0700 folder, deleted when the
            launch ends) that the job sources, and taken out of sbatch's environment, since
            slurmctld stores a batch job's environment with the job.  Other variables follow the
            cluster's export setting (by default every variable reaches the job); with sbatch and
            that default, the variables whose names say they hold a secret (``*_API_KEY``,
            ``*TOKEN``, ``*SECRET*``, ``*PASSWORD``, ``*CREDENTIALS``) go through the private
            file too (``private_variables``).
        submit_wait_s: with ``launcher='sbatch'``, how long jobs wait while the cluster refuses to
            take them for now (its job limits, e.g. ``MaxJobCount``; a drained partition; a busy
            controller): they are submitted again with backoff, without spending ``retry``, and
            end as infrastructure failures only after this long.
        **loop: the loop's options (``BaseRunner``), with this runner's meaning:
            ``max_num_workers`` jobs in flight (pending or running; default 32); ``retry`` extra
            attempts for a task whose job failed, timed out, was cancelled or preempted, or did
            not write its outputs; ``timeout_s`` one attempt as seen from here, queueing included
            (prefer ``time_limit``); ``poll_interval_s`` None: 0.1 s for srun (a local process
            check), 1 s for sbatch (one ``squeue`` call); ``infra_retry`` (default 3) attempts
            that may end for the cluster's sake (preempted, node failed or did not boot) without
            spending ``retry``; ``template`` a command around ``{task_cmd}``.  One that starts
            with ``srun`` (``'srun -p {partition} --gres=gpu:{num_gpus} {task_cmd}'``) replaces
            the runner's own srun line (launcher='srun' only; keep ``--job-name`` out of it); any
            other (``'apptainer exec img.sif {task_cmd}'``) runs inside the job.
    """

    reports_infra_loss = True  # PREEMPTED, NODE_FAIL, BOOT_FAIL; submissions refused past submit_wait_s
    loop_defaults: ClassVar[LoopOptions] = {"max_num_workers": 32, "infra_retry": 3}
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
        cancel_timeout_s: float = 60.0,
        forward_env: list[str] | tuple[str, ...] = (),
        submit_wait_s: float = 3600.0,
        **loop: Unpack[CommandLoopOptions],
    ) -> None:
        if isinstance(submit_wait_s, bool) or not isinstance(submit_wait_s, (int, float)) or submit_wait_s <= 0:
            raise ValueError(f"submit_wait_s must be a number of seconds > 0, got {submit_wait_s!r}")
        self.submit_wait_s = float(submit_wait_s)
        self.forward_env = forward_env_names(forward_env)
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(map(repr, LAUNCHERS))}, got {launcher!r}")
        if self.forward_env and launcher == "srun":  # sbatch: a private file (SbatchLauncher)
            extra = shlex.split(extra_args) if isinstance(extra_args, str) else list(extra_args or [])
            if any(a == "--export" or a.startswith("--export=") for a in extra):
                raise ValueError("forward_env with launcher='srun' needs Slurm to propagate the environment "
                                 "(--export=ALL): leave --export out of extra_args")
            extra_args = [*extra, "--export=ALL"]  # whatever SLURM_EXPORT_ENV/SBATCH_EXPORT say
        if loop.get("poll_interval_s") is None:
            loop["poll_interval_s"] = 0.1 if launcher == "srun" else 1.0
        super().__init__(**with_defaults(loop, self.loop_defaults))
        self.options = SlurmOptions.create(partition, qos, gres, cpus_per_task, mem_gb, time_limit, extra_args,
                                           cancel_timeout_s)
        self.launcher = launcher
        self.outlives_orchestrator = launcher == "sbatch"  # srun dies with us; batch jobs are adopted by -r
        self.array = array
        self._template_runs_srun = False
        if self.template is not None:
            probe = fill_template(self.template, ["true"], {k: "x" for k in self.template_fields})
            self._template_runs_srun = os.path.basename(probe[0]) == "srun"
            if self._template_runs_srun and launcher != "srun":
                raise ValueError(
                    "a template that starts with srun needs launcher='srun'; with launcher='sbatch' the "
                    "template wraps the task inside the batch job (e.g. 'apptainer exec img.sif {task_cmd}')"
                )
        if launcher == "sbatch":
            from orchestra.runners.slurm.script import sbatch_long_options

            sbatch_long_options(self.options.extra_args)  # validates now, not at the first submission
        self._tag = ""

    # -- what a job asks for ---------------------------------------------------------------------
    def command_fields(self, task: TaskSpec, resources: dict[str, Any], log_path: str) -> dict[str, Any]:
        return {**super().command_fields(task, resources, log_path), **self.options.template_fields(task)}

    def task_env(self, task: TaskSpec, resources: dict[str, Any], attempt: int) -> dict[str, str]:
        env = super().task_env(task, resources, attempt)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm sets it from --gres; never override it
        return env

    def srun_args(self, task: TaskSpec, name: str) -> list[str]:
        """The runner's own ``srun`` line for ``task`` (without the command)."""
        return ["srun", f"--job-name={name}", "--nodes=1", "--ntasks=1", "--unbuffered",
                *self.options.resource_args(task), *self.options.extra_args]

    def get_command(self, task: TaskSpec, spec_path: str, resources: dict[str, Any], attempt: int = 1,
                    log_path: str = "") -> Command:
        # Outside a launch (--dry-run) the tag comes from the task's own run folder.
        name = job_name(self._tag or run_tag(task.run_dir), task.task_id, attempt)
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

    def serve_placement(self) -> Any:
        """Managed servers (``server=dict(...)``): each replica in a Slurm job of its own."""
        from orchestra.serving.slurm_place import SlurmPlacement

        return SlurmPlacement(self._tag, self.options.partition, self.options.qos, self.options.gres)

    # -- the backend ---------------------------------------------------------------------------------
    def open(self, ctx: RunContext, tasks: Sequence[TaskSpec]) -> Session:
        self._tag = run_tag(ctx.paths.root)
        unfit = self._check_tools()
        launcher: SlurmLauncher
        if self.launcher == "sbatch":
            from orchestra.runners.core.ledger import Ledger
            from orchestra.runners.slurm.batch import SbatchLauncher
            from orchestra.runners.slurm.recover import recover
            from orchestra.runners.slurm.script import clear_pending

            ledger = Ledger(ctx.paths.slurm_dir)
            clear_pending(ctx.paths.slurm_dir)  # scripts of sbatch calls a SIGKILL cut short
            private = self.private_variables()
            env_file = os.path.join(ctx.paths.slurm_dir, "private", f"{tasks[0].stage}.env") if tasks else None
            batch = SbatchLauncher(self.options, self._tag, ctx.paths.slurm_dir, self.array, unfit, ledger, {},
                                   ctx.events, self.submit_wait_s, forward_env=private if env_file else (),
                                   env_file=env_file)
            try:  # the launcher first: its close() cancels what -r kept for adoption if a later step fails
                if unfit is None:
                    recover(ledger, tasks, self.options.cancel_timeout_s, batch.adopt)
            except BaseException:
                batch.close()
                raise
            launcher = batch
        else:
            from orchestra.runners.slurm.srun import SrunLauncher

            launcher = SrunLauncher(self.options, self._tag, unfit)
        return launcher

    def settle_left(self, ctx: RunContext, stage: str) -> None:
        """sbatch jobs outlive their orchestrator: those an earlier one left of ``stage``, whose
        outputs this run reuses, are recorded as ended or cancelled (``recover``, no task to adopt)."""
        if self.launcher == "sbatch" and self._check_tools() is None:
            from orchestra.runners.core.ledger import Ledger
            from orchestra.runners.slurm.recover import recover
            from orchestra.runners.slurm.script import clear_pending

            clear_pending(ctx.paths.slurm_dir)
            recover(Ledger(ctx.paths.slurm_dir), [], self.options.cancel_timeout_s, {}, stage)

    def private_variables(self) -> tuple[str, ...]:
        """The variables a batch job gets through the private file rather than from Slurm (which
        stores a batch job's environment): ``forward_env``, and, while Slurm would export every
        variable anyway (no ``--export`` in ``extra_args``, no ``SBATCH_EXPORT``), every variable
        of ours whose name says it holds a secret (``OPENAI_API_KEY``, ``HF_TOKEN``, ...)."""
        exported_all = "SBATCH_EXPORT" not in os.environ and not any(
            a == "--export" or a.startswith("--export=") for a in self.options.extra_args)
        found = secret_variables(os.environ) if exported_all else []
        return (*self.forward_env, *(n for n in found if n not in self.forward_env))

    def _check_tools(self) -> str | None:
        needed = ["srun" if self.launcher == "srun" else "sbatch", "squeue", "scancel"]
        missing = [tool for tool in needed if shutil.which(tool) is None]
        if missing:
            return f"{', '.join(missing)} not found in PATH: SlurmRunner must run where Slurm's commands are"
        return None


__all__ = ["LAUNCHERS", "SlurmRunner", "job_name", "run_tag", "time_limit_minutes"]
