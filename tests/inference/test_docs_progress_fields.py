"""The progress counters docs/models.md promises: ``oom_splits`` reaches the progress events."""

from __future__ import annotations

import asyncio
from typing import Any

from orchestra.inference.engine import Engine, SampleJob
from orchestra.models import DeterministicModel
from orchestra.requests import GenRequest, Sample


class _SplittingModel(DeterministicModel):
    """The deterministic model, counting one out-of-memory split per batch as HFCausalLM does."""

    def generate_batch(self, requests: list[GenRequest]) -> list[str]:
        self.stats.extra["oom_splits"] = self.stats.extra.get("oom_splits", 0) + 1
        return super().generate_batch(requests)


def test_oom_splits_of_the_model_are_in_the_progress_snapshot() -> None:
    model = _SplittingModel("m", batch_size=2)
    model.stats.extra["oom_splits"] = 5  # an earlier task of a warm worker: not this attempt's
    snaps: list[dict[str, Any]] = []
    engine = Engine(model, max_samples=2, on_progress=snaps.append, progress_interval_s=0.01)
    samples = [Sample(id=i, kind="gen", gold=None, gen=GenRequest(prompt=f"{i} + 1")) for i in range(4)]
    records: list[dict[str, Any]] = []
    asyncio.run(engine.run(SampleJob(s, records.append) for s in samples))
    final = engine.snapshot()
    assert len(records) == 4
    splits = model.stats.extra["oom_splits"] - 5
    assert splits >= 1
    assert final["oom_splits"] == splits
