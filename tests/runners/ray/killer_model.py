"""A model whose loading kills the process it loads in (a task that keeps killing its worker)."""

from __future__ import annotations

import os
import signal

from orchestra.models.fake import DeterministicModel


class WorkerKillerModel(DeterministicModel):
    """The deterministic model, except that ``load`` SIGKILLs its own process."""

    def load(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)
