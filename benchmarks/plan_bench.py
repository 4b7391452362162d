"""Planning many datasets that slice one file, or four lm-eval tasks: ``--dry-run`` wall time and peak memory.

The case of issue 15.14: 2,000 datasets, each a ``test_range`` slice of one 20,000-row
JSON-lines file, one model.  Each measurement is a fresh ``run.py --dry-run`` process with an
empty cache (``--dry-run`` writes none), so every measurement is cold.  Give ``--tree DIR`` to measure another
checkout (e.g. an older commit in a git worktree) under the same conditions, in the same run.

    python benchmarks/plan_bench.py [--datasets 2000] [--rows 20000] [--tree /path/to/other/checkout]

``--lmeval`` plans four ``LmEvalDataset``s instead (ARC-Easy, ARC-Challenge, BoolQ, HellaSwag,
``--limit`` documents each, from the offline task folder of ``benchmarks/lmeval_bench.py``):
each needs lm-eval's answer about its task (a probe subprocess: lm-eval imported, its task
index built, the task's data loaded), so this measures the probes (issue 40).  ``--base
COMMIT`` extracts that commit beside (``git archive``) and measures it too, alternating:

    python benchmarks/plan_bench.py --lmeval --base 6ba32d6 [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import REPO, print_table


def write_config(folder: Path, datasets: int, rows: int) -> Path:
    data = folder / "big.jsonl"
    with open(data, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"question": f"What is {i} + 1? " + "x" * 200, "answer": str(i + 1)}) + "\n")
    step = max(1, rows // datasets)
    entries = ",\n".join(
        f"    dict(type=JsonlDataset, abbr='slice{i}', path={str(data)!r}, "
        f"reader_cfg=dict(input_columns=['question'], output_column='answer', "
        f"test_range='[{i * step % rows}:{i * step % rows + step}]'), "
        f"infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)), "
        f"eval_cfg=dict(evaluator='numeric_match'))"
        for i in range(datasets)
    )
    cfg = folder / "many.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [
{entries}
]
work_dir = {str(folder / 'out')!r}
""")
    return cfg


_MEASURE = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "use = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(use.ru_maxrss, code, use.ru_utime + use.ru_stime)\n"
)


LMEVAL_TASKS = ["arc_easy", "arc_challenge", "boolq", "hellaswag"]


def write_lmeval_config(folder: Path, limit: int) -> Path:
    """A config of the four lm-eval tasks, ``limit`` documents each, from the offline task folder."""
    tasks = folder / "offline" / "tasks"
    if not tasks.exists():
        subprocess.run([sys.executable, str(REPO / "tools" / "lmeval_offline_tasks.py"), str(folder / "offline")],
                       check=True, capture_output=True)
    entries = "".join(f"    dict(type=LmEvalDataset, abbr={t!r}, task={t!r}, include_path={str(tasks)!r}, "
                      f"test_range='[0:{limit}]'),\n" for t in LMEVAL_TASKS)
    cfg = folder / "lmeval4.py"
    cfg.write_text("from orchestra.datasets.lmeval import LmEvalDataset\n"
                   "from orchestra.models.fake import DeterministicModel\n"
                   "models = [dict(type=DeterministicModel, abbr='det')]\n"
                   f"datasets = [\n{entries}]\nwork_dir = {str(folder / 'out')!r}\n")
    return cfg


def extract(commit: str, folder: Path) -> Path:
    """``commit`` of this repository as a plain tree under ``folder`` (as scale_bench's --base-tree)."""
    tree = folder / f"tree-{commit}"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def dry_run(tree: Path, cfg: Path, cache: Path) -> tuple[float, float, int, float]:
    """Wall seconds, peak RSS in MB, exit code and CPU seconds (user + system, its subprocesses
    included: what the load of other work does not inflate) of one ``--dry-run`` of ``tree``'s CLI
    (in a wrapper process of its own, so its peak memory is its own)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "ORCHESTRA_CACHE_DIR": str(cache), "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "run.py", str(cfg), "--dry-run"],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    peak_kb, code, cpu = res.stdout.split()
    return wall, int(peak_kb) / 1024, int(code), float(cpu)


def _uptime() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--lmeval", action="store_true", help="plan the four lm-eval tasks instead")
    ap.add_argument("--limit", type=int, default=100, help="with --lmeval: documents per task")
    ap.add_argument("--repeat", type=int, default=1, help="measurements of each tree (alternating)")
    ap.add_argument("--tree", type=Path, help="another checkout to measure the same way (e.g. an older commit)")
    ap.add_argument("--base", help="a commit to extract beside and measure the same way (instead of --tree)")
    args = ap.parse_args()
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.lmeval:
            cfg = write_lmeval_config(folder, args.limit)
            what = f"--dry-run of 4 lm-eval tasks ({args.limit} docs each)"
        else:
            cfg = write_config(folder, args.datasets, args.rows)
            what = f"--dry-run of {args.datasets} datasets slicing one file"
        trees = [("this checkout", REPO)]
        if args.base:
            trees.append((f"base {args.base}", extract(args.base, folder)))
        elif args.tree:
            trees.append(("--tree", args.tree.resolve()))
        for r in range(args.repeat):
            for label, tree in trees if r % 2 == 0 else trees[::-1]:
                load = _uptime()
                # a fresh, empty cache each time: a dry run writes none, so every measurement is cold
                wall, peak, code, cpu = dry_run(tree, cfg, folder / f"cache-{r}-{label.replace(' ', '_')}")
                rows.append((f"{label}: {what}: wall (load before: {load})", f"{wall:.2f} s"))
                rows.append((f"{label}: CPU time, user + system, subprocesses included", f"{cpu:.2f} s"))
                rows.append((f"{label}: peak memory (max RSS of the process)", f"{peak:.0f} MB"))
                rows.append((f"{label}: exit code", str(code)))
                print(f"{label}: {wall:.2f} s, {cpu:.2f} s CPU, {peak:.0f} MB, exit {code} (load before: {load})",
                      file=sys.stderr,
                      flush=True)  # as it goes: a long run under load still leaves its numbers
    print_table(rows)


if __name__ == "__main__":
    main()
