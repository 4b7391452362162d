"""RayRunner: warm workers reused vs a fresh worker per task, on a cluster whose nodes arrive over
time, as the model's load time grows; and RayRunner's per-task overhead vs LocalRunner's.

    python benchmarks/ray_bench.py                       # both parts
    python benchmarks/ray_bench.py --part reuse --loads 1,5,15 --arrivals 0,10,20 --tasks 12
    python benchmarks/ray_bench.py --part overhead --overhead-tasks 100

**reuse** (the "worker pool on Ray" comparison): a real Ray cluster (``tools/ray_cluster.py``,
a head without CPUs) gets one 1-CPU node when the run starts and one more at each further
``--arrivals`` second, counted from the start of the orchestrator.  The run has ``--tasks``
infer tasks of one model (the deterministic model: loading takes L s, each task ``--compute``
s); RayRunner has ``max_num_workers`` = the number of nodes.  ``reuse_workers=True`` keeps a
worker and its model for the next task; ``reuse_workers=False`` is the no-reuse baseline, a
fresh Ray worker per task that loads its model every time (a 1:1 input:worker mapping).
Makespan: from the orchestrator's start to the last task's end.  Worker-seconds: the sum over
workers of the time from their process start to their stop (what the pool holds of the
cluster).  **overhead**: ``--overhead-tasks`` trivial tasks (~1 ms of work each) through
LocalRunner (process per task, warm workers) and RayRunner on a local Ray (``address=None``),
2 workers each; overhead per task = stage wall time x workers / tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import REPO, read_events, stage_wall, trivial_config

sys.path.insert(0, str(REPO / "tools"))
from ray_cluster import ClusterProcess, ray_env  # noqa: E402


def reuse_config(folder: Path, address: str, tasks: int, load_s: float, compute_s: float, workers: int,
                 reuse: bool) -> Path:
    """``tasks`` infer tasks of one row each: load ``load_s`` once per worker, ``compute_s`` per task."""
    data = folder / "rows.jsonl"
    with open(data, "w") as f:
        for i in range(tasks):
            f.write(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n")
    cfg = folder / f"reuse_{reuse}_{load_s:g}.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner
from orchestra.runners import LocalRunner, RayRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=DeterministicModel, abbr='det', load_s={load_s}, delay_s={compute_s})]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker={tasks}),
             runner=dict(type=RayRunner, address={address!r}, max_num_workers={workers}, reuse_workers={reuse},
                         task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner), runner=dict(type=LocalRunner, task=dict(type=EvalTask)))
work_dir = {str(folder / f"out_{reuse}_{load_s:g}")!r}
""")
    return cfg


def run_with_arrivals(cluster: ClusterProcess, cfg: Path, arrivals: list[float]) -> tuple[float, Path]:
    """Run ``cfg``'s infer stage while nodes join at ``arrivals`` (s from the start); its start time."""
    cluster.add_node(cpus=1)  # the node at 0 s
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg), "--mode", "infer"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ray_env([str(REPO)]))
    try:
        for at in arrivals[1:]:
            while proc.poll() is None and time.time() - t0 < at:
                time.sleep(0.05)
            if proc.poll() is None:
                cluster.add_node(cpus=1)
        _, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"{cfg.name}: exit {proc.returncode}\n{err[-2000:]}")
    finally:
        proc.kill()
        for node in list(cluster.added):
            cluster.remove_node(node)
    out = Path(cfg.read_text().split("work_dir = ")[1].strip().strip("'\""))
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return t0, run


def reuse_metrics(t0: float, run: Path) -> dict[str, float]:
    evs = read_events(run)
    infer = [e for e in evs if e.get("stage") == "infer"]
    ends = [e["ts"] for e in infer if e["event"] == "done"]
    ready = {e["actor_id"]: e["up_since"] for e in evs if e["event"] == "worker_ready"}
    stopped = {e["actor_id"]: e["ts"] for e in evs if e["event"] == "worker_stopped"}
    worker_s = sum(stopped[a] - up for a, up in ready.items() if a in stopped)
    loads = sum(1 for e in evs if e["event"] == "worker_stopped" and e.get("tasks_run", 0) > 0)
    return {"makespan_s": max(ends) - t0, "worker_s": worker_s, "workers": float(len(ready)),
            "model_loads": float(loads), "done": float(len(ends))}


def part_reuse(args: argparse.Namespace, folder: Path) -> None:
    arrivals = [float(a) for a in args.arrivals.split(",")]
    loads = [float(x) for x in args.loads.split(",")]
    cluster = ClusterProcess(ray_env([str(REPO)]))
    rows = []
    try:
        for load_s in loads:
            for reuse in (True, False):
                cfg = reuse_config(folder, cluster.address, args.tasks, load_s, args.compute, len(arrivals), reuse)
                t0, run = run_with_arrivals(cluster, cfg, arrivals)
                m = reuse_metrics(t0, run)
                rows.append((load_s, reuse, m))
                print(f"  L={load_s:g}s reuse={reuse}: {json.dumps({k: round(v, 1) for k, v in m.items()})}",
                      file=sys.stderr, flush=True)
    finally:
        cluster.stop()
    print(f"\n{args.tasks} tasks x {args.compute:g} s of compute, 1-CPU nodes joining at "
          f"{', '.join(f'{a:g}' for a in arrivals)} s, max_num_workers={len(arrivals)}\n")
    print("| load L | makespan, reuse | makespan, fresh worker per task | worker-s, reuse | "
          "worker-s, fresh | model loads (reuse / fresh) |")
    print("|---|---|---|---|---|---|")
    by = {(load, reuse): m for load, reuse, m in rows}
    for load_s in loads:
        r, f = by[(load_s, True)], by[(load_s, False)]
        print(f"| {load_s:g} s | {r['makespan_s']:.1f} s "
              f"| {f['makespan_s']:.1f} s ({f['makespan_s'] / r['makespan_s']:.2f}x) "
              f"| {r['worker_s']:.0f} | {f['worker_s']:.0f} ({f['worker_s'] / r['worker_s']:.2f}x) "
              f"| {r['model_loads']:.0f} / {f['model_loads']:.0f} |")


def part_overhead(args: argparse.Namespace, folder: Path) -> None:
    n, workers = args.overhead_tasks, 2
    folder = folder / "overhead"
    folder.mkdir()
    setups = [
        ("LocalRunner, process per task", "LocalRunner", f"dict(type=LocalRunner, max_num_workers={workers}"),
        ("LocalRunner, warm workers", "LocalRunner",
         f"dict(type=LocalRunner, max_num_workers={workers}, reuse_workers=True"),
        ("RayRunner, local Ray (address=None)", "RayRunner", f"dict(type=RayRunner, max_num_workers={workers}"),
    ]
    print(f"\n{n} trivial tasks, {workers} workers\n")
    print("| runner | infer stage wall | overhead per task | whole run (both stages, start-up included) |")
    print("|---|---|---|---|")
    for i, (label, cls, runner) in enumerate(setups):
        cfg = trivial_config(folder, f"overhead_{i}", n, f"from orchestra.runners import {cls}", runner,
                             folder / f"overhead_out_{i}")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=ray_env([str(REPO)]))
        whole = time.perf_counter() - t0
        (run,) = [p for p in (folder / f"overhead_out_{i}").iterdir() if p.is_dir()]
        wall, done = stage_wall(run, "infer")
        assert done == n, (label, done)
        print(f"| {label} | {wall:.2f} s | {wall * workers / n:.3f} s | {whole:.1f} s |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["reuse", "overhead", "all"], default="all")
    ap.add_argument("--loads", default="1,5,15", help="model load times L to compare, in s")
    ap.add_argument("--arrivals", default="0,10,20", help="when each 1-CPU node joins, in s from the start")
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--compute", type=float, default=2.0, help="seconds of work per task")
    ap.add_argument("--overhead-tasks", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("reuse", "all"):
            part_reuse(args, Path(tmp))
        if args.part in ("overhead", "all"):
            part_overhead(args, Path(tmp))
    print(f"\nmachine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
