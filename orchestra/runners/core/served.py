"""Managed inference servers as a resource of a launch (``orchestra/serving``; docs/serving.md).

An infer task whose model has ``server=dict(...)``, or an eval task whose judge has one, may
start only once one replica of that model answers: :class:`ServedResources` wraps the session's
resources, asks the launch's :class:`~orchestra.serving.pool.ServerPool` for the replicas (the
first such task starts them) and makes the task wait (``acquire`` -> None) until one is ready,
or fails it with the pool's one-line reason once none can be.  The task learns where the
replicas are and where the key is through its environment (:func:`server_env`); once no task of
the model can still run (each one done, failed for good or cancelled) its replicas stop, and the
launch's end stops whatever is left.
"""

from __future__ import annotations

from typing import Any

from orchestra.errors import ConfigError
from orchestra.paths import RunPaths
from orchestra.runners.core.command import Command
from orchestra.runners.core.contract import CannotStart, Exit, Job, Resources, Session
from orchestra.runners.core.hooks import RunnerHooks
from orchestra.runners.core.host import FIRST_STAGE, HostCapacity
from orchestra.runners.core.run import RunContext
from orchestra.serving.pool import ServerPool, local_placement
from orchestra.serving.presets import KEY_FILE_ENV, REMOTE_ENV, SERVERS_DIR_ENV
from orchestra.serving.spec import ServerSpec, parse_server, served_judge
from orchestra.tasks.spec import TaskSpec


def _parsed(cfg: Any) -> ServerSpec | None:
    try:
        return parse_server(cfg)
    except ConfigError:
        return None  # the config was checked before the run; a spec edited since fails in its task


def served_models(task: TaskSpec) -> list[tuple[str, ServerSpec, str]]:
    """The managed servers a task needs, as (model abbr, spec, name served): an infer task's
    model, an eval task's judges (``eval_cfg.evaluator.judge`` with ``server=``)."""
    if task.stage == FIRST_STAGE:
        spec = _parsed(task.model["server"]) if task.model.get("server") else None
        return [(task.model_abbr, spec, str(task.model.get("path", "")))] if spec else []
    found: dict[str, tuple[str, ServerSpec, str]] = {}
    for unit in task.units:
        judge = served_judge(unit.dataset)
        if judge is not None:
            spec = _parsed(judge["server"])
            abbr = str(judge.get("abbr") or "judge")
            if spec is not None:
                found.setdefault(abbr, (abbr, spec, str(judge.get("path", ""))))
    return list(found.values())


def server_spec(task: TaskSpec) -> ServerSpec | None:
    """The (first) managed server a task needs (None: it needs none)."""
    needs = served_models(task)
    return needs[0][1] if needs else None


def server_env(pool: ServerPool, paths: RunPaths) -> dict[str, str]:
    """What a task of a served model needs to reach the replicas (no secret: a path to the key)."""
    remote = {REMOTE_ENV: "1"} if pool.placement is not local_placement else {}
    return {KEY_FILE_ENV: pool.key_file, SERVERS_DIR_ENV: paths.servers, **remote}


class ServedResources(Resources):
    """A session's resources, with the replicas of served models reserved before their tasks."""

    def __init__(self, inner: Resources, pool: ServerPool | None, tasks: list[TaskSpec]) -> None:
        self.inner, self.pool = inner, pool
        self.why_none = "managed servers (server=dict(...)) run with LocalRunner, SlurmRunner and RayRunner only"
        self.left: dict[str, set[str]] = {}  # model -> its tasks of this launch not done yet
        for task in tasks:
            for abbr, _spec, _name in served_models(task):
                self.left.setdefault(abbr, set()).add(task.task_id)

    def unfit(self, task: TaskSpec) -> str | None:
        if self.pool is None and server_spec(task) is not None:
            return self.why_none
        return self.inner.unfit(task)

    def acquire(self, task: TaskSpec) -> dict[str, Any] | None:
        if self.pool is not None:
            waiting = False
            for abbr, spec, name in served_models(task):
                ready, failed = self.pool.want(abbr, spec, name)
                if failed:
                    raise CannotStart(f"no server for {abbr}: {failed}")
                waiting = waiting or not ready
            if waiting:
                return None
        return self.inner.acquire(task)

    def release(self, job: Job, ended: Exit | None) -> None:
        self.inner.release(job, ended)

    def ended(self, task_id: str) -> None:
        """``task_id`` reached an end state (done, failed for good, could not start, cancelled,
        skipped): once no task of its model can still run, the model's replicas stop and give
        their GPUs back (a failed task must not keep them for the rest of the launch)."""
        self.inner.ended(task_id)
        for model, left in self.left.items():
            if task_id in left:
                left.discard(task_id)
                if not left and self.pool is not None:
                    self.pool.release(model)


def attach_servers(session: Session, tasks: list[TaskSpec], ctx: RunContext, runner: RunnerHooks
                   ) -> ServerPool | None:
    """Wrap ``session``'s resources when some task needs managed servers; the launch's pool.
    Replicas take their GPUs from the run's host hand-out (``runner.gpus``), shared with tasks,
    when the runner has ``serves_locally = True``; a runner with a ``serve_placement()`` hook
    puts them on its cluster (a Slurm job, a Ray actor: its scheduler hands out their GPUs); a
    runner with neither cannot run them (its served tasks are unfit, with ``serves_nowhere``)."""
    if not any(server_spec(t) for t in tasks):
        return None
    gpus = [str(g) for g in runner.gpus or []]
    placement = runner.serve_placement()
    if placement is not None:
        pool = ServerPool(ctx.paths.servers, ctx.events.emit, lambda n: [], lambda ids: None, placement)
        session.resources = ServedResources(session.resources, pool, tasks)
        return pool
    if not runner.serves_locally:
        session.resources = ServedResources(session.resources, None, tasks)
        why = runner.serves_nowhere
        if why:
            session.resources.why_none = why
        return None
    slots = ctx.host or HostCapacity()

    def take(n: int) -> list[str] | None:
        return slots.take(FIRST_STAGE, 0, gpus, n, 1)

    def give(ids: list[str]) -> None:
        slots.give(FIRST_STAGE, 0, ids)

    pool = ServerPool(ctx.paths.servers, ctx.events.emit, take, give)
    session.resources = ServedResources(session.resources, pool, tasks)
    return pool


def close_launch(session: Session, pool: ServerPool | None) -> None:
    """End a launch: the session first (its tasks stop), then its replicas; replicas placed through
    the session's connection (Ray actors) first, while it is still open (the tasks were stopped
    before this is called)."""
    first = pool is not None and getattr(pool.placement, "before_session", False)
    try:
        if first and pool is not None:
            pool.close()
    finally:
        try:
            session.close()
        finally:
            if pool is not None and not first:
                pool.close()


def with_server_env(command: Command, task: TaskSpec, pool: ServerPool | None, paths: RunPaths) -> Command:
    """``command`` with what a task of a served model needs to reach its replicas."""
    if pool is None or server_spec(task) is None:
        return command
    return Command(command.argv, {**command.env, **server_env(pool, paths)})
