"""What the Slurm runner and its two launchers share: job options, the job header, the session
both launchers are (names, stops, the watcher and the poll round).  Nothing here imports a
launcher or the runner."""

from __future__ import annotations

import abc
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestra.runners.core import checks
from orchestra.runners.core.contract import Exit, Job, NoResources, Session
from orchestra.runners.core.naming import job_name
from orchestra.runners.core.shell import header
from orchestra.runners.core.stopping import BackgroundStops
from orchestra.runners.slurm.watch import Footer, Watch
from orchestra.tasks.spec import TaskSpec

LAUNCHERS = ("srun", "sbatch")
_TIME_LIMIT = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def job_header(job_id: str) -> str:
    """The printf, inside a job, of the header a task log gets for each attempt: which job, node
    and GPUs it got and when it started (``job_id`` is a shell word)."""
    return header("slurm", job_id, '"${SLURMD_NODENAME-?}"',
                  fields=[("CUDA_VISIBLE_DEVICES", '"${CUDA_VISIBLE_DEVICES-<unset>}"')])


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
    days, *fields = m.groups()
    parts = [int(x) for x in fields if x is not None]
    # M and M:S have no hours; D-H, D-H:M, D-H:M:S and H:M:S start with them
    h, mi, s = [0, *parts, 0][:3] if days is None and len(parts) < 3 else (parts + [0, 0])[:3]
    seconds = ((int(days or 0) * 24 + h) * 60 + mi) * 60 + s
    if seconds < 1:
        raise ValueError(f"time_limit {spec!r} must be at least one second")
    return -(-seconds // 60)


def mem_arg(mem_gb: float) -> str:
    """``--mem``'s value for ``mem_gb`` GB: ``'4G'``, or whole MiB (``1.5`` -> ``'1536M'``)."""
    return f"{int(mem_gb)}G" if float(mem_gb).is_integer() else f"{int(mem_gb * 1024)}M"


@dataclass(frozen=True)
class SlurmOptions:
    """What every job of one ``SlurmRunner`` asks Slurm for (see ``SlurmRunner`` for each field).

    Build it with ``create``, which validates user input and names what is wrong.
    """

    partition: str | None = None
    qos: str | None = None
    gres: str = "gpu:{num_gpus}"
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    time_limit: str | None = None
    extra_args: tuple[str, ...] = ()
    cancel_timeout_s: float = 60.0

    @classmethod
    def create(cls, partition: str | None = None, qos: str | None = None, gres: str | None = None,
               cpus_per_task: int | None = None, mem_gb: float | None = None, time_limit: int | str | None = None,
               extra_args: list[str] | str | None = None, cancel_timeout_s: float = 60.0) -> SlurmOptions:
        """Validated options; ``ValueError`` names the first bad one."""
        checks.text("partition", partition)
        checks.text("qos", qos)
        if cpus_per_task is not None:
            checks.count("cpus_per_task", cpus_per_task, 1)
        checks.optional_amount("mem_gb", mem_gb)
        checks.amount("cancel_timeout_s", cancel_timeout_s)
        if time_limit is not None:
            time_limit_minutes(time_limit)
        gres = gres if gres is not None else cls.gres
        try:
            gres.format(num_gpus=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"gres {gres!r}: only the field {{num_gpus}} may be used ({exc})") from None
        if isinstance(extra_args, str):
            extra_args = shlex.split(extra_args)
        if extra_args is not None and not all(isinstance(a, str) for a in extra_args):
            raise ValueError(f"extra_args must be a list of strings, got {extra_args!r}")
        return cls(partition, qos, gres, cpus_per_task, mem_gb, str(time_limit) if time_limit is not None else None,
                   tuple(extra_args or ()), cancel_timeout_s)

    def gres_for(self, task: TaskSpec) -> str | None:
        """The ``--gres`` value of ``task``, or None when it needs no GPU."""
        return self.gres.format(num_gpus=task.num_gpus) if task.num_gpus > 0 else None

    def resource_args(self, task: TaskSpec) -> list[str]:
        """The srun/sbatch options that say where ``task`` runs and what it gets (no ``extra_args``)."""
        mem = mem_arg(self.mem_gb) if self.mem_gb else None
        asked = {"partition": self.partition, "qos": self.qos, "gres": self.gres_for(task),
                 "cpus-per-task": self.cpus_per_task, "mem": mem, "time": self.time_limit}
        return [f"--{option}={value}" for option, value in asked.items() if value]

    def template_fields(self, task: TaskSpec) -> dict[str, Any]:
        """The Slurm fields a ``template`` may use (empty where the cluster's default applies)."""
        fields = {"partition": self.partition, "qos": self.qos, "gres": self.gres_for(task),
                  "cpus_per_task": self.cpus_per_task, "mem_gb": self.mem_gb, "time_limit": self.time_limit}
        return {name: value or "" for name, value in fields.items()}


class SlurmLauncher(Session):
    """How jobs reach Slurm (srun processes or sbatch arrays): one launch's session.

    A poll round lets the launcher see to its jobs (``_prepare``), refreshes the watcher (off the
    loop) and asks ``_poll_one`` about each job that is not being stopped.

    Args:
        options: what every job asks for.
        tag: the run tag of the run folder (``run_tag``), the middle of every job name.
        unfit: why no task can run (Slurm's commands missing), or None.
        footer: how the watcher reads a job's exit code from its log (None: jobs leave none there).
    """

    def __init__(self, options: SlurmOptions, tag: str, unfit: str | None = None, footer: Footer | None = None) -> None:
        self.options = options
        self.tag = tag
        self.resources = NoResources(unfit)
        self.stops = BackgroundStops("slurm")  # scancel and wait for squeue to agree, off the loop
        self.watch = Watch(footer)  # the jobs whose state squeue tells, and what the last look said

    def name_of(self, job: Job) -> str:
        """The Slurm job name of ``job`` (see ``job_name``)."""
        return job_name(self.tag, job.task.task_id, job.attempt)

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        ended = self._prepare(jobs)
        self.watch.refresh()  # off the loop: a slow squeue never holds up the round
        return {**self.stops.poll_each([j for j in jobs if j not in ended], self._poll_one), **ended}

    @abc.abstractmethod
    def _prepare(self, jobs: Sequence[Job]) -> dict[Job, Exit]:
        """What a round does before the watcher looks; the jobs it ended."""

    @abc.abstractmethod
    def _poll_one(self, job: Job) -> Exit | None:
        """How ``job`` ended, or None while it runs (or its end is not known yet)."""

    def close(self) -> None:
        try:
            self.stops.wait(self.options.cancel_timeout_s + 10)
        finally:
            self.watch.close()
