"""RayPool's decisions (grow, hand out, shrink, make room, give up, avoid a silent node) against a
scripted stand-in for the ``ray`` module: the cases a real cluster shows only by chance."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ray import exceptions as rex

from orchestra.events import EventLog, read_events
from orchestra.runners.core import warm
from orchestra.runners.core.ledger import Ledger
from orchestra.runners.ray import pool as ray_pool
from orchestra.runners.ray.pool import RayPool, WorkerKind

pytestmark = pytest.mark.ray

MODEL_A = WorkerKind("infer|a", 1.0, 0.0)
MODEL_B = WorkerKind("infer|b", 1.0, 0.0)
_ids = itertools.count(1)


@dataclass(eq=False)  # hashable by identity, as ObjectRefs are
class Ref:
    """An ObjectRef: pending until the test sets ``value`` or ``error``."""

    value: Any = None
    error: BaseException | None = None
    done: bool = False

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error, self.done = value, error, True


@dataclass
class Handle:
    options: dict[str, Any]
    hello_ref: Ref = field(default_factory=Ref)
    killed: bool = False

    def __post_init__(self) -> None:
        self._actor_id = bytes.fromhex(f"{next(_ids):032x}")  # .hex() as Ray's ActorID has it
        self.hello = self  # handle.hello.remote()

    def remote(self) -> Ref:
        return self.hello_ref


class Remote:
    def __init__(self, fake: FakeRay, options: dict[str, Any] | None = None) -> None:
        self.fake, self.opts = fake, options or {}

    def options(self, **options: Any) -> Remote:
        return Remote(self.fake, options)

    def remote(self) -> Handle:
        handle = Handle(self.opts)
        self.fake.handles.append(handle)
        return handle


class FakeRay:
    """What RayPool asks of ``ray``: remote, wait, get, kill, nodes."""

    def __init__(self) -> None:
        self.handles: list[Handle] = []
        self.node_list = [{"NodeID": "n1", "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 4.0}}]

    def remote(self, cls: type) -> Remote:
        return Remote(self)

    def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list[Ref], list[Ref]]:
        return [r for r in refs if r.done], [r for r in refs if not r.done]

    def get(self, ref: Ref) -> Any:
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, handle: Handle, no_restart: bool = True) -> None:
        handle.killed = True

    def nodes(self) -> list[dict[str, Any]]:
        return self.node_list

    def get_runtime_context(self) -> Any:
        raise AttributeError("no driver here")

    def alive(self) -> list[Handle]:
        return [h for h in self.handles if not h.killed]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    stand_in = FakeRay()
    monkeypatch.setattr(ray_pool, "ray", stand_in)
    monkeypatch.setattr(RayPool, "node_types", staticmethod(lambda: []))
    return stand_in


def make_pool(tmp_path: Path, max_workers: int = 3, reuse: bool = True, idle_timeout_s: float = 60.0) -> RayPool:
    return RayPool(max_workers, reuse, idle_timeout_s, EventLog(str(tmp_path / "events.jsonl")), "orc-test")


def up(handle: Handle, node: str = "n1") -> None:
    handle.hello_ref.resolve({"node_id": node, "node_ip": "10.0.0.1", "pid": 7, "up_since": 0.0})


def wait_for(pool: RayPool, kind: WorkerKind, tasks: int) -> list[Any]:
    """One scheduling round in which ``tasks`` tasks of ``kind`` ask for a worker (as the loop asks
    for every waiting task each round), then the pool's tick; the workers they got."""
    got = [pool.take(kind) for _ in range(tasks)]
    pool.tick()
    return [a for a in got if a is not None]


def test_grows_for_waiting_tasks_up_to_the_cap_and_hands_out_ready_workers(fake: FakeRay, tmp_path: Path) -> None:
    pool = make_pool(tmp_path, max_workers=3)
    assert wait_for(pool, MODEL_A, 5) == []
    assert len(fake.handles) == 3  # not 5: the cap
    assert all(h.options["num_cpus"] == 1.0 and h.options["max_restarts"] == 0 for h in fake.handles)
    wait_for(pool, MODEL_A, 5)
    assert len(fake.handles) == 3  # still starting: no more are asked for
    up(fake.handles[0])
    assert wait_for(pool, MODEL_A, 5) == []  # this round's tick sees it up
    got = wait_for(pool, MODEL_A, 5)
    assert len(got) == 1 and got[0].busy and got[0].where["node_id"] == "n1"
    assert len(fake.alive()) == 3
    names = [e["name"] for e in read_events(str(tmp_path / "events.jsonl")) if e["event"] == "worker_requested"]
    assert names == ["orc-test-w1", "orc-test-w2", "orc-test-w3"]


def test_shrinks_to_the_remaining_work(fake: FakeRay, tmp_path: Path) -> None:
    pool = make_pool(tmp_path, max_workers=3, idle_timeout_s=0.0)
    wait_for(pool, MODEL_A, 3)
    up(fake.handles[0])
    wait_for(pool, MODEL_A, 3)
    (worker,) = wait_for(pool, MODEL_A, 1)  # one task is left, and it has a worker
    # the two queued workers are withdrawn at once: no task waits for them
    assert [h.killed for h in fake.handles] == [False, True, True]
    pool.finished(worker)
    pool.tick()  # idle, nothing waits: released after idle_timeout_s (0 here)
    assert fake.alive() == [] and pool.workers == {}
    reasons = {e["reason"] for e in read_events(str(tmp_path / "events.jsonl")) if e["event"] == "worker_stopped"}
    assert reasons == {"idle: no remaining task needs it"}


def test_idle_worker_is_kept_while_its_model_may_be_wanted_again(fake: FakeRay, tmp_path: Path) -> None:
    pool = make_pool(tmp_path, idle_timeout_s=60.0)
    wait_for(pool, MODEL_A, 1)
    up(fake.handles[0])
    wait_for(pool, MODEL_A, 1)
    (worker,) = wait_for(pool, MODEL_A, 1)
    pool.finished(worker)
    pool.tick()
    assert wait_for(pool, MODEL_A, 1) == [worker]  # the same worker, its model still loaded
    assert len(fake.handles) == 1


def test_a_full_pool_makes_room_for_another_model(fake: FakeRay, tmp_path: Path) -> None:
    pool = make_pool(tmp_path, max_workers=2)
    wait_for(pool, MODEL_A, 2)
    for h in fake.handles:
        up(h)
    wait_for(pool, MODEL_A, 2)
    for worker in wait_for(pool, MODEL_A, 2):
        pool.finished(worker)
    wait_for(pool, MODEL_B, 1)  # the pool is full of idle A workers
    assert sum(h.killed for h in fake.handles[:2]) == 1 and len(fake.alive()) == 2
    assert fake.handles[-1].options["num_cpus"] == 1.0 and len(fake.handles) == 3


def test_without_reuse_a_worker_runs_one_task(fake: FakeRay, tmp_path: Path) -> None:
    pool = make_pool(tmp_path, reuse=False)
    wait_for(pool, MODEL_A, 1)
    up(fake.handles[0])
    wait_for(pool, MODEL_A, 1)
    (worker,) = wait_for(pool, MODEL_A, 1)
    pool.finished(worker)
    assert fake.handles[0].killed and pool.workers == {}


def test_workers_that_cannot_start_end_the_wait_of_their_tasks(fake: FakeRay, tmp_path: Path) -> None:
    pool = make_pool(tmp_path, max_workers=1)
    for _ in range(warm.MAX_START_FAILURES):
        assert pool.broken(MODEL_A) is None
        wait_for(pool, MODEL_A, 1)
        fake.handles[-1].hello_ref.resolve(error=rex.RuntimeEnvSetupError("pip: no matching distribution"))
    assert len(fake.handles) == warm.MAX_START_FAILURES
    wait_for(pool, MODEL_A, 1)  # this round's tick sees the last failure
    message = pool.broken(MODEL_A)
    assert message and message.startswith("a Ray worker could not start (3 tries): ")
    assert message.endswith("pip: no matching distribution")
    wait_for(pool, MODEL_A, 1)
    assert len(fake.handles) == warm.MAX_START_FAILURES  # no more tries
    assert pool.broken(MODEL_B) is None


def test_a_start_lost_with_its_node_is_tried_again(fake: FakeRay, tmp_path: Path) -> None:
    pool = make_pool(tmp_path, max_workers=1)
    wait_for(pool, MODEL_A, 1)
    fake.handles[0].hello_ref.resolve(error=rex.ActorDiedError())  # not the actor's own failure
    wait_for(pool, MODEL_A, 1)  # seen, and another asked for at once
    assert len(fake.handles) == 2 and pool.broken(MODEL_A) is None
    up(fake.handles[1])
    wait_for(pool, MODEL_A, 1)
    assert len(wait_for(pool, MODEL_A, 1)) == 1


def test_a_node_that_stops_answering_gets_no_new_workers(fake: FakeRay, tmp_path: Path) -> None:
    fake.node_list.append({"NodeID": "n2", "Alive": True, "NodeManagerAddress": "10.0.0.2",
                           "Resources": {"CPU": 4.0}})
    pool = make_pool(tmp_path, max_workers=3)
    pool.tick()  # reads the nodes
    wait_for(pool, MODEL_A, 3)
    up(fake.handles[0], node="n2")
    wait_for(pool, MODEL_A, 3)
    (worker,) = wait_for(pool, MODEL_A, 3)
    # its call fails as when a node is killed: Ray still counts the node for ~15 s
    pool.lost(worker, rex.ActorUnavailableError("RpcError: Socket closed", None))
    # the two workers still queued may have been sent there: asked for again, off that node
    assert [h.killed for h in fake.handles] == [True, True, True, False, False]
    assert [h.options.get("label_selector") for h in fake.alive()] == [{"ray.io/node-id": "!in(n2)"}] * 2
    # once Ray declares the node dead it places nothing there: new workers go anywhere again
    fake.node_list.pop()
    pool._nodes_read = 0.5  # the next tick reads the nodes again
    wait_for(pool, MODEL_A, 3)
    assert len(fake.handles) == 6 and "label_selector" not in fake.handles[-1].options
    lost = [e["node_id"] for e in read_events(str(tmp_path / "events.jsonl")) if e["event"] == "node_lost"]
    assert lost == ["n2"]


class _FullDiskLedger(Ledger):
    """The run folder's ledger on a disk that fills between an actor's two lines (a unit test of
    the start alone: the real disk cannot be filled at that exact moment)."""

    def record(self, state: str, name: str, **fields: Any) -> None:
        if state == "submitted":
            raise OSError(28, "No space left on device")
        super().record(state, name, **fields)


def test_an_actor_created_before_its_start_failed_is_not_left_alive(fake: FakeRay, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The actor exists once ``.remote()`` returned; a failure after that (its ``submitted`` line
    cannot be written) must not leave it alive outside the pool, where nothing ever kills it (the
    pool's close included: it held a node's CPUs until the process ended)."""
    monkeypatch.setattr(fake, "get_runtime_context", lambda: SimpleNamespace(namespace="ns"), raising=False)
    pool = RayPool(2, True, 60.0, EventLog(str(tmp_path / "events.jsonl")), "orc-test",
                   _FullDiskLedger(str(tmp_path / "ray")))
    assert pool.take(MODEL_A) is None
    with pytest.raises(OSError, match="No space"):
        pool.tick()
    assert len(fake.handles) == 1
    pool.close()
    assert fake.alive() == [], "the actor outlived its failed start and the pool's close"
