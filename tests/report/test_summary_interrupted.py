"""What the summary says of a task a run did not finish: cancelled by Ctrl-C, or left running
when the orchestrator was killed outright (``--mode viz`` then rebuilds the table from the
run folder alone).  Real CLI runs of a model slow enough to be caught mid-task."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, orchestra

from orchestra.events import read_events
from tests.helpers import wait_for


def _config(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(2)))
    cfg = folder / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='slow', batch_size=1, delay_s=60)]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(folder / 'out')!r}
""")
    return cfg


def _start(cfg: Path) -> tuple[subprocess.Popen[str], Path]:
    """The CLI, started; returns once its infer task has started (and the run folder)."""
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = [p for p in (cfg.parent / "out").glob("*") if p.is_dir()]
        if runs and any(e.get("event") == "started" for e in read_events(str(runs[0] / "events.jsonl"))):
            return proc, runs[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the infer task never started")


def _pids_of(run: Path) -> list[int]:
    """Processes whose command line names ``run`` (a task of the killed orchestrator)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if str(run).encode() in f.read():
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


def _missing_line(run: Path) -> str:
    (line,) = [ln for ln in (run / "summary" / "summary.md").read_text().splitlines() if ln.startswith("- slow")]
    return line


def test_ctrl_c_names_the_cancelled_task_and_its_log(tmp_path: Path) -> None:
    proc, run = _start(_config(tmp_path))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert _missing_line(run) == ("- slow / rows: infer task infer_slow_rows was cancelled; "
                                  "log: logs/infer/infer_slow_rows.log")
    assert "infer task infer_slow_rows was cancelled" in out


def test_viz_after_a_killed_orchestrator_says_the_task_did_not_finish(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    proc, run = _start(cfg)
    os.kill(proc.pid, signal.SIGKILL)  # no stop, no event, no summary
    proc.communicate(timeout=30)
    for pid in _pids_of(run):  # a task the parent-death signal did not end yet
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not _pids_of(run), 30, "the killed run's tasks to be gone")  # none writes to the run now
    res = orchestra(cfg, "--mode", "viz")
    assert res.returncode == 1, res.stderr  # results are missing
    expected = ("- slow / rows: infer task infer_slow_rows did not finish (last state: started); "
                "log: logs/infer/infer_slow_rows.log")
    assert _missing_line(run) == expected and expected in res.stdout
