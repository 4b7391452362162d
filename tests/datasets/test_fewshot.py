"""Few-shot prompts (``infer_cfg.fewshot``) through the real command line and the demo model.

Up to this file nothing ran them: the worked examples were the bare prompts of the first rows,
without their answers; a chat prompt's examples were the Python text of a list of dicts; a
``fewshot_template`` could not show the answer column; and a setting that could never work
(no ``test_range`` to leave rows before, ``k='two'``) passed ``--dry-run`` and failed every
infer task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import jsonl, run_cli, run_dirs

ROWS = [{"question": f"What is {i} + 1?", "answer": str(i + 1), "choices": [str(i), str(i + 1)], "label": 1}
        for i in range(5)]


def config(tmp_path: Path, datasets: list[str]) -> Path:
    """A config over ``ROWS`` with one JsonlDataset per entry of ``datasets`` (the dict's
    arguments after ``path``)."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    entries = ",\n".join(f"    dict(type=JsonlDataset, path={str(data)!r}, {d})" for d in datasets)
    cfg = tmp_path / "cfg.py"
    cfg.write_text("from orchestra.datasets import JsonlDataset\n"
                   "from orchestra.models import DeterministicModel\n"
                   "models = [dict(type=DeterministicModel, abbr='m')]\n"
                   f"datasets = [\n{entries},\n]\n"
                   f"work_dir = {str(tmp_path / 'out')!r}\n")
    return cfg


def prompts(run: Path, abbr: str) -> list[Any]:
    return [r["prompt"] for r in jsonl(run / "predictions" / "m" / f"{abbr}.jsonl") if "id" in r]


GEN = "reader_cfg=dict(input_columns=['question'], output_column='answer', test_range='[2:4]')"


def test_worked_examples_carry_their_answers_in_every_prompt_shape(tmp_path: Path) -> None:
    cfg = config(tmp_path, [
        f"abbr='plain', {GEN}, infer_cfg=dict(prompt_template='Q: {{question}}\\nA:', fewshot=dict(k=2)), "
        "eval_cfg=dict(evaluator='numeric_match')",
        f"abbr='own', {GEN}, infer_cfg=dict(prompt_template='Q: {{question}}\\nA:', "
        "fewshot=dict(k=1, separator='\\n---\\n'), "
        "fewshot_template='Question: {question} Answer: {answer}.'), eval_cfg=dict(evaluator='numeric_match')",
        f"abbr='chat', {GEN}, infer_cfg=dict(prompt_template=[dict(role='user', content='Q: {{question}}')], "
        "fewshot=dict(k=2)), eval_cfg=dict(evaluator='numeric_match')",
        "abbr='mc', reader_cfg=dict(input_columns=['question'], output_column='label', test_range='[2:4]'), "
        "infer_cfg=dict(prompt_template='Q: {question}\\nA:', fewshot=dict(k=2), "
        "inferencer=dict(type='loglik', choices_column='choices')), eval_cfg=dict(evaluator='accuracy')",
    ])
    res = run_cli(cfg)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = run_dirs(tmp_path / "out")
    examples = "Q: What is 0 + 1?\nA: 1\n\nQ: What is 1 + 1?\nA: 2\n\n"
    assert prompts(run, "plain") == [examples + "Q: What is 2 + 1?\nA:", examples + "Q: What is 3 + 1?\nA:"]
    assert prompts(run, "own")[0] == "Question: What is 0 + 1? Answer: 1.\n---\nQ: What is 2 + 1?\nA:"
    chat = prompts(run, "chat")
    assert chat[0] == [{"role": "user", "content": "Q: What is 0 + 1? 1\n\nQ: What is 1 + 1? 2\n\nQ: What is 2 + 1?"}]
    assert prompts(run, "mc")[0] == examples + "Q: What is 2 + 1?\nA:"  # the gold choice's continuation
    summary = json.loads((run / "summary" / "summary.json").read_text())
    assert "plain" in json.dumps(summary) and "mc" in json.dumps(summary)


@pytest.mark.parametrize(("reader", "fewshot", "fragment"), [
    ("reader_cfg=dict(input_columns=['question'], output_column='answer')", "dict(k=2)",
     "fewshot k=2 takes its examples from the rows before reader_cfg.test_range, which starts at row 0; "
     "start it at row 2 or later (test_range='[2:]')"),
    ("reader_cfg=dict(input_columns=['question'], output_column='answer', test_range='[1:]')", "dict(k=2)",
     "which starts at row 1"),
    (GEN, "dict(k='two')", "infer_cfg.fewshot.k='two' is not valid; give an integer >= 0"),
    (GEN, "dict(k=1, source='random')", "infer_cfg.fewshot.source='random' is not valid; valid: 'head'"),
    (GEN, "dict(k=1, separator=3)", "infer_cfg.fewshot.separator=3 is not valid; give a string"),
])
def test_a_fewshot_setting_that_cannot_work_is_refused_before_the_run(tmp_path: Path, reader: str, fewshot: str,
                                                                       fragment: str) -> None:
    cfg = config(tmp_path, [f"abbr='t', {reader}, infer_cfg=dict(prompt_template='{{question}}', fewshot={fewshot})"])
    res = run_cli(cfg, "--dry-run")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert fragment in lines[0] and "datasets[0]" in lines[0], lines[0]


def test_predictions_made_with_answerless_examples_are_not_reused_by_resume() -> None:
    """Predictions made before examples carried their answers hold other prompts: a few-shot
    dataset's part of the prediction hash changed with the fix, so ``-r`` of such a run asks
    again; a dataset without few-shot keeps the hash it had (its finished work is reused)."""
    from orchestra.datasets.info import DatasetInfo
    from orchestra.fileio import stable_hash
    from orchestra.planner import dataset_key

    def info(infer_cfg: dict[str, Any]) -> DatasetInfo:
        cfg = {"abbr": "d", "path": "rows.jsonl", "infer_cfg": infer_cfg}
        return DatasetInfo(cfg, "d", 5, "gen", 0.0, "content")

    def before_the_fix(i: DatasetInfo) -> str:
        return stable_hash([{k: v for k, v in i.cfg.items() if k != "abbr"}, i.content_key])

    few, plain = info({"prompt_template": "Q", "fewshot": {"k": 2}}), info({"prompt_template": "Q"})
    assert dataset_key(few) != before_the_fix(few)
    assert dataset_key(plain) == before_the_fix(plain)
