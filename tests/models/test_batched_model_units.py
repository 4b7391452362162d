"""Unit tests of BatchedModel's dynamic batching (orchestra/models/base.py) with a model whose
batch calls misbehave: one that raises fails the callers of that batch only, and one that
returns fewer (or more) results than requests fails its callers with one line instead of leaving
them waiting forever."""

from __future__ import annotations

import asyncio

import pytest

from orchestra.errors import ModelError
from orchestra.models.base import BatchedModel
from orchestra.requests import GenRequest, LoglikRequest


class Misbehaving(BatchedModel):
    """Answers a prompt with itself upper-cased; a batch holding ``boom`` raises, one holding
    ``short`` returns one result too few, one holding ``long`` one too many."""

    def __init__(self) -> None:
        super().__init__("misbehaving", batch_size=2)
        self.batches: list[list[str]] = []

    def generate_batch(self, requests: list[GenRequest]) -> list[str]:
        prompts = [str(r.prompt) for r in requests]
        self.batches.append(prompts)
        if "boom" in prompts:
            raise RuntimeError("CUDA out of memory")
        out = [p.upper() for p in prompts]
        if "short" in prompts:
            return out[:-1]
        return out + ["extra"] if "long" in prompts else out

    def loglikelihood_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        return [[0.0] * len(r.continuations) for r in requests]


def _run(prompts: list[str]) -> tuple[list[object], Misbehaving]:
    model = Misbehaving()

    async def main() -> list[object]:
        calls = (model.generate(GenRequest(p)) for p in prompts)
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)

    return asyncio.run(main()), model


def test_a_batch_that_raises_fails_its_own_callers_only() -> None:
    answers, model = _run(["a", "boom", "c", "d"])
    assert model.batches == [["a", "boom"], ["c", "d"]]
    assert isinstance(answers[0], RuntimeError) and isinstance(answers[1], RuntimeError)
    assert answers[2:] == ["C", "D"]


@pytest.mark.parametrize("odd", ["short", "long"])
def test_a_batch_with_the_wrong_number_of_results_fails_its_callers(odd: str) -> None:
    answers, model = _run(["a", odd, "c", "d"])
    for bad in answers[:2]:
        assert isinstance(bad, ModelError) and "results for 2 requests" in str(bad), bad
    assert answers[2:] == ["C", "D"]
    assert model.stats.in_flight == 0 and model.stats.done == 4
