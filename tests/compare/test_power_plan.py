"""The plan's power lines (``orchestra.plan`` / ``--dry-run``): per dataset its n and the smallest
difference it can detect at 80% power and 5% significance for scores near 0.5; a plan of many
datasets shows the first 20 unless ``full``."""

from __future__ import annotations

import math
from pathlib import Path

from planted import REPO
from scipy import stats as sps

import orchestra


def test_power_lines_per_dataset_summarised_unless_full(tmp_path: Path) -> None:
    sizes = [1, *range(5, 125, 5)]  # 25 datasets of 1, 5, 10, ... rows
    datasets = [{"type": "orchestra.datasets.JsonlDataset", "abbr": f"d{i:02d}",
                 "path": str(REPO / "configs/data/arith.jsonl"),
                 "reader_cfg": {"input_columns": ["question"], "output_column": "answer", "test_range": f"[0:{n}]"},
                 "infer_cfg": {"prompt_template": "{question}", "inferencer": {"type": "gen"}},
                 "eval_cfg": {"evaluator": "numeric_match"}} for i, n in enumerate(sizes)]
    cfg = {"models": [{"type": "orchestra.models.fake.DeterministicModel", "abbr": "m"}], "datasets": datasets}
    view = orchestra.plan(cfg, work_dir=str(tmp_path / "out"))
    z = sps.norm.ppf(0.975) + sps.norm.ppf(0.80)
    full = view.render(full=True).splitlines()
    start = next(i for i, line in enumerate(full) if line.startswith("[power]"))
    assert full[start + 1:start + 26] == [f"  d{i:02d}  n = {n}: {z * math.sqrt(0.25 / n):.3f}"
                                          for i, n in enumerate(sizes)]
    assert "  d00  n = 1: 1.401" in full  # one question cannot detect any difference of a 0/1 score
    short = view.render().splitlines()
    start = next(i for i, line in enumerate(short) if line.startswith("[power]"))
    assert short[start + 20] == "  d19  n = 95: 0.144"
    assert short[start + 21] == "  ... 5 more dataset(s) (--dry-run --list shows all)"
