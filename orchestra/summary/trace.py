"""The run's timeline as a Chrome trace (Trace Event Format), for Perfetto or chrome://tracing.

One process per host (or runner), one thread per worker slot, one complete event ("X") per
attempt, named by the task's readable name and coloured by outcome; instant events mark
retries; counter tracks show samples done per stage over time and, where the local runner
sampled them (``gpu.jsonl``), each GPU's utilisation and memory.  Large runs that a page
cannot draw comfortably open fine in https://ui.perfetto.dev (drag the file in; it stays local).
"""

from __future__ import annotations

from typing import Any

from orchestra.fileio import atomic_write_text
from orchestra.paths import RunPaths
from orchestra.summary.gpu import gpu_counters
from orchestra.summary.runlog import RunLog

# Trace viewers' reserved colour names (catapult's colour scheme)
_COLOURS = {"done": "good", "retried": "bad", "failed": "terrible", "timed_out": "terrible",
            "cancelled": "grey", "lost": "grey"}


def build_trace(run: RunLog, paths: RunPaths) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``traceEvents`` in microseconds since the run began)."""
    attempts = run.attempts
    t0 = min([a.start for a in attempts] + [i.started for i in run.invocations] or [0.0])
    events: list[dict[str, Any]] = []
    pids: dict[str, int] = {}
    tids: set[tuple[int, int]] = set()

    def us(ts: float) -> int:
        return int(round((ts - t0) * 1e6))

    for a in attempts:
        host = a.host or a.runner or "orchestrator"
        if host not in pids:
            pids[host] = len(pids) + 1
            events.append({"ph": "M", "name": "process_name", "pid": pids[host], "tid": 0, "args": {"name": host}})
        pid, tid = pids[host], (a.slot if a.slot is not None else -1) + 1
        if (pid, tid) not in tids:
            tids.add((pid, tid))
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f"worker {tid - 1}" if tid else "worker ?"}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        task = run.tasks[a.task_id]
        args = {"task_id": a.task_id, "attempt": a.attempt, "outcome": a.outcome, "exit_code": a.exit_code,
                "duration_s": round(a.duration_s, 3), "model": task.model, "log": task.log}
        for key in ("reason", "explanation"):
            if getattr(a, key):
                args[key] = getattr(a, key)
        if a.gpu_ids:
            args["gpus"] = ",".join(a.gpu_ids)
        args.update({f"where.{k}": v for k, v in a.where.items()})
        events.append({"ph": "X", "name": task.name or a.task_id, "cat": f"{a.stage},{a.outcome}", "pid": pid,
                       "tid": tid, "ts": us(a.start), "dur": max(1, us(a.end or a.start) - us(a.start)),
                       "cname": _COLOURS.get(a.outcome, "grey"), "args": args})
        if a.outcome in ("retried", "timed_out", "failed") and a.end is not None:
            events.append({"ph": "i", "s": "t", "name": f"{a.outcome}: {a.explanation or a.reason}"[:200],
                           "pid": pid, "tid": tid, "ts": us(a.end)})
    events += _sample_counters(paths, run, us)
    events += gpu_counters(paths, us, len(pids) + 1)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run_folder": paths.root, "tasks": len(run.tasks), "attempts": len(attempts)}}


def _sample_counters(paths: RunPaths, run: RunLog, us: Any) -> list[dict[str, Any]]:
    """A counter per stage: samples done, from progress events and the tasks that finished."""
    out: list[dict[str, Any]] = []
    done: dict[str, dict[str, int]] = {"infer": {}, "eval": {}}
    totals: dict[str, int] = {}  # kept as ``done`` changes: summing it per event is quadratic
    for ts, kind, task_id, samples_done in run.sample_marks:
        if kind == "run_started":
            done, totals = {"infer": {}, "eval": {}}, {}
        rec = run.tasks.get(task_id)
        if rec is None:
            continue
        now = samples_done if kind == "progress" else rec.num_samples
        stage = done.setdefault(rec.stage, {})
        totals[rec.stage] = totals.get(rec.stage, 0) + now - stage.get(task_id, 0)
        stage[task_id] = now
        out.append({"ph": "C", "name": f"{rec.stage} samples done", "pid": 0, "tid": 0,
                    "ts": us(ts), "args": {"samples": totals[rec.stage]}})
    if out:
        out.insert(0, {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "progress"}})
    return out


def write_trace(run: RunLog, paths: RunPaths, path: str) -> None:
    """Write the trace JSON atomically to ``path``."""
    import json

    atomic_write_text(path, json.dumps(build_trace(run, paths), ensure_ascii=False, separators=(",", ":")))
