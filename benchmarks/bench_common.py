"""Pieces the benchmark scripts share: a config of trivial tasks, stage timing, the table."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def trivial_config(folder: Path, name: str, tasks: int, imports: str, runner: str, work_dir: Path) -> Path:
    """A config of ``tasks`` infer tasks of ~1 ms each (deterministic model, one row each).

    ``runner`` is the runner dict's source without ``task=``, e.g.
    ``"dict(type=LocalRunner, max_num_workers=2"`` (left open: the task is appended).
    """
    data = folder / "rows.jsonl"
    if not data.exists():
        with open(data, "w") as f:
            for i in range(tasks):
                f.write(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n")
    cfg = folder / f"{name}.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner
from orchestra.tasks import EvalTask, InferTask
{imports}

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker={tasks}),
             runner={runner}, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner), runner={runner}, task=dict(type=EvalTask)))
work_dir = {str(work_dir)!r}
""")
    return cfg


def read_events(run: Path) -> list[dict]:
    # blank lines are skipped as orchestra.events does (an append that raced a check of the end)
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


def stage_wall(run: Path, stage: str) -> tuple[float, int]:
    """Seconds from a stage's first task start to its last task end, and its tasks done."""
    mine = [e for e in read_events(run) if e.get("stage") == stage]
    starts = [e["ts"] for e in mine if e["event"] == "started"]
    ends = [e["ts"] for e in mine if e["event"] in ("done", "failed")]
    return max(ends) - min(starts), sum(1 for e in mine if e["event"] == "done")


def print_table(rows: list[tuple[str, str]]) -> None:
    """Two columns, measure and value, then the machine."""
    width = max(len(k) for k, _ in rows)
    print(f"{'measure':<{width}}  value")
    print(f"{'-' * width}  -------")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print(f"\n(machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]})")
