"""A real orchestra run with a retried and a failed task, and a real headless Chromium."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_argv

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "outputs" / "test-artifacts"
sys.path.insert(0, str(Path(__file__).resolve().parent))



def write_run_config(folder: Path, arith_rows: int = 40, extra: str = "") -> Path:
    """Three deterministic models on two datasets: ``det`` works, ``det_flaky`` fails its
    first attempt (retried), ``det_broken`` fails every attempt.  One arith answer in five is
    wrong on purpose, and a prompt carries HTML that the page must show as text."""
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "arith.jsonl", "w") as f:
        for i in range(arith_rows):
            answer = 3 * i if i % 5 else 3 * i + 1
            f.write(json.dumps({"question": f"What is {i} + {2 * i}? <b>bold</b>", "answer": str(answer)}) + "\n")
    with open(data / "pick.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"q": f"The word is w{i}.", "choices": ["x", f"w{i}", "y"], "label": 1}) + "\n")
    cfg = folder / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=DeterministicModel, abbr='det', batch_size=4, delay_s=0.02),
          dict(type=DeterministicModel, abbr='det_flaky', batch_size=4, fail_attempts=1),
          dict(type=DeterministicModel, abbr='det_broken', batch_size=4, fail_always=True)]
datasets = [
    dict(type=JsonlDataset, abbr='arith', path={str(data / 'arith.jsonl')!r},
         reader_cfg=dict(input_columns=['question'], output_column='answer'),
         infer_cfg=dict(prompt_template='Q: {{question}}\\nA:', inferencer=dict(type='gen', max_out_len=16)),
         eval_cfg=dict(evaluator=dict(type='numeric_match'))),
    dict(type=JsonlDataset, abbr='pick', path={str(data / 'pick.jsonl')!r},
         reader_cfg=dict(input_columns=['q'], output_column='label'),
         infer_cfg=dict(prompt_template='{{q}}', inferencer=dict(type='loglik', choices_column='choices')),
         eval_cfg=dict(evaluator='accuracy')),
]
infer = dict(partitioner=dict(type=NaivePartitioner),
             runner=dict(type=LocalRunner, max_num_workers=2, retry=1, retry_backoff_s=0.1, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner),
            runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)))
work_dir = {str(folder / 'out')!r}
{extra}
""")
    return cfg


def orchestra(*args: str | Path, env: dict[str, str] | None = None, timeout: float = 180,
              ) -> subprocess.CompletedProcess[str]:
    return run_argv([sys.executable, "run.py", *map(str, args)], timeout=timeout,
                    env={**os.environ, **(env or {})})  # forked: tests/cli_fork.py


def events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


def summary_cells(run: Path) -> list[tuple[str, str, str, str]]:
    """(dataset, metric, model, value) of every cell of summary.csv."""
    with open(run / "summary" / "summary.csv", newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    return [(r[0], r[1], model, value) for r in rows[1:] for model, value in zip(header[2:], r[2:])]


def save_artifact(path: Path) -> Path:
    """Copy a file a person may want to look at into outputs/test-artifacts/."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(path, ARTIFACTS / path.name))


class RunResult:
    def __init__(self, folder: Path, cfg: Path, proc: subprocess.CompletedProcess[str]) -> None:
        self.folder, self.cfg, self.proc = folder, cfg, proc
        (self.run,) = [p for p in (folder / "out").iterdir() if p.is_dir()]
        self.report = self.run / "summary" / "report.html"


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """The CLI in a subprocess: 6 infer tasks, 2 of them retried once, 2 failed after a retry."""
    folder = tmp_path_factory.mktemp("report_run")
    cfg = write_run_config(folder, extra="prices = {'det': dict(per_gpu_hour=1.0, per_request=0.001)}")
    env = {"ORCHESTRA_LOCK_DIR": str(folder / "locks"), "ORCHESTRA_PROGRESS_INTERVAL_S": "0.2"}
    proc = orchestra(cfg, env=env)
    return RunResult(folder, cfg, proc)
