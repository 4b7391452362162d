"""The warm pool, once for both transports (a worker process behind a pipe, a Ray actor).

A warm worker keeps a model loaded between tasks.  Workers are interchangeable when their
``key`` is equal (the model and what the worker holds: GPUs, CPUs).  :class:`WarmPool` is the
policy, a state machine over its workers:

* ``take``: a task gets the idle worker of its key used most recently (its caches are warmest);
  when there is none, its key is counted as wanted this round;
* ``tick`` (once per round): notice the workers that came up or could not start, start workers for
  the keys wanted (grow), at most ``max_workers`` in all, making room by stopping an idle worker no
  waiting task can use (one still starting first, else the one idle longest), and stop idle
  workers that no task wanted for ``idle_timeout_s`` and starting ones nobody waits for (shrink);
* ``start``: a worker at once for a task that asks now (a transport whose workers are up as soon
  as they are started: a local process);
* ``finished``: idle again, or stopped when workers are not reused (``reuse=False``);
* a key whose workers keep failing to start is *broken*: its tasks fail instead of waiting.

A :class:`Transport` starts, watches and stops the workers: ``local/warm.py`` (processes and
their pipes) and ``ray/pool.py`` (Ray actors).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

#: failed starts of one key in a row, by the worker itself (its own start, which fails the same
#: way everywhere) or otherwise (the platform lost it while it started), before the key is broken
MAX_START_FAILURES = 3
MAX_LOST_STARTS = 10

K = TypeVar("K", bound=Hashable)


@dataclass(eq=False)
class Worker(Generic[K]):
    """One warm worker of a pool and what the pool knows of it (hashed by identity)."""

    key: K
    name: str
    requested: float  # time.monotonic() of its start
    handle: Any = None  # the transport's: a process and its pipe, a Ray actor handle
    ident: str = ""  # the transport's id of it (a Ray actor id; the name if it sets none)
    where: dict[str, Any] | None = None  # None while it starts; where it runs once it is up
    busy: bool = False
    idle_since: float = 0.0
    tasks_run: int = 0

    @property
    def ready(self) -> bool:
        return self.where is not None


@dataclass(frozen=True)
class StartFailed:
    """Why a worker could not start; ``own``: its own start failed (it would fail again anywhere),
    not the platform while it started (a node lost)."""

    why: str
    own: bool


class Transport(Protocol[K]):
    """How a pool's workers are started, seen up and stopped."""

    #: what a worker is called in messages (``"Ray worker"``)
    what: str

    def start(self, worker: Worker[K], request: Any) -> None:
        """Start ``worker`` (a new one of its key, under its name): set its ``handle`` and ``ident``,
        and its ``where`` if it is up at once.  ``request``: what the task that asks for it gives
        (None when the pool grows ahead of tasks)."""

    def came_up(self, starting: list[Worker[K]]) -> Mapping[Worker[K], dict[str, Any] | StartFailed]:
        """Of the workers still starting, those whose start ended: where each runs, or why it failed."""

    def stop(self, workers: list[Worker[K]], reason: str) -> None:
        """Stop these workers (the pool has forgotten them already)."""


class WarmPool(Generic[K]):
    """At most ``max_workers`` warm workers, handed out by key, grown for waiting tasks and shrunk
    to the remaining work (see the module).

    Args:
        transport: starts, watches and stops the workers.
        max_workers: workers at once (busy, idle or starting).
        name_prefix: workers are named ``<prefix>-w<n>``.
        reuse: keep a worker for the next task of its key (False: one task per worker).
        idle_timeout_s: how long an idle worker that no waiting task can use is kept by ``tick``.
    """

    def __init__(self, transport: Transport[K], max_workers: int, name_prefix: str, reuse: bool = True,
                 idle_timeout_s: float = math.inf) -> None:
        self.transport = transport
        self.max_workers = max_workers
        self.name_prefix = name_prefix
        self.reuse = reuse
        self.idle_timeout_s = idle_timeout_s
        self.workers: dict[str, Worker[K]] = {}  # by ident
        self._started = 0
        self._wanted: Counter[K] = Counter()  # tasks that waited for a key this round
        self._last_wanted: dict[K, float] = {}
        self._start_failures: Counter[K] = Counter()  # in a row, by the worker itself
        self._lost_starts: Counter[K] = Counter()  # in a row, by anything else
        self._broken: dict[K, str] = {}

    # -- handing out -----------------------------------------------------------------------------
    def take(self, key: K) -> Worker[K] | None:
        """An idle worker of ``key``, now busy; None (and the key counted as wanted) if there is none."""
        worker = pick(self.workers.values(), key)
        if worker is None:
            self._wanted[key] += 1
            return None
        worker.busy = True
        return worker

    def start(self, key: K, request: Any = None) -> Worker[K] | None:
        """A new worker of ``key``, room made by stopping a spare one if the pool is full; None if
        there is no room.  Called for a task that asks now, it is busy with it at once (that want is
        met); an error of the transport's start propagates, the worker stopped if it exists already."""
        while len(self.workers) >= self.max_workers:
            spare = victim(self.workers.values(), self._is_wanted)
            if spare is None:
                return None
            self.stop([spare], "room for another model")
        if request is not None:  # met now, even if the start fails: the task is not waiting any more
            self._wanted[key] = max(0, self._wanted[key] - 1)
        self._started += 1
        worker = Worker(key, f"{self.name_prefix}-w{self._started}", time.monotonic(), busy=request is not None)
        try:
            self.transport.start(worker, request)
        except BaseException:
            if worker.handle is not None:  # it exists already (an actor whose ledger line failed): stop it
                self.transport.stop([worker], "could not start")
            raise
        worker.ident = worker.ident or worker.name
        self.workers[worker.ident] = worker
        return worker

    def broken(self, key: K) -> str | None:
        """Why workers of ``key`` cannot start (after repeated failures), or None."""
        return self._broken.get(key)

    def finished(self, worker: Worker[K]) -> None:
        """``worker`` ended its task: idle again, or stopped when workers are not reused."""
        worker.busy = False
        worker.tasks_run += 1
        worker.idle_since = time.monotonic()
        if not self.reuse:
            self.stop([worker], "used once (reuse_workers=False)")

    def stop(self, workers: Iterable[Worker[K]], reason: str) -> None:
        """Forget these workers and have the transport stop them."""
        gone = [w for w in workers if self.workers.pop(w.ident, None) is not None]
        if gone:
            self.transport.stop(gone, reason)

    def close(self) -> None:
        """Stop every worker of the pool."""
        self.stop(list(self.workers.values()), "the launch ended")

    # -- one round -------------------------------------------------------------------------------
    def tick(self) -> None:
        """Once per scheduling round: see who came up, grow for the keys wanted, shrink."""
        now = time.monotonic()
        starting = [w for w in self.workers.values() if not w.ready]
        for worker, outcome in (self.transport.came_up(starting) if starting else {}).items():
            if isinstance(outcome, StartFailed):
                self._start_failed(worker, outcome)
            else:
                worker.where, worker.idle_since = outcome, time.monotonic()
                self._start_failures.pop(worker.key, None)
                self._lost_starts.pop(worker.key, None)
        for key in self._wanted:
            self._last_wanted[key] = now
        for key, waiting in list(self._wanted.items()):
            # those starting, and those that came up during this tick, serve the next round
            need = waiting - sum(1 for w in self.workers.values() if w.key == key and not w.busy)
            while key not in self._broken and need > 0 and self.start(key) is not None:
                need -= 1
        unwanted = expired(self.workers.values(), now, self.idle_timeout_s, self._is_wanted, self._last_wanted)
        self.stop(unwanted, "idle: no remaining task needs it")
        self._wanted.clear()

    def _start_failed(self, worker: Worker[K], failed: StartFailed) -> None:
        self.stop([worker], f"could not start: {failed.why}")
        counter = self._start_failures if failed.own else self._lost_starts
        counter[worker.key] += 1
        if counter[worker.key] >= (MAX_START_FAILURES if failed.own else MAX_LOST_STARTS):
            self._broken[worker.key] = (f"a {self.transport.what} could not start ({counter[worker.key]} tries): "
                                        f"{failed.why}")

    def _is_wanted(self, key: K) -> bool:
        return bool(self._wanted[key])


class WarmWorker(Protocol):
    """What the policy's choices read of a worker."""

    @property
    def key(self) -> Hashable: ...

    @property
    def busy(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    @property
    def idle_since(self) -> float: ...


W = TypeVar("W", bound=WarmWorker)


def pick(workers: Iterable[W], key: Hashable) -> W | None:
    """The idle, ready worker of ``key`` used most recently, or None."""
    idle = [w for w in workers if w.key == key and w.ready and not w.busy]
    return max(idle, key=lambda w: w.idle_since) if idle else None


def victim(workers: Iterable[W], wanted: Callable[[Any], bool] = lambda key: False) -> W | None:
    """The worker to stop for room: idle, of a key no waiting task wants, starting ones first, then
    the one idle longest; None if there is none."""
    spare = [w for w in workers if not w.busy and not wanted(w.key)]
    return min(spare, key=lambda w: (w.ready, w.idle_since)) if spare else None


def expired(workers: Iterable[W], now: float, idle_timeout_s: float, wanted: Callable[[Any], bool],
            last_wanted: Mapping[Any, float]) -> list[W]:
    """Workers to stop because nothing needs them: idle and unwanted for ``idle_timeout_s``, or still
    starting while no task waits for their key any more."""
    out = []
    for w in workers:
        if w.busy or wanted(w.key):
            continue
        if not w.ready or now - max(w.idle_since, last_wanted.get(w.key, 0.0)) >= idle_timeout_s:
            out.append(w)
    return out
