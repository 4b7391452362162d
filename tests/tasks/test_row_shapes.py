"""A list column (loglik choices, chat turns) that holds text: through the real CLI, real task
processes, the deterministic model.

A CSV cell is text unless ``column_types`` types it, and a JSONL row may hold a string where a
list is meant.  Such a text used to be taken letter by letter: a CSV choices cell
``["x", "w0"]`` became eleven one-character choices and the run reported accuracy 0 without a
word, a turns cell sent every letter as a conversation turn.  Now the task fails with one line
naming the row and the column (and the ``column_types`` fix for a CSV).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.tasks.test_eval_heavy import only_run, orchestra, write_jsonl
from tests.tasks.test_loglik_template import loglik_config, one_line_config_error, predictions


def csv_config(tmp_path: Path, typed: bool) -> Path:
    data = tmp_path / "pick.csv"
    data.write_text('q,choices,label\n' + "".join(f'w{i},"[""x"", ""w{i}""]",1\n' for i in range(4)))
    types = "dict(label='int', choices='json')" if typed else "dict(label='int')"
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import CsvDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=CsvDataset, abbr='pick', path={str(data)!r}, column_types={types},
                 reader_cfg=dict(input_columns=['q'], output_column='label'),
                 infer_cfg=dict(prompt_template='The word is {{q}}.',
                                inferencer=dict(type='loglik', choices_column='choices')),
                 eval_cfg=dict(evaluator='accuracy'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    return cfg


def task_failure(res: object, run: Path, log: str) -> str:
    """The one FAILED line of the task's log (the task ran, failed, and said why in one line)."""
    text = (run / "logs" / "infer" / log).read_text()
    assert "Traceback" not in text, text
    failed = [line for line in text.splitlines() if "FAILED" in line]
    assert len(failed) == 1, text
    return failed[0]


def test_a_csv_choices_cell_read_as_text_fails_in_one_line_not_letter_by_letter(tmp_path: Path) -> None:
    res = orchestra(csv_config(tmp_path, typed=False))
    assert res.returncode == 1, res.stdout + res.stderr
    run = only_run(tmp_path)
    line = task_failure(res, run, "infer_det_pick.log")
    assert "row 0: column 'choices' holds str '[\"x\", \"w0\"]', not a list of choices" in line, line
    assert "column_types=dict(choices='json')" in line, line
    assert not (run / "predictions" / "det" / "pick.jsonl").exists()
    assert not (run / "results" / "det" / "pick.json").exists()


def test_a_csv_choices_cell_typed_as_json_scores_its_choices(tmp_path: Path) -> None:
    res = orchestra(csv_config(tmp_path, typed=True))
    assert res.returncode == 0, res.stdout + res.stderr
    run = only_run(tmp_path)
    assert [p["choices"] for p in predictions(run)] == [["x", f"w{i}"] for i in range(4)]
    assert json.loads((run / "results" / "det" / "pick.json").read_text())["metrics"]["accuracy"] == 1.0


def test_chat_turns_given_as_text_fail_in_one_line(tmp_path: Path) -> None:
    rows = [{"turns": ["Hi", "What is 2 + 2?"], "answer": "4"}, {"turns": "What is 3 + 3?", "answer": "6"}]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='chat', path={str(data)!r},
                 reader_cfg=dict(input_columns=['turns'], output_column='answer'),
                 infer_cfg=dict(prompt_template='', inferencer=dict(type='chat', turns_column='turns', max_out_len=8)),
                 eval_cfg=dict(evaluator='numeric_match'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    res = orchestra(cfg)
    assert res.returncode == 1, res.stdout + res.stderr
    run = only_run(tmp_path)
    line = task_failure(res, run, "infer_det_chat.log")
    assert "row 1: column 'turns' holds str 'What is 3 + 3?', not a list of user turns" in line, line
    assert "column_types=dict(turns='json')" in line, line
    assert not (run / "predictions" / "det" / "chat.jsonl").exists()


def test_choices_in_the_config_that_are_text_are_a_config_error(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "pick.jsonl", [{"q": "w0", "label": 1}])
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='pick', path={str(data)!r},
                 reader_cfg=dict(input_columns=['q'], output_column='label'),
                 infer_cfg=dict(prompt_template='{{q}}', inferencer=dict(type='loglik', choices='AB')),
                 eval_cfg=dict(evaluator='accuracy'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    line = one_line_config_error(tmp_path, orchestra(cfg))
    assert "infer_cfg.inferencer.choices: expected a list such as ['A', 'B'], got 'AB'" in line, line


def test_a_row_without_choices_fails_in_one_line(tmp_path: Path) -> None:
    rows = [{"q": f"w{i}", "choices": [] if i == 2 else ["x", f"w{i}"], "label": 1} for i in range(4)]
    res = orchestra(loglik_config(tmp_path, rows, None))
    assert res.returncode == 1, res.stdout + res.stderr
    line = task_failure(res, only_run(tmp_path), "infer_det_pick.log")
    assert "dataset pick: row 2: column 'choices' holds no choices" in line, line


def test_a_choices_cell_that_is_a_number_fails_its_task_in_one_line_not_the_plan(tmp_path: Path) -> None:
    """Planning estimates each row's cost from its choices: a number there was a TypeError
    traceback before any task ran; now the task says what is wrong with the row."""
    rows = [{"q": f"w{i}", "choices": 7 if i == 1 else ["x", f"w{i}"], "label": 1} for i in range(3)]
    own_cache = {**os.environ, "ORCHESTRA_CACHE_DIR": str(tmp_path / "cache")}  # sizes counted afresh
    res = orchestra(loglik_config(tmp_path, rows, None), env=own_cache)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stdout + res.stderr
    line = task_failure(res, only_run(tmp_path), "infer_det_pick.log")
    assert "dataset pick: row 1: column 'choices' holds int" in line, line


def test_eval_cfg_none_scores_with_the_default_evaluator(tmp_path: Path) -> None:
    """``eval_cfg=None`` is the dataset classes' own default; written out in a config it was an
    AttributeError traceback at planning."""
    data = write_jsonl(tmp_path / "rows.jsonl", [{"q": "w0", "answer": "w0"}])
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='rows', path={str(data)!r},
                 reader_cfg=dict(input_columns=['q'], output_column='answer'),
                 infer_cfg=dict(prompt_template='{{q}}', inferencer=dict(type='gen', max_out_len=8)),
                 eval_cfg=None)]
work_dir = {str(tmp_path / 'out')!r}
""")
    res = orchestra(cfg)
    assert res.returncode == 0, res.stdout + res.stderr
    metrics = json.loads((only_run(tmp_path) / "results" / "det" / "rows.json").read_text())["metrics"]
    assert set(metrics) >= {"accuracy"}, metrics
