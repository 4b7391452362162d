"""The main job's plan (``configs/eval_llama.py``), as ``run.py --dry-run`` prints it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gsm8k_rows_are_one_infer_task_queued_first(tmp_path: Path) -> None:
    # A generation batch runs until its longest row ends and 4 of the 16 GSM8K rows run to
    # max_out_len: split into shards, each shard paid that tail again (docs/benchmarks.md).
    res = subprocess.run(
        [sys.executable, "run.py", "configs/eval_llama.py", "-w", str(tmp_path / "out"), "--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stderr
    infer = re.findall(r"^  (infer_\S+)\s.*units: (.*)$", res.stdout, flags=re.M)
    gsm8k = [(task, units) for task, units in infer if "gsm8k" in units]
    assert gsm8k == [(gsm8k[0][0], "gsm8k[0:16]")], infer
    # the costliest task is queued first, so its serial decoding overlaps the scoring tasks
    assert infer[0] == gsm8k[0], infer
