"""Ctrl-C / SIGTERM outside the window where tasks run: while a (slow) config loads and while a (large)
summary and report are built.  One line, exit 130, never a traceback or a silent 143."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROWS = 40_000  # x 2 datasets: the summary and report take ~1-2 s to build after the last task


def start(cfg: Path, extra_path: Path | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if extra_path is not None:  # where the config's own module is found (plain Python import path)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(extra_path)) if p)
    return subprocess.Popen([sys.executable, "run.py", str(cfg)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def check_one_line(proc: subprocess.Popen[str], out: str, err: str, sig: signal.Signals, before: str) -> None:
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    tail = err[err.rindex(before) + len(before):] if before else err
    # "run folder: ..." is said once the tasks are over, before the summary is built
    assert [line for line in tail.splitlines() if line.strip() and not line.startswith("run folder: ")] == [
        f"orchestra: {sig.name} received, stopped (files already written stay; -r continues the run)"], err[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_the_config_loads(tmp_path: Path, sig: signal.Signals) -> None:
    """The config's model class lives in a module that takes long to import (as a big one may)."""
    (tmp_path / "slow_models.py").write_text(
        "import pathlib, time\n"
        "pathlib.Path(__file__).with_name('importing').write_text('now')\n"
        "time.sleep(60)\n"
        "from orchestra.models import DeterministicModel as SlowModel\n")
    (tmp_path / "rows.jsonl").write_text(json.dumps({"question": "1 + 1", "answer": "2"}) + "\n")
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from slow_models import SlowModel
from orchestra.datasets import JsonlDataset

models = [dict(type=SlowModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(tmp_path / 'rows.jsonl')!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    proc = start(cfg, tmp_path)
    deadline = time.monotonic() + 60
    while not (tmp_path / "importing").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert (tmp_path / "importing").exists(), "the config's module was never imported"
    proc.send_signal(sig)
    out, err = finish(proc)
    check_one_line(proc, out, err, sig, "")
    assert not (tmp_path / "out").exists()  # nothing was started


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_while_the_summary_and_report_are_built(tmp_path: Path, sig: signal.Signals) -> None:
    data = tmp_path / "rows.jsonl"
    with open(data, "w") as f:
        for i in range(ROWS):
            f.write(json.dumps({"question": f"What is {i} + 2?", "answer": str(i + 2)}) + "\n")
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='det', batch_size=64)]
datasets = [dict(type=JsonlDataset, abbr=f'rows{{i}}', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match')) for i in range(2)]
work_dir = {str(tmp_path / 'out')!r}
""")
    proc = start(cfg)
    deadline = time.monotonic() + 120
    finished = False
    while not finished and time.monotonic() < deadline and proc.poll() is None:
        events = list((tmp_path / "out").glob("*/events.jsonl"))
        finished = bool(events) and '"run_finished"' in events[0].read_text()
        time.sleep(0.005)
    assert finished and proc.poll() is None, "the run ended before its summary could be interrupted"
    proc.send_signal(sig)  # the last task is done: the summary and report are being built
    out, err = finish(proc)
    check_one_line(proc, out, err, sig, "tasks 2/2 done\n")
    assert "report: " not in err  # it was stopped before the report was written
