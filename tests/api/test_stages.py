"""orchestra/stages.py: the eval stage beside the infer stage, and what one stage's failure or a
stop does to the other (real LocalRunner subprocesses, a real model)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import orchestra
from orchestra.events import read_events
from orchestra.runners.base import RunContext
from orchestra.runners.core.contract import Session
from orchestra.runners.local.runner import LocalRunner
from orchestra.stages import StopOnSignals
from orchestra.tasks.spec import TaskSpec
from tests.api.test_python_api import config


class BrokenEvalRunner(LocalRunner):
    """A LocalRunner whose launch fails as it opens (a backend that cannot be reached)."""

    def open(self, ctx: RunContext, tasks: Sequence[TaskSpec]) -> Session:
        time.sleep(0.5)  # the infer stage has started its tasks by now
        raise RuntimeError("eval backend unreachable")


def test_an_eval_stage_that_breaks_stops_the_infer_stage_and_its_error_is_raised(tmp_path: Path) -> None:
    """With ``eval.overlap`` the eval stage runs in a thread: its error must stop inference at once
    (not after a minute of model loading) and reach the caller, as it would without overlap."""
    cfg = config(load_s=60)
    cfg["eval"]["runner"]["type"] = f"{__name__}.BrokenEvalRunner"
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="eval backend unreachable"):
        orchestra.run(cfg, work_dir=str(tmp_path / "out"), quiet=True)
    assert time.monotonic() - started < 30, "inference ran on after the eval stage broke"
    (events_file,) = (tmp_path / "out").glob("*/events.jsonl")
    ends = {e["task_id"]: e["event"] for e in read_events(events_file)
            if e["event"] in ("done", "failed", "cancelled")}
    assert ends["infer_good_arith"] == "cancelled"


def test_a_run_stopped_between_stages_starts_no_further_stage(tmp_path: Path) -> None:
    """Without overlap the eval stage follows inference; a stop that lands as inference ends
    (a Ctrl-C) must not start it."""
    cfg = config()
    cfg["eval"]["overlap"] = False
    cfg["infer"]["runner"]["type"] = f"{__name__}.StopsWhenDone"
    run = orchestra.run(cfg, work_dir=str(tmp_path / "out"), quiet=True)
    assert run.status == "interrupted"
    assert sorted(r.task_id for r in run.results) == ["infer_bad_arith", "infer_good_arith"]


class StopsWhenDone(LocalRunner):
    """A LocalRunner that sets the run's stop flag once its launch is over (a Ctrl-C just then)."""

    def launch(self, tasks: list[TaskSpec], ctx: RunContext) -> Any:
        try:
            return super().launch(tasks, ctx)
        finally:
            ctx.stop.set()


def test_a_stage_without_tasks_is_passed_over(tmp_path: Path) -> None:
    first = orchestra.run(config(), work_dir=str(tmp_path / "out"), quiet=True)
    cfg = config()
    cfg["models"] = cfg["models"][:1]  # only the model whose outputs exist: nothing to run
    again = orchestra.run(cfg, work_dir=str(tmp_path / "out"), reuse=first.run_dir, quiet=True)
    assert (again.status, again.results) == ("done", [])


def test_signals_outside_the_main_thread_are_left_alone() -> None:
    """Only the main thread may set signal handlers: a run started in another thread (a notebook's
    worker, a web app) runs without them instead of failing."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def body() -> None:
        try:
            with StopOnSignals(stop) as signals:
                assert signals._previous == {}
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert errors == []
