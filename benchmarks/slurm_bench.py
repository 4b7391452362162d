"""Slurm overhead: 50 trivial tasks through SlurmRunner (srun and sbatch launchers) vs the same
task commands submitted with plain ``sbatch --wait``.

    eval "$(tools/slurm_cluster.sh env)"      # or any Slurm cluster: SLURM_CONF / PATH set
    python benchmarks/slurm_bench.py [--tasks 50] [--partition debug] [--repeat 3]

Each orchestra run is the real CLI on a config with the deterministic model and
``NumWorkerPartitioner(num_worker=N)`` (N infer tasks, each a ~1 s Python process), with
``max_num_workers=N`` so that every task may be in flight; the node decides how many run at
once (the test cluster declares 8 CPUs, each job asks for the default 1 CPU).  "infer stage" is
the time from the first task submitted to the last one seen finished (events.jsonl); the
baselines run the very same ``python -m orchestra.tasks.infer <spec>`` commands (the specs of an
orchestra run, with its predictions deleted) with the same CPU and memory requests:

* ``sbatch --wait``: N threads, each ``sbatch --wait --wrap '<command>'``, what a user scripts;
* ``sbatch + squeue``: N plain ``sbatch`` calls, then ``squeue`` every 0.2 s until all ended
  (a lower bound for anything that submits batch jobs and watches them).

The table gives the median of ``--repeat`` runs and the ratio to ``sbatch --wait``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_common import REPO, stage_wall, trivial_config


def write_config(folder: Path, tasks: int, partition: str, launcher: str) -> Path:
    runner = (f"dict(type=SlurmRunner, launcher={launcher!r}, partition={partition!r}, "
              f"max_num_workers={tasks}")
    return trivial_config(folder, f"bench_{launcher}", tasks, "from orchestra.runners import SlurmRunner", runner,
                          folder / f"out_{launcher}")


def run_orchestra(folder: Path, tasks: int, partition: str, launcher: str) -> tuple[float, float, Path]:
    cfg = write_config(folder, tasks, partition, launcher)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "run.py", str(cfg)], cwd=REPO, capture_output=True, text=True)
    total = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"orchestra ({launcher}) failed:\n{res.stderr[-3000:]}")
    run = max(p for p in (folder / f"out_{launcher}").iterdir() if p.is_dir())
    wall, done = stage_wall(run, "infer")
    if done != tasks:
        raise SystemExit(f"orchestra ({launcher}): {done} of {tasks} infer tasks done")
    return wall, total, run


def task_commands(run: Path) -> list[list[str]]:
    """The infer tasks' commands of an orchestra run, with its predictions deleted so they work again."""
    shutil.rmtree(run / "predictions", ignore_errors=True)
    (run / "predictions").mkdir()
    specs = sorted((run / "tasks").glob("infer_*.py"))
    return [[sys.executable, "-m", "orchestra.tasks.infer", str(spec)] for spec in specs]


def sbatch_argv(command: list[str], partition: str, log: Path, wait: bool) -> list[str]:
    return ["sbatch", "--parsable", *(["--wait"] if wait else []), f"--partition={partition}",
            "--job-name=bench-plain", f"--output={log}", "--wrap", shlex.join(command)]


def run_sbatch_wait(commands: list[list[str]], partition: str, logs: Path) -> float:
    codes: list[int] = []

    def one(i: int, command: list[str]) -> None:
        res = subprocess.run(sbatch_argv(command, partition, logs / f"wait_{i}.log", wait=True),
                             capture_output=True, text=True)
        codes.append(res.returncode)

    threads = [threading.Thread(target=one, args=(i, c)) for i, c in enumerate(commands)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if any(codes):
        raise SystemExit(f"plain sbatch --wait: exit codes {sorted(set(codes))}; logs in {logs}")
    return wall


def run_sbatch_squeue(commands: list[list[str]], partition: str, logs: Path) -> float:
    t0 = time.perf_counter()
    ids = []
    for i, command in enumerate(commands):
        res = subprocess.run(sbatch_argv(command, partition, logs / f"poll_{i}.log", wait=False),
                             capture_output=True, text=True, check=True)
        ids.append(res.stdout.strip().split(";")[0])
    while True:
        out = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T"],
                             capture_output=True, text=True, check=True).stdout
        states = dict(line.split("|") for line in out.split())
        if len(states) == len(ids) and all(s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
                                           for s in states.values()):
            break
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    if any(s != "COMPLETED" for s in states.values()):
        raise SystemExit(f"plain sbatch: states {sorted(set(states.values()))}; logs in {logs}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--partition", default="debug")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("sbatch") is None:
        print("no sbatch in PATH: start the test cluster (tools/slurm_cluster.sh start) and set SLURM_CONF",
              file=sys.stderr)
        return 2
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="slurm_bench_") as tmp:
        folder = Path(tmp)
        logs = folder / "plain_logs"
        logs.mkdir()
        for r in range(args.repeat):
            for launcher in ("srun", "sbatch"):
                wall, total, run = run_orchestra(folder, args.tasks, args.partition, launcher)
                samples.setdefault(f"SlurmRunner launcher={launcher}: infer stage", []).append(wall)
                samples.setdefault(f"SlurmRunner launcher={launcher}: whole CLI run (+eval, summary)",
                                   []).append(total)
            commands = task_commands(run)
            samples.setdefault(f"{args.tasks} x plain sbatch --wait (threads)", []).append(
                run_sbatch_wait(commands, args.partition, logs))
            commands = task_commands(run)
            samples.setdefault(f"{args.tasks} x plain sbatch + squeue every 0.2 s", []).append(
                run_sbatch_squeue(commands, args.partition, logs))
            print(f"round {r + 1}/{args.repeat}: " + ", ".join(f"{v[-1]:.2f}" for v in samples.values()),
                  file=sys.stderr)
    baseline = statistics.median(samples[f"{args.tasks} x plain sbatch --wait (threads)"])
    width = max(len(k) for k in samples)
    print(f"{'what (' + str(args.tasks) + ' trivial tasks)':<{width}}  median wall   vs sbatch --wait")
    print(f"{'-' * width}  -----------   ---------------")
    for key, values in samples.items():
        med = statistics.median(values)
        print(f"{key:<{width}}  {med:9.2f} s   {med / baseline:13.2f}x")
    print(f"\n(median of {args.repeat}; machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
          f"partition {args.partition})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
