"""What makes two of the Ray pool's actors interchangeable (:class:`WorkerKind`), and where one runs.

Plain data, without ``ray``: RayRunner works out a task's kind before anything connects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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

    def needs(self) -> dict[str, float]:
        """This kind's demand in Ray's resource names."""
        return {"CPU": self.num_cpus, "GPU": self.num_gpus, "memory": float(self.memory_bytes)}


def place(where: dict[str, Any] | None) -> dict[str, Any]:
    """Where an actor runs: ``node_id``, ``node_ip``, ``pid`` (nothing before it is up)."""
    return {k: where[k] for k in ("node_id", "node_ip", "pid") if k in where} if where else {}
