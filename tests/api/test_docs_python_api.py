"""docs/python-api.md's first example, run as written (from a folder that has the repository's
``configs/``), in a fresh interpreter: the Python API does what the page says."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_python_api_example_runs_as_written(tmp_path: Path) -> None:
    page = (REPO / "docs/python-api.md").read_text(encoding="utf-8")
    example = re.search(r"```python\n(.*?)```", page, re.S)
    assert example and "orchestra.run(" in example.group(1)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", example.group(1)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "2 infer task(s)"
    status, run_dir = lines[1].split(" ", 1)
    assert status == "done" and Path(run_dir).parent == tmp_path / "outputs/api_example"
    rows = [ast.literal_eval(line) for line in lines[2:]]  # the dicts the example prints
    assert {(r["dataset"], r["metric"]) for r in rows} == {("arith", "numeric_match"), ("capitals", "accuracy"),
                                                            ("capitals", "accuracy_norm")}
    assert all(r["model"] == "deterministic" and r["value"] == 1.0 for r in rows)
