"""RayRunner's pool of warm workers: Ray actors that run task after task, grown and shrunk
with the work and the cluster.

Each actor is a warm worker (:class:`TaskWorker`): it runs requests of the protocol of
``orchestra/tasks/worker.py`` one after another in one process, so a model loaded by one task
stays loaded for the next task with the same :class:`WorkerKind` (the task's ``worker_key`` and
the resources the actor holds).  Once per scheduling round :meth:`RayPool.tick`

* notices actors that came up (their ``hello`` answered) and ones that could not start;
* starts actors for the tasks that waited this round (:meth:`RayPool.take` counts them), at most
  ``max_workers`` in all, making room by stopping idle actors no waiting task can use.  An actor
  that does not fit the cluster now waits in Ray's queue, which is what an autoscaler sees and
  what places it the moment a node with room joins: the work in flight follows the cluster;
* stops idle actors that no waiting task has wanted for ``idle_timeout_s``, and queued ones that
  no task wants any more: the pool never outgrows the remaining work;
* follows the cluster's nodes (``node_joined`` / ``node_lost`` events).

A node that stops answering (``ActorUnavailableError``) is counted alive by Ray for ~15 s more;
until it is declared dead new actors are kept off it (a label selector on ``ray.io/node-id``) and
actors still queued are started again, since Ray may have assigned them to it.

With ``ray_session.py`` (the process's connection) this is where the orchestrator imports
``ray``; RayRunner imports both only when it launches (see ``.importlinter``).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import ray
from ray import exceptions as rex

from orchestra.events import EventLog
from orchestra.runners.core import warm
from orchestra.runners.core.ledger import Ledger
from orchestra.runners.ray.actors import Actor, WorkerKind
from orchestra.tasks.worker import run_request

#: how often the node list is read from the cluster
NODES_EVERY_S = 1.0
#: a node that stopped answering is kept out of placement for at most this long
SUSPECT_FOR_S = 60.0
#: starts of one kind in a row that fail in the actor itself (its ``__init__``, its runtime_env),
#: or otherwise (its node lost while it started), before tasks of that kind fail instead of
#: waiting for a worker that cannot start
MAX_START_FAILURES = 3
MAX_LOST_STARTS = 10


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
    """One line for a Ray error: Ray's own words, without its traceback and boilerplate."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("class_name:", "actor_id:", "namespace:", "name:"))]
    text = " ".join(useful[:3]) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class RayPool:
    """At most ``max_workers`` actors, started for waiting tasks and stopped when nothing needs them.

    Args:
        max_workers: actors at once (busy, idle or starting).
        reuse: keep an actor for the next task of its kind (False: one task per actor).
        idle_timeout_s: how long an idle actor that no waiting task can use is kept.
        events: the run's event log (``worker_*`` and ``node_*`` events).
        name_prefix: actors are named ``<prefix>-w<n>`` (visible in ``ray list actors``).
        ledger: the run folder's record of actors (``<run>/ray/jobs.jsonl``): each is written there
            before it is created, so that ``recover`` finds it after a SIGKILL of this process.
    """

    def __init__(self, max_workers: int, reuse: bool, idle_timeout_s: float, events: EventLog,
                 name_prefix: str, ledger: Ledger | None = None) -> None:
        self.max_workers = max_workers
        self.reuse = reuse
        self.idle_timeout_s = idle_timeout_s
        self.events = events
        self.name_prefix = name_prefix
        self.actors: dict[str, Actor] = {}
        self.ledger = ledger
        self._namespace = ray.get_runtime_context().namespace if ledger is not None else ""
        self._remote: Any = ray.remote(TaskWorker)
        self._started = 0
        self._wanted: Counter[WorkerKind] = Counter()  # tasks that waited for a kind this round
        self._last_wanted: dict[WorkerKind, float] = {}
        self._start_failures: Counter[WorkerKind] = Counter()  # in a row, by the actor itself
        self._lost_starts: Counter[WorkerKind] = Counter()  # in a row, by anything else
        self._broken: dict[WorkerKind, str] = {}
        self._nodes: dict[str, str] = {}  # alive node id -> ip
        self._nodes_read = 0.0  # 0: never read
        self._suspects: dict[str, float] = {}  # node id -> when it stopped answering
        #: total resources of each alive node, and of each node type an autoscaler may add
        self.node_resources: list[dict[str, float]] = []
        self.node_type_resources: list[dict[str, float]] = []

    # -- handing out -----------------------------------------------------------------------------
    def take(self, kind: WorkerKind) -> Actor | None:
        """An idle actor of ``kind``, now busy; None (and the kind counted as wanted) if there is none."""
        actor = warm.pick(self.actors.values(), kind)  # the most recently used: its caches are warmest
        if actor is None:
            self._wanted[kind] += 1
            return None
        actor.busy = True
        return actor

    def broken(self, kind: WorkerKind) -> str | None:
        """Why actors of ``kind`` cannot start (after repeated failures), or None."""
        return self._broken.get(kind)

    def finished(self, actor: Actor) -> None:
        """``actor`` ended its task: idle again, or stopped when workers are not reused."""
        actor.busy = False
        actor.tasks_run += 1
        actor.idle_since = time.monotonic()
        if not self.reuse:
            self.stop([actor], "used once (reuse_workers=False)")

    def lost(self, actor: Actor, exc: BaseException) -> None:
        """``actor`` died under its task: forget it (a replacement starts when a task waits)."""
        if isinstance(exc, rex.ActorUnavailableError) and actor.where.get("node_id"):
            self._suspect(actor.where["node_id"])
        self.stop([actor], f"lost: {describe(exc)}")

    # -- one round -------------------------------------------------------------------------------
    def tick(self) -> None:
        """Once per scheduling round: see who came up, follow the nodes, grow and shrink."""
        now = time.monotonic()
        self._check_starting()
        if now - self._nodes_read >= NODES_EVERY_S:
            self._read_nodes(now)
        for kind in self._wanted:
            self._last_wanted[kind] = now
        self._grow()
        self._shrink(now)
        self._wanted.clear()

    def _check_starting(self) -> None:
        starting = {a.hello: a for a in self.actors.values() if a.hello is not None}
        if not starting:
            return
        done, _ = ray.wait(list(starting), num_returns=len(starting), timeout=0)
        for ref in done:
            actor = starting[ref]
            actor.hello = None
            try:
                actor.where = ray.get(ref)
            except rex.RayError as exc:
                self._start_failed(actor, exc)
                continue
            actor.idle_since = time.monotonic()
            self._start_failures.pop(actor.kind, None)
            self._lost_starts.pop(actor.kind, None)
            # start_s: from the request to its answer (queueing for a node, process start, imports);
            # up_since: the actor process's own start, from which the worker holds its resources
            self.events.emit("worker_ready", actor_id=actor.actor_id, name=actor.name, **self.place(actor),
                             start_s=round(time.monotonic() - actor.requested, 3),
                             up_since=round(actor.where.get("up_since", 0.0), 3))

    def _start_failed(self, actor: Actor, exc: BaseException) -> None:
        # The actor's own start failed (its __init__, its runtime_env): that repeats on every node,
        # so a few in a row end the wait of its kind's tasks.  Anything else (a node lost while it
        # started) is the cluster's doing: another is started, unless it keeps happening.
        own = isinstance(exc, rex.RuntimeEnvSetupError) or getattr(exc, "actor_init_failed", False)
        self.stop([actor], f"could not start: {describe(exc)}")
        self._start_failures[actor.kind] += 1 if own else 0
        self._lost_starts[actor.kind] += 0 if own else 1
        tries = self._start_failures[actor.kind] if own else self._lost_starts[actor.kind]
        if tries >= (MAX_START_FAILURES if own else MAX_LOST_STARTS):
            self._broken[actor.kind] = f"a Ray worker could not start ({tries} tries): {describe(exc)}"

    def _grow(self) -> None:
        for kind, waiting in self._wanted.items():
            if kind in self._broken:
                continue
            # those starting, and those that came up during this tick, serve the next round
            need = waiting - sum(1 for a in self.actors.values() if a.kind == kind and not a.busy)
            while need > 0 and (len(self.actors) < self.max_workers or self._evict_one()):
                self._start(kind)
                need -= 1

    def _evict_one(self) -> bool:
        """Stop one actor no waiting task can use (queued ones first: they would take the room)."""
        spare = warm.victim(self.actors.values(), self._is_wanted)
        if spare is not None:
            self.stop([spare], "room for another model")
        return spare is not None

    def _shrink(self, now: float) -> None:
        unwanted = warm.expired(self.actors.values(), now, self.idle_timeout_s, self._is_wanted, self._last_wanted)
        if unwanted:
            self.stop(unwanted, "idle: no remaining task needs it")

    def _is_wanted(self, kind: WorkerKind) -> bool:
        return bool(self._wanted[kind])

    def _start(self, kind: WorkerKind) -> None:
        self._started += 1
        name = f"{self.name_prefix}-w{self._started}"
        options = {**kind.options(), "name": name, "max_restarts": 0, "max_concurrency": 1}
        if self.ledger is not None:  # recorded before it exists: a SIGKILL from here on leaves its name
            self.ledger.claim([name])
            self.ledger.record("submitting", name, namespace=self._namespace)
        suspects = self._live_suspects()
        if suspects:  # keep off nodes that stopped answering until Ray declares them dead
            options["label_selector"] = {"ray.io/node-id": f"!in({','.join(sorted(suspects))})"}
        try:
            handle: Any = self._remote.options(**options).remote()
        except (TypeError, ValueError):  # a Ray without label selectors: placement as Ray sees fit
            options.pop("label_selector", None)
            handle = self._remote.options(**options).remote()
        actor = Actor(kind, handle, handle._actor_id.hex(), name, time.monotonic())  # the id Ray reports it by
        self.actors[actor.actor_id] = actor
        if self.ledger is not None:
            self.ledger.record("submitted", name, job_id=actor.actor_id, namespace=self._namespace)
        # recorded before it is relied on: the run folder names every actor this run started
        self.events.emit("worker_requested", actor_id=actor.actor_id, name=name, worker_key=kind.worker_key,
                         **{k: v for k, v in kind.options().items() if v})
        actor.hello = handle.hello.remote()

    # -- calls -----------------------------------------------------------------------------------
    @staticmethod
    def ended(refs: list[Any], wait_s: float = 0.0) -> set[Any]:
        """Which of these calls have ended (waiting up to ``wait_s`` for all of them)."""
        if not refs:
            return set()
        return set(ray.wait(refs, num_returns=len(refs), timeout=wait_s)[0])

    @staticmethod
    def result(ref: Any) -> int | BaseException:
        """An ended call's exit code, or the Ray error it ended with."""
        try:
            return int(ray.get(ref))
        except rex.RayError as exc:
            return exc

    # -- the cluster -----------------------------------------------------------------------------
    def could_ever_hold(self, kind: WorkerKind) -> bool:
        """Whether a node of the cluster, or one an autoscaler may add, can hold an actor of ``kind``."""
        needs = {k: v for k, v in kind.needs().items() if v}
        return any(all(res.get(k, 0.0) >= v for k, v in needs.items())
                   for res in self.node_resources + self.node_type_resources)

    @staticmethod
    def nodes() -> list[dict[str, Any]]:
        """The alive nodes: ``NodeID``, ``NodeManagerAddress``, ``Resources`` (totals)."""
        return [n for n in ray.nodes() if n.get("Alive")]

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
            alive = {n["NodeID"]: n for n in self.nodes()}
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
            gone = [a for a in self.actors.values() if not a.busy and a.where.get("node_id") == node_id]
            self.stop(gone, "lost: its node left the cluster")

    def _suspect(self, node_id: str) -> None:
        if node_id in self._suspects or node_id not in self._nodes:
            return
        self._suspects[node_id] = time.monotonic()
        # actors still queued may have been assigned to that node: start them again elsewhere
        queued = [a for a in self.actors.values() if not a.ready]
        for actor in queued:
            self.stop([actor], "restarted: queued while a node stopped answering")
            self._start(actor.kind)

    def _live_suspects(self) -> list[str]:
        now = time.monotonic()
        for node_id in [n for n, t in self._suspects.items() if now - t > SUSPECT_FOR_S]:
            del self._suspects[node_id]
        return list(self._suspects)

    # -- stopping --------------------------------------------------------------------------------
    def stop(self, actors: list[Actor], reason: str) -> None:
        """Kill these actors (no restart) and forget them."""
        for actor in actors:
            if self.actors.pop(actor.actor_id, None) is None:
                continue
            try:
                ray.kill(actor.handle, no_restart=True)
            except (rex.RayError, ValueError, ConnectionError):
                pass  # already gone
            if self.ledger is not None:
                self.ledger.record("stopped", actor.name, job_id=actor.actor_id, reason=reason)
            self.events.emit("worker_stopped", actor_id=actor.actor_id, name=actor.name, reason=reason,
                             tasks_run=actor.tasks_run, **self.place(actor))

    def close(self) -> None:
        """Kill every actor of the pool."""
        self.stop(list(self.actors.values()), "the launch ended")

    @staticmethod
    def place(actor: Actor) -> dict[str, Any]:
        """Where ``actor`` runs: ``node_id``, ``node_ip``, ``pid`` (nothing before it is up)."""
        return {k: actor.where[k] for k in ("node_id", "node_ip", "pid") if k in actor.where}


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
