"""Configs and probes shared by the Slurm end-to-end tests (real CLI, real cluster)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from helpers import events, predictions, summary_rows  # noqa: F401 - the suite's names
from helpers import run_cli as _run_cli
from helpers import run_dirs as _run_dirs
from helpers import start_cli as _start_cli

REPO = Path(__file__).resolve().parents[3]
ARITH_ROWS = 40


def write_config(folder: Path, infer_runner: str, eval_runner: str | None = None, *, model: str = "",
                 gpu_model: str = "", max_task_size: int = 200, data_dir: Path | None = None,
                 work_dir: Path | None = None, gpu: bool = True,
                 datasets: tuple[str, ...] = ("arith", "pick")) -> Path:
    """Two deterministic models (``det`` on CPU, ``det_gpu`` with ``num_gpus=1``) on two datasets.

    ``arith`` (40 rows x cost 10) is cut into 2 shards, ``pick`` is one task: 6 infer tasks, 3 of
    them GPU tasks, and 4 eval tasks.  ``infer_runner`` / ``eval_runner`` are Python source of the
    runner dicts (``task=`` is added).  ``model`` / ``gpu_model`` add keyword arguments to the models.
    Run folders go to ``work_dir`` (default ``folder / "out"``).  ``gpu=False`` leaves ``det_gpu``
    out; ``datasets`` picks a subset.
    """
    data = data_dir or folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    if not (data / "arith.jsonl").exists():  # written once: a dataset's content key sees its mtime
        with open(data / "arith.jsonl", "w") as f:
            for i in range(ARITH_ROWS):
                f.write(json.dumps({"question": f"What is {i} + {2 * i}?", "answer": str(3 * i)}) + "\n")
        with open(data / "pick.jsonl", "w") as f:
            for i in range(20):
                f.write(json.dumps({"q": f"The word is w{i}.", "choices": ["x", f"w{i}", "y"], "label": 1}) + "\n")
    eval_runner = eval_runner or infer_runner
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner, SlurmRunner
from orchestra.tasks import EvalTask, InferTask

models = [
    dict(type=DeterministicModel, abbr='det', batch_size=4{model}),
    dict(type=DeterministicModel, abbr='det_gpu', batch_size=4, run_cfg=dict(num_gpus=1){gpu_model}),
][:{2 if gpu else 1}]
datasets = [d for d in [
    dict(type=JsonlDataset, abbr='arith', path={str(data / 'arith.jsonl')!r},
         reader_cfg=dict(input_columns=['question'], output_column='answer'),
         infer_cfg=dict(prompt_template='Q: {{question}}\\nA:', inferencer=dict(type='gen', max_out_len=16)),
         eval_cfg=dict(evaluator=dict(type='numeric_match'))),
    dict(type=JsonlDataset, abbr='pick', path={str(data / 'pick.jsonl')!r},
         reader_cfg=dict(input_columns=['q'], output_column='label'),
         infer_cfg=dict(prompt_template='{{q}}', inferencer=dict(type='loglik', choices_column='choices')),
         eval_cfg=dict(evaluator='accuracy')),
] if d['abbr'] in {list(datasets)!r}]
infer = dict(
    partitioner=dict(type=SizePartitioner, max_task_size={max_task_size}, gen_task_coef=10, granularity=1),
    runner=dict({infer_runner}, task=dict(type=InferTask)),
)
eval = dict(
    partitioner=dict(type=NaivePartitioner),
    runner=dict({eval_runner}, task=dict(type=EvalTask)),
)
work_dir = {str(work_dir or folder / 'out')!r}
""")
    return cfg


def run_cli(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return _run_cli(*args, timeout=timeout)


def start_cli(*args: str | Path) -> subprocess.Popen[str]:
    return _start_cli(*args)


def run_dirs(folder: Path, work_dir: Path | None = None) -> list[Path]:
    return _run_dirs(work_dir or folder / "out")


def job_prefix(run: Path) -> str:
    """The prefix of every Slurm job name of this run folder (``orc-<tag>-``)."""
    tag = hashlib.sha1(os.path.normpath(os.path.abspath(run)).encode()).hexdigest()[:8]
    return f"orc-{tag}-"


def squeue_jobs(prefix: str, all_states: bool = False) -> list[tuple[str, str, str]]:
    """``(job id, name, state)`` of the jobs whose name starts with ``prefix`` (alive ones unless
    ``all_states``)."""
    argv = ["squeue", "-h", "-o", "%i|%j|%T"] + (["-t", "all"] if all_states else [])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    rows = [tuple(line.split("|")) for line in out.splitlines() if line.strip()]
    return [r for r in rows if len(r) == 3 and r[1].startswith(prefix)]  # type: ignore[misc]


def job_headers(log: Path) -> list[dict[str, str]]:
    """The ``===== slurm: job N on NODE, CUDA_VISIBLE_DEVICES=X, started T`` lines of a task log."""
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("===== slurm: job ") and "CUDA_VISIBLE_DEVICES=" in line:
            head, _, rest = line.partition(", CUDA_VISIBLE_DEVICES=")
            gpus, _, started = rest.partition(", started ")
            out.append({"job": head.split()[3], "gpus": gpus, "started": started})
    return out
