"""Pieces the benchmark scripts share: a config of trivial tasks, stage timing, the table, and a
command's wall time and peak memory over its whole process tree."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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


@dataclass
class TreeRun:
    """One measured command: wall seconds, the peak memory of its process tree, its output."""

    started_at: float  # epoch seconds at the start, to line up with a run's events
    wall_s: float
    peak_rss_mb: float  # the largest sum of RSS over the command and its descendants at one sample
    peak_anon_mb: float  # the same of anonymous RSS (heap, tensors): shared libraries left out
    returncode: int
    stdout: str
    stderr: str
    cpu_s: float = 0.0  # user + system seconds of the command and every descendant it waited for


def _tree(pid: int) -> list[int]:
    """``pid`` and its living descendants (``/proc/PID/task/TID/children``)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for children in glob.glob(f"/proc/{p}/task/*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in Path(children).read_text().split())
    return found


def _memory_kb(pid: int) -> tuple[int, int]:
    """RSS and anonymous RSS of one process in kB, (0, 0) once it is gone.  From ``status``, whose
    counters cost microseconds: ``smaps_rollup`` (PSS) walks the page tables, 0.4 s a read of a
    1 GB process under load, and slows the process it measures."""
    rss = anon = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1])
    return rss, anon


def run_tree(argv: list[str], env: dict[str, str], cwd: Path, sample_s: float = 0.2) -> TreeRun:
    """Run ``argv`` to its end, sampling the memory of its whole process tree every ``sample_s``.

    A whole tree because orchestra is an orchestrator and its worker processes (lm-eval is one
    process): ``ru_maxrss`` would give only the largest single process.  Output goes to files (a
    full pipe would stall the command between samples).
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started_at, t0 = time.time(), time.monotonic()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err, text=True)
        peak_rss = peak_anon = 0
        while proc.poll() is None:
            sizes = [_memory_kb(p) for p in _tree(proc.pid)]
            peak_rss = max(peak_rss, sum(r for r, _ in sizes))
            peak_anon = max(peak_anon, sum(a for _, a in sizes))
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(sample_s)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        out.seek(0)
        err.seek(0)
        return TreeRun(started_at, wall, peak_rss / 1024, peak_anon / 1024, proc.returncode, out.read(), err.read(),
                       cpu)
