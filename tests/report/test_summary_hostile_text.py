"""Text from outside that reaches the summary files: an endpoint's error message, quoted as the
reason a result is missing.  ``summary.md`` is read in a terminal (``cat``) and rendered by
Markdown viewers, so it holds neither terminal control nor live HTML; a real CLI run against
the project's test HTTP server, whose 400 quotes the hostile prompt."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from conftest import REPO, orchestra

HTML = '<img src=x onerror="alert(1)"><script>alert(2)</script>![seen](http://127.0.0.1:9/track.png)'
ESCAPES = "\x1b]0;pwned\x07\x1b[2K\x1b[1;32mALL TASKS DONE\x1b[0m\x9b31m"
CONTROLS = {chr(c) for c in (*range(0, 9), *range(11, 32), *range(0x7F, 0xA0))}


def test_an_endpoint_error_in_summary_md_is_text_without_terminal_control(server: Any, tmp_path: Path) -> None:
    server.configure(bad_marker=HTML + ESCAPES)  # its 400 says "the prompt contains <HTML + ESCAPES>"
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question": f"1 + 1 {HTML}{ESCAPES}", "answer": "2"}) + "\n")
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import OpenAIAPI

models = [dict(type=OpenAIAPI, abbr='api', path='test-model', base_url={server.base_url!r}, max_out_len=8)]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    res = orchestra(cfg)
    assert res.returncode == 1, res.stderr
    (md,) = (tmp_path / "out").glob("*/summary/summary.md")
    text = md.read_text(encoding="utf-8")
    (missing,) = [line for line in text.splitlines() if line.startswith("- api / rows: ")]
    assert "the prompt contains" in missing and "ALL TASKS DONE" in missing, missing
    assert "<" not in text and ">" not in text, text
    assert ('&lt;img src=x onerror="alert(1)"&gt;&lt;script&gt;alert(2)&lt;/script&gt;'
            "!\\[seen\\](http://127.0.0.1:9/track.png)") in missing, missing
    assert not CONTROLS & set(text), sorted(f"{ord(c):#x}" for c in CONTROLS & set(text))


EVALUATOR = '''
from orchestra.evaluators.basic import BaseEvaluator


class LabelledEval(BaseEvaluator):
    """Accuracy, plus a grade and a per-class list: metrics that are not numbers."""

    def judge(self, record):
        return {"right": str(record.get("prediction")).strip() == str(record.get("gold")).strip()}

    def score(self, records):
        metrics, details = super().score(records)
        return {**metrics, "grade": "B+", "per_class": [0.5, 1.0]}, details
'''


def test_metrics_that_are_not_numbers_are_shown_as_text(tmp_path: Path) -> None:
    """An evaluator of the user's own may return a grade or a list among its metrics: the
    summary formatted every value as a number, so the run ended in a ValueError traceback
    where the table is written (and --mode viz could never rebuild it)."""
    (tmp_path / "my_eval.py").write_text(EVALUATOR)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(3)))
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='m')]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['question'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{question}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=dict(evaluator=dict(type='my_eval.LabelledEval')))]
sweep = dict(params={{'models.batch_size': [1, 2]}}, baseline={{'batch_size': 1}})
work_dir = {str(tmp_path / 'out')!r}
""")
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    for args in ((), ("--mode", "viz")):
        res = orchestra(cfg, *args, env=env)
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
        assert res.returncode == 0, res.stderr[-3000:]  # the eval task printed every metric as a number
        (run,) = (tmp_path / "out").iterdir()
        md = (run / "summary" / "summary.md").read_text()
        assert "| rows | grade | B+ | B+ |" in md and "| rows | per_class | \\[0.5, 1.0\\] | \\[0.5, 1.0\\] |" in md, md
        assert "| rows | right | 1.0000 | 1.0000 |" in md, md
        pivot = (run / "summary" / "pivot.md").read_text()
        assert "| m | rows | grade | B+ | B+ | - |" in pivot, pivot
        assert "| m | rows | right | 1.0000 | 1.0000 | +0.0000 |" in pivot, pivot
        assert "B+" in res.stdout and (run / "summary" / "report.html").exists()
