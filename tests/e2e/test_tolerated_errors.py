"""A run whose infer task tolerated failed samples (``error_tolerance``) exits 0 with a score that
counts them as wrong: the table, ``summary.md``, ``summary.json`` and the report say how many samples failed
at inference, so a model's wrong answers and an endpoint's errors are never shown as one number.
Through ``python run.py`` and the real OpenAI-compatible test server (a 400 for one prompt)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers import run_argv

REPO = Path(__file__).resolve().parents[2]


def _run(server: Any, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``python run.py`` on four rows, one of which the endpoint answers with a 400, with
    ``error_tolerance=0.5`` (progress lines every 0.1 s)."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1{' BAD_REQUEST' if i == 1 else ''}", "answer": i + 1})
                            + "\n" for i in range(4)))
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI

models = [dict(type=OpenAIAPI, abbr='api', path='test-model', base_url={server.base_url!r}, max_out_len=8)]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    flags = ["--cfg-options", "infer.runner.task.error_tolerance=0.5"]
    return run_argv([sys.executable, "run.py", str(cfg), *flags], timeout=120,
                    env={**os.environ, "ORCHESTRA_PROGRESS_INTERVAL_S": "0.1"})  # forked: tests/cli_fork.py


def test_tolerated_prediction_errors_are_named_in_the_table_and_summary(server: Any, tmp_path: Path) -> None:
    res = _run(server, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]  # within the tolerance the user set: not a failed run
    said = "api / rows: 1 of 4 samples failed at inference (within error_tolerance) and are counted as wrong"
    assert "0.750" in res.stdout and said in res.stdout, res.stdout  # before: only the 0.750, as if whole
    (run,) = (tmp_path / "out").iterdir()
    assert said in (run / "summary" / "summary.md").read_text()
    assert said in (run / "summary" / "report.html").read_text()
    errors = json.loads((run / "summary" / "summary.json").read_text())["prediction_errors"]
    assert errors == [{"model": "api", "dataset": "rows", "failed": 1, "samples": 4}]


def test_the_progress_line_and_the_report_count_the_tolerated_failures(server: Any, tmp_path: Path) -> None:
    """The infer stage's last progress line used to say ``4/4 samples (100%)`` and the report
    ``4 samples inferred``, as if every sample had an answer; both now say that one failed."""
    res = _run(server, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    final = [line for line in res.stderr.splitlines() if line.startswith("[infer] ")][-1]
    assert final.startswith("[infer] 4/4 samples (100%), 1 failed, "), res.stderr[-3000:]
    assert "tasks 1/1 done" in final
    (run,) = (tmp_path / "out").iterdir()
    assert "</b> samples inferred, 1 failed" in (run / "summary" / "report.html").read_text()
