"""The in-process runner of ``--debug``: a task's own error keeps its type and traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestra.events import EventLog
from orchestra.paths import RunPaths
from orchestra.runners.base import RunContext
from orchestra.runners.local import inprocess
from orchestra.tasks.spec import TaskSpec


def test_an_oserror_inside_the_task_propagates_instead_of_reading_as_could_not_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(spec: TaskSpec) -> None:
        raise FileNotFoundError(2, "No such file or directory", "/data/missing.jsonl")

    monkeypatch.setattr(inprocess, "run_task", broken)
    paths = RunPaths(str(tmp_path / "run"))
    paths.make_dirs()
    ctx = RunContext(paths, EventLog(paths.events))
    task = TaskSpec(stage="infer", task_id="t", run_dir=paths.root, model={}, model_abbr="m", units=())
    with pytest.raises(FileNotFoundError) as info:
        inprocess.InProcessRunner().launch([task], ctx)
    assert info.value.filename == "/data/missing.jsonl"
    assert any(frame.name == "broken" for frame in info.traceback)  # the task's own frame is kept
