"""A backend that runs nothing: each attempt's fate comes from a script, time from poll counts.

``FakeBackend`` opens a ``FakeSession`` whose ``submit``/``poll``/``cancel`` of many jobs call the
backend's per-job methods, each recorded, so tests of the shared scheduling loop can assert what
the loop asked of its backend (how many jobs at once, which were submitted and cancelled
together, which slots came back) without processes, threads or sleeps.  A ``submit`` call ends
with a ``flush`` entry in the trace (the end of one batch).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestra.events import EventLog
from orchestra.fileio import write_sealed_jsonl
from orchestra.paths import RunPaths
from orchestra.runners.base import BaseRunner, Exit, Job, Resources, RunContext, Session
from orchestra.tasks.spec import TaskSpec, Unit


@dataclass(frozen=True)
class Outcome:
    """The fate of one attempt.

    Args:
        code: exit code reported once the job has been polled ``polls`` times; None: it hangs.
        polls: polls until it ends (the poll that reports the exit counts).
        reason: the ``Exit.reason`` the backend reports with the code.
        submit_error: ``submit`` raises ``OSError(submit_error)`` instead of starting anything.
        write_outputs: the job writes its outputs, carrying their hashes, before it exits.
    """

    code: int | None = 0
    polls: int = 1
    reason: str = ""
    submit_error: str | None = None
    write_outputs: bool = False


def exits(code: int, polls: int = 1, reason: str = "") -> Outcome:
    return Outcome(code=code, polls=polls, reason=reason)


def writes(polls: int = 1) -> Outcome:
    """Write every output with its hash, then exit 0."""
    return Outcome(code=0, polls=polls, write_outputs=True)


HANG = Outcome(code=None)

#: polls of one job, and refusals of one task's ``acquire``, after which the test fails: the loop
#: has spun (for at least that many poll intervals) where every test expects a few rounds
MAX_POLLS_OF_A_JOB = 10_000
MAX_REFUSALS = 10_000


def submit_fails(message: str) -> Outcome:
    return Outcome(submit_error=message)


def write_output(path: str, expected_hash: str) -> None:
    """Write ``path`` the way a task does: carrying ``expected_hash`` where ``output_done`` reads it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if path.endswith(".jsonl"):
        write_sealed_jsonl(path, {"hash": expected_hash}, [{"prediction": "x"}])
        return
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"hash": expected_hash, "accuracy": 1.0}, f)


class BackendFailure(RuntimeError):
    """What a backend method raises when a test tells it to (not an OSError: a bug, not a start failure)."""


class FakeBackend(BaseRunner, Resources):
    """Runs nothing; ``script[task_id][attempt - 1]`` decides each attempt (a missing entry is a test error).

    Args:
        script: outcomes per task id, one per attempt.
        gpus: GPUs in the fake machine; ``acquire`` hands them out and returns None while too few are free.
        ctx: the run context, for ``stop_after_polls`` and ``stop_on_submit``.
        stop_after_polls: set ``ctx.stop`` once this many polls (all jobs together) have been made.
        stop_on_submit: set ``ctx.stop`` inside ``submit`` of this task id (a Ctrl-C arriving mid-round).
        raise_on: ``{method: n}``: the n-th call of that method raises ``BackendFailure``.
        cancel_polls: polls after its ``cancel`` before a cancelled job is reported gone.
        **loop: ``BaseRunner`` options (``max_num_workers``, ``retry``, ...); tiny intervals by default.
    """

    def __init__(self, script: dict[str, list[Outcome]], gpus: int = 0, ctx: RunContext | None = None,
                 stop_after_polls: int | None = None, stop_on_submit: str | None = None,
                 raise_on: dict[str, int] | None = None, cancel_polls: int = 0, **loop: Any) -> None:
        super().__init__(**{"poll_interval_s": 0.001, "retry_backoff_s": 0.0, **loop})
        self.script = script
        self.ctx = ctx
        self.stop_after_polls = stop_after_polls
        self.stop_on_submit = stop_on_submit
        self.raise_on = raise_on or {}
        self.cancel_polls = cancel_polls
        self.free_gpus = list(range(gpus))
        self.num_gpus = gpus
        # what the loop asked for
        self.trace: list[tuple[str, str]] = []  # (method, task_id or "")
        self.calls: dict[str, int] = {}
        self.submitted: list[tuple[str, int]] = []  # (task_id, attempt)
        self.submit_times: dict[tuple[str, int], float] = {}
        # the loop's clock mark of each job as its submit saw it (``job.started``: a timeout counts from it)
        self.started_marks: dict[tuple[str, int], float] = {}
        self.end_times: dict[tuple[str, int], float] = {}  # when poll reported the exit
        self.cancelled: list[list[tuple[str, int]]] = []  # one list per cancel call
        self.cancel_times: dict[tuple[str, int], float] = {}
        self.end_of_cancel = 0.0  # when the session last reported a cancelled job gone
        self.acquired: list[int] = []  # slot tokens handed out
        self.released: list[int] = []
        self.running: set[tuple[str, int]] = set()
        self.peak_running = 0
        self.gpu_owner: dict[int, str] = {}
        self.total_polls = 0
        self.batches: list[tuple[str, list[str]]] = []  # ("submit" | "poll", task ids): one per session call

    def _count(self, method: str, task_id: str = "") -> None:
        self.trace.append((method, task_id))
        self.calls[method] = self.calls.get(method, 0) + 1
        if self.raise_on.get(method) == self.calls[method]:
            raise BackendFailure(f"fake {method} failure")

    # -- resources ---------------------------------------------------------------------------
    def open(self, ctx: RunContext, tasks: Sequence[TaskSpec]) -> Session:
        return FakeSession(self)

    def unfit(self, task: TaskSpec) -> str | None:
        self._count("unfit", task.task_id)
        if task.num_gpus > self.num_gpus:
            return f"needs {task.num_gpus} GPU(s) but this runner has {self.num_gpus}"
        return None

    def acquire(self, task: TaskSpec) -> dict[str, Any] | None:
        self._count("acquire", task.task_id)
        if len(self.free_gpus) < task.num_gpus:
            refusals = self.trace.count(("acquire", task.task_id))
            assert refusals < MAX_REFUSALS, f"{task.task_id} refused {refusals} times: a slot never came back"
            return None
        gpus, self.free_gpus = self.free_gpus[: task.num_gpus], self.free_gpus[task.num_gpus:]
        for g in gpus:
            assert g not in self.gpu_owner, f"GPU {g} handed out twice"
            self.gpu_owner[g] = task.task_id
        token = len(self.acquired)
        self.acquired.append(token)
        return {"slot": token, "gpus": gpus}

    def release(self, job: Job, ended: Exit | None) -> None:
        self._count("release", job.task.task_id)
        self.released.append(job.resources["slot"])
        for g in job.resources["gpus"]:
            del self.gpu_owner[g]
            self.free_gpus.append(g)

    # -- jobs --------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        key = (job.task.task_id, job.attempt)
        self._count("submit", job.task.task_id)
        assert key not in self.submit_times, f"{key} submitted twice"
        self.submit_times[key] = time.monotonic()
        self.started_marks[key] = job.started
        self.submitted.append(key)
        attempts = self.script[job.task.task_id]
        assert job.attempt <= len(attempts), f"{key}: the script has only {len(attempts)} attempt(s)"
        outcome = attempts[job.attempt - 1]
        if self.stop_on_submit == job.task.task_id:
            assert self.ctx is not None
            self.ctx.stop.set()
        if outcome.submit_error is not None:
            raise OSError(outcome.submit_error)
        job.handle = {"outcome": outcome, "polls": 0}
        self.running.add(key)
        self.peak_running = max(self.peak_running, len(self.running))

    def poll(self, job: Job) -> Exit | None:
        key = (job.task.task_id, job.attempt)
        self._count("poll", job.task.task_id)
        assert key in self.running, f"{key} polled but not running"
        self.total_polls += 1
        if self.stop_after_polls is not None and self.total_polls >= self.stop_after_polls:
            assert self.ctx is not None
            self.ctx.stop.set()
        state = job.handle
        state["polls"] += 1
        assert state["polls"] < MAX_POLLS_OF_A_JOB, f"{key} polled {state['polls']} times: never timed out or stopped"
        outcome: Outcome = state["outcome"]
        if outcome.code is None or state["polls"] < outcome.polls:
            return None
        if outcome.write_outputs:
            for path, expected_hash in job.task.outputs:
                write_output(path, expected_hash)
        self.running.discard(key)
        self.end_times[key] = time.monotonic()
        return Exit(outcome.code, outcome.reason)

    def cancel(self, jobs: list[Job]) -> None:
        keys = [(job.task.task_id, job.attempt) for job in jobs]
        self._count("cancel", ",".join(k[0] for k in keys))
        self.cancelled.append(keys)
        for key in keys:
            assert key in self.running, f"{key} cancelled but not running"
            self.running.discard(key)
            self.cancel_times[key] = time.monotonic()

    def flush(self) -> None:
        self._count("flush")

    def close(self) -> None:
        self._count("close")


class FakeSession(Session):
    """The contract's batched calls over ``FakeBackend``'s recorded per-job methods."""

    def __init__(self, backend: FakeBackend) -> None:
        self.backend = backend
        self.resources = backend
        self.cancelling: dict[Job, int] = {}  # cancelled job -> polls left until it is reported gone

    def submit(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        refused = {}
        self.backend.batches.append(("submit", [job.task.task_id for job in jobs]))
        for job in jobs:
            try:
                self.backend.submit(job)
            except OSError as exc:
                refused[job] = Exit(-1, f"could not start: {exc}")
        self.backend.flush()
        return refused

    def poll(self, jobs: Sequence[Job]) -> Mapping[Job, Exit]:
        ended = {}
        self.backend.batches.append(("poll", [job.task.task_id for job in jobs]))
        for job in jobs:
            if job in self.cancelling:
                self.cancelling[job] -= 1
                if self.cancelling[job] < 0:
                    del self.cancelling[job]
                    ended[job] = Exit(-1, "cancelled")
                    self.backend.end_of_cancel = time.monotonic()
                continue
            got = self.backend.poll(job)
            if got is not None:
                ended[job] = got
        return ended

    def cancel(self, jobs: Sequence[Job]) -> None:
        started = [job for job in jobs if job.handle is not None]  # a submit that raised started no more
        if started:
            self.backend.cancel(started)
        self.cancelling.update(dict.fromkeys(jobs, self.backend.cancel_polls))

    def close(self) -> None:
        self.backend.close()


# -- tasks and runs ----------------------------------------------------------------------------
def make_context(tmp_path: Any) -> RunContext:
    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    return RunContext(paths, EventLog(paths.events))


def infer_task(task_id: str, ctx: RunContext | None = None, num_gpus: int = 0, shards: int = 0) -> TaskSpec:
    """An infer task; with ``shards`` > 0 it has that many units whose prediction files are in the run."""
    units = tuple(
        Unit(dataset={"type": "x.Dataset"}, dataset_abbr="ds", start=i * 10, end=(i + 1) * 10, shard=i,
             num_shards=shards, output=ctx.paths.predictions("m", "ds", i) if ctx else "", hash=f"h{i}", cost=10)
        for i in range(shards)
    )
    root = ctx.paths.root if ctx else ""
    return TaskSpec(stage="infer", task_id=task_id, run_dir=root, model={"abbr": "m"}, model_abbr="m",
                    units=units, num_gpus=num_gpus)


def eval_task(task_id: str, ctx: RunContext, inputs: tuple[tuple[str, str], ...]) -> TaskSpec:
    """An eval task scoring ``inputs`` (prediction file, hash) into one results file."""
    unit = Unit(dataset={"type": "x.Dataset"}, dataset_abbr="ds", start=0, end=20, shard=None, num_shards=1,
                output=ctx.paths.results("m", "ds"), hash="r1", cost=20, inputs=inputs)
    return TaskSpec(stage="eval", task_id=task_id, run_dir=ctx.paths.root, model={"abbr": "m"}, model_abbr="m",
                    units=(unit,))
