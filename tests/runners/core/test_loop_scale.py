"""The shared loop at 10,000 tasks (issue 23): nothing it does per round may grow with the tasks
already finished, and a freed slot is filled without waiting out a poll interval."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest
from fake_backend import BackendFailure, FakeBackend, eval_task, exits, infer_task, make_context, write_output

from orchestra.events import EventLog, read_events
from orchestra.runners.core import run
from orchestra.runners.core.run import PendingTask, Results, TaskResult, TaskState
from orchestra.summary.progress import StageProgress


class CountingStop(threading.Event):
    """The loop's stop flag, counting the waits between rounds made on it."""

    waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


class CheapPolls(FakeBackend):
    """A backend whose polls cost nothing (as LocalRunner's), so it refills a slot at once."""

    refill_at_once = True


@pytest.mark.parametrize("cheap", [True, False])
def test_a_slot_freed_in_a_round_is_filled_in_the_next_without_a_wait(tmp_path: Path, cheap: bool) -> None:
    script = {f"t{i}": [exits(0, polls=1)] for i in range(40)}
    backend = (CheapPolls if cheap else FakeBackend)(script, max_num_workers=1, poll_interval_s=0.01)
    ctx = make_context(tmp_path)
    ctx.stop = stop = CountingStop()
    results = backend.launch([infer_task(t) for t in script], ctx)
    assert [r.state for r in results] == [TaskState.DONE] * 40
    if cheap:  # each round one task starts and ends; the old loop waited a poll interval after every one
        assert stop.waits <= 1, stop.waits
    else:  # a backend whose poll asks a scheduler (squeue) keeps one poll round per interval
        assert stop.waits >= 39, stop.waits


def test_local_runner_polls_cheaply() -> None:
    from orchestra.runners.local import LocalRunner

    assert LocalRunner.refill_at_once and not FakeBackend.refill_at_once


def test_a_waiting_task_reads_each_input_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = make_context(tmp_path)
    inputs = tuple((ctx.paths.predictions("m", "ds", i), f"h{i}") for i in range(50))
    entry = PendingTask(eval_task("e", ctx, inputs), 1)
    reads: list[str] = []
    real = run.output_done
    monkeypatch.setattr(run, "output_done", lambda path, h: reads.append(path) or real(path, h))
    for path, h in inputs[:30]:
        write_output(path, h)
    assert entry.first_missing() == inputs[30][0]
    assert len(reads) == 31
    assert entry.first_missing() == inputs[30][0]  # only the first missing is looked at again
    assert len(reads) == 32
    for path, h in inputs[30:]:
        write_output(path, h)
    assert entry.first_missing() is None
    assert len(reads) == 52 and len(set(reads)) == 50


def test_result_counts_follow_each_result_as_it_changes() -> None:
    results = Results()
    results["a"] = TaskResult("a", "infer", TaskState.DONE, 1, "")
    results["b"] = TaskResult("b", "infer", TaskState.FAILED, 1, "")
    results["b"] = TaskResult("b", "infer", TaskState.CANCELLED, 1, "")
    assert {k: v for k, v in results.counts.items() if v} == {"done": 1, "cancelled": 1}


def test_progress_counts_samples_only_when_a_line_is_due(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = EventLog(str(tmp_path / "events.jsonl"))
    out = io.StringIO()
    bar = StageProgress("infer", [infer_task(f"t{i}") for i in range(100)], events.path, stream=out,
                        interval_s=3600)
    counted: list[Any] = []
    real = StageProgress.samples
    monkeypatch.setattr(StageProgress, "samples", lambda self: counted.append(1) or real(self))
    for done in range(100):  # every round of the loop brings new counts
        bar({"pending": 99 - done, "running": 1, "done": done})
    assert counted == [] and out.getvalue() == ""
    bar.close({"pending": 0, "running": 0, "done": 100})
    assert len(counted) == 1 and out.getvalue().startswith("[infer] ")


def test_the_first_round_starts_before_the_queued_lines_of_the_tasks_that_wait(tmp_path: Path) -> None:
    """Issue 40: the first tasks start before the ``queued`` lines of the tasks that wait are written
    (at 100,000 tasks, a second of formatting); each task's ``queued`` line still comes before its
    other lines, and every one carries the time the launch queued it.  ``ctx.begun`` tells a stage
    beside this one that the first round is done.  Before: all 50 lines came first."""
    script = {f"t{i}": [exits(0, polls=1)] for i in range(50)}
    backend = FakeBackend(script, max_num_workers=2)
    ctx = make_context(tmp_path)
    ctx.begun = threading.Event()
    results = backend.launch([infer_task(t) for t in script], ctx)
    assert [r.state for r in results] == [TaskState.DONE] * 50 and ctx.begun.is_set()
    log = read_events(ctx.paths.events)
    said = [(e["event"], e["task_id"]) for e in log]
    assert said[:4] == [("queued", "t0"), ("queued", "t1"), ("started", "t0"), ("started", "t1")]
    assert said[4:52] == [("queued", f"t{i}") for i in range(2, 50)]
    assert len({e["ts"] for e in log if e["event"] == "queued"}) == 1


def test_a_launch_that_raises_in_its_first_round_still_says_begun_and_each_task_queued_first(tmp_path: Path) -> None:
    """A backend that raises at the first submit: ``ctx.begun`` is set all the same (a stage beside
    it must not wait for good), and the tasks cancelled say ``queued`` before ``cancelled``."""
    ctx = make_context(tmp_path)
    ctx.begun = threading.Event()
    backend = FakeBackend({f"t{i}": [exits(0)] for i in range(5)}, max_num_workers=2, raise_on={"submit": 1})
    with pytest.raises(BackendFailure):
        backend.launch([infer_task(f"t{i}") for i in range(5)], ctx)
    assert ctx.begun.is_set()
    said: dict[str, list[str]] = {}
    for e in read_events(ctx.paths.events):
        said.setdefault(e["task_id"], []).append(e["event"])
    assert said == {f"t{i}": ["queued", "cancelled"] for i in range(5)}
