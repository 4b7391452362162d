"""The example backend (``examples/subprocess_runner.py``) used as a user uses it: from a config, by
the real CLI, on the deterministic model (the conformance suite drives it at the loop)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import jsonl, run_cli, run_dirs, summary_rows


def write_config(folder: Path, runner: str) -> Path:
    """Three rows, one infer task per row on ``runner`` (the runner dict's source), eval on LocalRunner."""
    data = folder / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 2?", "answer": str(i + 2)}) + "\n"
                            for i in range(3)))
    cfg = folder / "cfg.py"
    cfg.write_text(f"""
from examples.subprocess_runner import SubprocessRunner
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=DeterministicModel, abbr='det', batch_size=4)]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker=3),
             runner=dict({runner}, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(type=LocalRunner, task=dict(type=EvalTask)))
work_dir = {str(folder / 'out')!r}
""")
    return cfg


def test_a_config_runs_its_infer_stage_on_the_example_backend(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "type=SubprocessRunner, max_num_workers=3, kill_grace_s=1.0")
    res = run_cli(cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    assert summary_rows(run)[("rows", "numeric_match")] == {"det": 1.0}
    ledger = jsonl(run / "subprocess" / "jobs.jsonl")
    jobs = {r["name"] for r in ledger}
    assert len(jobs) == 3  # one job per infer task, each recorded before it started, then ended
    assert all([r["state"] for r in ledger if r["name"] == j] == ["submitting", "ended"] for j in jobs)
    assert "examples.subprocess_runner.SubprocessRunner" in (run / "config.py").read_text()


def test_an_unknown_key_of_the_example_backend_is_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "type=SubprocessRunner, kill_grace=1.0")
    res = run_cli(cfg)
    assert res.returncode == 2, res.stderr[-3000:]
    (line,) = res.stderr.strip().splitlines()
    assert "infer.runner" in line and "kill_grace" in line and "kill_grace_s" in line, line
