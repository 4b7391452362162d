"""A run folder's history as the report and the trace need it: every task, every attempt
(when, where, how it ended, its log tail) and what each model used.

Everything comes from ``events.jsonl`` and the task logs; nothing here changes the run.
A folder continued with ``-r`` holds several invocations of the orchestrator; attempts
keep the invocation they belong to.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from orchestra.events import iter_events
from orchestra.paths import RunPaths
from orchestra.summary.logs import read_sections
from orchestra.tasks.spec import TaskSpec

#: how an attempt ended; ``lost``: the orchestrator stopped without recording its end
OUTCOMES = ("done", "retried", "failed", "timed_out", "cancelled", "lost")
_TAIL_LINES = {"done": 6}
_TAIL_LINES_FAILED = 20


@dataclass
class Attempt:
    """One attempt of one task."""

    task_id: str
    stage: str
    attempt: int
    invocation: int
    start: float  # epoch seconds
    end: float | None = None
    outcome: str = "lost"
    exit_code: int | None = None
    reason: str = ""
    slot: int | None = None
    runner: str = ""
    where: dict[str, Any] = field(default_factory=dict)
    gpu_ids: list[str] = field(default_factory=list)
    tail: str = ""
    explanation: str = ""

    @property
    def duration_s(self) -> float:
        return max(0.0, (self.end if self.end is not None else self.start) - self.start)

    @property
    def host(self) -> str:
        return str(self.where.get("host") or self.where.get("node") or "")

    @property
    def lane(self) -> str:
        """The worker slot this attempt held, as the timeline names its row."""
        slot = f"worker {self.slot}" if self.slot is not None else "worker ?"
        return f"{self.host} · {slot}" if self.host else slot


@dataclass
class TaskRecord:
    """A task and where it ended up (in the latest invocation that planned it)."""

    task_id: str
    stage: str
    name: str = ""
    model: str = ""
    num_samples: int = 0
    num_gpus: int = 0
    state: str = "planned"  # queued | running | retrying | done | failed | cancelled | skipped | planned
    reason: str = ""
    log: str = ""
    attempts: list[Attempt] = field(default_factory=list)


@dataclass
class ModelUsage:
    """What one model's infer tasks used, summed over every attempt of every invocation."""

    model: str
    api: bool = False
    samples_done: int = 0
    samples_failed: int = 0
    requests: int = 0
    rate_limited: int = 0
    retries: int = 0
    errors: int = 0
    prompt_tokens: int | None = None  # None: the model does not count tokens
    completion_tokens: int | None = None
    task_s: float = 0.0  # wall seconds of its infer attempts
    gpu_s: float = 0.0  # GPU-seconds of its infer attempts


@dataclass
class Invocation:
    """One run of the orchestrator on this folder (``-r`` adds one)."""

    index: int
    started: float
    finished: float | None = None
    mode: str = ""
    interrupted: bool = False


@dataclass
class RunLog:
    """The history of a run folder."""

    invocations: list[Invocation]
    tasks: dict[str, TaskRecord]
    usage: dict[str, ModelUsage]
    #: (ts, event, task_id, samples_done) of every run_started, progress and done event, in
    #: order: the trace's sample counters, without a second pass over events.jsonl
    sample_marks: list[tuple[float, str, str, int]] = field(default_factory=list)

    @property
    def attempts(self) -> list[Attempt]:
        return sorted((a for t in self.tasks.values() for a in t.attempts), key=lambda a: (a.start, a.task_id))


def _outcome(ev: dict[str, Any]) -> str:
    kind = ev["event"]
    if kind in ("retry", "failed") and ev.get("timed_out"):
        return "timed_out"
    return {"retry": "retried", "done": "done", "failed": "failed", "cancelled": "cancelled"}[kind]


def read_run(paths: RunPaths, api_models: set[str] | frozenset[str] = frozenset(), logs: bool = True) -> RunLog:
    """Read a run folder's events (and, with ``logs``, each attempt's log tail)."""
    invocations: list[Invocation] = []
    tasks: dict[str, TaskRecord] = {}
    open_attempts: dict[tuple[int, str, int], Attempt] = {}
    progress: dict[tuple[int, str, Any], dict[str, Any]] = {}  # (invocation, task, attempt) -> latest
    last_ts = 0.0
    marks: list[tuple[float, str, str, int]] = []
    for ev in iter_events(paths.events):
        kind, ts = ev.get("event"), float(ev.get("ts") or 0.0)
        last_ts = max(last_ts, ts)
        if kind in ("run_started", "progress", "done"):
            marks.append((ts, str(kind), str(ev.get("task_id")), int(ev.get("samples_done") or 0)))
        if kind == "run_started":
            invocations.append(Invocation(len(invocations), ts, mode=str(ev.get("mode", ""))))
            continue
        if not invocations:  # events written without a run_started (a runner used on its own)
            invocations.append(Invocation(0, ts))
        inv = invocations[-1]
        if kind == "run_finished":
            inv.finished, inv.interrupted = ts, bool(ev.get("interrupted"))
            continue
        task_id = ev.get("task_id")
        if not isinstance(task_id, str):
            continue
        rec = tasks.get(task_id)
        if rec is None:
            rec = tasks[task_id] = TaskRecord(task_id, str(ev.get("stage", "")))
        if kind == "progress":
            progress[(inv.index, task_id, ev.get("attempt"))] = ev
            rec.model = rec.model or str(ev.get("model") or "")
            continue
        if ev.get("name"):
            rec.name = str(ev["name"])
        if ev.get("model"):
            rec.model = str(ev["model"])
        if kind == "queued":
            rec.state, rec.reason = "queued", ""
            rec.num_samples = int(ev.get("samples") or rec.num_samples)
            rec.num_gpus = int(ev.get("num_gpus") or rec.num_gpus)
        elif kind == "started":
            number = int(ev.get("attempt") or 1)
            resources = ev.get("resources") or {}
            att = Attempt(task_id, rec.stage, number, inv.index, ts, slot=ev.get("slot"),
                          runner=str(ev.get("runner") or ""), where=dict(ev.get("where") or {}),
                          gpu_ids=[str(g) for g in resources.get("gpu_ids") or []])
            open_attempts[(inv.index, task_id, number)] = att
            rec.attempts.append(att)
            rec.state, rec.log = "running", str(ev.get("log") or rec.log)
        elif kind in ("done", "retry", "failed", "cancelled"):
            ended_no = ev.get("attempt")
            open_key = (inv.index, task_id, int(ended_no)) if ended_no is not None else None
            if open_key is None:  # older events: the task's one open attempt, if any
                open_key = next((k for k in open_attempts if k[:2] == (inv.index, task_id)), None)
            ended = open_attempts.pop(open_key) if open_key in open_attempts else None
            if ended is not None:
                ended.end, ended.outcome = ts, _outcome(ev)
                ended.exit_code = ev.get("exit_code", 0 if kind == "done" else None)
                ended.reason = str(ev.get("reason") or ("cancelled" if kind == "cancelled" else ""))
                if ended.slot is None and ev.get("slot") is not None:
                    ended.slot = ev["slot"]
            rec.state = "retrying" if kind == "retry" else kind
            rec.reason = str(ev.get("reason") or ("cancelled" if kind == "cancelled" else ""))
            rec.log = str(ev.get("log") or rec.log)
        elif kind == "skipped":
            rec.state, rec.reason = "skipped", str(ev.get("reason") or "")
    for att in open_attempts.values():  # no end recorded: the orchestrator was stopped hard
        inv = invocations[att.invocation]
        att.end = inv.finished or last_ts
    _fill_from_specs(paths, tasks)
    if logs:
        _read_logs(paths, tasks)
    return RunLog(invocations, tasks, _usage(tasks, progress, api_models), marks)


def _fill_from_specs(paths: RunPaths, tasks: dict[str, TaskRecord]) -> None:
    """Names, models and sizes that older events did not carry, from the task specs."""
    for rec in tasks.values():
        if rec.name and rec.model and rec.num_samples:
            continue
        try:
            spec = TaskSpec.load(paths.task_spec(rec.task_id))
        except (OSError, ValueError, SyntaxError):
            rec.name = rec.name or rec.task_id
            continue
        rec.name = rec.name or spec.display_name
        rec.model = rec.model or spec.model_abbr
        rec.num_samples = rec.num_samples or spec.num_samples
        rec.num_gpus = rec.num_gpus or spec.num_gpus


def _read_logs(paths: RunPaths, tasks: dict[str, TaskRecord]) -> None:
    """Each attempt's log tail and failure line: the k-th attempt header in a task's log is
    the k-th attempt started (aligned from the end when only the log's end was read)."""
    for rec in tasks.values():
        if not rec.attempts:
            continue
        path = rec.log or paths.task_log(rec.stage, rec.task_id)
        if not rec.log and os.path.exists(path):
            rec.log = path
        sections = read_sections(path)
        for att, section in zip(reversed(rec.attempts), reversed(sections)):
            failed = att.outcome != "done"
            att.tail = section.tail(_TAIL_LINES_FAILED if failed else _TAIL_LINES["done"])
            if failed:
                att.explanation = section.explanation()
            if section.slurm:
                att.where = {**section.slurm, **att.where}


def _usage(tasks: dict[str, TaskRecord], progress: dict[tuple[int, str, Any], dict[str, Any]],
           api_models: set[str] | frozenset[str]) -> dict[str, ModelUsage]:
    usage: dict[str, ModelUsage] = {}

    def of(model: str) -> ModelUsage:
        if model not in usage:
            usage[model] = ModelUsage(model, api=model in api_models)
        return usage[model]

    for (_, task_id, _), ev in progress.items():  # every attempt's requests were made (and paid for)
        u = of(str(ev.get("model") or tasks[task_id].model))
        u.requests += int(ev.get("requests_done") or 0)
        u.rate_limited += int(ev.get("rate_limited") or 0)
        u.retries += int(ev.get("retries") or 0)
        u.errors += int(ev.get("errors") or 0)
        for key in ("prompt_tokens", "completion_tokens"):
            if key in ev:
                setattr(u, key, (getattr(u, key) or 0) + int(ev[key] or 0))
    latest: dict[str, dict[str, Any]] = {}
    for (_, task_id, _), ev in progress.items():  # in event order: the last one per task wins
        latest[task_id] = ev
    for rec in tasks.values():
        if rec.stage != "infer" or not rec.model:
            continue
        u = of(rec.model)
        ev = latest.get(rec.task_id, {})
        if rec.state == "done":  # failed samples within error_tolerance are counted as failed too
            u.samples_done += rec.num_samples
            u.samples_failed += int(ev.get("samples_failed") or 0)
        else:
            u.samples_done += int(ev.get("samples_done") or 0)
            u.samples_failed += int(ev.get("samples_failed") or 0)
        for att in rec.attempts:
            u.task_s += att.duration_s
            u.gpu_s += att.duration_s * len(att.gpu_ids)
    return usage
