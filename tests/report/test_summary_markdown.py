"""summary.md stays a table whatever the abbrs hold: ``|``, backslashes and line breaks are escaped."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tests.helpers import run_argv

REPO = Path(__file__).resolve().parents[2]
_UNESCAPED_PIPE = re.compile(r"(?<!\\)(?:\\\\)*\|")


def cells(line: str) -> list[str]:
    """A GitHub-flavoured Markdown table row's cells (a pipe after an odd number of backslashes is text)."""
    parts, start = [], 0
    for m in _UNESCAPED_PIPE.finditer(line):
        parts.append(line[start:m.end() - 1])
        start = m.end()
    parts.append(line[start:])
    inner = parts[1:-1]  # the row starts and ends with a pipe
    return [re.sub(r"\\(.)", r"\1", c.strip()) for c in inner]


def test_pipes_in_abbrs_keep_every_score_under_its_model(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 10?", "answer": str(i + 10)}) + "\n"
                            for i in range(4)))
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='left|right'), dict(type=DeterministicModel, abbr='wrong', max_out_len=1),
          dict(type=DeterministicModel, abbr='back\\\\slash|')]
datasets = [dict(type=JsonlDataset, abbr='a|b|c', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen')),
                 eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    res = run_argv([sys.executable, "run.py", str(cfg)], timeout=180)  # forked: tests/cli_fork.py
    assert res.returncode == 0, res.stderr[-3000:]
    (md,) = (tmp_path / "out").glob("*/summary/summary.md")
    header, rule, row = md.read_text().splitlines()[:3]
    assert cells(header) == ["dataset", "metric", "left|right", "wrong", "back\\slash|"], header
    assert len(cells(rule)) == 5
    assert cells(row) == ["a|b|c", "numeric_match", "1.0000", "0.0000", "1.0000"], row


def test_md_cell_keeps_a_row_on_one_line() -> None:
    from orchestra.summary.table import md_cell, md_row

    assert md_cell("a\nb\r\nc\rd") == "a b c d"
    assert md_cell("x|y\\") == "x\\|y\\\\"
    assert cells(md_row(["p|q", "r\\|s", "t"])) == ["p|q", "r\\|s", "t"]
