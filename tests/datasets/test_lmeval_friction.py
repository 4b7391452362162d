"""What an lm-eval user meets in the first minute, through ``run.py`` with the real lm-eval probe:

- a dataset without ``abbr`` is named after its task;
- a misspelt task name is one line (exit 2) naming the config file, the key and the value, and
  lm-eval's closest task names.

The tasks are tests/datasets/lmeval_toy.py's, answered by ``DeterministicModel``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lmeval_toy as toy  # noqa: E402

sys.path.pop(0)


@pytest.mark.slow
def test_a_dataset_without_abbr_is_named_after_its_task(tmp_path: Path) -> None:
    tasks = toy.write(tmp_path / "lay")
    cfg = toy.config(tmp_path / "cfg.py", tasks, tmp_path / "work",
                     "dict(type=LmEvalDataset, task='arith', include_path={tasks!r}, test_range='[0:3]')")
    proc = toy.run(cfg, "--dry-run", environ=toy.env(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "units: arith[0:3]" in proc.stdout, proc.stdout  # the shard, under the task's name
    assert "infer_det_arith" in proc.stdout


@pytest.mark.slow
def test_a_misspelt_task_is_one_line_with_lm_evals_closest_names(tmp_path: Path) -> None:
    tasks = toy.write(tmp_path / "lay")
    cfg = toy.config(tmp_path / "cfg.py", tasks, tmp_path / "work",
                     "dict(type=LmEvalDataset, abbr='arc', task='arc_chalenge', include_path={tasks!r})")
    proc = toy.run(cfg, "--dry-run", environ=toy.env(tmp_path / "cache"))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = lines[0]
    assert str(cfg) in line and "datasets[0]" in line and "task='arc_chalenge'" in line, line
    suggested = line.split("closest names: ", 1)[1].split(", ")
    assert suggested[0] == "arc_challenge", line  # lm-eval's stock task, the nearest name
