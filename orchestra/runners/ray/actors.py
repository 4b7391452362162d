"""What the Ray pool's workers are: the kind that makes two actors interchangeable, and one actor.

Plain data, without ``ray``: RayRunner works out a task's kind before anything connects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkerKind:
    """What makes two actors interchangeable: the model they keep and the resources they hold."""

    worker_key: str
    num_cpus: float
    num_gpus: float
    memory_bytes: int = 0

    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory_bytes:
            opts["memory"] = self.memory_bytes
        return opts

    def needs(self) -> dict[str, float]:
        """This kind's demand in Ray's resource names."""
        return {"CPU": self.num_cpus, "GPU": self.num_gpus, "memory": float(self.memory_bytes)}


@dataclass
class Actor:
    """One actor of the pool and what the pool knows of it."""

    kind: WorkerKind
    handle: Any
    actor_id: str
    name: str
    requested: float  # time.monotonic() of its creation
    hello: Any = None  # the ObjectRef of ``hello`` while it starts
    where: dict[str, Any] = field(default_factory=dict)  # node_id, node_ip, pid, up_since once up
    busy: bool = False
    idle_since: float = 0.0
    tasks_run: int = 0

    @property
    def ready(self) -> bool:
        return bool(self.where)

    @property
    def key(self) -> WorkerKind:
        return self.kind
