"""Sweep scale: planning 1k / 10k / 100k tasks, and a real run of many trivial tasks.

``plan``: N models x N datasets (each its own 1,000-row file), DeterministicModel,
SizePartitioner cut so that every (model, dataset) is one infer task and one eval task.  Each
point is a fresh ``run.py --dry-run`` process (wall, its own CPU time and peak RSS).  Give
``--base-tree DIR`` (e.g. ``git archive 30be510 | tar -x -C DIR``) to measure another
checkout the same way in the same run; the table then shows the ratios.

``run``: ``--run-tasks`` infer tasks of one row each (plus as many eval tasks) through
LocalRunner with warm workers; then ``-r`` of the finished run, streaming events.jsonl,
``--mode viz`` (summary, pivot, report) and the report opened in headless Chromium.

    python benchmarks/scale_bench.py plan [--sides 32,100,316] [--base-tree DIR] [--repeat 1]
    python benchmarks/scale_bench.py run [--run-tasks 10000] [--workers 2] [--base-tree DIR]
    python benchmarks/scale_bench.py refuse [--side 300] [--base-tree DIR]   # issue 20.8
    python benchmarks/scale_bench.py open [--run-tasks 10000] [--repeat 5] [--base-tree DIR] [--gpus 2]
    python benchmarks/scale_bench.py resume [--run-tasks 10000 | --run-dir DIR] --base-tree DIR [--repeat 5]
    python benchmarks/scale_bench.py cli [--side 316] [--base-tree DIR] [--repeat 3]   # issue 40: the command line
    (Slurm arrays and Ray at this scale: benchmarks/scale_backends_bench.py)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import REPO, print_table

sys.path.insert(0, str(REPO / "tests" / "report"))
from chromium import Chromium, find_chromium  # noqa: E402

ROWS = 1000


def write_plan_config(folder: Path, side: int) -> Path:
    """``side`` models x ``side`` datasets, one infer and one eval task per pair."""
    data = folder / "data"
    data.mkdir(exist_ok=True)
    for i in range(side):
        path = data / f"d{i}.jsonl"
        if not path.exists():
            with open(path, "w") as f:
                for r in range(ROWS):
                    f.write(json.dumps({"question": f"What is {r} + {i}?", "answer": str(r + i)}) + "\n")
    cfg = folder / f"plan_{side}.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.partitioners import NaivePartitioner, SizePartitioner

models = [dict(type=DeterministicModel, abbr=f'm{{i}}', path=f'det-{{i}}') for i in range({side})]
datasets = [dict(type=JsonlDataset, abbr=f'd{{i}}', path={str(data)!r} + f'/d{{i}}.jsonl',
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match')) for i in range({side})]
infer = dict(partitioner=dict(type=SizePartitioner, max_task_size={ROWS * 20}, granularity=1))
eval = dict(partitioner=dict(type=NaivePartitioner))
work_dir = {str(folder / 'out')!r}
""")
    return cfg


_MEASURE = (
    "import resource, subprocess, sys, time\n"
    "t0 = time.perf_counter()\n"
    "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "wall = time.perf_counter() - t0\n"
    "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, code)\n"
)


def measured(tree: Path, argv: list[str], cache: Path, base_env: dict[str, str] | None = None
             ) -> tuple[float, float, float]:
    """Wall s, CPU s and peak RSS MB of ``run.py ARGV`` from ``tree``, in a wrapper of its own."""
    env = {**(os.environ if base_env is None else base_env), "PYTHONPATH": str(tree), "ORCHESTRA_CACHE_DIR": str(cache)}
    res = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "run.py", *argv],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    wall, cpu, peak_kb, code = res.stdout.split()
    if int(code) != 0:
        raise SystemExit(f"{tree}: run.py {' '.join(argv)} exited {code}")
    return float(wall), float(cpu), int(peak_kb) / 1024


def plan_main(args: argparse.Namespace) -> None:
    sides = [int(s) for s in args.sides.split(",")]
    trees = [("new", REPO)] + ([("base", args.base_tree.resolve())] if args.base_tree else [])
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for side in sides:
            cfg = write_plan_config(folder, side)
            got: dict[str, tuple[float, float, float]] = {}
            for label, tree in trees:
                best = min((measured(tree, [str(cfg), "--dry-run"], folder / f"cache-{label}")
                            for _ in range(args.repeat)), key=lambda m: m[1])
                got[label] = best
                wall, cpu, peak = best
                rows.append((f"{label}: {side}x{side} = {side * side} + {side * side} tasks, "
                             f"{side * side * ROWS / 1e6:g}M samples: wall / CPU / peak RSS",
                             f"{wall:.2f} s / {cpu:.2f} s / {peak:.0f} MB"))
            if "base" in got:
                (nw, nc, nm), (bw, bc, bm) = got["new"], got["base"]
                rows.append((f"base / new at {side * side} + {side * side} tasks: wall / CPU / RSS",
                             f"{bw / nw:.1f}x / {bc / nc:.1f}x / {bm / nm:.1f}x"))
    print_table(rows)


def _timed(tree: Path, argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "run.py", *argv], cwd=tree, env=env, capture_output=True, text=True,
                         timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"run.py {' '.join(argv)} exited {res.returncode}:\n{res.stderr[-3000:]}")
    return time.perf_counter() - t0, res


def chromium_cold(page: Path, mode: str) -> float:
    """Seconds for a fresh headless Chromium to open ``page`` and leave: ``dump`` (load, scripts,
    then the DOM written to stdout: the first measurement of issue 23) or ``shot`` (load,
    scripts, layout and paint of a 1300x900 window into a PNG)."""
    with tempfile.TemporaryDirectory() as profile:
        extra = ["--dump-dom"] if mode == "dump" else [f"--screenshot={profile}/shot.png", "--window-size=1300,900"]
        t0 = time.perf_counter()
        subprocess.run([find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                        *extra, page.as_uri()], capture_output=True, timeout=120, check=True)
        return time.perf_counter() - t0


def open_rows(reports: dict[str, Path], folder: Path, repeat: int) -> list[tuple[str, str]]:
    """Each report opened ``repeat`` times in a fresh Chromium (interleaved with an empty page,
    so that load on the machine hits all alike; medians), then once more over the DevTools
    protocol: the load event, first paint, the timeline's bars and the page's elements."""
    blank = folder / "blank.html"
    blank.write_text("<!doctype html><title>x</title>")
    pages = {"empty page": blank, **reports}
    times: dict[tuple[str, str], list[float]] = {}
    chromium_cold(blank, "dump")  # untimed: the first start reads Chromium from disk
    for _ in range(repeat):
        for label, page in pages.items():
            for mode in ("dump", "shot"):
                times.setdefault((label, mode), []).append(chromium_cold(page, mode))
    rows = []
    for mode, what in (("dump", "--dump-dom (start, load, scripts, DOM out)"),
                       ("shot", "--screenshot (start, load, scripts, paint)")):
        empty = statistics.median(times[("empty page", mode)])
        for label in pages:
            med = statistics.median(times[(label, mode)])
            over = "" if label == "empty page" else f" ({med - empty:+.2f} s over the empty page)"
            rows.append((f"cold Chromium {what}: {label}, median of {repeat}", f"{med:.2f} s{over}"))
    drawn = "document.querySelectorAll('#tl rect.bar').length || +(document.getElementById('tl').dataset || {}).bars"
    with Chromium() as chrome:
        chrome.open(str(blank))
        for label, page in reports.items():
            load = chrome.open(str(page))
            fcp = chrome.wait_for("(performance.getEntriesByType('paint').find(e => e.name === "
                                  "'first-contentful-paint') || {}).startTime")
            bars, nodes = chrome.eval(drawn), chrome.eval("document.getElementsByTagName('*').length")
            rows.append((f"DevTools: {label}: load event / first paint / bars / elements",
                         f"{load:.2f} s / {fcp / 1000:.2f} s / {bars} / {nodes}"))
            if chrome.console:
                rows.append((f"DevTools: {label}: console errors", str(chrome.console)))
    return rows


def _run_one(tree: Path, label: str, folder: Path, args: argparse.Namespace) -> list[tuple[str, str]]:
    from bench_common import stage_wall, trivial_config

    env = {**os.environ, "PYTHONPATH": str(tree), "ORCHESTRA_CACHE_DIR": str(folder / "cache")}
    runner = f"dict(type=LocalRunner, max_num_workers={args.workers}, reuse_workers=True"
    cfg = trivial_config(folder, f"run_{label}", args.run_tasks, "from orchestra.runners import LocalRunner", runner,
                         folder / f"out_{label}")
    total, _ = _timed(tree, [str(cfg)], env)
    (run,) = [p for p in (folder / f"out_{label}").iterdir() if p.is_dir()]
    wall, done = stage_wall(run, "infer")
    rows = [(f"{label}: infer stage, {done} tasks, {args.workers} warm workers: wall", f"{wall:.1f} s"),
            (f"{label}: overhead per task (wall x workers / tasks)", f"{wall * args.workers / done:.4f} s"),
            (f"{label}: whole run (plan, both stages, summary, report): wall", f"{total:.1f} s")]
    cache = folder / "cache"
    for what, argv in (("-r --dry-run (decides every output done)", ["-r", "--dry-run"]),
                       ("-r of the finished run (decides, then rebuilds summary + report)", ["-r"]),
                       ("--mode viz -r (summary, pivot, report.html, trace)", ["-r", "--mode", "viz"])):
        w, c, m = measured(tree, [str(cfg), *argv], cache)
        rows.append((f"{label}: {what}: wall / CPU / peak RSS", f"{w:.2f} s / {c:.2f} s / {m:.0f} MB"))
    size = (run / "events.jsonl").stat().st_size
    t0 = time.perf_counter()
    with open(run / "events.jsonl", encoding="utf-8") as f:
        lines = sum(1 for line in f if line.strip() and json.loads(line))
    rows.append((f"{label}: events.jsonl: {lines} events, {size / 1e6:.1f} MB, streamed once",
                 f"{time.perf_counter() - t0:.2f} s"))
    report = run / "summary" / "report.html"
    rows.append((f"{label}: report.html size", f"{report.stat().st_size / 1e6:.1f} MB"))
    return rows + open_rows({f"{label}: report.html": report}, folder, 3)


def run_main(args: argparse.Namespace) -> None:
    trees = [("new", REPO)] + ([("base", args.base_tree.resolve())] if args.base_tree else [])
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, tree in trees:
            folder = Path(tmp) / label
            folder.mkdir()
            rows += _run_one(tree, label, folder, args)
    print_table(rows)


def refuse_main(args: argparse.Namespace) -> None:
    """A sweep over max_variants (issue 20.8): one model swept over SIDE x SIDE x 3 values; how
    long until run.py refuses it, and at what memory (a base that expands first is stopped at 60 s)."""
    trees = [("new", REPO)] + ([("base", args.base_tree.resolve())] if args.base_tree else [])
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = folder / "rows.jsonl"
        data.write_text(json.dumps({"question": "1 + 1?", "answer": "2"}) + "\n")
        cfg = folder / "sweep.py"
        cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='m')]
datasets = [dict(type=JsonlDataset, abbr='d', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
sweep = dict(params={{'models.generation_kwargs.temperature': [i / {args.side} for i in range({args.side})],
                      'models.generation_kwargs.top_p': [i / {args.side} for i in range({args.side})],
                      'models.max_out_len': [8, 16, 32]}}, max_variants=50)
work_dir = {str(folder / 'out')!r}
""")
        for label, tree in trees:
            env = {**os.environ, "PYTHONPATH": str(tree), "ORCHESTRA_CACHE_DIR": str(folder / "cache")}
            res = subprocess.run([sys.executable, "-c", _MEASURE, "timeout", "60", sys.executable, "run.py",
                                  str(cfg)], cwd=tree, env=env, capture_output=True, text=True, timeout=900)
            wall, cpu, peak_kb, code = res.stdout.split()
            rows.append((f"{label}: {args.side} x {args.side} x 3 values, max_variants=50: "
                         "refused after (wall / CPU / peak RSS, exit code)",
                         f"{float(wall):.2f} s / {float(cpu):.2f} s / {int(peak_kb) / 1024:.0f} MB, {code}"))
    print_table(rows)


def write_gpu_samples(run: Path, gpus: int, per_gpu: int = 20000) -> None:
    """A made-up ``gpu.jsonl`` over the run's time span, in the sampler's record shape: the
    report keeps 2,000 points per GPU of it, the most it ever draws."""
    with open(run / "events.jsonl", encoding="utf-8") as f:
        ts = [json.loads(line)["ts"] for line in f if line.strip()]
    start, span = min(ts), max(max(ts) - min(ts), 1.0)
    with open(run / "gpu.jsonl", "w", encoding="utf-8") as f:
        for i in range(per_gpu):
            for g in range(gpus):
                f.write(json.dumps({"t": start + span * i / per_gpu, "gpu": g, "util": (i * 7 + g * 13) % 101,
                                    "mem_mib": 1000 + i % 500}) + "\n")


def open_main(args: argparse.Namespace) -> None:
    """One run of ``--run-tasks`` trivial tasks; its report written by this tree (and by
    ``--base-tree``, from the same run folder), then opened in Chromium."""
    from bench_common import trivial_config

    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        env = {**os.environ, "PYTHONPATH": str(REPO), "ORCHESTRA_CACHE_DIR": str(folder / "cache")}
        cfg = trivial_config(folder, "open", args.run_tasks, "from orchestra.runners import LocalRunner",
                             "dict(type=LocalRunner, max_num_workers=2, reuse_workers=True", folder / "out")
        _timed(REPO, [str(cfg)], env)
        (run,) = [p for p in (folder / "out").iterdir() if p.is_dir()]
        reports: dict[str, Path] = {}
        trees = [("new", REPO)] + ([("base", args.base_tree.resolve())] if args.base_tree else [])
        for label, tree in trees:
            wall, _ = _timed(tree, [str(cfg), "-r", run.name, "--mode", "viz"], {**env, "PYTHONPATH": str(tree)})
            page = run / "summary" / f"report-{label}.html"  # beside the original: its links still work
            shutil.copyfile(run / "summary" / "report.html", page)
            reports[f"{label}: report.html"] = page
            rows.append((f"{label}: report.html of {args.run_tasks} + 1 tasks: size / --mode viz -r",
                         f"{page.stat().st_size / 1e6:.2f} MB / {wall:.1f} s"))
        if args.gpus:  # the same report with GPU lanes: a made-up gpu.jsonl, 20,000 samples per GPU
            write_gpu_samples(run, args.gpus)
            wall, _ = _timed(REPO, [str(cfg), "-r", run.name, "--mode", "viz"], env)
            page = run / "summary" / "report-gpu.html"
            shutil.copyfile(run / "summary" / "report.html", page)
            reports[f"new + {args.gpus} GPU lanes: report.html"] = page
            rows.append((f"new + {args.gpus} GPU lanes: report.html size / --mode viz -r",
                         f"{page.stat().st_size / 1e6:.2f} MB / {wall:.1f} s"))
        rows += open_rows(reports, folder, args.repeat)
    print_table(rows)


def resume_main(args: argparse.Namespace) -> None:
    """``-r`` of a finished run (``--run-dir``, or one of ``--run-tasks`` trivial tasks made now),
    from this tree and ``--base-tree``, each on its own copy of the run folder, alternating
    ``--repeat`` times after one untimed ``-r`` each (which also leaves the .pyc files a user's
    second command finds; bytecode is written even where PYTHONDONTWRITEBYTECODE is set).
    Medians of wall and CPU: the machine is shared, so the CPU column is the steadier one."""
    from bench_common import read_events, trivial_config

    trees = [("new", REPO)] + ([("base", args.base_tree.resolve())] if args.base_tree else [])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        if args.run_dir:
            src = args.run_dir.resolve()
            cfg = src / "config.py"
        else:
            cfg = trivial_config(folder, "resume", args.run_tasks, "from orchestra.runners import LocalRunner",
                                 "dict(type=LocalRunner, max_num_workers=2, reuse_workers=True", folder / "made")
            _timed(REPO, [str(cfg)], {**env, "PYTHONPATH": str(REPO), "ORCHESTRA_CACHE_DIR": str(folder / "cache")})
            (src,) = [p for p in (folder / "made").iterdir() if p.is_dir()]
        times: dict[str, list[tuple[float, float, float]]] = {}
        for label, _ in trees:
            shutil.copytree(src, folder / label / "out" / src.name, symlinks=True)
        for i in range(args.repeat + 1):
            for label, tree in trees if i % 2 == 0 else list(reversed(trees)):
                run = folder / label / "out" / src.name
                argv = [str(cfg), "-w", str(run.parent), "-r", run.name]
                got = measured(tree, argv, folder / label / "cache", env)
                if i:  # the first is untimed: a report written by another tree, .pyc files
                    times.setdefault(label, []).append(got)
                last = [e for e in read_events(run) if e["event"] == "run_started"][-1]
                if any(last["tasks"].values()):
                    raise SystemExit(f"{label}: -r planned tasks: {last['tasks']}")
        rows: list[tuple[str, str]] = []
        med = {label: tuple(statistics.median(m[k] for m in t) for k in range(3)) for label, t in times.items()}
        for label, (w, c, m) in med.items():
            rows.append((f"{label}: -r of the finished run, median of {args.repeat}: wall / CPU / peak RSS",
                         f"{w:.2f} s / {c:.2f} s / {m:.0f} MB (walls: "
                         f"{', '.join(f'{x[0]:.2f}' for x in times[label])})"))
        if "base" in med:
            ratios = " / ".join(f"{b / n:.2f}x" for b, n in zip(med["base"], med["new"]))
            rows.append(("base / new: wall / CPU / RSS", ratios))
    print_table(rows)


def first_start(tree: Path, cfg: Path, work: Path, cache: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """Wall s from ``run.py CFG``'s start to its first task's ``started`` event, with the
    orchestrator's CPU s and peak RSS MB at that moment (from /proc); then the run is stopped
    (SIGINT, as Ctrl-C) and, once its ``run_finished`` event says every task is stopped, killed
    (the summary and report of 200,000 cancelled tasks are not what is measured).  events.jsonl
    is looked at every 20 ms (a benchmark's look, not a test's)."""
    env = {**env, "PYTHONPATH": str(tree), "ORCHESTRA_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "run.py", str(cfg), "-w", str(work)], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    events: Path | None = None
    offset, seen = 0, None
    try:
        while seen is None and proc.poll() is None:
            time.sleep(0.02)
            if events is None:
                events = next((r / "events.jsonl" for r in (work.iterdir() if work.is_dir() else [])
                               if (r / "events.jsonl").is_file()), None)
                continue
            with open(events, "rb") as f:
                f.seek(offset)
                data = f.read()
            whole = data[: data.rfind(b"\n") + 1]
            offset += len(whole)
            if b'"event": "started"' in whole:
                wall = time.perf_counter() - t0
                stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
                hwm = next(line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                           if line.startswith("VmHWM"))
                seen = (wall, cpu, int(hwm.split()[1]) / 1024)
        proc.send_signal(signal.SIGINT)
        while events is not None and proc.poll() is None:
            time.sleep(0.1)
            with open(events, "rb") as f:
                f.seek(offset)
                data = f.read()
            whole = data[: data.rfind(b"\n") + 1]
            offset += len(whole)
            if b'"event": "run_finished"' in whole:
                break
    finally:
        if proc.poll() is None:
            proc.kill() if seen is not None else proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=600)
    if seen is None:
        raise SystemExit(f"{tree}: run.py {cfg} ended before a task started:\n{err.decode()[-2000:]}")
    return seen


def cli_main(args: argparse.Namespace) -> None:
    """``run.py --dry-run`` and a normal run's time to its first task, from the command line,
    for this tree and ``--base-tree``, alternating ``--repeat`` times after one untimed dry run
    each (which leaves the .pyc files a user's second command finds).  Every measured command
    starts cold: a fresh ``ORCHESTRA_CACHE_DIR`` (no dataset-size cache) and a fresh work dir.
    Medians; the CPU column (the process's own) is the steadier one on a shared machine."""
    trees = [("new", REPO)] + ([("base", args.base_tree.resolve())] if args.base_tree else [])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    side = args.side
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cfg = write_plan_config(folder, side)
        times: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        n = 0
        for i in range(args.repeat + 1):
            for label, tree in trees if i % 2 == 0 else list(reversed(trees)):
                n += 1
                got = measured(tree, [str(cfg), "--dry-run", "-w", str(folder / f"w{n}")], folder / f"c{n}", env)
                if i:
                    times.setdefault((label, "dry"), []).append(got)
                    n += 1
                    times.setdefault((label, "first"), []).append(
                        first_start(tree, cfg, folder / f"w{n}", folder / f"c{n}", env))
                    shutil.rmtree(folder / f"w{n}", ignore_errors=True)
        what = {"dry": "run.py --dry-run", "first": "run.py: start to the first task's start"}
        med = {k: tuple(statistics.median(m[j] for m in t) for j in range(3)) for k, t in times.items()}
        for kind in ("dry", "first"):
            for label, _ in trees:
                w, c, m = med[(label, kind)]
                walls = ", ".join(f"{x[0]:.2f}" for x in times[(label, kind)])
                rows.append((f"{label}: {what[kind]}, {side}x{side} x {ROWS} rows, median of {args.repeat}: "
                             "wall / CPU / peak RSS", f"{w:.2f} s / {c:.2f} s / {m:.0f} MB (walls: {walls})"))
            if args.base_tree:
                ratios = " / ".join(f"{b / n:.2f}x" for b, n in zip(med[("base", kind)], med[("new", kind)]))
                rows.append((f"base / new: {what[kind]}: wall / CPU / RSS", ratios))
    print_table(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--sides", default="32,100,316", help="N for N models x N datasets, comma-separated")
    p.add_argument("--base-tree", type=Path, help="another checkout to measure the same way")
    p.add_argument("--repeat", type=int, default=1, help="runs per point; the one with the least CPU is kept")
    r = sub.add_parser("run")
    r.add_argument("--run-tasks", type=int, default=10000)
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--base-tree", type=Path, help="another checkout to measure the same way")
    o = sub.add_parser("open")
    o.add_argument("--run-tasks", type=int, default=10000)
    o.add_argument("--repeat", type=int, default=5, help="cold opens per page; the median is shown")
    o.add_argument("--base-tree", type=Path, help="another checkout whose report of the same run is measured too")
    o.add_argument("--gpus", type=int, default=0, help="also a report with N GPU lanes (made-up samples)")
    s = sub.add_parser("resume")
    s.add_argument("--run-tasks", type=int, default=10000, help="tasks of the run made first (without --run-dir)")
    s.add_argument("--run-dir", type=Path, help="a finished run folder to copy instead (its config.py is used)")
    s.add_argument("--repeat", type=int, default=5)
    s.add_argument("--base-tree", type=Path, help="another checkout measured the same way, alternating")
    c = sub.add_parser("cli")
    c.add_argument("--side", type=int, default=316, help="N models x N datasets of 1,000 rows")
    c.add_argument("--repeat", type=int, default=3)
    c.add_argument("--base-tree", type=Path, help="another checkout measured the same way, alternating")
    f = sub.add_parser("refuse")
    f.add_argument("--side", type=int, default=300)
    f.add_argument("--base-tree", type=Path, help="another checkout to measure the same way")
    args = ap.parse_args()
    {"plan": plan_main, "run": run_main, "refuse": refuse_main, "open": open_main,
     "resume": resume_main, "cli": cli_main}[args.what](args)


if __name__ == "__main__":
    main()
