"""Orchestration overhead: 100 trivial tasks through LocalRunner, and CLI start-up time.

    python benchmarks/overhead.py [--tasks 100] [--workers 2]

Prints a table.  "overhead per task" is worker-seconds per task: the stage's wall time x
workers / tasks, for tasks whose own work is ~1 ms.  It includes starting each task's
interpreter and importing orchestra, which is what a task costs the user beyond its work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_config(folder: Path, tasks: int, workers: int, reuse: bool) -> Path:
    data = folder / "rows.jsonl"
    with open(data, "w") as f:
        for i in range(tasks):
            f.write(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n")
    cfg = folder / f"bench_{'warm' if reuse else 'cold'}.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker={tasks}),
             runner=dict(type=LocalRunner, max_num_workers={workers}, reuse_workers={reuse},
                         task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner),
            runner=dict(type=LocalRunner, max_num_workers={workers}, task=dict(type=EvalTask)))
work_dir = {str(folder / ('out_warm' if reuse else 'out_cold'))!r}
""")
    return cfg


def stage_wall(run_dir: Path, stage: str) -> tuple[float, int]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    mine = [e for e in events if e.get("stage") == stage]
    starts = [e["ts"] for e in mine if e["event"] == "started"]
    ends = [e["ts"] for e in mine if e["event"] in ("done", "failed")]
    done = sum(1 for e in mine if e["event"] == "done")
    return max(ends) - min(starts), done


def time_cmd(argv: list[str], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="repetitions of the start-up timings")
    args = ap.parse_args()
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for reuse in (False, True):
            cfg = write_config(folder, args.tasks, args.workers, reuse)
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, capture_output=True, text=True)
            total = time.perf_counter() - t0
            if res.returncode != 0:
                print(res.stderr, file=sys.stderr)
                return 1
            out = folder / ("out_warm" if reuse else "out_cold")
            (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
            wall, done = stage_wall(run_dir, "infer")
            mode = "warm workers" if reuse else "process per task"
            rows.append((f"infer stage, {done} tasks, {args.workers} workers, {mode}: wall", f"{wall:.2f} s"))
            rows.append((f"overhead per task ({mode})", f"{wall * args.workers / done:.3f} s"))
            rows.append((f"whole run incl. eval and summary ({mode})", f"{total:.2f} s"))
        cfg = write_config(folder, args.tasks, args.workers, False)
        help_s = time_cmd([sys.executable, "run.py", "--help"], args.repeat)
        dry_s = time_cmd([sys.executable, "run.py", str(cfg), "--dry-run"], args.repeat)
        bare_s = time_cmd([sys.executable, "-c", "pass"], args.repeat)
        probe = subprocess.run(
            [sys.executable, "-c",
             "import sys, runpy; sys.argv=['run.py', sys.argv[1], '--dry-run'];\n"
             "import contextlib, io\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try: runpy.run_path('run.py', run_name='__main__')\n"
             "    except SystemExit: pass\n"
             "print(','.join(m for m in ('torch','transformers','vllm','ray','numpy') if m in sys.modules))",
             str(cfg)],
            cwd=REPO, capture_output=True, text=True, check=True)
        rows.append(("CLI start-up: run.py --help (median)", f"{help_s:.3f} s"))
        rows.append(("CLI start-up: plan + print 100 tasks (--dry-run, median)", f"{dry_s:.3f} s"))
        rows.append(("bare python -c pass (for scale)", f"{bare_s:.3f} s"))
        rows.append(("ML frameworks imported by the orchestrator", probe.stdout.strip() or "none"))
    width = max(len(k) for k, _ in rows)
    print(f"{'measure':<{width}}  value")
    print(f"{'-' * width}  -------")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print(f"\n(machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
