"""A 3 models x 4 datasets x 3 settings sweep on the deterministic model.

Measures planning time (``--dry-run``), how many prediction files the sweep shares between
variants whose predictions cannot differ (the swept setting is the evaluator, which only
changes scoring), and the wall time of the sweep against the same work as three hand-written
configs run one after another, in one run of this script.

    python benchmarks/sweep_bench.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import REPO, print_table

EVALUATORS = {"num": "numeric_match", "exact": "exact_match", "acc": "accuracy"}


def write_config(folder: Path, name: str, tail: str, evaluator: str = "numeric_match") -> Path:
    data = folder / "data"
    data.mkdir(exist_ok=True)
    paths = {}
    for ds in ("add", "add_big", "add_neg", "words"):
        path = data / f"{ds}.jsonl"
        with open(path, "w") as f:
            for i in range(50):
                f.write(json.dumps({"question": f"What is {i} + {len(ds)}?", "answer": str(i + len(ds))}) + "\n")
        paths[ds] = path
    datasets = ",\n".join(
        f"    dict(type=JsonlDataset, abbr={ds!r}, path={str(p)!r}, "
        "reader_cfg=dict(input_columns=['question'], output_column='answer'), "
        "infer_cfg=dict(prompt_template='{question}', inferencer=dict(type='gen', max_out_len=8)), "
        f"eval_cfg=dict(evaluator={evaluator!r}))" for ds, p in paths.items())
    cfg = folder / f"{name}.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel
from orchestra.runners import LocalRunner

models = [dict(type=DeterministicModel, abbr=f'm{{i}}', path=f'det-{{i}}', delay_s=0.05) for i in range(3)]
datasets = [
{datasets}
]
infer = dict(runner=dict(type=LocalRunner, max_num_workers=2, reuse_workers=True))
eval = dict(runner=dict(type=LocalRunner, max_num_workers=2, reuse_workers=True))
work_dir = {str(folder / ('out_' + name))!r}
{tail}
""")
    return cfg


def timed(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "run.py", *args], cwd=REPO, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise SystemExit(f"run.py {' '.join(args)} failed:\n{res.stderr[-2000:]}")
    return time.perf_counter() - t0, res


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sweep = write_config(folder, "sweep", "sweep = dict(params={'datasets.eval_cfg.evaluator': "
                             f"{EVALUATORS!r}}}, baseline={{'evaluator': 'num'}})")
        plan_s, dry = timed(str(sweep), "--dry-run")
        shared = next(line for line in dry.stdout.splitlines() if "shared" in line).split()[0]
        sweep_s, _ = timed(str(sweep))
        (run,) = (folder / "out_sweep").iterdir()
        made = len(list((run / "predictions").rglob("*.jsonl")))
        hand_s = 0.0
        for label, evaluator in EVALUATORS.items():
            wall, _ = timed(str(write_config(folder, f"hand_{label}", "", evaluator)))
            hand_s += wall
        print_table([
            ("(model, dataset) pairs in the sweep", "36 (3 models x 4 datasets x 3 evaluators)"),
            ("planning: --dry-run of the sweep (wall, incl. interpreter start)", f"{plan_s:.2f} s"),
            ("prediction files made / shared with another variant", f"{made} / {shared}"),
            ("sweep run, wall", f"{sweep_s:.2f} s"),
            ("3 hand-written configs run one by one, wall", f"{hand_s:.2f} s"),
            ("sweep / hand-written", f"{sweep_s / hand_s:.2f}x"),
        ])


if __name__ == "__main__":
    main()
