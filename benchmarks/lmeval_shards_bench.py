"""MMLU in many shards: planning time, and how long each infer task takes to start inferring.

Issue 37 point 4: each shard of an lm-eval group used to rebuild the whole group's requests
(lm-eval's task index, 57 subjects loaded, every prompt built) before its first sample; now the
first shard builds them once per run into ``<run>/shared/`` and the others read their slice.
One ``run.py --mode infer`` of MMLU (``test_range='[0:LIMIT]'`` per subject) split into
``--shards`` infer tasks by ``NumWorkerPartitioner``, ``DeterministicModel`` answering (inference
itself is ~0 s), ``LocalRunner`` with ``--workers`` at a time, a fresh cache (the planning probe
runs).  Give ``--tree DIR`` to measure another checkout (an older commit) the same way.

    python benchmarks/lmeval_shards_bench.py [--shards 20] [--limit 10] [--workers 2] [--tree DIR]

Measured from ``events.jsonl``: *planning* is the wall time from the process start to the first
infer task start (config, probe, plan); a task's *infer start* is from its start to its first
``progress`` event (the engine's first tick: its samples are built and inference begins).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import REPO, print_table, read_events


def write_config(folder: Path, tasks: Path, shards: int, limit: int, workers: int) -> Path:
    cfg = folder / "mmlu_shards.py"
    cfg.write_text(f"""
from orchestra.datasets.lmeval import LmEvalDataset
from orchestra.models.fake import DeterministicModel
from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=LmEvalDataset, abbr='mmlu', task='mmlu', include_path={str(tasks)!r},
                 test_range='[0:{limit}]')]
infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker={shards}),
             runner=dict(type=LocalRunner, max_num_workers={workers}, task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner),
            runner=dict(type=LocalRunner, max_num_workers=1, task=dict(type=EvalTask)))
work_dir = {str(folder / 'out')!r}
""")
    return cfg


def measure(tree: Path, cfg: Path, cache: Path) -> dict[str, float]:
    """One ``--mode infer`` run of ``tree``'s CLI: planning and per-task infer start, seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree), "ORCHESTRA_CACHE_DIR": str(cache),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    before = set(cfg.parent.joinpath("out").glob("*")) if cfg.parent.joinpath("out").exists() else set()
    t0 = time.time()
    proc = subprocess.run([sys.executable, "run.py", str(cfg), "--mode", "infer"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=3600)
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.exit(f"run failed ({tree}): {proc.stderr[-2000:]}")
    (run,) = set(cfg.parent.joinpath("out").glob("*")) - before
    events = read_events(run)
    started = {e["task_id"]: e["ts"] for e in events if e["event"] == "started" and e.get("stage") == "infer"}
    first: dict[str, float] = {}
    for e in events:
        if e["event"] == "progress" and e.get("task_id") in started:
            first.setdefault(e["task_id"], e["ts"])
    ends = [e["ts"] for e in events if e["event"] == "done" and e.get("stage") == "infer"]
    starts = [first[t] - started[t] for t in started]
    return {"tasks": len(started), "plan": min(started.values()) - t0, "start_median": statistics.median(starts),
            "start_max": max(starts), "start_sum": sum(starts), "infer_wall": max(ends) - min(started.values()),
            "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=20)
    ap.add_argument("--limit", type=int, default=10, help="documents per MMLU subject")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tree", type=Path, help="another checkout to measure the same way (e.g. main before)")
    args = ap.parse_args()
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(folder / "offline")],
                       check=True, capture_output=True)
        cfg = write_config(folder, folder / "offline" / "tasks", args.shards, args.limit, args.workers)
        trees = [("this checkout", REPO)] + ([("--tree", args.tree.resolve())] if args.tree else [])
        for label, tree in trees:
            m = measure(tree, cfg, folder / f"cache-{label.replace(' ', '_')}")
            what = f"{label}: MMLU [0:{args.limit}] x 57 in {m['tasks']:.0f} infer tasks, {args.workers} at a time"
            rows.append((f"{what}: planning (start to first task)", f"{m['plan']:.1f} s"))
            rows.append((f"{label}: infer start per task, median / max", f"{m['start_median']:.1f} / "
                                                                         f"{m['start_max']:.1f} s"))
            rows.append((f"{label}: infer start, summed over tasks", f"{m['start_sum']:.1f} s"))
            rows.append((f"{label}: infer stage wall (first start to last end)", f"{m['infer_wall']:.1f} s"))
            rows.append((f"{label}: run.py wall", f"{m['wall']:.1f} s"))
    print_table(rows)


if __name__ == "__main__":
    main()
