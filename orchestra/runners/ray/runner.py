"""Run tasks on a Ray cluster: an elastic pool of warm workers (Ray actors).

The loop is the runner base's.  Each task goes to an idle actor that already holds its model
(:class:`~orchestra.runners.ray.pool.RayPool`); a task waits while none is free, and the pool
starts actors for waiting tasks as the cluster has room, so the work in flight is
``min(max_num_workers, what the cluster holds now)`` and grows as nodes join.  Ray is optional:
it is imported when a launch starts, never by importing this module.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
from collections.abc import Sequence
from typing import Any, ClassVar, Unpack

from orchestra.errors import UserError
from orchestra.runners.core import checks
from orchestra.runners.core.command import forward_env_names
from orchestra.runners.core.contract import Session
from orchestra.runners.core.grpc_probe import why_not_grpc
from orchestra.runners.core.ledger import Ledger
from orchestra.runners.core.loop import BaseRunner
from orchestra.runners.core.naming import run_tag
from orchestra.runners.core.options import LoopOptions, with_defaults
from orchestra.runners.core.run import RunContext
from orchestra.tasks.spec import TaskSpec

INSTALL_HINT = "pip install 'orchestra[ray]'"
#: what must listen at a cluster's address: a Ray head (a gRPC server)
RAY_HEAD = "a Ray head's gRPC port (the GCS port, 6379 by default; with ray:// the Ray Client port, 10001 by default)"


class RayRunner(BaseRunner):
    """Run each task in a warm worker on a Ray cluster, with as many workers as it holds.

    Args:
        address: the cluster: None starts a local Ray for the run (on this machine, stopped after
            it); ``'auto'`` joins the cluster this machine belongs to (``RAY_ADDRESS`` or the one
            started here with ``ray start``); ``'host:6379'`` joins a cluster's head (GCS address);
            ``'ray://host:10001'`` connects through Ray Client (``pip install 'ray[client]'``).
        reuse_workers: keep a worker for the next task of the same model, so a model is loaded
            once per worker (False: a fresh worker per task, which loads its model every time).
        runtime_env: Ray's ``runtime_env`` for the run's workers (``pip``, ``env_vars``,
            ``working_dir``, ...); workers need orchestra importable and the run folder reachable.
        cpus_per_task: CPUs each worker holds (None: the task's ``num_procs``).
        mem_gb: memory each worker reserves in Ray's accounting (None: none).
        forward_env: names of environment variables copied from here into every task (e.g.
            ``['OPENAI_API_KEY']``); values travel with each task, never in a config or log.
        idle_timeout_s: an idle worker that no waiting task can use is released after this long.
        connect_timeout_s: how long one Ray Client (``ray://``) connection may wait for the head's
            answer before it is cut and tried again (3 tries); the head installs the
            ``runtime_env`` within this time, so one that installs packages may need longer.
        **loop: the loop's options (``BaseRunner``; no ``template``: a task runs in an actor, not
            as a command): ``max_num_workers`` workers (and so tasks in flight) at most, fewer
            while the cluster has less room (default 32); ``retry`` for a task that fails by
            itself (a lost worker is not counted); ``timeout_s`` from the moment a worker takes
            the attempt (its actor is killed); ``infra_retry`` (default 3) attempts that may lose
            their worker (dead actor, node removed or preempted, out of memory) and rerun at once
            without spending ``retry``; ``poll_interval_s`` default 0.02 s.
    """

    #: a lost attempt goes to another warm worker at once (the pool replaces the dead one)
    infra_retry_at_once = True
    outlives_orchestrator = True  # actors a killed orchestrator left (Ray Client keeps them) are stopped by -r
    reports_infra_loss = True  # a worker lost under its task (node gone, actor died)
    carries_exit_codes = False  # an actor answers its task done (0) or failed (1), as warm workers do
    loop_defaults: ClassVar[LoopOptions] = {"max_num_workers": 32, "infra_retry": 3, "poll_interval_s": 0.02}

    def __init__(
        self,
        address: str | None = None,
        reuse_workers: bool = True,
        runtime_env: dict[str, Any] | None = None,
        cpus_per_task: float | None = None,
        mem_gb: float | None = None,
        forward_env: list[str] | tuple[str, ...] = (),
        idle_timeout_s: float = 2.0,
        connect_timeout_s: float = 120.0,
        **loop: Unpack[LoopOptions],
    ) -> None:
        super().__init__(**with_defaults(loop, self.loop_defaults))
        try:
            found = importlib.util.find_spec("ray") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ValueError(f"RayRunner needs Ray, which is not installed: {INSTALL_HINT}")
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise ValueError(f"address must be None, 'auto', 'host:port' or 'ray://host:port', got {address!r}")
        checks.optional_amount("cpus_per_task", cpus_per_task)
        checks.optional_amount("mem_gb", mem_gb)
        checks.amount("idle_timeout_s", idle_timeout_s, zero=True)
        checks.amount("connect_timeout_s", connect_timeout_s)
        self.address = address.strip() if address else None
        self.reuse_workers = reuse_workers
        self.runtime_env = runtime_env
        self.cpus_per_task = cpus_per_task
        self.mem_gb = mem_gb
        self.forward_env = forward_env_names(forward_env, must_be_set=False)  # read when each task starts
        self.idle_timeout_s = idle_timeout_s
        self.connect_timeout_s = connect_timeout_s

    # -- connecting ---------------------------------------------------------------------------------
    def preflight(self) -> None:
        """Refuse (:class:`UserError`) a cluster address where no Ray head answers; ``orchestra.api``
        asks before a run folder is made and a stage starts, so the error is the run's only line."""
        unreachable = self._unreachable()
        if unreachable:
            raise UserError(f"RayRunner could not connect to the Ray cluster at {self.address}: {unreachable}")

    def open(self, ctx: RunContext, tasks: Sequence[TaskSpec]) -> Session:
        self.preflight()  # asked again: the head may have gone since
        try:  # the modules that import ray
            from orchestra.runners.ray.connection import connect
            from orchestra.runners.ray.pool import RayPool, recover
            from orchestra.runners.ray.session import RaySession
        except ModuleNotFoundError as exc:
            if exc.name != "ray" and not (exc.name or "").startswith("ray."):
                raise  # not Ray missing: a real error, with its traceback
            raise UserError(f"RayRunner needs Ray: {INSTALL_HINT} ({exc})") from None
        connect(self.address, self.runtime_env, os.path.join(ctx.paths.worker_logs, "ray-cluster.log"),
                self.connect_timeout_s, ctx.stop)
        # its close() pairs the connect with a disconnect
        session = RaySession(self.cpus_per_task, self.mem_gb, self.forward_env)
        try:
            stage = tasks[0].stage if tasks else "run"
            prefix = f"orc-{run_tag(ctx.paths.root)}-{stage}-{secrets.token_hex(2)}"
            ledger = Ledger(ctx.paths.ray_dir)
            left = recover(ledger)
            if left:
                ctx.events.emit("ray_recovered", stopped=left)
            session.pool = RayPool(self.max_num_workers, self.reuse_workers, self.idle_timeout_s, ctx.events, prefix,
                                   ledger)
            session.pool.tick()  # reads the nodes, for unfit
        except BaseException:
            session.close()
            raise
        return session

    def serve_placement(self) -> Any:
        """Managed servers (``server=dict(...)``): each replica in a Ray actor of its own."""
        from orchestra.serving.ray_place import RayPlacement

        return RayPlacement("orc-serve")

    def _unreachable(self) -> str | None:
        """Why the head of an address given as ``[ray://]host:port`` does not answer as a Ray head,
        if it does not: nothing listens (Ray itself retries a dead address for minutes), or what
        listens is no gRPC server (an HTTP server, the dashboard's port, a silent socket), where
        ``ray.init`` would hang for 10+ minutes."""
        if self.address is None or self.address == "auto":
            return None
        host, sep, port = self.address.removeprefix("ray://").rpartition(":")
        if not sep or not port.isdigit():
            return None  # another form Ray understands (or explains)
        return why_not_grpc(host.strip("[]"), int(port), RAY_HEAD,
                            tls=os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"),
                            http1="an HTTP/1 server (a web server, or Ray's dashboard port?)")

    # -- resources ----------------------------------------------------------------------------------
    def task_env(self, task: TaskSpec, resources: dict[str, Any], attempt: int) -> dict[str, str]:
        env = super().task_env(task, resources, attempt)
        if task.num_gpus == 0:  # Ray sets CUDA_VISIBLE_DEVICES for GPU workers only: hide them from the rest
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env
