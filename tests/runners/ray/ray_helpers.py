"""Configs, CLI runs and event reading for the RayRunner tests."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from conftest import ray_env
from helpers import events  # noqa: F401 - the suite's names
from helpers import run_cli as _run_cli
from helpers import start_cli as _start_cli

LOCAL_EVAL = "dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask))"


def write_config(tmp_path: Path, runner: str, eval_runner: str = LOCAL_EVAL, model: str = "", rows: int = 40,
                 task_rows: int = 10, model_type: str = "DeterministicModel", name: str = "cfg.py") -> Path:
    """Two datasets (generation, log-likelihood) and the deterministic model; ``rows`` arithmetic
    rows cut into tasks of ``task_rows`` rows, one log-likelihood task; the infer stage runs on
    ``runner`` (the inside of ``dict(...)``), the eval stage on ``eval_runner``."""
    data = tmp_path / "data"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "arith.jsonl", "w") as f:
        for i in range(rows):
            f.write(json.dumps({"question": f"What is {i} + {2 * i}?", "answer": str(3 * i)}) + "\n")
    with open(data / "pick.jsonl", "w") as f:
        for i in range(12):
            f.write(json.dumps({"q": f"The word is w{i}.", "choices": ["x", f"w{i}", "y"], "label": 1}) + "\n")
    cfg = tmp_path / name
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, SizePartitioner
from orchestra.runners import LocalRunner, RayRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type={model_type!r}, abbr='det', batch_size=4{model})]
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
infer = dict(
    partitioner=dict(type=SizePartitioner, max_task_size={task_rows * 10}, gen_task_coef=10, granularity=1),
    runner=dict({runner}, task=dict(type=InferTask)),
)
eval = dict(partitioner=dict(type=NaivePartitioner), runner={eval_runner})
work_dir = {str(tmp_path / 'out')!r}
""")
    return cfg








def run_cli(cfg: Path, *args: str, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return _run_cli(cfg, *args, timeout=timeout, env={**ray_env(), **(env or {})})


def start_cli(cfg: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The CLI in its own session (as in a terminal: a Ctrl-C goes to its whole process group);
    ``env``: variables on top of the cluster's."""
    return _start_cli(cfg, *args, env={**ray_env(), **(env or {})}, new_session=True)


def run_dir(tmp_path: Path) -> Path:
    runs = sorted(p for p in (tmp_path / "out").iterdir() if p.is_dir())
    assert len(runs) == 1, runs
    return runs[0]




def wait_for_event(tmp_path: Path, match: Any, timeout_s: float = 60.0,
                   proc: subprocess.Popen[str] | None = None) -> dict[str, Any]:
    """The first event of the (only) run under ``tmp_path`` for which ``match(event)`` is true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = tmp_path / "out"
        runs = sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []
        for ev in events(runs[0]) if runs else []:
            if match(ev):
                return ev
        if proc is not None and proc.poll() is not None:
            said = proc.stderr.read()[-3000:] if proc.stderr is not None else ""
            raise AssertionError(f"the run ended (exit {proc.returncode}) before the event; it said:\n{said}")
        time.sleep(0.05)
    raise AssertionError("timed out waiting for an event")


def outputs(run: Path) -> dict[str, Any]:
    """Every prediction record and result metric of a run, keyed by file name (no run-specific fields)."""
    out: dict[str, Any] = {}
    for path in sorted((run / "predictions").rglob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()[1:]]  # line 1: the seal
        out[str(path.relative_to(run))] = sorted(rows, key=lambda r: r.get("id", 0))
    for path in sorted((run / "results").rglob("*.json")):
        out[str(path.relative_to(run))] = json.loads(path.read_text())["metrics"]
    return out


def stage_events(run: Path, stage: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in events(run) if e.get("stage") == stage and e["event"] == kind]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
