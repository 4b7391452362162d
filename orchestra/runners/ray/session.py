"""RayRunner's session: one launch's warm pool of actors and the calls in flight (the verbs).

RayRunner imports this module only when a launch starts: it imports ``ray`` (see ``.importlinter``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray import exceptions as rex

from orchestra.runners.core.contract import CannotStart, Exit, Job, Resources, Session
from orchestra.runners.ray.connection import disconnect
from orchestra.runners.ray.pool import WorkerKind, describe, lost_worker, place
from orchestra.tasks.spec import TaskSpec

CANCEL_WAIT_S = 10.0  # a cancelled call is reported gone after this even if Ray has not said so


@dataclass
class RayCall:
    """One attempt's call on its actor, and the error it ended with once it did."""

    ref: Any
    error: BaseException | None = None
    cancel_by: float = 0.0  # once cancelled: when it is reported gone even if Ray has not said so


class RaySession(Session, Resources):
    """One launch of a RayRunner: its warm pool of actors, the calls in flight, and the connection
    (shared with other launches) it gives back when it closes.

    Args:
        cpus_per_task, mem_gb, forward_env: RayRunner's.
    """

    def __init__(self, cpus_per_task: float | None, mem_gb: float | None, forward_env: tuple[str, ...]) -> None:
        self.cpus_per_task = cpus_per_task
        self.memory_bytes = int(mem_gb * 1024**3) if mem_gb else 0
        self.forward_env = forward_env
        self.resources = self
        self.pool: Any = None  # a RayPool, set by RayRunner.open
        self.losses: dict[str, int] = {}  # task id -> attempts that lost their worker

    def worker_kind(self, task: TaskSpec) -> WorkerKind:
        """The kind of the actors that can run ``task``."""
        cpus = self.cpus_per_task if self.cpus_per_task is not None else max(1, task.num_procs)
        return WorkerKind(task.worker_key or task.stage, float(cpus), float(task.num_gpus), self.memory_bytes)

    # -- resources: a warm actor per job ---------------------------------------------------------
    def unfit(self, task: TaskSpec) -> str | None:
        return self.pool.unfit(self.worker_kind(task))

    def acquire(self, task: TaskSpec) -> dict[str, Any] | None:
        kind = self.worker_kind(task)
        broken = self.pool.broken(kind)
        if broken:
            raise CannotStart(broken)
        actor = self.pool.take(kind)
        if actor is None:
            return None
        return {"actor_id": actor.ident, **place(actor.where),
                "num_cpus": kind.num_cpus, "num_gpus": kind.num_gpus}

    def release(self, job: Job, ended: Exit | None) -> None:
        actor = self.pool.workers.get(job.resources.get("actor_id")) if self.pool is not None else None
        if actor is None:
            return  # killed by a timeout or a cancel: already gone from the pool
        call = job.handle
        if ended is not None and ended.infra and isinstance(call, RayCall) and call.error is not None:
            self.pool.lost(actor, call.error)
        else:
            self.pool.finished(actor)

    # -- jobs ------------------------------------------------------------------------------------
    def placement(self, job: Job) -> dict[str, Any]:
        """The node (id, ip), actor and its pid: the ``started`` event's ``where``."""
        return {k: job.resources[k] for k in ("node_id", "node_ip", "actor_id", "pid") if k in job.resources}

    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        forwarded = {name: os.environ[name] for name in self.forward_env if name in os.environ}
        for job in jobs:
            actor = self.pool.workers[job.resources["actor_id"]]
            request = {"spec": job.command.argv[-1], "log": job.log_path, "env": {**job.command.env, **forwarded}}
            job.handle = RayCall(actor.handle.run.remote(request))
        return {}

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        """The pool's housekeeping, then one ``ray.wait`` over every call in flight."""
        self.pool.tick()
        calls = {job.handle.ref: job for job in jobs if isinstance(job.handle, RayCall)}
        done = set(ray.wait(list(calls), num_returns=len(calls), timeout=0)[0]) if calls else set()
        now = time.monotonic()
        out: dict[Job, Exit] = {}
        for ref, job in calls.items():
            call: RayCall = job.handle
            if call.cancel_by:
                if ref in done or now >= call.cancel_by:
                    out[job] = Exit(-1, "cancelled")
            elif ref in done:
                out[job] = self._exit(job, call)
        return out

    def _exit(self, job: Job, call: RayCall) -> Exit:
        try:
            return Exit(int(ray.get(call.ref)))
        except rex.RayError as exc:
            if not lost_worker(exc):
                return Exit(-1, f"Ray error: {describe(exc)}")
            call.error = exc  # release() hands it to the pool
            where = f"{job.resources.get('node_ip', '?')} {str(job.resources.get('node_id', '?'))[:12]}"
            losses = self.losses[job.task.task_id] = self.losses.get(job.task.task_id, 0) + 1
            times = f" (this task has lost its worker {losses} times)" if losses > 1 else ""
            return Exit(-1, f"worker lost (node {where}): {describe(exc)}{times}", infra=True)

    def cancel(self, jobs: Sequence[Job]) -> None:
        """Kill the jobs' actors now; ``poll`` reports each job once its call ended (or after a while)."""
        actors = [self.pool.workers[a] for a in (j.resources.get("actor_id") for j in jobs) if a in self.pool.workers]
        self.pool.stop(actors, "cancelled")
        for job in jobs:
            if isinstance(job.handle, RayCall):
                job.handle.cancel_by = time.monotonic() + CANCEL_WAIT_S

    def close(self) -> None:
        try:
            if self.pool is not None:
                self.pool.close()
        finally:
            self.pool = None
            disconnect()
