"""A model whose batches wait for a file: a test holds its tasks running until it has done its harm."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from orchestra.models.fake import DeterministicModel
from orchestra.requests import GenRequest, LoglikRequest


class GatedModel(DeterministicModel):
    """The deterministic model, except that each batch first waits (at most 120 s) for ``gate`` to exist."""

    def __init__(self, abbr: str, gate: str = "", **kwargs: Any) -> None:
        super().__init__(abbr, **kwargs)
        self.gate = Path(gate)

    def _wait(self) -> None:
        deadline = time.monotonic() + 120
        while not self.gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate {self.gate} was not opened within 120 s")
            time.sleep(0.05)

    def generate_batch(self, requests: list[GenRequest]) -> list[str]:
        self._wait()
        return super().generate_batch(requests)

    def loglikelihood_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        self._wait()
        return super().loglikelihood_batch(requests)
