"""Infer task script: ``python -m orchestra.tasks.infer <run>/tasks/<task_id>.py``.

Runs the spec's model over each of its dataset shards and writes one prediction file per
shard.  Samples are checkpointed one by one, so a killed task resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from orchestra.datasets.info import build_dataset
from orchestra.errors import TaskFailedError
from orchestra.events import EventLog
from orchestra.inference.checkpoint import Checkpoint
from orchestra.inference.engine import run_samples
from orchestra.models.registry_cache import get_model
from orchestra.paths import RunPaths
from orchestra.tasks.spec import TaskSpec, output_done


async def _run_units(spec: TaskSpec) -> None:
    paths = RunPaths(spec.run_dir)
    events = EventLog(paths.events)
    t0 = time.monotonic()
    model = get_model(spec.model)
    print(f"[{spec.task_id}] model {spec.model_abbr} ready in {time.monotonic() - t0:.2f} s", flush=True)
    tolerance = float(spec.task_cfg.get("error_tolerance", 0.0))
    max_samples = spec.task_cfg.get("max_samples")
    failures: list[str] = []
    for unit in spec.units:
        if output_done(unit.output, unit.hash):
            print(f"[{spec.task_id}] {unit.name}: already done", flush=True)
            continue
        dataset = build_dataset(unit.dataset)
        samples = dataset.build_samples(unit.start, unit.end)
        ckpt = Checkpoint(paths.checkpoint(unit.output), unit.hash)
        done = ckpt.done_ids()
        todo = [s for s in samples if s.id not in done]
        print(f"[{spec.task_id}] {unit.name}: {len(samples)} samples, {len(done)} from checkpoint, "
              f"{len(todo)} to run", flush=True)

        def progress(stats: dict[str, Any], unit_name: str = unit.name) -> None:
            events.emit("progress", task_id=spec.task_id, stage="infer", unit=unit_name, **stats)

        t1 = time.monotonic()
        try:
            await run_samples(model, todo, ckpt.append, max_samples=max_samples, on_progress=progress)
        finally:
            ckpt.close()
        errors = [r for r in ckpt.records.values() if r.get("error") is not None]
        print(f"[{spec.task_id}] {unit.name}: ran {len(todo)} samples in {time.monotonic() - t1:.2f} s, "
              f"{len(errors)} failed", flush=True)
        if errors and len(errors) > tolerance * len(samples):
            first = min(errors, key=lambda r: r["id"])
            failures.append(f"{unit.name}: {len(errors)}/{len(samples)} samples failed "
                            f"(first: sample {first['id']}: {first['error']})")
            continue
        ckpt.finalize(unit.output, {"task_id": spec.task_id, "model": spec.model_abbr, "dataset": unit.dataset_abbr,
                                    "start": unit.start, "end": unit.end, "failed": len(errors)})
    await model.aclose()
    if failures:
        raise TaskFailedError("; ".join(failures))


def run_task(spec: TaskSpec) -> None:
    """Run one infer task in this process (raises on failure)."""
    asyncio.run(_run_units(spec))


def main(argv: list[str] | None = None) -> int:
    from orchestra.tasks.entry import task_main

    return task_main(argv, run_task)


if __name__ == "__main__":
    sys.exit(main())
