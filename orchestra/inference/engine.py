"""The inference engine: run samples concurrently on one asyncio loop.

Every sample is a coroutine; at most ``max_samples`` run at once.  A multi-turn sample
is one coroutine that sends turn k+1 as soon as turn k returns, so conversations never
wait for each other.  Each finished sample goes to ``on_record`` (the checkpoint) before
the engine moves on; a sample that raises is recorded with its error, never dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from orchestra.datasets.base import Sample
from orchestra.models.base import BaseModel, GenRequest, Message


def _serializable_prompt(prompt: Any) -> Any:
    return prompt if isinstance(prompt, (str, list)) else str(prompt)


async def run_sample(model: BaseModel, sample: Sample) -> dict[str, Any]:
    """Run one sample to a prediction record."""
    if sample.kind == "gen":
        assert sample.gen is not None
        text = await model.generate(sample.gen)
        return {"id": sample.id, "prompt": _serializable_prompt(sample.gen.prompt), "prediction": text,
                "gold": sample.gold}
    if sample.kind == "loglik":
        assert sample.loglik is not None
        lls = await model.loglikelihood(sample.loglik)
        best = max(range(len(lls)), key=lls.__getitem__)
        return {"id": sample.id, "prompt": _serializable_prompt(sample.loglik.context),
                "continuations": list(sample.loglik.continuations), "logliks": lls, "prediction": best,
                "gold": sample.gold}
    assert sample.chat_template is not None
    messages: list[Message] = []
    replies = []
    for turn in sample.turns:
        messages.append({"role": "user", "content": turn})
        settings = sample.chat_template
        req = GenRequest(prompt=list(messages), max_out_len=settings.max_out_len, stop=settings.stop,
                         temperature=settings.temperature, top_p=settings.top_p, seed=settings.seed)
        reply = await model.generate(req)
        messages.append({"role": "assistant", "content": reply})
        replies.append(reply)
    return {"id": sample.id, "turns": sample.turns, "prediction": replies, "gold": sample.gold}


async def run_samples(
    model: BaseModel,
    samples: list[Sample],
    on_record: Callable[[dict[str, Any]], None],
    max_samples: int | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    progress_interval_s: float = 2.0,
) -> None:
    """Run ``samples`` with at most ``max_samples`` in flight; report each record as it ends."""
    limit = asyncio.Semaphore(max_samples or model.max_concurrency())
    last = time.monotonic()

    async def one(sample: Sample) -> None:
        nonlocal last
        async with limit:
            try:
                record = await run_sample(model, sample)
            except Exception as exc:  # recorded, and the task decides whether to fail
                record = {"id": sample.id, "error": f"{type(exc).__name__}: {exc}", "gold": sample.gold}
            on_record(record)
        if on_progress is not None and time.monotonic() - last >= progress_interval_s:
            last = time.monotonic()
            on_progress(model.stats.as_dict())

    await asyncio.gather(*(one(s) for s in samples))
