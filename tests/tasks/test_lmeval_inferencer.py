"""``LmEvalInferencer.run``: lm-eval's requests of one document against the deterministic model
(a real model class of the repository, no ML framework), answered in lm-eval's shapes; and an
answer of the wrong shape from the model is the sample's error, never a response.  (The lm-eval
tests in tests/datasets run it with real models and compare with lm-eval; they take minutes.)"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

import numpy
import pytest

from orchestra.inferencers import INFERENCERS
from orchestra.models.fake import DeterministicModel
from orchestra.requests import GenRequest, LoglikRequest, Sample

CALLS: list[dict[str, Any]] = [
    {"type": "loglikelihood", "args": ["Q: which is w1? A:", " w1"], "idx": 0},
    {"type": "loglikelihood", "args": ["Q: which is w1? A:", " zz"], "idx": 1},
    {"type": "loglikelihood_rolling", "args": ["some text"], "idx": 0},
    {"type": "generate_until", "args": ["What is 2 + 3?", {"until": "\n", "max_gen_toks": 8}], "idx": 0},
    {"type": "loglikelihood", "args": ["other context", " abc"], "idx": 2},
]


def run(model: Any, calls: list[dict[str, Any]]) -> dict[str, Any]:
    sample = Sample(id=7, kind="lmeval", gold={"task": "t", "doc_id": 0}, calls=calls)

    async def main() -> dict[str, Any]:
        model.load()
        try:
            return await INFERENCERS["lmeval"].run(model, sample)
        finally:
            await model.aclose()

    return asyncio.run(main())


class Counting(DeterministicModel):
    """The deterministic model, counting the scoring requests it gets."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scored: list[LoglikRequest] = []

    def loglikelihood_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        self.scored.extend(requests)
        return super().loglikelihood_batch(requests)


def test_every_request_kind_is_answered_in_lm_evals_shape() -> None:
    model = Counting(abbr="det")
    record = run(model, CALLS)
    assert record["id"] == 7 and record["calls"] == CALLS and record["prediction"] == record["responses"]
    assert record["responses"] == [[0.0, False], [-3.0, False], -9.0, "5", [-4.0, False]]
    # the two calls sharing a context went to the model as one request of two continuations
    shapes = sorted((str(r.context), r.continuations) for r in model.scored)
    assert shapes == [("", ("some text",)), ("Q: which is w1? A:", (" w1", " zz")), ("other context", (" abc",))]


def test_an_unknown_request_type_fails_the_sample() -> None:
    with pytest.raises(ValueError, match="sample 7: lm-eval request type 'loglikelihood_x' is not supported"):
        run(DeterministicModel(abbr="det"), [{"type": "loglikelihood_x", "args": ["a"], "idx": 0}])


class Bent(DeterministicModel):
    """Answers of the wrong shape: one log-likelihood too few, a NaN, a generation that is no text."""

    def __init__(self, bend: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bend = bend

    def loglikelihood_batch(self, requests: list[LoglikRequest]) -> list[list[float]]:
        out = super().loglikelihood_batch(requests)
        if self.bend == "short":
            return [o[:-1] for o in out]
        if self.bend == "nan":
            return [[math.nan for _ in o] for o in out]
        if self.bend == "numpy":  # a user's model may hand back numpy's floats: numbers all the same
            return [[numpy.float32(v) for v in o] for o in out]
        return out

    def generate_batch(self, requests: list[GenRequest]) -> list[str]:
        return [None] * len(requests) if self.bend == "none" else super().generate_batch(requests)  # type: ignore[list-item]


@pytest.mark.parametrize(("bend", "says"), [
    ("short", r"sample 7: the model answered (0|1) log-likelihood\(s\) for (1|2) continuations"),
    ("nan", r"sample 7: the model answered log-likelihood nan, not a number below infinity"),
    ("none", r"sample 7: the model answered NoneType, not text"),
])
def test_an_answer_of_the_wrong_shape_is_the_samples_error(bend: str, says: str) -> None:
    with pytest.raises(ValueError) as err:  # the first of the document's requests to fail
        run(Bent(bend, abbr="det"), CALLS)
    assert re.fullmatch(says, str(err.value)), str(err.value)


def test_numpy_floats_are_log_likelihoods_too() -> None:
    record = run(Bent("numpy", abbr="det"), CALLS)
    assert record["responses"] == [[0.0, False], [-3.0, False], -9.0, "5", [-4.0, False]]
    assert all(type(r[0]) is float for r in record["responses"] if isinstance(r, list))


class Greedy(Counting):
    """The deterministic model, reporting is_greedy: a continuation is greedy when it scores 0."""

    scores_greedy = True

    def loglikelihood_greedy_batch(self, requests: list[LoglikRequest]) -> list[list[tuple[float, bool]]]:
        return [[(v, v == 0.0) for v in values] for values in self.loglikelihood_batch(requests)]


def test_calls_marked_greedy_are_answered_with_the_models_is_greedy() -> None:
    calls = [{**c, "greedy": True} if c["type"] == "loglikelihood" else c for c in CALLS]
    record = run(Greedy(abbr="det"), calls)
    assert record["responses"] == [[0.0, True], [-3.0, False], -9.0, "5", [-4.0, False]]
    # a model that cannot tell fails the sample (the config check refuses such a dataset earlier)
    with pytest.raises(Exception, match="does not report whether a continuation is the greedy one"):
        run(DeterministicModel(abbr="det"), calls)
