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


def _debug_config(load_s: float = 0.0) -> dict[str, object]:
    from tests.api.test_python_api import config

    cfg = config(load_s)
    cfg["models"] = cfg["models"][:1]  # the model that answers
    return cfg


def test_a_debug_run_runs_both_stages_in_this_process(tmp_path: Path) -> None:
    import orchestra

    run = orchestra.run(_debug_config(), work_dir=str(tmp_path / "out"), debug=True, quiet=True)
    assert run.status == "done" and [r.task_id for r in run.results] == ["infer_good_arith", "eval_good_arith"]
    assert run.rows()[0]["value"] == 1.0
    assert not list((tmp_path / "out").glob("*/logs/*/*.log"))  # the task wrote to this terminal


def test_a_debug_run_raises_the_tasks_own_error(tmp_path: Path) -> None:
    import orchestra
    from tests.api.test_python_api import config

    with pytest.raises(RuntimeError, match=r"model bad: configured to fail \(fail_always=True\)"):
        orchestra.run(config(), work_dir=str(tmp_path / "out"), debug=True, quiet=True)


DEBUG_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[2])
import orchestra
from tests.runners.local.test_inprocess import _debug_config
run = orchestra.run(_debug_config(load_s=60), work_dir=sys.argv[1], debug=True, quiet=True)
print(json.dumps([run.exit_code, [(r.task_id, r.state.value) for r in run.results]]), flush=True)
"""


def test_ctrl_c_interrupts_the_debug_task_itself_and_the_run_ends_cancelled(tmp_path: Path) -> None:
    """Ctrl-C reaches the task as KeyboardInterrupt (there is no child to signal): the run returns
    130 with that task cancelled and the eval stage not started, without a minute of loading."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from orchestra.events import read_events

    repo = str(Path(__file__).resolve().parents[3])
    proc = subprocess.Popen([sys.executable, "-c", DEBUG_SCRIPT, str(tmp_path / "out"), repo],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": repo})
    deadline = time.monotonic() + 60
    # (a debug task runs inside submit: its "started" event comes once it is over)
    while not any(e["event"] == "queued" for p in (tmp_path / "out").glob("*/events.jsonl")
                  for e in read_events(p)):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    time.sleep(1.5)  # inside the model's load
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 10, "the model's load ran on after Ctrl-C"
    assert proc.returncode == 0, err
    code, states = json.loads(out)
    assert (code, states) == (130, [["infer_good_arith", "cancelled"]])


def test_a_debug_tasks_started_event_comes_before_it_runs(tmp_path: Path) -> None:
    """The events (progress, trace.json, the report's timeline) must show a debug task running for
    as long as it ran: its ``started`` came only once it was over, a task of no duration."""
    import orchestra
    from orchestra.events import read_events

    run = orchestra.run(_debug_config(load_s=1.0), work_dir=str(tmp_path / "out"), debug=True, quiet=True)
    assert run.status == "done"
    events = [e for e in read_events(Path(run.run_dir) / "events.jsonl") if e.get("task_id") == "infer_good_arith"]
    ts = {e["event"]: e["ts"] for e in events}
    assert ts["done"] - ts["started"] >= 1.0, events
