"""A deterministic model with no ML framework, for testing the pipeline end to end."""

from __future__ import annotations

import os
import re
import time
from typing import Any

from orchestra.models.base import BatchedModel
from orchestra.requests import GenRequest, LoglikRequest, prompt_text

_ARITH = re.compile(r"(-?\d+)\s*([-+*]|plus|minus|times)\s*(-?\d+)")



class DeterministicModel(BatchedModel):
    """Answers arithmetic in the prompt, echoes otherwise; knobs to inject failures.

    Generation: the last ``a + b`` / ``a - b`` / ``a * b`` in the prompt is computed;
    without one, the prompt's last word is returned upper-cased.  Output is cut to
    ``max_out_len`` characters and at the first stop string.  Log-likelihood: a
    continuation whose text occurs in the context scores 0, others ``-len(continuation)``.

    Args:
        abbr: name in the run folder.
        path: unused, kept for symmetry with real models.
        delay_s: seconds each batch takes (simulated compute).
        load_s: seconds the model takes to load.
        fail_attempts: fail to load on attempts ``1..fail_attempts`` (``ORCHESTRA_ATTEMPT``).
        fail_always: fail to load on every attempt.
        hang: hang on load (for timeout tests).
    """

    def __init__(
        self,
        abbr: str,
        path: str = "deterministic",
        max_out_len: int = 256,
        batch_size: int = 8,
        generation_kwargs: dict[str, Any] | None = None,
        delay_s: float = 0.0,
        load_s: float = 0.0,
        fail_attempts: int = 0,
        fail_always: bool = False,
        hang: bool = False,
    ) -> None:
        super().__init__(abbr, path, batch_size=batch_size, max_out_len=max_out_len,
                         generation_kwargs=generation_kwargs)
        if delay_s < 0 or load_s < 0 or fail_attempts < 0:
            raise ValueError("delay_s, load_s and fail_attempts must be >= 0")
        self.delay_s = delay_s
        self.load_s = load_s
        self.fail_attempts = fail_attempts
        self.fail_always = fail_always
        self.hang = hang

    def load(self) -> None:
        attempt = int(os.environ.get("ORCHESTRA_ATTEMPT", "1"))
        if self.fail_always:
            raise RuntimeError(f"model {self.abbr}: configured to fail (fail_always=True)")
        if attempt <= self.fail_attempts:
            raise RuntimeError(f"model {self.abbr}: configured to fail on attempt {attempt} of {self.fail_attempts}")
        if self.hang:
            time.sleep(3600)
        if self.load_s:
            time.sleep(self.load_s)

    def _answer(self, request: GenRequest) -> str:
        text = prompt_text(request.prompt)
        found = _ARITH.findall(text)
        if found:
            a, op, b = found[-1]
            x, y = int(a), int(b)
            value = x + y if op in ("+", "plus") else x - y if op in ("-", "minus") else x * y
            out = str(value)
        else:
            words = text.split()
            out = words[-1].upper() if words else ""
        for stop in request.stop:
            if stop and stop in out:
                out = out[: out.index(stop)]
        return out[: self.out_len(request)]

    def generate_batch(self, requests: list[GenRequest]) -> list[str]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return [self._answer(r) for r in requests]

    def loglikelihood_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        if self.delay_s:
            time.sleep(self.delay_s)
        out = []
        for r in requests:
            ctx = prompt_text(r.context)
            out.append([0.0 if c.strip() and c.strip() in ctx else -float(len(c)) for c in r.continuations])
        return out
