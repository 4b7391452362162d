"""Paths of the one loop that the other loop tests never ran: a task whose own files cannot be
written, an attempt the backend says can never start, and a task waiting for inputs that never
come (``FakeBackend``, as in test_loop.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from fake_backend import FakeBackend, eval_task, exits, infer_task, make_context, write_output, writes

from orchestra.events import read_events
from orchestra.runners.base import CannotStart, RunContext, TaskResult, TaskState

OK = exits(0)


def by_id(results: list[TaskResult]) -> dict[str, TaskResult]:
    return {r.task_id: r for r in results}


def events_of(ctx: RunContext, task_id: str) -> list[dict[str, Any]]:
    return [e for e in read_events(ctx.paths.events) if e.get("task_id") == task_id]


def test_a_task_whose_log_cannot_be_written_fails_alone(tmp_path: Path) -> None:
    """Its log path is taken by a folder (planted, or a full disk for one file): that task fails,
    said in its result and events, and the others run (the launch ended with an OSError)."""
    ctx = make_context(tmp_path)
    os.makedirs(ctx.paths.task_log("infer", "blocked"))
    backend = FakeBackend({"blocked": [OK, OK], "other": [OK]}, retry=1)
    results = by_id(backend.launch([infer_task("blocked"), infer_task("other")], ctx))
    assert results["other"].state == TaskState.DONE
    assert results["blocked"].state == TaskState.FAILED
    assert results["blocked"].reason.startswith("could not start: ")
    assert [e["event"] for e in events_of(ctx, "blocked")] == ["queued", "retry", "failed"]
    assert ("blocked", 1) not in backend.submitted
    assert sorted(backend.released) == backend.acquired


def test_a_task_whose_spec_cannot_be_written_fails_alone(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    os.makedirs(ctx.paths.task_spec("blocked"))
    backend = FakeBackend({"blocked": [OK], "other": [OK]})
    results = by_id(backend.launch([infer_task("blocked"), infer_task("other")], ctx))
    assert results["other"].state == TaskState.DONE
    assert results["blocked"].state == TaskState.FAILED and "could not start" in results["blocked"].reason
    with open(ctx.paths.task_log("infer", "blocked"), encoding="utf-8") as f:
        assert "attempt 1 failed: could not start" in f.read()


class NoServer(FakeBackend):
    """``acquire`` of task ``doomed`` raises CannotStart (a managed server that failed to start)."""

    def acquire(self, task: Any) -> dict[str, Any] | None:
        if task.task_id == "doomed":
            raise CannotStart("no server for m: its replica exited with code 1")
        return super().acquire(task)


def test_an_attempt_that_can_never_start_fails_with_the_backends_reason(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    backend = NoServer({"doomed": [], "other": [OK]}, max_num_workers=1)
    results = by_id(backend.launch([infer_task("doomed"), infer_task("other")], ctx))
    assert (results["doomed"].state, results["doomed"].reason) == (
        TaskState.FAILED, "no server for m: its replica exited with code 1")
    assert results["other"].state == TaskState.DONE  # the one slot came back
    assert ("doomed", 1) not in backend.submitted


def test_a_task_waiting_for_inputs_is_skipped_once_the_stage_that_writes_them_is_over(tmp_path: Path) -> None:
    ctx = make_context(tmp_path)
    ctx.upstream = threading.Event()
    ctx.upstream.set()
    came = ctx.paths.predictions("m", "ds", 0)
    never = ctx.paths.predictions("m", "ds", 1)
    waits, starves = eval_task("waits", ctx, ((came, "h0"),)), eval_task("starves", ctx, ((never, "h1"),))
    backend = FakeBackend({"waits": [writes()], "starves": []})
    backend.INPUT_CHECK_S = 0.01

    def upstream_stage() -> None:
        time.sleep(0.2)
        write_output(came, "h0")
        time.sleep(0.3)
        assert ctx.upstream is not None
        ctx.upstream.clear()

    writer = threading.Thread(target=upstream_stage)
    writer.start()
    try:
        results = by_id(backend.launch([waits, starves], ctx))
    finally:
        writer.join()
    assert results["waits"].state == TaskState.DONE
    assert results["starves"].state == TaskState.SKIPPED
    assert results["starves"].reason == f"predictions missing: {os.path.relpath(never, ctx.paths.root)}"
    assert backend.submitted == [("waits", 1)]
