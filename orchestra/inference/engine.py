"""The inference engine: run samples concurrently on one asyncio loop.

Every sample is a coroutine, run by one of ``max_samples`` workers that pull from a shared
queue (no coroutine per waiting sample, so 100k samples cost nothing up front).  A
multi-turn sample is one coroutine that sends turn k+1 as soon as turn k returns, so
conversations never wait for each other.  Each finished sample goes to its job's
``on_record`` (the checkpoint append) *before* it counts as done; a sample that raises is
recorded with its error, never dropped.

While it runs, the engine reports live counters (requests in flight, done, 429s, retries,
errors, samples done/failed) every ``progress_interval_s`` and once at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestra.inferencers import get_inferencer
from orchestra.models.base import BaseModel, SampleTag, current_sample
from orchestra.requests import Sample

#: request counters of ``ModelStats`` reported as deltas over one engine run
_COUNTERS = ("done", "rate_limited", "retries", "errors")
#: counters a model may keep in ``ModelStats.extra``, also deltas: tokens (OpenAI usage names)
#: and ``oom_splits``, passes HFCausalLM split after running out of memory (docs/models.md)
_TOKENS = ("prompt_tokens", "completion_tokens", "oom_splits")


async def run_sample(model: BaseModel, sample: Sample) -> dict[str, Any]:
    """Run one sample to a prediction record, as its inferencer kind says."""
    return await get_inferencer(sample.kind, f"sample {sample.id}: kind").run(model, sample)


@dataclass(frozen=True)
class SampleJob:
    """One sample to run and where its record goes (its unit's checkpoint)."""

    sample: Sample
    on_record: Callable[[dict[str, Any]], None]
    unit: str = ""  # the tag of its prediction file (SampleTag.unit)


@dataclass
class EngineCounts:
    """Sample counts of one engine run."""

    total: int = 0
    done: int = 0
    failed: int = 0
    running: int = 0


class Engine:
    """Runs jobs on one model with at most ``max_samples`` samples in progress.

    Args:
        model: the model every job calls.
        max_samples: samples in progress at once (default: twice the model's concurrency,
            so that the next request is ready the moment a connection frees up).
        on_progress: called with :meth:`snapshot` every ``progress_interval_s`` and at the end.
        progress_interval_s: how often live counters are reported.
        already_done: samples finished before this run (from checkpoints), for the totals.
    """

    def __init__(
        self,
        model: BaseModel,
        max_samples: int | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        progress_interval_s: float = 2.0,
        already_done: int = 0,
    ) -> None:
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {max_samples}")
        self.model = model
        self.max_samples = max_samples or default_max_samples(model)
        self.on_progress = on_progress
        self.progress_interval_s = progress_interval_s
        self.already_done = already_done
        self.counts = EngineCounts()
        self._start_stats: dict[str, Any] = {}
        self._t0 = 0.0

    def snapshot(self) -> dict[str, Any]:
        """Live counters: samples of this task and the model's requests during this run.

        Keys: ``samples_total``, ``samples_done`` (checkpointed ones included),
        ``samples_failed``, ``samples_running``, ``in_flight``, ``requests_done``,
        ``rate_limited``, ``retries``, ``errors``, ``elapsed_s``, ``samples_resumed`` (from
        checkpoints), ``rate_limit_rps`` when the model paces its requests,
        ``prompt_tokens`` / ``completion_tokens`` when the model counts tokens, and
        ``oom_splits`` once a local model split a pass that ran out of memory.
        """
        stats = self.model.stats.as_dict()
        snap: dict[str, Any] = {
            "samples_total": self.counts.total + self.already_done,
            "samples_done": self.counts.done + self.already_done,
            "samples_failed": self.counts.failed,
            "samples_running": self.counts.running,
            "in_flight": stats.get("in_flight", 0),
            "requests_done": stats.get("done", 0) - self._start_stats.get("done", 0),
        }
        for key in _COUNTERS[1:]:
            snap[key] = stats.get(key, 0) - self._start_stats.get(key, 0)
        snap["samples_resumed"] = self.already_done
        for key in _TOKENS:
            if key in stats:
                snap[key] = stats[key] - self._start_stats.get(key, 0)
        for key, value in stats.items():
            if key.startswith("batches_"):  # batch mode: batches of this task (absolute)
                snap[key] = value
        rate = stats.get("rate_limit_rps")
        if rate:
            snap["rate_limit_rps"] = round(float(rate), 2)
        snap["elapsed_s"] = round(time.monotonic() - self._t0, 3)
        return snap

    async def run(self, jobs: Iterable[SampleJob]) -> EngineCounts:
        """Run every job; returns once each has a record (done or failed)."""
        todo = list(jobs)
        self.counts = EngineCounts(total=len(todo))
        self._start_stats = self.model.stats.as_dict()
        self._t0 = time.monotonic()
        it = iter(todo)

        async def worker() -> None:
            for job in it:  # the shared iterator hands each job to exactly one worker
                self.counts.running += 1
                current_sample.set(SampleTag(job.sample.id, job.unit))  # each worker runs in its own context
                try:
                    record = await run_sample(self.model, job.sample)
                except Exception as exc:  # recorded; the task decides whether to fail
                    record = {"id": job.sample.id, "error": f"{type(exc).__name__}: {exc}",
                              "gold": job.sample.gold}
                finally:
                    self.counts.running -= 1
                job.on_record(record)  # durable first, then counted
                if "error" in record:
                    self.counts.failed += 1
                else:
                    self.counts.done += 1

        ticker = asyncio.get_running_loop().create_task(self._tick()) if self.on_progress else None
        try:
            n = min(self.max_samples, len(todo))
            await asyncio.gather(*(worker() for _ in range(n)))
        finally:
            if ticker is not None:
                ticker.cancel()
        if self.on_progress is not None:
            self.on_progress(self.snapshot())
        return self.counts

    async def _tick(self) -> None:
        assert self.on_progress is not None
        self.on_progress(self.snapshot())
        while True:
            await asyncio.sleep(self.progress_interval_s)
            self.on_progress(self.snapshot())


def default_max_samples(model: BaseModel) -> int:
    """Samples in progress by default: enough to keep every connection busy, with spares."""
    conc = model.max_concurrency()
    return max(2 * conc, conc + 16)


async def run_samples(
    model: BaseModel,
    samples: Sequence[Sample],
    on_record: Callable[[dict[str, Any]], None],
    max_samples: int | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    progress_interval_s: float = 2.0,
) -> EngineCounts:
    """Run ``samples`` with at most ``max_samples`` in progress; report each record as it ends."""
    engine = Engine(model, max_samples, on_progress, progress_interval_s)
    return await engine.run(SampleJob(s, on_record) for s in samples)
