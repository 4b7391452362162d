"""The warm-pool policy, once for both transports (a worker process behind a pipe, a Ray actor).

A warm worker keeps a model loaded between tasks.  Workers are interchangeable when their
``key`` is equal (the model and what the worker holds: GPUs, CPUs).  The policy:

* a task goes to the idle worker of its key used most recently (its caches are warmest);
* when the pool is full, room is made by stopping an idle worker no waiting task can use,
  one still starting first, else the one idle longest;
* an idle worker that no task wanted for ``idle_timeout_s`` is stopped (a pool that grows
  for waiting tasks ahead of them, as the Ray pool does, also shrinks).

The pools (``local/warm.py``, ``ray/pool.py``) own their workers and how to start and stop them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Protocol, TypeVar


class WarmWorker(Protocol):
    """What the policy reads of a worker."""

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
