"""Heavy evaluators: per-sample verdicts that are slow or dangerous (sandboxed code, judge models).

A heavy evaluator scores one prediction record at a time with ``await ajudge(record)``; the
eval task runs many of them concurrently (:func:`run_verdicts`) and appends each verdict to a
checkpoint before it counts, so a killed eval resumes without scoring finished samples again.
A verdict is a plain dict.  Three kinds of outcome are kept apart:

* a verdict: the sample was scored (a failing program and an unparsable judge answer are
  verdicts too, recorded with their reason);
* ``{"prediction_error": ...}``: inference failed for this sample; it counts as wrong;
* ``{"error": ...}``: the sample could not be scored (a judge call failed after its retries,
  a sandbox did not start, the sample has no tests).  The task fails with one line and its
  retry scores only these samples again.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from orchestra.evaluators.basic import BaseEvaluator

Verdict = dict[str, Any]


class HeavyEvaluator(BaseEvaluator):
    """An evaluator that scores samples concurrently, one awaited verdict each."""

    def judge(self, record: dict[str, Any]) -> dict[str, Any]:
        raise TypeError(f"{type(self).__name__} scores asynchronously: use ajudge() or score()")

    #: settings that change how fast scoring runs, never a verdict (left out of the hash)
    speed_keys: frozenset[str] = frozenset()

    @classmethod
    def identity(cls, cfg: dict[str, Any]) -> Any:
        """What the result's hash must cover: the settings that can change a verdict."""
        kept = {k: v for k, v in cfg.items() if k not in cls.speed_keys and k != "type"}
        return {"type": f"{cls.__module__}.{cls.__qualname__}", **kept}

    async def start(self) -> dict[str, Any]:
        """Get ready (choose the sandbox, build the judge model) and say what is in force, for
        the run log and the events; raise a ``UserError`` (one line) if it cannot run here."""
        return {}

    def describe_line(self, info: Mapping[str, Any]) -> str:
        """``info`` from :meth:`start` as one line for the task log."""
        return ", ".join(f"{k}={v}" for k, v in info.items())

    @abc.abstractmethod
    async def ajudge(self, record: dict[str, Any]) -> Verdict:
        """The verdict on one prediction record (raise to record an ``error``)."""

    @abc.abstractmethod
    def aggregate(self, records: list[dict[str, Any]], verdicts: Mapping[int, Verdict]) -> dict[str, float]:
        """Metrics (the headline first) from every record's verdict."""

    def metrics_of(self, records: list[dict[str, Any]], details: list[dict[str, Any]]) -> dict[str, float]:
        """:meth:`aggregate` of ``records`` with their details as the verdicts (no sample is
        judged again)."""
        return self.aggregate(records, {int(d["id"]): d for d in details})

    def max_concurrency(self) -> int:
        """Samples scored at once by one task."""
        return 16

    def snapshot(self) -> dict[str, Any]:
        """Live counters for progress events (sandboxes running, judge requests in flight)."""
        return {}

    async def aclose(self) -> None:
        """Release what :meth:`start` took."""

    async def verdict(self, record: dict[str, Any]) -> Verdict:
        """:meth:`ajudge`, with failed predictions and scoring errors turned into verdicts."""
        if record.get("error") is not None:
            return {"prediction_error": str(record["error"])}
        try:
            return await self.ajudge(record)
        except Exception as exc:  # recorded; the task fails at the end and is retried
            return {"error": f"{type(exc).__name__}: {exc}"}

    def score(self, records: list[dict[str, Any]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """Score ``records`` in one go, without a checkpoint (tests, scripts)."""

        async def go() -> dict[int, Verdict]:
            verdicts: dict[int, Verdict] = {}
            await self.start()
            try:
                await run_verdicts(self, records, lambda rid, v: verdicts.__setitem__(rid, v))
            finally:
                await self.aclose()
            return verdicts

        verdicts = asyncio.run(go())
        return self.aggregate(records, verdicts), details_of(records, verdicts)


async def run_verdicts(
    evaluator: HeavyEvaluator,
    records: Iterable[dict[str, Any]],
    on_verdict: Callable[[int, Verdict], None],
    max_concurrency: int | None = None,
) -> None:
    """Score every record with at most ``max_concurrency`` in progress; hand each verdict to
    ``on_verdict`` (the checkpoint append) as soon as it is ready."""
    todo = iter(list(records))
    workers = max(1, max_concurrency or evaluator.max_concurrency())

    async def worker() -> None:
        for record in todo:  # the shared iterator hands each record to one worker
            verdict = await evaluator.verdict(record)
            on_verdict(int(record["id"]), verdict)

    await asyncio.gather(*(worker() for _ in range(workers)))


def details_of(records: list[dict[str, Any]], verdicts: Mapping[int, Verdict]) -> list[dict[str, Any]]:
    """One details line per record: id, gold, prediction and its verdict."""
    out = []
    for rec in records:
        verdict = {k: v for k, v in verdicts.get(int(rec["id"]), {}).items() if k != "id"}
        out.append({"id": rec["id"], "gold": rec.get("gold"), "prediction": rec.get("prediction"), **verdict})
    return out
