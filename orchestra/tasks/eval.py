"""Eval task script: ``python -m orchestra.tasks.eval <run>/tasks/<task_id>.py``.

Scores every shard's predictions of a dataset together and writes the dataset's results
(metrics, their standard errors and intervals (:mod:`orchestra.tasks.errorbars`), with the
content hash) and per-sample details.

Heavy evaluators (sandboxed code, judge models) score samples concurrently; each verdict
is appended to a checkpoint (``results/<model>/<dataset>.json.ckpt``) before it counts, so
a killed eval resumes without scoring finished samples again.  What is in force (the
sandbox's isolation and limits, the judge model) is printed to the task log and written to
``events.jsonl`` as a ``scorer`` event before the first sample; live counters go there as
``progress`` events.  Samples that could not be scored fail the task with one line, and
its retry scores only those.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from typing import Any

from orchestra.datasets.base import build_dataset
from orchestra.datasets.digest import prompt_digest
from orchestra.errors import TaskFailedError
from orchestra.evaluators import HeavyEvaluator, build_evaluator
from orchestra.evaluators.heavy import details_of, run_verdicts
from orchestra.events import EventLog
from orchestra.fileio import atomic_write_json, atomic_write_jsonl, read_sealed_jsonl, remove_stale_temps
from orchestra.inference.checkpoint import Checkpoint
from orchestra.paths import RunPaths
from orchestra.tasks.errorbars import evaluator_estimates, lmeval_estimates
from orchestra.tasks.spec import TaskSpec, Unit, output_done

PROGRESS_INTERVAL_S = 2.0
LOG_INTERVAL_S = 10.0


def _load_records(spec: TaskSpec, unit: Unit) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path, expected in unit.inputs:
        if not output_done(path, expected):
            raise TaskFailedError(
                f"{unit.dataset_abbr}: predictions {os.path.relpath(path, spec.run_dir)} are missing or "
                "from other settings (did its infer task fail?)"
            )
        sealed = read_sealed_jsonl(path)
        if sealed is None:  # damaged since it was checked
            raise TaskFailedError(f"{unit.dataset_abbr}: predictions {path} are damaged; run infer again")
        records.extend(sealed[1])
    return records


async def _score_heavy(spec: TaskSpec, unit: Unit, evaluator: HeavyEvaluator, records: list[dict[str, Any]],
                       paths: RunPaths) -> tuple[dict[str, float], list[dict[str, Any]], dict[str, Any]]:
    events = EventLog(paths.events)
    where = {"task_id": spec.task_id, "stage": "eval", "model": spec.model_abbr, "dataset": unit.dataset_abbr}
    info = await evaluator.start()  # a UserError here (no isolation available) fails the task in one line
    try:
        print(f"[{spec.task_id}] {unit.dataset_abbr}: {evaluator.describe_line(info)}", flush=True)
        events.emit("scorer", **where, **info)
        ckpt = Checkpoint(paths.checkpoint(unit.output), unit.hash)
        try:
            done = ckpt.done_ids()
            todo = [r for r in records if int(r["id"]) not in done]
            print(f"[{spec.task_id}] {unit.dataset_abbr}: {len(records)} samples, {len(records) - len(todo)} from "
                  f"checkpoint, {len(todo)} to score", flush=True)
            counts = {"done": len(records) - len(todo), "failed": 0}

            def on_verdict(rid: int, verdict: dict[str, Any]) -> None:
                ckpt.append({"id": rid, **verdict})  # durable first, then counted
                counts["failed" if "error" in verdict else "done"] += 1

            def snapshot() -> dict[str, Any]:
                return {**where, "samples_total": len(records), "samples_done": counts["done"],
                        "samples_failed": counts["failed"], **evaluator.snapshot()}

            async def tick() -> None:
                last_log = time.monotonic()
                while True:
                    await asyncio.sleep(PROGRESS_INTERVAL_S)
                    snap = snapshot()
                    events.emit("progress", **snap)
                    if time.monotonic() - last_log >= LOG_INTERVAL_S:
                        last_log = time.monotonic()
                        print(f"[{spec.task_id}] {unit.dataset_abbr}: {snap['samples_done']}/{len(records)} scored, "
                              f"{snap['samples_failed']} could not be", flush=True)

            t0 = time.monotonic()
            ticker = asyncio.ensure_future(tick())
            try:
                await run_verdicts(evaluator, todo, on_verdict)
            finally:
                ticker.cancel()
            events.emit("progress", **snapshot())
            print(f"[{spec.task_id}] {unit.dataset_abbr}: scored {len(todo)} samples in {time.monotonic() - t0:.2f} s",
                  flush=True)
        finally:
            ckpt.close()
    finally:
        await evaluator.aclose()
    errors = sorted(ckpt.errors(), key=lambda r: int(r["id"]))
    if errors:
        raise TaskFailedError(f"{unit.dataset_abbr}: {len(errors)}/{len(records)} samples could not be scored "
                              f"(first: sample {errors[0]['id']}: {errors[0]['error']}); a retry scores only those")
    verdicts = {int(r["id"]): r for r in ckpt.records.values()}
    metrics = evaluator.aggregate(records, verdicts)
    extra: dict[str, Any] = {"scorer": info}
    statuses = getattr(evaluator, "statuses", None)
    if callable(statuses):
        extra["statuses"] = statuses(verdicts)
    return metrics, details_of(records, verdicts), extra


def _run_heavy(spec: TaskSpec, unit: Unit, evaluator: HeavyEvaluator, records: list[dict[str, Any]],
               paths: RunPaths) -> tuple[dict[str, float], list[dict[str, Any]], dict[str, Any]]:
    """:func:`_score_heavy` on its own event loop; SIGTERM (the runner stopping the task)
    cancels it, so every sandbox is killed and removed before the task exits."""

    async def main() -> tuple[dict[str, float], list[dict[str, Any]], dict[str, Any]]:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        handled = threading.current_thread() is threading.main_thread()
        if handled and task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await _score_heavy(spec, unit, evaluator, records, paths)
        except asyncio.CancelledError:
            raise TaskFailedError(
                f"{unit.dataset_abbr}: stopped before the end; finished samples are checkpointed") from None
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGTERM)

    return asyncio.run(main())


def _own_score(unit: Unit, records: list[dict[str, Any]]
               ) -> tuple[dict[str, float], list[dict[str, Any]], dict[str, Any]] | None:
    """The dataset's own scoring (lm-eval tasks score with lm-eval), or None."""
    try:
        return build_dataset(unit.dataset).score(records)
    except NotImplementedError:
        return None


def run_task(spec: TaskSpec) -> None:
    """Run one eval task in this process (raises on failure)."""
    paths = RunPaths(spec.run_dir)
    for unit in spec.units:
        records = _load_records(spec, unit)
        evaluator_cfg = (unit.dataset.get("eval_cfg") or {}).get("evaluator", "accuracy")
        evaluator = build_evaluator(evaluator_cfg)
        extra: dict[str, Any] = {}
        own = _own_score(unit, records)
        if own is not None:
            metrics, details, extra = own
        elif isinstance(evaluator, HeavyEvaluator):
            metrics, details, extra = _run_heavy(spec, unit, evaluator, records, paths)
        else:
            metrics, details = evaluator.score(records)
        if own is not None:
            estimates = lmeval_estimates(metrics, details, len(records))
        else:
            estimates = evaluator_estimates(unit.dataset, evaluator, records, metrics, details)
        details = _keyed(unit, records, details)
        # one attempt of a task at a time: a temporary file of these outputs is an earlier, killed one's
        remove_stale_temps([paths.details(spec.model_abbr, unit.dataset_abbr), unit.output])
        atomic_write_jsonl(paths.details(spec.model_abbr, unit.dataset_abbr), details)
        atomic_write_json(
            unit.output,
            {
                "hash": unit.hash,
                "model": spec.model_abbr,
                "dataset": unit.dataset_abbr,
                "metrics": metrics,
                "estimates": estimates,
                "num_samples": len(records),
                "num_failed_samples": len([r for r in records if r.get("error") is not None]),
                # the predictions scored, by their hash: a later -r that makes them again leaves
                # this result stale, and `orchestra compare` can tell (paths relative to the run)
                "inputs": [[os.path.relpath(path, spec.run_dir), digest] for path, digest in unit.inputs],
                **extra,
            },
        )
        if extra and own is None:  # the results carry every verdict now: the checkpoint has done its job
            ckpt = paths.checkpoint(unit.output)
            for path in (ckpt, ckpt + ".lock"):
                if os.path.exists(path):
                    os.unlink(path)
        shown = ", ".join(f"{k}={_shown(v)}" for k, v in metrics.items())
        print(f"[{spec.task_id}] {unit.dataset_abbr}: {shown}", flush=True)


def _keyed(unit: Unit, records: list[dict[str, Any]], details: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Details with each sample's ``key`` (its row's content: what ``orchestra compare`` aligns
    runs by) and ``prompt_sha`` (what the model was sent) after its ``id``, and for a
    log-likelihood sample ``choices_sha``: the continuations scored after the prompt (answer
    choices from the config or a ``continuation_template`` are no part of the row, yet another
    set of them is another question).  A dataset whose own scorer wrote keys (lm-eval) keeps its own."""
    prompts: dict[Any, str] = {}
    choices: dict[Any, str] = {}
    for rec in records:
        sent = rec.get("prompt", rec.get("turns"))
        if sent is not None:
            prompts[rec.get("id")] = prompt_digest(sent)
        if isinstance(rec.get("continuations"), list):
            choices[rec.get("id")] = prompt_digest(rec["continuations"])
    keys: list[str] | None = None
    out = []
    for row in details:
        if "key" in row:
            out.append(row)
            continue
        if keys is None:
            keys = build_dataset(unit.dataset).sample_keys() or []
        sid = row.get("id")
        head: dict[str, Any] = {"id": sid}
        if isinstance(sid, int) and 0 <= sid < len(keys):
            head["key"] = keys[sid]
        if sid in prompts:
            head["prompt_sha"] = prompts[sid]
        if sid in choices:
            head["choices_sha"] = choices[sid]
        out.append({**head, **row})
    return out


def _shown(value: Any) -> str:
    """A metric as the task log shows it: a number to four places, anything else (an evaluator
    of the user's own may return a grade or a list) as its short text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.4f}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def main(argv: list[str] | None = None) -> int:
    from orchestra.tasks.entry import task_main

    return task_main(argv, run_task)


if __name__ == "__main__":
    sys.exit(main())
