"""How long one poll round of SlurmRunner takes while the controller is slow (issue 21).

    eval "$(tools/slurm_cluster.sh env)"      # or any Slurm cluster: SLURM_CONF / PATH set
    python benchmarks/slurm_poll_bench.py [--tasks 8] [--delay 3] [--partition debug]

For each launcher, ``--tasks`` attempts (each ``sleep 1; exit 3``: a plain non-zero exit, the case
where srun's session asks squeue how the job ended) are submitted through a real session, with a
``squeue`` first on PATH that sleeps ``--delay`` seconds before it runs the real one.  The session
is polled every 0.05 s until every attempt ended; the table gives the slowest and the median poll
round and the time until the last attempt was reported.  Run it with ``PYTHONPATH`` at another
checkout to compare code versions on the same cluster.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from orchestra.events import EventLog
from orchestra.paths import RunPaths
from orchestra.runners.core.contract import Exit, Job
from orchestra.runners.core.run import RunContext
from orchestra.runners.slurm.runner import SlurmRunner
from orchestra.tasks.spec import TaskSpec


def one(launcher: str, tasks: int, partition: str, folder: Path) -> tuple[float, float, float, list[Exit]]:
    """(slowest poll, median poll, seconds until all ended, the Exits) of one launcher."""
    paths = RunPaths(str(folder / launcher))
    paths.make_dirs()
    ctx = RunContext(paths, EventLog(paths.events))
    specs = [TaskSpec(stage="infer", task_id=f"infer_m_t{i}", run_dir=paths.root, model={"abbr": "m"},
                      model_abbr="m", units=()) for i in range(tasks)]
    runner = SlurmRunner(launcher=launcher, partition=partition, template=["bash", "-c", "sleep 1; exit 3", "_",
                                                                           "{task_cmd}"])
    session = runner.open(ctx, specs)
    jobs = []
    for task in specs:
        log = paths.task_log("infer", task.task_id)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        jobs.append(Job(task, 1, runner.get_command(task, str(folder / "spec.json"), {}, 1, log), log, {}))
    rounds: list[float] = []
    ended: dict[Job, Exit] = {}
    t0 = time.monotonic()
    try:
        assert session.submit(jobs) == {}
        while len(ended) < len(jobs) and time.monotonic() - t0 < 300:
            start = time.monotonic()
            ended.update(session.poll([j for j in jobs if j not in ended]))
            rounds.append(time.monotonic() - start)
            time.sleep(0.05)
        return max(rounds), statistics.median(rounds), time.monotonic() - t0, [ended[j] for j in jobs if j in ended]
    finally:
        session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--delay", type=float, default=3.0, help="seconds each squeue call sleeps first")
    parser.add_argument("--partition", default="debug")
    args = parser.parse_args()
    real = shutil.which("squeue")
    assert real is not None, "squeue not on PATH: run it where Slurm's commands are"
    with tempfile.TemporaryDirectory(prefix="orc-pollbench-") as tmp:
        folder = Path(tmp)
        slow = folder / "bin"
        slow.mkdir()
        (slow / "squeue").write_text(f'#!/bin/bash\nsleep {args.delay}\nexec {real} "$@"\n')
        (slow / "squeue").chmod(0o755)
        os.environ["PATH"] = f"{slow}:{os.environ['PATH']}"
        print(f"{args.tasks} attempts exiting 3, each squeue call {args.delay:g} s slower")
        print("| launcher | slowest poll (s) | median poll (s) | all ended after (s) | exits |")
        print("|---|---|---|---|---|")
        for launcher in ("srun", "sbatch"):
            slowest, median, total, exits = one(launcher, args.tasks, args.partition, folder)
            codes = sorted({e.code for e in exits})
            print(f"| {launcher} | {slowest:.2f} | {median:.3f} | {total:.1f} | {len(exits)} ended, codes {codes} |")


if __name__ == "__main__":
    main()
