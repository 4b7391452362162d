"""Planning many datasets that slice one file: ``--dry-run`` wall time and peak memory.

The case of issue 15.14: 2,000 datasets, each a ``test_range`` slice of one 20,000-row
JSON-lines file, one model.  Each measurement is a fresh ``run.py --dry-run`` process with an
empty cache (``--dry-run`` writes none), so every measurement is cold.  Give ``--tree DIR`` to measure another
checkout (e.g. an older commit in a git worktree) under the same conditions, in the same run.

    python benchmarks/plan_bench.py [--datasets 2000] [--rows 20000] [--tree /path/to/other/checkout]
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
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)\n"
)


def dry_run(tree: Path, cfg: Path, cache: Path) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in MB and exit code of one ``--dry-run`` of ``tree``'s CLI (in a
    wrapper process of its own, so its peak memory is its own)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "ORCHESTRA_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "run.py", str(cfg), "--dry-run"],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    peak_kb, code = res.stdout.split()
    return wall, int(peak_kb) / 1024, int(code)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--tree", type=Path, help="another checkout to measure the same way (e.g. an older commit)")
    args = ap.parse_args()
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cfg = write_config(folder, args.datasets, args.rows)
        trees = [("this checkout", REPO)] + ([("--tree", args.tree.resolve())] if args.tree else [])
        for label, tree in trees:
            wall, peak, code = dry_run(tree, cfg, folder / f"cache-{label.replace(' ', '_')}")
            rows.append((f"{label}: --dry-run of {args.datasets} datasets slicing one file: wall", f"{wall:.2f} s"))
            rows.append((f"{label}: peak memory (max RSS of the process)", f"{peak:.0f} MB"))
            rows.append((f"{label}: exit code", str(code)))
    print_table(rows)


if __name__ == "__main__":
    main()
