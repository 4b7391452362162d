"""This machine's GPUs and cores, shared by the local runners of one run.

The infer and eval stages run side by side (``eval=dict(overlap=True)``, the default), each
with a runner of its own.  What they must not both hand out is kept here: a GPU held by an
inference task is never given to an eval task's judge model as well, and eval tasks take only
the cores inference leaves.  Inference never waits for cores, so the eval stage cannot starve
it; one eval task may always run, so scoring keeps pace with the predictions it is handed.
"""

from __future__ import annotations

import os
import threading

#: the stage whose tasks never wait for cores held by another stage
FIRST_STAGE = "infer"


def usable_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class HostCapacity:
    """Who holds which GPU and how many cores, across the stages of a run (thread-safe).

    Args:
        cores: the cores to share (default: those this process may use).
    """

    def __init__(self, cores: int | None = None) -> None:
        self.cores = cores if cores is not None else usable_cores()
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, got {self.cores}")
        self._lock = threading.Lock()
        self._gpu_use: dict[str, int] = {}
        self._cores: dict[str, int] = {}  # stage -> cores its running tasks hold
        self._tasks: dict[str, int] = {}  # stage -> its running tasks

    def take(self, stage: str, cores: int, gpus: list[str], num_gpus: int, per_gpu: int) -> list[str] | None:
        """Reserve ``cores`` and ``num_gpus`` of ``gpus`` (each shared by at most ``per_gpu``
        tasks) for a task of ``stage``; the GPU ids, or None if it must wait."""
        with self._lock:
            if stage != FIRST_STAGE and self._tasks.get(stage, 0) > 0:
                held = sum(self._cores.values())
                if held + cores > self.cores:
                    return None
            chosen: list[str] = []
            if num_gpus > 0:
                free = [g for g in gpus if self._gpu_use.get(g, 0) < per_gpu]
                if len(free) < num_gpus:
                    return None
                chosen = sorted(free, key=lambda g: self._gpu_use.get(g, 0))[:num_gpus]
                for g in chosen:
                    self._gpu_use[g] = self._gpu_use.get(g, 0) + 1
            self._cores[stage] = self._cores.get(stage, 0) + cores
            self._tasks[stage] = self._tasks.get(stage, 0) + 1
            return chosen

    def give(self, stage: str, cores: int, gpu_ids: list[str]) -> None:
        """Give back what :meth:`take` reserved."""
        with self._lock:
            for g in gpu_ids:
                self._gpu_use[g] -= 1
            self._cores[stage] -= cores
            self._tasks[stage] -= 1

    def held(self) -> dict[str, dict[str, int]]:
        """Cores and tasks held per stage, and tasks per GPU (for progress and tests)."""
        with self._lock:
            return {"cores": dict(self._cores), "tasks": dict(self._tasks),
                    "gpus": {g: n for g, n in self._gpu_use.items() if n}}

