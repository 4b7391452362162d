"""DLCRunner's orchestration overhead and ``dlc`` call volume, on the CLI double (tests/runners/dlc/bin/dlc).

    python benchmarks/dlc_bench.py [--tasks 50] [--repeat 3]

No real PAI-DLC is reachable here: every ``dlc`` call is the double, a Python script (~40 ms a
call on the dev VM; Alibaba's client, a Go binary talking HTTPS, takes longer), whose jobs pass
Creating -> Queuing -> EnvPreparing in 3 x 0.05 s and then really run the task.

1. **Overhead**: ``--tasks`` trivial tasks (deterministic model, one row each, ~0.5 s of Python
   start-up) through LocalRunner and through DLCRunner (``max_num_workers`` = tasks), each run by
   ``orchestra.run`` in a process of its own that reports its own CPU time (threads included;
   tasks and ``dlc`` calls, its children, not): the orchestration's cost per task whatever else
   loads the machine.  For DLCRunner, each task's time is cut in three from the double's record of when
   the command ran: *start latency* (``started`` event -> command starts: submit call, the job's
   three passing states, nothing else), the command, and *end latency* (command ends -> ``done``
   event: the exit code file seen, the ``get job`` that sees the job over, the last log read).  Run
   with the defaults (``max_calls_per_s=10``: 50 tasks x 3 calls take 15 s of the rate alone) and
   with ``max_calls_per_s=50``.
2. **Call volume**: ``dlc`` calls per task by verb, from the double's call log; and the steady
   state of long jobs, time-compressed ten times (20 jobs of 40 s, ``poll_interval_s=1``,
   ``max_poll_interval_s=6``, no effective rate cap), from which the calls a 1,000-task run
   makes per minute follow.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench_common import REPO, read_events, stage_wall, trivial_config

DOUBLE_BIN = REPO / "tests" / "runners" / "dlc" / "bin"


def double_env(cloud: Path) -> dict[str, str]:
    """This environment with the double's ``dlc`` first on PATH and its cloud in ``cloud``."""
    return {**os.environ, "FAKE_DLC_STATE": str(cloud), "PATH": f"{DOUBLE_BIN}{os.pathsep}{os.environ['PATH']}"}


def aliyun_file(folder: Path) -> Path:
    path = folder / "aliyun.json"
    (folder / "dlc.ini").write_text("[default]\n")
    path.write_text(json.dumps({"workspace_id": "ws", "resource_id": "quota", "worker_image": "img",
                                "python_env_path": str(Path(sys.executable).parent.parent),
                                "dlc_config_path": str(folder / "dlc.ini")}))
    return path


# The orchestrator in a process of its own, reporting its own CPU time (threads included, children
# such as tasks and dlc calls not): what orchestration costs, whatever else loads the machine.
_DRIVER = """
import json, resource, sys
import orchestra
run = orchestra.run(sys.argv[1], mode='infer', quiet=True)
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"exit_code": run.exit_code, "cpu_s": use.ru_utime + use.ru_stime}))
"""


def run(folder: Path, name: str, tasks: int, runner: str, env: dict[str, str],
        model: str = "") -> tuple[float, float, Path]:
    """``(whole run wall, orchestrator CPU seconds, run folder)`` of the infer stage of one config."""
    imports = "from orchestra.runners import DLCRunner, LocalRunner"
    cfg = trivial_config(folder, name, tasks, imports, runner, folder / f"out_{name}")
    if model:
        cfg.write_text(cfg.read_text().replace("abbr='det')", f"abbr='det'{model})"))
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", _DRIVER, str(cfg)], cwd=REPO, capture_output=True, text=True,
                         env=env)
    total = time.perf_counter() - t0
    last = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else "{}"
    report = json.loads(last) if last.startswith("{") else {}
    if res.returncode != 0 or report.get("exit_code") != 0:
        raise SystemExit(f"{name} failed:\n{res.stdout[-2000:]}{res.stderr[-3000:]}")
    (out,) = [p for p in (folder / f"out_{name}").iterdir() if p.is_dir()]
    return total, report["cpu_s"], out


def latencies(out: Path, cloud: Path) -> tuple[list[float], list[float]]:
    """Per task: ``started`` -> command start, command end -> ``done`` (seconds)."""
    events = read_events(out)
    started = {e["task_id"]: e["ts"] for e in events if e["event"] == "started"}
    done = {e["task_id"]: e["ts"] for e in events if e["event"] == "done"}
    job_task = {e["job_id"]: e["task_id"] for e in events if e["event"] == "dlc_submitted"}
    start_lat, end_lat = [], []
    for job_id, task_id in job_task.items():
        times = json.loads((cloud / "jobs" / job_id / "times.json").read_text())
        start_lat.append(times["started"] - started[task_id])
        end_lat.append(done[task_id] - times["finished"])
    return start_lat, end_lat


def calls(cloud: Path, since: float = 0.0, until: float = float("inf")) -> Counter[str]:
    lines = (cloud / "calls.jsonl").read_text().splitlines()
    counted: Counter[str] = Counter()
    for line in lines:
        c = json.loads(line)
        if since <= c["ts"] < until:
            counted[c["verb"].split()[0]] += 1
    return counted


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):5.2f} s" if xs else "  -  "


def p90(xs: list[float]) -> str:
    return f"{sorted(xs)[int(0.9 * (len(xs) - 1))]:5.2f} s" if xs else "  -  "


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--steady-s", type=float, default=40.0, help="length of each steady-state job")
    args = parser.parse_args()
    rows: dict[str, list[tuple[float, float, float, list[float], list[float], Counter[str]]]] = {}
    steady: Counter[str] = Counter()
    steady_jobs = min(args.tasks, 20)  # few enough that the policy, not the rate cap, sets the calls
    steady_window = 0.0
    for r in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="dlc_bench_") as tmp:
            folder = Path(tmp)
            aliyun = aliyun_file(folder)
            configs = {
                "LocalRunner": f"dict(type=LocalRunner, max_num_workers={args.tasks}",
                "DLCRunner, defaults (max_calls_per_s=10)":
                    f"dict(type=DLCRunner, aliyun_cfg={str(aliyun)!r}, max_num_workers={args.tasks}",
                "DLCRunner, max_calls_per_s=50":
                    f"dict(type=DLCRunner, aliyun_cfg={str(aliyun)!r}, max_num_workers={args.tasks}, "
                    "max_calls_per_s=50",
            }
            for i, (what, runner) in enumerate(configs.items()):
                cloud = folder / f"cloud{i}"
                env = double_env(cloud)
                total, cpu, out = run(folder, f"b{i}", args.tasks, runner, env)
                wall, done = stage_wall(out, "infer")
                if done != args.tasks:
                    raise SystemExit(f"{what}: {done} of {args.tasks} tasks done")
                lat = latencies(out, cloud) if cloud.exists() else ([], [])
                rows.setdefault(what, []).append((wall, total, cpu, *lat,
                                                  calls(cloud) if cloud.exists() else Counter()))
                print(f"round {r + 1}: {what}: infer stage {wall:.2f} s, whole run {total:.2f} s", file=sys.stderr)
            if r == 0:  # the steady state of long jobs, time-compressed 10x
                cloud = folder / "cloud_steady"
                env = double_env(cloud)
                runner = (f"dict(type=DLCRunner, aliyun_cfg={str(aliyun)!r}, max_num_workers={steady_jobs}, "
                          "poll_interval_s=1, max_poll_interval_s=6, log_settle_s=1, max_calls_per_s=100")
                t0 = time.time()
                run(folder, "steady", steady_jobs, runner, env, model=f", load_s={args.steady_s}")
                t0 = min(json.loads(line)["ts"] for line in (cloud / "calls.jsonl").read_text().splitlines())
                since, until = t0 + 15, t0 + args.steady_s - 2  # every job running, intervals at their cap
                steady = calls(cloud, since, until)
                steady_window = until - since
    if shutil.which("dlc"):
        print("note: a 'dlc' on PATH was not used; the benchmark always runs the double", file=sys.stderr)
    base_wall = statistics.median(x[0] for x in rows["LocalRunner"])
    width = max(len(k) for k in rows) + 2
    print(f"{args.tasks} trivial tasks, max_num_workers={args.tasks}, median of {args.repeat}")
    print(f"{'runner':<{width}}  infer stage  vs local  orchestrator CPU/task  start lat. (med/p90)  "
          "end lat. (med/p90)")
    print(f"{'-' * width}  -----------  --------  ---------------------  --------------------  ------------------")
    for what, samples in rows.items():
        wall = statistics.median(s[0] for s in samples)
        cpu = statistics.median(s[2] for s in samples) / args.tasks
        start = [x for s in samples for x in s[3]]
        end = [x for s in samples for x in s[4]]
        print(f"{what:<{width}}  {wall:9.2f} s  {wall / base_wall:7.2f}x  {cpu * 1000:16.0f} ms    "
              f"{med(start)} / {p90(start)}     {med(end)} / {p90(end)}")
    print(f"\n{'dlc calls per task':<{width}}  submit   get  logs  stop  total")
    for what, samples in rows.items():
        if what == "LocalRunner":
            continue
        c = samples[0][5]
        n = args.tasks
        print(f"{what:<{width}}  {c['submit'] / n:6.2f} {c['get'] / n:5.2f} {c['logs'] / n:5.2f} {c['stop'] / n:5.2f}"
              f" {sum(c.values()) / n:6.2f}")
    per_job_per_max = sum(steady.values()) / steady_jobs / (steady_window / 6.0)
    print(f"\nsteady state ({steady_jobs} jobs running, intervals at max_poll_interval_s, 10x compressed): "
          f"{dict(steady)} in {steady_window:.1f} s = {per_job_per_max:.2f} calls per job per max_poll_interval_s")
    per_min = per_job_per_max * 1000  # max_poll_interval_s=60 s by default: per job per minute
    print(f"1,000 running jobs at the defaults (max_poll_interval_s=60): {per_min:.0f} calls/min wanted, "
          f"capped by max_calls_per_s=10 at 600/min")
    print(f"\n(machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end, python "
          f"{sys.version.split()[0]}; each dlc call and each job's driver is a Python process of the double)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
