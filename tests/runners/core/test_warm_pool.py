"""core/warm.WarmPool, the one warm-pool policy, against a scripted transport (a unit test of the state
machine; the real transports are driven by tests/runners/ray and the LocalRunner warm-worker tests)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestra.runners.core import warm
from orchestra.runners.core.warm import StartFailed, WarmPool, Worker


class Script:
    """A transport whose workers come up (or fail) when the test says so."""

    what = "test worker"

    def __init__(self, up_at_once: bool = False) -> None:
        self.up_at_once = up_at_once
        self.started: list[Worker[str]] = []
        self.stopped: list[tuple[str, str]] = []  # (name, reason)
        self.outcomes: dict[Worker[str], dict[str, Any] | StartFailed] = {}
        self.requests: list[Any] = []

    def start(self, worker: Worker[str], request: Any) -> None:
        worker.handle = f"handle of {worker.name}"
        worker.where = {"pid": len(self.started)} if self.up_at_once else None
        self.started.append(worker)
        self.requests.append(request)

    def came_up(self, starting: list[Worker[str]]) -> dict[Worker[str], dict[str, Any] | StartFailed]:
        out = {w: self.outcomes.pop(w) for w in starting if w in self.outcomes}
        return out

    def stop(self, workers: list[Worker[str]], reason: str) -> None:
        self.stopped.extend((w.name, reason) for w in workers)

    def up(self, *workers: Worker[str]) -> None:
        for w in workers:
            self.outcomes[w] = {"node": "n1"}


def round_of(pool: WarmPool[str], key: str, tasks: int) -> list[Worker[str]]:
    """One scheduling round in which ``tasks`` tasks of ``key`` ask for a worker, then the tick."""
    got = [pool.take(key) for _ in range(tasks)]
    pool.tick()
    return [w for w in got if w is not None]


def test_grows_for_waiting_tasks_to_the_cap_and_hands_out_the_warmest_worker() -> None:
    script = Script()
    pool = WarmPool(script, max_workers=3, name_prefix="p", idle_timeout_s=60)
    assert round_of(pool, "a", 5) == []
    assert [w.name for w in script.started] == ["p-w1", "p-w2", "p-w3"]  # the cap, not 5
    assert round_of(pool, "a", 5) == [] and len(script.started) == 3  # starting ones serve the next round
    script.up(*script.started[:2])
    round_of(pool, "a", 5)
    first, second = round_of(pool, "a", 2)
    assert first.busy and second.busy and first.where == {"node": "n1"}
    pool.finished(first)
    pool.finished(second)  # used last: its caches are warmest
    assert pool.take("a") is second and first.tasks_run == 1


def test_a_full_pool_stops_an_idle_worker_no_waiting_task_wants() -> None:
    script = Script()
    pool = WarmPool(script, max_workers=2, name_prefix="p", idle_timeout_s=60)
    round_of(pool, "a", 2)
    script.up(*script.started)
    round_of(pool, "a", 2)
    a1, a2 = round_of(pool, "a", 2)
    pool.finished(a2)
    round_of(pool, "b", 1)  # a1 is busy, a2 idle: a2 makes room
    assert script.stopped == [(a2.name, "room for another model")]
    assert sorted(w.key for w in pool.workers.values()) == ["a", "b"]
    b = script.started[-1]
    script.up(b)
    round_of(pool, "b", 1)  # seen up in this round's tick
    assert round_of(pool, "b", 1) == [b]
    assert pool.start("c") is None  # every worker is busy: no room
    assert len(pool.workers) == 2 and len(script.stopped) == 1


def test_shrinks_idle_workers_and_withdraws_starting_ones_nobody_waits_for() -> None:
    script = Script()
    pool = WarmPool(script, max_workers=3, name_prefix="p", idle_timeout_s=0.0)
    round_of(pool, "a", 3)
    script.up(script.started[0])
    round_of(pool, "a", 3)
    (worker,) = round_of(pool, "a", 1)  # one task left, and it has a worker: the two starting ones go
    assert [r for _, r in script.stopped] == ["idle: no remaining task needs it"] * 2
    pool.finished(worker)
    pool.tick()
    assert pool.workers == {} and len(script.stopped) == 3


def test_an_idle_worker_is_kept_while_its_key_was_wanted_lately() -> None:
    script = Script()
    pool = WarmPool(script, max_workers=1, name_prefix="p", idle_timeout_s=60)
    round_of(pool, "a", 1)
    script.up(*script.started)
    round_of(pool, "a", 1)
    (worker,) = round_of(pool, "a", 1)
    pool.finished(worker)
    pool.tick()
    assert round_of(pool, "a", 1) == [worker] and script.stopped == []


def test_without_reuse_a_worker_runs_one_task() -> None:
    script = Script(up_at_once=True)
    pool = WarmPool(script, max_workers=2, name_prefix="p", reuse=False)
    worker = pool.start("a", request={"env": 1})
    assert worker is not None and worker.busy and script.requests == [{"env": 1}]
    pool.finished(worker)
    assert script.stopped == [("p-w1", "used once (reuse_workers=False)")] and pool.workers == {}


def test_a_start_for_a_task_now_meets_its_want() -> None:
    script = Script(up_at_once=True)
    pool = WarmPool(script, max_workers=2, name_prefix="p")
    assert pool.take("a") is None  # counted as wanted
    worker = pool.start("a", request="env")
    assert worker is not None and worker.busy and worker.ready
    pool.tick()  # the want was met: no second worker for it
    assert len(script.started) == 1 and pool.workers == {"p-w1": worker}


def test_a_key_whose_workers_cannot_start_is_broken_after_a_few_tries() -> None:
    script = Script()
    pool = WarmPool(script, max_workers=1, name_prefix="p")
    for _ in range(warm.MAX_START_FAILURES):
        assert pool.broken("a") is None
        round_of(pool, "a", 1)
        script.outcomes[script.started[-1]] = StartFailed("no such module", own=True)
    round_of(pool, "a", 1)
    assert pool.broken("a") == "a test worker could not start (3 tries): no such module"
    round_of(pool, "a", 1)
    assert len(script.started) == warm.MAX_START_FAILURES  # no more tries
    assert script.stopped[-1] == ("p-w3", "could not start: no such module") and pool.broken("b") is None


def fail_starts(pool: WarmPool[str], script: Script, times: int, own: bool) -> None:
    """``times`` starts of key ``a`` in a row that fail, each seen by the round after it."""
    for _ in range(times):
        round_of(pool, "a", 1)
        script.outcomes[script.started[-1]] = StartFailed("node lost", own=own)
    round_of(pool, "a", 1)


def test_starts_lost_by_the_platform_are_tried_longer_and_a_success_resets_the_count() -> None:
    script = Script()
    pool = WarmPool(script, max_workers=1, name_prefix="p")
    fail_starts(pool, script, warm.MAX_LOST_STARTS - 1, own=False)
    assert pool.broken("a") is None and len(script.started) == warm.MAX_LOST_STARTS  # one short of the limit
    script.up(script.started[-1])
    round_of(pool, "a", 1)
    (worker,) = round_of(pool, "a", 1)
    pool.stop([worker], "lost")
    fail_starts(pool, script, warm.MAX_LOST_STARTS - 1, own=False)
    assert pool.broken("a") is None  # counted afresh after the success
    fail_starts(pool, script, 1, own=False)
    assert pool.broken("a") == f"a test worker could not start ({warm.MAX_LOST_STARTS} tries): node lost"


def test_stop_hands_the_transport_only_workers_of_the_pool() -> None:
    script = Script(up_at_once=True)
    pool = WarmPool(script, max_workers=2, name_prefix="p")
    worker = pool.start("a", request="env")
    assert worker is not None
    pool.stop([worker], "cancelled")
    pool.stop([worker], "cancelled")  # already gone: not stopped twice
    pool.close()
    assert script.stopped == [("p-w1", "cancelled")]


def test_a_failed_start_for_a_task_leaves_no_want_behind() -> None:
    class Refusing(Script):
        refuse = False

        def start(self, worker: Worker[str], request: Any) -> None:
            if self.refuse:
                raise OSError("too many open files")
            super().start(worker, request)

    script = Refusing(up_at_once=True)
    pool = WarmPool(script, max_workers=2, name_prefix="p")
    first = pool.start("a", request="env")
    assert first is not None and pool.take("a") is None
    script.refuse = True
    with pytest.raises(OSError):
        pool.start("a", request="env")  # the task's attempt fails; it does not wait for an "a" worker
    script.refuse = False
    assert pool.start("b", request="env") is not None  # the pool is full now
    pool.finished(first)
    assert pool.take("c") is None
    assert pool.start("c", request="env") is not None  # the idle "a" worker makes room: nobody wants "a"
    assert script.stopped == [("p-w1", "room for another model")]
