"""Many trivial tasks on a real cluster backend: Slurm job arrays and Ray with warm actors.

``slurm``: ``--sizes`` runs of N one-row infer tasks through ``SlurmRunner(launcher='sbatch')``
on the local test cluster (``tools/slurm_cluster.sh``; ``SLURM_CONF`` set), every Slurm client
call counted by a shim on ``PATH`` that logs its name and execs the real binary (used by this
benchmark only).  ``ray``: the same tasks through ``RayRunner(reuse_workers=True)`` on a local
Ray cluster (``tools/ray_cluster.py``: a head without CPUs and one node of ``--ray-cpus``).

For each size: the infer stage's wall (first start to last end), the orchestrator's own CPU
time (``getrusage`` of ``run.py --mode infer`` and its children: the client calls, not the
jobs), and both per task, so a per-task storm or a quadratic step shows as a growing column.

    python benchmarks/scale_backends_bench.py slurm [--sizes 1000,2000] [--partition debug] [--max-workers N]
    python benchmarks/scale_backends_bench.py ray [--sizes 1000,2000,5000] [--ray-cpus 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench_common import REPO, print_table, read_events, stage_wall, trivial_config

CLIENTS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "srun")
_MEASURE = (
    "import resource, subprocess, sys, time\n"
    "t0 = time.perf_counter()\n"
    "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode\n"
    "wall = time.perf_counter() - t0\n"
    "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, code)\n"
)


def run_measured(cfg: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """Wall s, CPU s (run.py and its children) and peak RSS MB of ``run.py CFG --mode infer``."""
    res = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "run.py", str(cfg), "--mode", "infer"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=7200)
    wall, cpu, peak_kb, code = res.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"run.py {cfg} exited {code}")
    return float(wall), float(cpu), int(peak_kb) / 1024


@contextlib.contextmanager
def work_folder(keep: Path | None, name: str) -> Iterator[str]:
    """``keep/name`` (left in place, a failed run's folder included), or a temporary folder."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix=f"scale-{name}-") as tmp:
            yield tmp
        return
    folder = keep / name
    folder.mkdir(parents=True)
    yield str(folder)


def write_shims(folder: Path, log: Path) -> Path:
    """A folder of ``sbatch``, ``squeue``, ... scripts that append their name to ``log`` and exec
    the real client (found on ``PATH`` now)."""
    shims = folder / "shims"
    shims.mkdir()
    for name in CLIENTS:
        real = shutil.which(name)
        if real is None:
            raise SystemExit(f"{name} is not on PATH: start the test cluster (tools/slurm_cluster.sh) first")
        shim = shims / name
        shim.write_text(f"#!/bin/sh\necho {name} >> {shlex.quote(str(log))}\nexec {shlex.quote(real)} \"$@\"\n")
        shim.chmod(0o755)
    return shims


def _per_size_rows(label: str, n: int, run: Path, wall_cpu_rss: tuple[float, float, float],
                   workers: int) -> list[tuple[str, str]]:
    stage, done = stage_wall(run, "infer")
    if done != n:
        raise SystemExit(f"{label}: {done} of {n} tasks done")
    whole, cpu, rss = wall_cpu_rss
    return [(f"{label}, {n} tasks: infer stage wall / whole run.py --mode infer", f"{stage:.1f} s / {whole:.1f} s"),
            (f"{label}, {n} tasks: wall per task (x {workers} slots)", f"{stage * workers / n:.4f} s"),
            (f"{label}, {n} tasks: orchestrator CPU (+ client calls) / per task / peak RSS",
             f"{cpu:.1f} s / {cpu / n * 1000:.1f} ms / {rss:.0f} MB")]


def slurm_main(args: argparse.Namespace) -> None:
    if not os.environ.get("SLURM_CONF"):
        raise SystemExit("set SLURM_CONF to the test cluster's slurm.conf")
    rows: list[tuple[str, str]] = []
    for n in [int(s) for s in args.sizes.split(",")]:
        with work_folder(args.keep, f"slurm-{n}") as tmp:
            folder = Path(tmp)
            calls = folder / "calls.log"
            calls.touch()
            shims = write_shims(folder, calls)
            workers = args.max_workers or n
            runner = (f"dict(type=SlurmRunner, launcher='sbatch', partition={args.partition!r}, "
                      f"max_num_workers={workers}")
            cfg = trivial_config(folder, "slurm", n, "from orchestra.runners import SlurmRunner", runner,
                                 folder / "out")
            env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO),
                   "ORCHESTRA_CACHE_DIR": str(folder / "cache")}
            measured = run_measured(cfg, env)
            (run,) = [p for p in (folder / "out").iterdir() if p.is_dir()]
            rows += _per_size_rows("slurm sbatch arrays", n, run, measured, args.slots)
            counts = {name: 0 for name in CLIENTS}
            for line in calls.read_text().split():
                counts[line] += 1
            rows.append((f"slurm sbatch arrays, {n} tasks: calls sbatch / squeue / sacct / scancel / scontrol / srun",
                         " / ".join(str(counts[c]) for c in CLIENTS)))
            rows.append((f"slurm sbatch arrays, {n} tasks: squeue calls per task",
                         f"{counts['squeue'] / n:.3f}"))
            refused = [e for e in read_events(run) if e["event"] == "slurm_submit_refused"]
            rows.append((f"slurm sbatch arrays, {n} tasks: jobs in flight (max_num_workers) / submissions the "
                         "cluster refused for now", f"{workers} / {len(refused)}"))
        print(f"  slurm {n} done", file=sys.stderr, flush=True)
    print_table(rows)


def ray_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    from ray_cluster import ClusterProcess, ray_env

    rows: list[tuple[str, str]] = []
    cluster = ClusterProcess(ray_env([str(REPO)]))
    try:
        cluster.add_node(cpus=args.ray_cpus)
        for n in [int(s) for s in args.sizes.split(",")]:
            with work_folder(args.keep, f"ray-{n}") as tmp:
                folder = Path(tmp)
                runner = (f"dict(type=RayRunner, address={cluster.address!r}, max_num_workers={args.ray_cpus}, "
                          "reuse_workers=True")
                cfg = trivial_config(folder, "ray", n, "from orchestra.runners import RayRunner", runner,
                                     folder / "out")
                env = {**ray_env([str(REPO)]), "ORCHESTRA_CACHE_DIR": str(folder / "cache")}
                measured = run_measured(cfg, env)
                (run,) = [p for p in (folder / "out").iterdir() if p.is_dir()]
                rows += _per_size_rows(f"ray warm actors ({args.ray_cpus} CPUs)", n, run, measured, args.ray_cpus)
            print(f"  ray {n} done", file=sys.stderr, flush=True)
    finally:
        cluster.stop()
    print_table(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("slurm")
    s.add_argument("--sizes", default="1000,2000", help="task counts, comma-separated")
    s.add_argument("--partition", default="debug")
    s.add_argument("--slots", type=int, default=8, help="job slots of the cluster (for wall x slots / tasks)")
    s.add_argument("--max-workers", type=int, default=0,
                   help="SlurmRunner max_num_workers, jobs in flight (default: the task count, all at once)")
    r = sub.add_parser("ray")
    r.add_argument("--sizes", default="1000,2000,5000", help="task counts, comma-separated")
    r.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the one worker node (= warm actors)")
    for p in (s, r):
        p.add_argument("--keep", type=Path, help="run in DIR/<backend>-<size> and keep it (default: a temp folder)")
    args = ap.parse_args()
    {"slurm": slurm_main, "ray": ray_main}[args.what](args)


if __name__ == "__main__":
    main()
