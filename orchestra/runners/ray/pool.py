"""RayRunner's warm workers: Ray actors that run task after task, under ``core/warm.py``'s pool.

Each actor is a warm worker (:class:`TaskWorker`): it runs requests of the protocol of
``orchestra/tasks/worker.py`` one after another in one process, so a model loaded by one task
stays loaded for the next task of its :class:`WorkerKind`.  What is Ray's own lives here:

* :class:`Actors`, the pool's transport: an actor is recorded in the run's ledger before it is
  created, is up once its ``hello`` answers, and is killed without restart.  One that does not fit
  the cluster now waits in Ray's queue, which is what an autoscaler sees and what places it the
  moment a node with room joins: the work in flight follows the cluster;
* :class:`RayPool` follows the cluster's nodes (``node_joined`` / ``node_lost``).  A node that
  stops answering (``ActorUnavailableError``) is counted alive by Ray for ~15 s more; until it is
  declared dead new actors are kept off it (a label selector on ``ray.io/node-id``) and actors
  still queued are started again, since Ray may have assigned them to it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray import exceptions as rex

from orchestra.events import EventLog
from orchestra.runners.core.ledger import Ledger
from orchestra.runners.core.warm import StartFailed, WarmPool, Worker
from orchestra.tasks.worker import run_request

#: how often the node list is read from the cluster
NODES_EVERY_S = 1.0
#: a node that stopped answering is kept out of placement for at most this long
SUSPECT_FOR_S = 60.0
#: the resource names in Ray's node totals of the actor options of :class:`WorkerKind`
RESOURCE_NAMES = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}



@dataclass(frozen=True)
class WorkerKind:
    """What makes two actors interchangeable: the model they keep and the resources they hold."""

    worker_key: str
    num_cpus: float
    num_gpus: float
    memory_bytes: int = 0

    def options(self) -> dict[str, Any]:
        """Ray's actor options for these resources."""
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory_bytes:
            opts["memory"] = self.memory_bytes
        return opts


Actor = Worker[WorkerKind]  #: one warm worker of the pool: a Ray actor


def place(where: dict[str, Any] | None) -> dict[str, Any]:
    """Where an actor runs: ``node_id``, ``node_ip``, ``pid`` (nothing before it is up)."""
    return {k: where[k] for k in ("node_id", "node_ip", "pid") if k in where} if where else {}


class TaskWorker:
    """The body of one Ray actor: a warm worker behind actor calls instead of a pipe."""

    def __init__(self) -> None:
        self.started = time.time()

    def hello(self) -> dict[str, Any]:
        """Where this actor runs (answered once it is up; the pool waits for it)."""
        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "up_since": self.started}

    def run(self, request: dict[str, Any]) -> int:
        """Run one task request (spec, log, env) in this process; its exit code."""
        return run_request(request)


def lost_worker(exc: BaseException) -> bool:
    """Whether a Ray error means the worker or its node went away (not the task's own failure)."""
    return isinstance(exc, (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError, rex.OutOfMemoryError,
                            rex.LocalRayletDiedError, rex.ObjectLostError))


def describe(exc: BaseException) -> str:
    """One line for a Ray error: Ray's own words, without its traceback and boilerplate (Ray indents
    both: a traceback's frames, an actor's ``class_name:``, ``pid:``, ... lines)."""
    useful = [line.strip() for line in str(exc).splitlines()
              if line.strip() and not line[0].isspace() and line != "Traceback (most recent call last):"]
    text = " ".join(useful[:3]) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class Actors:
    """The warm pool's transport on Ray: one actor per worker (see the module).

    Args:
        events: the run's event log (``worker_requested``, ``worker_ready``, ``worker_stopped``).
        ledger: the run folder's record of actors (``<run>/ray/jobs.jsonl``): each is written there
            before it is created, so that ``recover`` finds it after a SIGKILL of this process.
        avoid: the ids of the nodes a new actor must keep off.
    """

    what = "Ray worker"

    def __init__(self, events: EventLog, ledger: Ledger | None, avoid: Callable[[], list[str]]) -> None:
        self.events = events
        self.ledger = ledger
        self.avoid = avoid
        self._namespace = ray.get_runtime_context().namespace if ledger is not None else ""
        self._remote: Any = ray.remote(TaskWorker)
        self._hellos: dict[Actor, Any] = {}  # the ObjectRef of each starting actor's ``hello``

    def start(self, worker: Actor, request: Any) -> None:
        kind = worker.key
        options = {**kind.options(), "name": worker.name, "max_restarts": 0, "max_concurrency": 1}
        if self.ledger is not None:  # recorded before it exists: a SIGKILL from here on leaves its name
            self.ledger.claim([worker.name])
            self.ledger.record("submitting", worker.name, namespace=self._namespace)
        avoid = self.avoid()
        if avoid:  # keep off nodes that stopped answering until Ray declares them dead
            options["label_selector"] = {"ray.io/node-id": f"!in({','.join(sorted(avoid))})"}
        handle: Any = self._remote.options(**options).remote()
        worker.handle, worker.ident = handle, handle._actor_id.hex()  # the id Ray reports it by
        if self.ledger is not None:
            self.ledger.record("submitted", worker.name, job_id=worker.ident, namespace=self._namespace)
        # recorded before it is relied on: the run folder names every actor this run started
        self.events.emit("worker_requested", actor_id=worker.ident, name=worker.name, worker_key=kind.worker_key,
                         **{k: v for k, v in kind.options().items() if v})
        self._hellos[worker] = handle.hello.remote()

    def came_up(self, starting: list[Actor]) -> dict[Actor, dict[str, Any] | StartFailed]:
        hellos = {self._hellos[w]: w for w in starting if w in self._hellos}
        out: dict[Actor, dict[str, Any] | StartFailed] = {}
        for ref in ray.wait(list(hellos), num_returns=len(hellos), timeout=0)[0] if hellos else []:
            actor = hellos[ref]
            del self._hellos[actor]
            try:
                where = out[actor] = ray.get(ref)
            except rex.RayError as exc:
                # The actor's own start failed (its __init__, its runtime_env): that repeats on every
                # node.  Anything else (a node lost while it started) is the cluster's doing.
                own = isinstance(exc, rex.RuntimeEnvSetupError) or getattr(exc, "actor_init_failed", False)
                out[actor] = StartFailed(describe(exc), own)
                continue
            # start_s: from the request to its answer (queueing for a node, process start, imports);
            # up_since: the actor process's own start, from which the worker holds its resources
            self.events.emit("worker_ready", actor_id=actor.ident, name=actor.name, **place(where),
                             start_s=round(time.monotonic() - actor.requested, 3),
                             up_since=round(where.get("up_since", 0.0), 3))
        return out

    def stop(self, workers: list[Actor], reason: str) -> None:
        """Kill these actors (no restart)."""
        for actor in workers:
            self._hellos.pop(actor, None)
            with contextlib.suppress(rex.RayError, ValueError, ConnectionError):  # an error: already gone
                ray.kill(actor.handle, no_restart=True)
            if self.ledger is not None:
                self.ledger.record("stopped", actor.name, job_id=actor.ident, reason=reason)
            self.events.emit("worker_stopped", actor_id=actor.ident, name=actor.name, reason=reason,
                             tasks_run=actor.tasks_run, **place(actor.where))


class RayPool(WarmPool[WorkerKind]):
    """The warm pool of actors, following the cluster's nodes.

    Args (the others: ``WarmPool``'s):
        events: the run's event log (``worker_*`` and ``node_*`` events).
        name_prefix: actors are named ``<prefix>-w<n>`` (visible in ``ray list actors``).
        ledger: the run folder's record of actors (see :class:`Actors`).
    """

    def __init__(self, max_workers: int, reuse: bool, idle_timeout_s: float, events: EventLog,
                 name_prefix: str, ledger: Ledger | None = None) -> None:
        self.events = events
        self._nodes: dict[str, str] = {}  # alive node id -> ip
        self._nodes_read = 0.0  # 0: never read
        self._suspects: dict[str, float] = {}  # node id -> when it stopped answering
        #: total resources of each alive node, and of each node type an autoscaler may add
        self.node_resources: list[dict[str, float]] = []
        self.node_type_resources: list[dict[str, float]] = []
        super().__init__(Actors(events, ledger, self._live_suspects), max_workers, name_prefix, reuse,
                         idle_timeout_s)

    def tick(self) -> None:
        """Once per scheduling round: follow the nodes, then the pool's round (see ``WarmPool.tick``)."""
        now = time.monotonic()
        if now - self._nodes_read >= NODES_EVERY_S:
            self._read_nodes(now)
        super().tick()

    def lost(self, actor: Actor, exc: BaseException) -> None:
        """``actor`` died under its task: forget it (a replacement starts when a task waits)."""
        if isinstance(exc, rex.ActorUnavailableError) and actor.where and actor.where.get("node_id"):
            self._suspect(actor.where["node_id"])
        self.stop([actor], f"lost: {describe(exc)}")

    # -- the cluster -----------------------------------------------------------------------------
    def unfit(self, kind: WorkerKind) -> str | None:
        """Why no node of the cluster, nor one an autoscaler may add, can hold an actor of ``kind``; None
        if one can."""
        needs = {RESOURCE_NAMES[k]: float(v) for k, v in kind.options().items() if v}
        known = self.node_resources + self.node_type_resources
        if any(all(res.get(k, 0.0) >= v for k, v in needs.items()) for res in known):
            return None
        largest = ", ".join(f"{max((r.get(k, 0.0) for r in known), default=0):g} {k}" for k in needs)
        want = ", ".join(f"{v:g} {k}" for k, v in needs.items())
        return (f"needs {want} per worker but no node of the Ray cluster can hold that (most on one node: "
                f"{largest}); lower the model's run_cfg or the runner's cpus_per_task/mem_gb, or add such nodes")

    @staticmethod
    def node_types() -> list[dict[str, float]]:
        """The resources of each node type an autoscaler may start (none without an autoscaler)."""
        try:  # the autoscaler publishes its node types to the head; no public API reads them yet
            from ray._private.state import state

            config = state.get_cluster_config()
        except Exception:  # noqa: BLE001 - an older or newer Ray, Ray Client: no node types known
            return []
        if config is None:
            return []
        return [dict(group.resources) for group in config.node_group_configs if group.max_count != 0]

    def _read_nodes(self, now: float) -> None:
        first = not self._nodes_read
        self._nodes_read = now
        try:
            alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}  # Resources: the node's totals
        except (rex.RayError, ConnectionError, OSError):
            return  # the head did not answer this time; the calls in flight tell what matters
        self.node_resources = [dict(n.get("Resources", {})) for n in alive.values()]
        if first:
            self._nodes = {node_id: n.get("NodeManagerAddress", "") for node_id, n in alive.items()}
            self.node_type_resources = self.node_types()
            total = Counter[str]()
            for resources in self.node_resources:
                total.update({k: v for k, v in resources.items() if k in ("CPU", "GPU")})
            try:
                gcs = ray.get_runtime_context().gcs_address
            except (AttributeError, rex.RayError):
                gcs = ""
            self.events.emit("ray_cluster", gcs_address=gcs, nodes=len(alive), resources=dict(total),
                             node_types=self.node_type_resources)
            return
        for node_id in alive.keys() - self._nodes.keys():
            node = alive[node_id]
            self._nodes[node_id] = node.get("NodeManagerAddress", "")
            resources = {k: v for k, v in node.get("Resources", {}).items() if k in ("CPU", "GPU")}
            self.events.emit("node_joined", node_id=node_id, node_ip=self._nodes[node_id], resources=resources)
        for node_id in self._nodes.keys() - alive.keys():
            self.events.emit("node_lost", node_id=node_id, node_ip=self._nodes.pop(node_id))
            self._suspects.pop(node_id, None)  # declared dead: Ray places nothing there any more
            # idle actors there are gone too (busy ones: their calls fail and say so)
            gone = [a for a in self.workers.values() if not a.busy and place(a.where).get("node_id") == node_id]
            self.stop(gone, "lost: its node left the cluster")

    def _suspect(self, node_id: str) -> None:
        if node_id in self._suspects or node_id not in self._nodes:
            return
        self._suspects[node_id] = time.monotonic()
        # actors still queued may have been assigned to that node: start them again elsewhere
        for actor in [a for a in self.workers.values() if not a.ready]:
            self.stop([actor], "restarted: queued while a node stopped answering")
            self.start(actor.key)

    def _live_suspects(self) -> list[str]:
        now = time.monotonic()
        for node_id in [n for n, t in self._suspects.items() if now - t > SUSPECT_FOR_S]:
            del self._suspects[node_id]
        return list(self._suspects)


def recover(ledger: Ledger) -> list[str]:
    """Kill the actors an earlier orchestrator of this run folder left (``-r`` after a SIGKILL; Ray
    Client keeps a dead driver's actors for a while): every one the ledger shows possibly alive
    that no launch of this process owns.  Returns the names of those that were still alive."""
    interrupted, known = ledger.left_behind()
    killed = []
    for rec in interrupted + known:
        try:
            ray.kill(ray.get_actor(rec.name, namespace=rec.namespace or None), no_restart=True)
        except (ValueError, rex.RayError, ConnectionError):  # not alive (any more)
            ledger.record("ended", rec.name, job_id=rec.job_id)
            continue
        ledger.record("stopped", rec.name, job_id=rec.job_id, reason="left by an earlier orchestrator")
        killed.append(rec.name)
    return killed
