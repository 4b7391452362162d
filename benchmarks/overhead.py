"""Orchestration overhead: 100 trivial tasks through LocalRunner, and CLI start-up time.

    python benchmarks/overhead.py [--tasks 100] [--workers 2]

Prints a table.  "overhead per task" is worker-seconds per task: the stage's wall time x
workers / tasks, for tasks whose own work is ~1 ms.  It includes starting each task's
interpreter and importing orchestra, which is what a task costs the user beyond its work.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import REPO, print_table, stage_wall, trivial_config


def write_config(folder: Path, tasks: int, workers: int, reuse: bool) -> Path:
    mode = "warm" if reuse else "cold"
    runner = f"dict(type=LocalRunner, max_num_workers={workers}, reuse_workers={reuse}"
    return trivial_config(folder, f"bench_{mode}", tasks, "from orchestra.runners import LocalRunner", runner,
                          folder / f"out_{mode}")


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
        rows.append((f"CLI start-up: plan + print {args.tasks} tasks (--dry-run, median)", f"{dry_s:.3f} s"))
        rows.append(("bare python -c pass (for scale)", f"{bare_s:.3f} s"))
        rows.append(("ML frameworks imported by the orchestrator", probe.stdout.strip() or "none"))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
