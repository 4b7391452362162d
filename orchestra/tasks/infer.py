"""Infer task script: ``python -m orchestra.tasks.infer <run>/tasks/<task_id>.py``.

Runs the spec's model over each of its dataset shards and writes one prediction file per
shard.  The samples of all shards run together on one engine (no barrier between shards);
each finished sample is appended to its shard's checkpoint before it counts as done, so a
killed task resumes where it stopped and re-sends only what was in flight.

A shard with failed samples is not finalized and the task fails, unless the failed
fraction is within ``error_tolerance``; the task's retry then re-sends only the failed
samples.  Live counters go to ``<run>/events.jsonl`` as ``progress`` events (see
:func:`progress_event_fields`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from orchestra.datasets.base import build_dataset
from orchestra.errors import TaskFailedError
from orchestra.events import EventLog
from orchestra.fileio import remove_stale_temps, sealed_meta, stable_hash
from orchestra.inference.checkpoint import Checkpoint
from orchestra.inference.engine import Engine, SampleJob
from orchestra.models.base import task_units
from orchestra.models.registry_cache import get_model
from orchestra.paths import RunPaths
from orchestra.tasks.spec import TaskSpec, Unit, output_done

PROGRESS_INTERVAL_S = 2.0
#: After SIGTERM the task exits within this many seconds (plus its models' ``stop_grace_s``),
#: even when the model is stuck in a call that cancelling cannot interrupt (a load, a
#: generate step in a thread).  Checkpointed samples are already on disk.
STOP_GRACE_S = 1.5
_stop_grace_s: list[float] = [0.0]  # the models' extra time, set when a model is bound
LOG_INTERVAL_S = 10.0


@dataclass
class _UnitRun:
    unit: Unit
    ckpt: Checkpoint
    num_samples: int


def progress_event_fields(spec: TaskSpec, snapshot: dict[str, Any]) -> dict[str, Any]:
    """The fields of one ``progress`` event: who, and the engine's live counters."""
    return {"task_id": spec.task_id, "stage": "infer", "model": spec.model_abbr,
            "attempt": int(os.environ.get("ORCHESTRA_ATTEMPT", "1")), **snapshot}


def _format(snap: dict[str, Any]) -> str:
    rate = f", pace {snap['rate_limit_rps']:.1f} req/s" if "rate_limit_rps" in snap else ""
    if "batches_submitted" in snap:
        rate += (f"; batches: {snap['batches_submitted']} submitted, {snap['batches_in_progress']} in progress, "
                 f"{snap['batches_completed']} completed")
    return (f"{snap['samples_done']}/{snap['samples_total']} samples done, {snap['samples_failed']} failed; "
            f"requests: {snap['in_flight']} in flight, {snap['requests_done']} done, {snap['rate_limited']} "
            f"answered 429, {snap['retries']} retries, {snap['errors']} errors{rate}")


async def _run_units(spec: TaskSpec) -> None:
    paths = RunPaths(spec.run_dir)
    events = EventLog(paths.events)
    t0 = time.monotonic()
    model = get_model(spec.model)
    _stop_grace_s[0] = max(_stop_grace_s[0], float(model.stop_grace_s))
    model.bind_task(spec.run_dir, spec.task_id, lambda event, **fields: events.emit(
        event, task_id=spec.task_id, stage="infer", model=spec.model_abbr, **fields))
    print(f"[{spec.task_id}] model {spec.model_abbr} ready in {time.monotonic() - t0:.2f} s", flush=True)
    tolerance = float(spec.task_cfg.get("error_tolerance", 0.0))
    max_samples = spec.task_cfg.get("max_samples")
    runs: list[_UnitRun] = []
    jobs: list[SampleJob] = []
    already = 0
    sealed_failed = 0  # samples that failed within error_tolerance in shards an earlier attempt sealed
    try:
        for unit in spec.units:
            if output_done(unit.output, unit.hash):
                print(f"[{spec.task_id}] {unit.name}: already done", flush=True)
                sealed_failed += _failed_in(unit.output)
                continue
            dataset = build_dataset(unit.dataset)
            dataset.bind_run(paths.shared)
            samples = dataset.build_samples(unit.start, unit.end)
            ckpt = Checkpoint(paths.checkpoint(unit.output), unit.hash)  # the writer's lock (waits a while)
            if output_done(unit.output, unit.hash):  # sealed by the earlier attempt whose end it waited for
                ckpt.close()
                print(f"[{spec.task_id}] {unit.name}: already done", flush=True)
                sealed_failed += _failed_in(unit.output)
                continue
            ckpt.open()  # before anything is sent
            done = ckpt.done_ids()
            todo = [s for s in samples if s.id not in done]
            already += len(samples) - len(todo)
            print(f"[{spec.task_id}] {unit.name}: {len(samples)} samples, {len(samples) - len(todo)} from "
                  f"checkpoint, {len(todo)} to run", flush=True)
            runs.append(_UnitRun(unit, ckpt, len(samples)))
            tag = unit_tag(spec.run_dir, unit)
            jobs.extend(SampleJob(s, ckpt.append, tag) for s in todo)
        remove_stale_temps(run.unit.output for run in runs)  # an earlier attempt killed as it wrote; ours: the locks

        last_log = time.monotonic()

        def progress(snap: dict[str, Any]) -> None:
            nonlocal last_log
            # the task's failed samples, sealed shards' too: the progress line shows them once it is done
            snap = {**snap, "samples_failed": snap["samples_failed"] + sealed_failed}
            events.emit("progress", **progress_event_fields(spec, snap))
            if time.monotonic() - last_log >= LOG_INTERVAL_S:
                last_log = time.monotonic()
                print(f"[{spec.task_id}] {_format(snap)}", flush=True)

        engine = Engine(model, max_samples=max_samples, on_progress=progress,
                        progress_interval_s=PROGRESS_INTERVAL_S, already_done=already)
        t1 = time.monotonic()
        task_units.set(frozenset(unit_tag(spec.run_dir, run.unit) for run in runs))
        if jobs:
            await engine.run(jobs)
            print(f"[{spec.task_id}] ran {len(jobs)} samples in {time.monotonic() - t1:.2f} s: "
                  f"{_format(engine.snapshot())}", flush=True)
    finally:
        for run in runs:
            run.ckpt.close()
        await model.aclose()
    failures: list[str] = []
    for run in runs:
        unit, ckpt = run.unit, run.ckpt
        errors = ckpt.errors()
        if errors and len(errors) > tolerance * run.num_samples:
            first = min(errors, key=lambda r: r["id"])
            failures.append(f"{unit.name}: {len(errors)}/{run.num_samples} samples failed "
                            f"(first: sample {first['id']}: {first['error']})")
            continue
        ckpt.finalize(unit.output, {"task_id": spec.task_id, "model": spec.model_abbr,
                                    "dataset": unit.dataset_abbr, "start": unit.start, "end": unit.end,
                                    "failed": len(errors)})
    if failures:
        raise TaskFailedError("; ".join(failures))


def _failed_in(output: str) -> int:
    """How many samples of the sealed prediction file ``output`` failed (within ``error_tolerance``)."""
    failed = (sealed_meta(output) or {}).get("failed")
    return failed if isinstance(failed, int) and not isinstance(failed, bool) else 0


def unit_tag(run_dir: str, unit: Unit) -> str:
    """The tag of a prediction file that batch mode puts into its requests' ids: its place in the
    run folder, so the same whichever task (and task id) holds it."""
    return stable_hash(os.path.relpath(unit.output, run_dir), 8)


def run_task(spec: TaskSpec) -> None:
    """Run one infer task in this process (raises on failure).  SIGTERM (the runner stopping
    the task: Ctrl-C, a timeout) cancels it, so the model can stop what it started elsewhere
    (batch mode cancels its batches) and every checkpoint is closed before the task exits."""

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        # Only a task process of its own: in-process (--debug) the orchestrator's handler stays.
        handled = (threading.current_thread() is threading.main_thread() and task is not None
                   and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
        terminated: list[bool] = []

        def on_term(signum: int, frame: Any) -> None:
            # A plain handler, not loop.add_signal_handler: it runs even while the loop is
            # blocked (a model loading), and it arms the deadline that ends the process if
            # cancelling does not (a call in a thread cannot be interrupted).
            if terminated:
                return
            terminated.append(True)
            threading.Thread(target=_exit_after, args=(spec.task_id, STOP_GRACE_S + _stop_grace_s[0]),
                             name="orchestra-stop-deadline", daemon=True).start()
            if task is not None:
                loop.call_soon_threadsafe(task.cancel)

        previous = signal.signal(signal.SIGTERM, on_term) if handled else None
        try:
            await _run_units(spec)
        except asyncio.CancelledError:
            if not terminated:
                raise  # Ctrl-C in-process (--debug): asyncio.run turns it back into KeyboardInterrupt
            raise TaskFailedError("stopped (SIGTERM) before the end; finished samples are checkpointed") from None
        finally:
            if handled:
                signal.signal(signal.SIGTERM, previous)

    asyncio.run(main())


def _exit_after(task_id: str, seconds: float) -> None:
    """End the process ``seconds`` after SIGTERM if it has not ended by itself."""
    time.sleep(seconds)
    print(f"[{task_id}] FAILED: stopped (SIGTERM); the model did not stop within {seconds:.1f} s, so the task "
          "exits now; finished samples are checkpointed", file=sys.stderr, flush=True)
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    from orchestra.tasks.entry import task_main

    return task_main(argv, run_task)


if __name__ == "__main__":
    sys.exit(main())
