"""A loglik dataset's ``continuation_template`` through the real CLI: real task processes, the
deterministic model (a continuation found in the prompt scores 0, any other ``-len``).

The template used to be read only inside the task: a column named ``choice`` (a common name)
failed every task with ``str.format() got multiple values``, and an unknown field or a stray
brace failed the run with a traceback per task after every retry, where a config error must be
one line and exit 2 before anything runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.tasks.test_eval_heavy import only_run, orchestra, write_jsonl


def loglik_config(tmp_path: Path, rows: list[dict[str, Any]], template: str | int | None) -> Path:
    data = write_jsonl(tmp_path / "pick.jsonl", rows)
    extra = "" if template is None else f", continuation_template={template!r}"
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"""
from orchestra.datasets import JsonlDataset
from orchestra.models import DeterministicModel

models = [dict(type=DeterministicModel, abbr='det')]
datasets = [dict(type=JsonlDataset, abbr='pick', path={str(data)!r},
                 reader_cfg=dict(input_columns=['q'], output_column='label'),
                 infer_cfg=dict(prompt_template='The word is {{q}}.',
                                inferencer=dict(type='loglik', choices_column='choices'{extra})),
                 eval_cfg=dict(evaluator='accuracy'))]
work_dir = {str(tmp_path / 'out')!r}
""")
    return cfg


def predictions(run: Path) -> list[dict[str, Any]]:
    lines = (run / "predictions" / "det" / "pick.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines[1:]]  # the first line seals the records


def one_line_config_error(tmp_path: Path, res: Any) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir()), "a run folder was written"
    return lines[0]


def test_a_column_named_choice_does_not_break_the_continuations(tmp_path: Path) -> None:
    rows = [{"q": f"w{i}", "choices": ["x", f"w{i}", "y"], "label": 1, "choice": "spoiler"} for i in range(6)]
    res = orchestra(loglik_config(tmp_path, rows, None))
    assert res.returncode == 0, res.stdout + res.stderr
    run = only_run(tmp_path)
    preds = predictions(run)
    assert [p["continuations"] for p in preds] == [[" x", f" w{i}", " y"] for i in range(6)]
    assert [p["prediction"] for p in preds] == [1] * 6
    metrics = json.loads((run / "results" / "det" / "pick.json").read_text())["metrics"]
    assert metrics["accuracy"] == 1.0


def test_the_template_may_use_other_columns_of_the_row(tmp_path: Path) -> None:
    rows = [{"q": f"w{i}", "choices": ["x", "y"], "label": i % 2, "tag": f"w{i}"} for i in range(4)]
    res = orchestra(loglik_config(tmp_path, rows, " {choice}-{tag}."))
    assert res.returncode == 0, res.stdout + res.stderr
    preds = predictions(only_run(tmp_path))
    assert [p["continuations"] for p in preds] == [[f" x-w{i}.", f" y-w{i}."] for i in range(4)]


def test_a_field_that_is_no_column_is_a_config_error_before_anything_runs(tmp_path: Path) -> None:
    rows = [{"q": f"w{i}", "choices": ["x", f"w{i}"], "label": 1} for i in range(4)]
    line = one_line_config_error(tmp_path, orchestra(loglik_config(tmp_path, rows, " {answer}")))
    assert "'answer'" in line and "columns are: choices, label, q" in line, line


def test_a_column_some_row_lacks_is_named_with_that_row(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [{"q": f"w{i}", "choices": ["x", f"w{i}"], "label": 1, "tag": "t"} for i in range(4)]
    del rows[2]["tag"]
    line = one_line_config_error(tmp_path, orchestra(loglik_config(tmp_path, rows, " {choice} {tag}")))
    assert "'tag'" in line and "row 2" in line, line


def test_a_broken_template_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    rows = [{"q": f"w{i}", "choices": ["x", f"w{i}"], "label": 1} for i in range(4)]
    for template in (" {choice", " {}", " {0}", 5):
        line = one_line_config_error(tmp_path, orchestra(loglik_config(tmp_path, rows, template)))
        assert "continuation_template" in line and "cfg.py" in line, (template, line)
