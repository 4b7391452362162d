"""The engine: bounded concurrency, no barrier between conversations, errors recorded."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from orchestra.inference.engine import Engine, SampleJob, run_samples
from orchestra.models.base import BaseModel
from orchestra.requests import GenRequest, LoglikRequest, Sample


class ScriptedModel(BaseModel):
    """Answers after a delay chosen by the prompt; records every call; fails on 'boom'."""

    def __init__(self, delays: dict[str, float] | None = None) -> None:
        super().__init__("scripted")
        self.delays = delays or {}
        self.calls: list[tuple[float, str]] = []
        self.active = 0
        self.peak = 0

    async def generate(self, request: GenRequest) -> str:
        prompt = request.prompt if isinstance(request.prompt, str) else request.prompt[-1]["content"]
        first = prompt if isinstance(request.prompt, str) else request.prompt[0]["content"]
        self.calls.append((time.monotonic(), prompt if isinstance(request.prompt, str) else f"{first}/{prompt}"))
        self.active += 1
        self.peak = max(self.peak, self.active)
        self.stats.in_flight += 1
        try:
            await asyncio.sleep(self.delays.get(first, 0.01))
            if "boom" in prompt:
                raise RuntimeError("exploded")
            self.stats.done += 1
            return prompt.upper()
        finally:
            self.active -= 1
            self.stats.in_flight -= 1

    async def loglikelihood(self, request: LoglikRequest) -> list[float]:
        return [-float(len(c)) for c in request.continuations]

    def max_concurrency(self) -> int:
        return 4


def gen_sample(i: int, prompt: str) -> Sample:
    return Sample(id=i, kind="gen", gold=None, gen=GenRequest(prompt=prompt))


def chat_sample(i: int, turns: list[str]) -> Sample:
    return Sample(id=i, kind="chat", gold=None, turns=turns, chat_template=GenRequest(prompt=""))


def test_max_samples_bounds_samples_in_progress() -> None:
    model = ScriptedModel()
    records: list[dict[str, Any]] = []
    asyncio.run(run_samples(model, [gen_sample(i, f"p{i}") for i in range(30)], records.append, max_samples=3))
    assert model.peak == 3
    assert sorted(r["id"] for r in records) == list(range(30))
    assert all(r["prediction"] == f"P{r['id']}" for r in records)


def test_default_max_samples_is_above_the_models_concurrency() -> None:
    assert Engine(ScriptedModel()).max_samples > ScriptedModel().max_concurrency()


def test_conversations_do_not_wait_for_each_other() -> None:
    model = ScriptedModel(delays={"slow": 0.3})
    records: list[dict[str, Any]] = []
    samples = [chat_sample(0, ["slow", "s2", "s3"]), chat_sample(1, ["fast", "f2", "f3"])]
    asyncio.run(run_samples(model, samples, records.append, max_samples=2))
    order = [name for _, name in model.calls]
    # All three turns of the fast conversation are sent before the slow one's second turn.
    assert order.index("fast/f3") < order.index("slow/s2")
    by_id = {r["id"]: r for r in records}
    assert by_id[1]["prediction"] == ["FAST", "F2", "F3"]
    # Turn k+1 carries the history: the model saw the earlier turns and replies.
    assert by_id[0]["turns"] == ["slow", "s2", "s3"]


def test_a_failing_sample_is_recorded_and_the_rest_finish() -> None:
    model = ScriptedModel()
    records: list[dict[str, Any]] = []
    snaps: list[dict[str, Any]] = []
    engine = Engine(model, max_samples=4, on_progress=snaps.append, progress_interval_s=0.01, already_done=5)
    samples = [gen_sample(i, "boom" if i == 2 else f"p{i}") for i in range(6)]
    counts = asyncio.run(engine.run(SampleJob(s, records.append) for s in samples))
    assert counts.done == 5 and counts.failed == 1
    failed = [r for r in records if "error" in r]
    assert [r["id"] for r in failed] == [2] and failed[0]["error"] == "RuntimeError: exploded"
    last = snaps[-1]
    assert last["samples_total"] == 11 and last["samples_done"] == 10 and last["samples_failed"] == 1
    assert last["requests_done"] == 5 and last["in_flight"] == 0
    assert {"rate_limited", "retries", "errors", "elapsed_s", "samples_running"} <= set(last)


def test_a_record_is_written_before_the_sample_counts() -> None:
    model = ScriptedModel()
    engine = Engine(model, max_samples=2)
    seen: list[int] = []

    def on_record(record: dict[str, Any]) -> None:
        seen.append(engine.counts.done)  # not yet counted while it is being written

    asyncio.run(engine.run(SampleJob(gen_sample(i, f"p{i}"), on_record) for i in range(5)))
    assert seen == [0, 1, 2, 3, 4]  # each one counted only after its own write
    assert engine.counts.done == 5
