"""The Python API itself (``orchestra.run``, ``plan``, ``api.viz`` and what they return), driven from
Python with a real model (DeterministicModel) run by real LocalRunner subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import orchestra
from orchestra import api
from orchestra.errors import ConfigError, RunFolderBusyError, UserError
from orchestra.events import read_events
from orchestra.paths import RunPaths

REPO = Path(__file__).resolve().parents[2]


def config(load_s: float = 0.0) -> dict[str, Any]:
    """Two models of one dataset: ``good`` answers, ``bad`` fails to load on every attempt."""
    dataset = {"type": "orchestra.datasets.JsonlDataset", "abbr": "arith",
               "path": str(REPO / "configs/data/arith.jsonl"),
               "reader_cfg": {"input_columns": ["question"], "output_column": "answer", "test_range": "[0:4]"},
               "infer_cfg": {"prompt_template": "Question: {question}\nAnswer:",
                             "inferencer": {"type": "gen", "max_out_len": 16}},
               "eval_cfg": {"evaluator": {"type": "numeric_match"}}}
    model = "orchestra.models.fake.DeterministicModel"
    return {
        "models": [{"type": model, "abbr": "good", "load_s": load_s},
                   {"type": model, "abbr": "bad", "fail_always": True}],
        "datasets": [dataset],
        "infer": {"partitioner": {"type": "orchestra.partitioners.NaivePartitioner"},
                  "runner": {"type": "orchestra.runners.LocalRunner", "max_num_workers": 2,
                             "task": {"type": "orchestra.tasks.InferTask"}}},
        "eval": {"partitioner": {"type": "orchestra.partitioners.NaivePartitioner"},
                 "runner": {"type": "orchestra.runners.LocalRunner", "max_num_workers": 2,
                            "task": {"type": "orchestra.tasks.EvalTask"}}},
    }


def test_a_partly_failed_run_its_rows_dataframe_failures_viz_and_the_plan_of_its_rerun(tmp_path: Path) -> None:
    run = orchestra.run(config(), work_dir=str(tmp_path / "out"), quiet=True)
    assert (run.exit_code, run.status, run.ok) == (api.EXIT_FAILED, "failed", False)
    failed = {r.task_id: (r.state.value, r.reason) for r in run.failed}
    assert failed["infer_bad_arith"][0] == "failed"
    assert failed["eval_bad_arith"] == ("skipped", "predictions missing: predictions/bad/arith.jsonl")
    assert len(failed) == 2 and all(os.path.isabs(r.log_path) for r in run.failed)
    rows = run.rows()
    assert rows == [{"model": "good", "dataset": "arith", "metric": "numeric_match", "value": 1.0},
                    {"model": "bad", "dataset": "arith", "metric": "numeric_match", "value": None}]
    frame = run.to_pandas()
    assert list(frame.columns) == ["model", "dataset", "metric", "value"] and len(frame) == 2
    assert frame["value"].iloc[0] == 1.0 and frame["value"].isna().iloc[1]

    # viz rebuilds the same summary from the folder's saved config, and runs nothing
    events_before = (Path(run.run_dir) / "events.jsonl").read_bytes()
    again = api.viz(run.run_dir, quiet=True)
    assert (again.exit_code, again.rows(), again.results) == (api.EXIT_FAILED, rows, [])
    assert (Path(run.run_dir) / "events.jsonl").read_bytes() == events_before

    # the plan of a rerun in that folder: only the failed model's tasks, nothing written
    view = orchestra.plan(config(), work_dir=str(tmp_path / "out"), reuse=run.run_dir)
    assert view.existed and view.run_dir == run.run_dir
    assert [t.task_id for t in view.tasks["infer"]] == ["infer_bad_arith"]
    text = str(view)
    assert text.startswith(f"run folder: {run.run_dir} (reused)")
    assert "[infer] 1 task(s) to run, 1 output(s) reused, runner LocalRunner" in text
    assert "$ CUDA_VISIBLE_DEVICES=''" in text and "-m orchestra.tasks.infer" in text
    assert (Path(run.run_dir) / "events.jsonl").read_bytes() == events_before


def test_a_plan_of_many_tasks_is_summarised_unless_full(tmp_path: Path) -> None:
    cfg = config()
    cfg["models"] = [{"type": "orchestra.models.fake.DeterministicModel", "abbr": f"m{i}"} for i in range(25)]
    view = orchestra.plan(cfg, work_dir=str(tmp_path / "out"))
    short, full = view.render(), view.render(full=True)
    assert "25 tasks, 100 sample(s)" in short and "25 model(s); the first 20:" in short
    assert "... 5 more task(s) (--dry-run --list prints every task)" in short
    assert "infer_m24_arith" not in short and "infer_m24_arith" in full and "more task(s)" not in full
    assert not (tmp_path / "out").exists(), "a plan wrote the work dir"


def test_a_run_folder_held_by_another_orchestrator_is_refused(tmp_path: Path) -> None:
    first = orchestra.run(config(), work_dir=str(tmp_path / "out"), quiet=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, filelock; lock = filelock.FileLock(sys.argv[1]); lock.acquire(); "
         "print('held', flush=True); sys.stdin.read()", RunPaths(first.run_dir).lock],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunFolderBusyError, match="in use by another orchestrator"):
            orchestra.run(config(), work_dir=str(tmp_path / "out"), reuse=first.run_dir, quiet=True)
    finally:
        holder.communicate("", timeout=30)
    # the lock released, the same call reruns only what failed
    rerun = orchestra.run(config(), work_dir=str(tmp_path / "out"), reuse=first.run_dir, quiet=True)
    assert sorted(r.task_id for r in rerun.results) == ["eval_bad_arith", "infer_bad_arith"]


def test_bad_arguments_are_one_line_user_errors_before_anything_is_written(tmp_path: Path) -> None:
    work = str(tmp_path / "out")
    with pytest.raises(UserError, match="mode 'everything' is not valid; valid: all, infer, eval, viz"):
        orchestra.run(config(), work_dir=work, mode="everything")
    with pytest.raises(UserError, match="config must be a path or a dict, got int"):
        orchestra.run(42, work_dir=work)
    with pytest.raises(UserError, match="unknown keyword argument 'retry'"):
        orchestra.run(config(), work_dir=work, retry=3)
    with pytest.raises(ConfigError, match=r"<config dict>: infer\.runner: .*max_num_workers"):
        orchestra.run(config(), work_dir=work, **{"infer.runner.max_num_workers": 0})
    with pytest.raises(ConfigError, match=r"infer\.runner: .*max_num_workers"):
        orchestra.plan(config(), work_dir=work, cfg_options=["infer.runner.max_num_workers=-1"])
    assert not Path(work).exists()


def test_cfg_options_apply_to_a_dict_config(tmp_path: Path) -> None:
    view = orchestra.plan(config(), work_dir=str(tmp_path / "out"), cfg_options=["infer.runner.retry=2"])
    assert view.runners["infer"].retry == 2


SCRIPT = textwrap.dedent("""
    import json, sys
    import orchestra
    sys.path.insert(0, sys.argv[2])
    from tests.api.test_python_api import config
    run = orchestra.run(config(load_s=60), work_dir=sys.argv[1], quiet=True)
    print(json.dumps([run.exit_code, run.status, sorted(r.state.value for r in run.results)]), flush=True)
""")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, api.EXIT_INTERRUPTED), (signal.SIGHUP, api.EXIT_HANGUP)])
def test_a_signal_stops_a_python_api_run_within_seconds_and_it_returns_interrupted(
        tmp_path: Path, sig: signal.Signals, code: int) -> None:
    """A script calling ``orchestra.run`` gets a Run back (no traceback) with the shell's exit code,
    status ``interrupted`` and its tasks cancelled, once a Ctrl-C (or a hangup) reached it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "out"), str(REPO)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    events = tmp_path / "out"
    while not any(e["event"] == "started" and e["task_id"] == "infer_good_arith"
                  for p in events.glob("*/events.jsonl") for e in read_events(p)):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(sig)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 15, "the run took too long to stop"
    assert proc.returncode == 0, err
    exit_code, status, states = json.loads(out)
    assert (exit_code, status) == (code, "interrupted")
    assert "cancelled" in states and "done" not in states
    assert "Traceback" not in err


def test_mode_viz_and_eval_use_the_latest_run_folder_and_viz_refuses_a_folder_that_is_no_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "out"
    first = orchestra.run(config(), work_dir=str(work), quiet=True)
    shown = orchestra.run(config(), work_dir=str(work), mode="viz", quiet=True)
    assert (shown.run_dir, shown.rows(), shown.results) == (first.run_dir, first.rows(), [])
    view = orchestra.plan(config(), work_dir=str(work), mode="eval")
    assert view.existed and view.run_dir == first.run_dir
    assert len(list(work.iterdir())) == 1  # neither made a new run folder
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    with pytest.raises(UserError, match=f"--mode viz: {empty} holds no config.py"):
        api.viz(str(empty))
    monkeypatch.setitem(sys.modules, "pandas", None)  # pandas not installed
    with pytest.raises(UserError, match=r"Run.to_pandas\(\) needs pandas \(pip install pandas\)"):
        first.to_pandas()


def test_a_run_leaves_what_its_caller_froze_out_of_the_collector(tmp_path: Path) -> None:
    """A program that froze its own objects (``gc.freeze()``, as one does before forking workers)
    and then calls ``orchestra.run`` finds them still frozen after it (the run keeps its plan out
    of the collector with ``gc.freeze`` too; its ``gc.unfreeze`` handed the caller's back)."""
    import gc

    cfg = config()
    cfg["models"] = cfg["models"][:1]
    held = [[i] for i in range(1000)]  # the caller's objects
    gc.freeze()
    try:
        assert gc.get_freeze_count() >= len(held)
        run = orchestra.run(cfg, work_dir=str(tmp_path / "out"), quiet=True)
        assert run.ok, run.failed
        assert gc.isenabled()
        assert not any(obj is held for obj in gc.get_objects())  # still where no collection walks
    finally:
        gc.unfreeze()
