"""``InferTask``'s options out of range, and an inferencer kind no config may name: one config
error line naming the key, exit 2, before anything runs (the real CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tasks.test_eval_heavy import code_config, orchestra
from tests.tasks.test_loglik_template import one_line_config_error


@pytest.mark.parametrize(("option", "says"), [
    ("max_samples=0", "infer.runner.task: max_samples must be >= 1, got 0"),
    ("error_tolerance=1.5", "infer.runner.task: error_tolerance must be within [0, 1], got 1.5"),
    ("error_tolerance=-0.1", "infer.runner.task: error_tolerance must be within [0, 1], got -0.1"),
])
def test_infer_task_options_out_of_range_are_one_line(tmp_path: Path, option: str, says: str) -> None:
    cfg = code_config(tmp_path, [{"question": "q", "tests": {}}])
    stage = f"infer = dict(runner=dict(type='LocalRunner', task=dict(type='InferTask', {option})))\n"
    cfg.write_text(cfg.read_text() + stage)
    line = one_line_config_error(tmp_path, orchestra(cfg))
    assert line.endswith(f"cfg.py: {says}"), line


def test_the_lmeval_inferencer_named_in_a_config_is_one_line(tmp_path: Path) -> None:
    """It is LmEvalDataset's own; named for another dataset it used to pass the check and fail
    the task (exit 1) after the run had started."""
    cfg = code_config(tmp_path, [{"question": "q", "tests": {}}])
    cfg.write_text(cfg.read_text().replace("inferencer=dict(type='gen', max_out_len=16)", "inferencer='lmeval'"))
    line = one_line_config_error(tmp_path, orchestra(cfg))
    assert line.endswith("datasets[0].infer_cfg.inferencer.type: 'lmeval' is LmEvalDataset's own kind (it "
                         "builds lm-eval's requests itself, with no infer_cfg.inferencer); valid here: gen, loglik, "
                         "chat"), line


def test_a_chat_inferencer_without_its_turns_column_is_one_line(tmp_path: Path) -> None:
    cfg = code_config(tmp_path, [{"question": "q", "tests": {}}])
    cfg.write_text(cfg.read_text().replace("inferencer=dict(type='gen', max_out_len=16)", "inferencer='chat'"))
    line = one_line_config_error(tmp_path, orchestra(cfg))
    assert line.endswith("datasets[0].infer_cfg.inferencer: chat needs turns_column (a column of user turns)"), line


def test_error_tolerance_with_an_lmeval_dataset_is_one_line(tmp_path: Path) -> None:
    """lm-eval's metrics cannot count a document without an answer: a sample kept as failed by
    ``error_tolerance`` used to fail the eval task on every attempt, after the whole inference
    had run.  It is a config error before anything runs; another dataset keeps the option."""
    cfg = code_config(tmp_path, [{"question": "q", "tests": {}}])
    stage = "infer = dict(runner=dict(type='LocalRunner', task=dict(type='InferTask', error_tolerance=0.05)))\n"
    lmeval = ("datasets.append(dict(type='orchestra.datasets.LmEvalDataset', abbr='arc', task='arc_easy', "
              "test_range='[0:4]'))\n")
    cfg.write_text(cfg.read_text() + stage + lmeval)
    line = one_line_config_error(tmp_path, orchestra(cfg, "--dry-run"))
    assert line.endswith("cfg.py: infer.runner.task.error_tolerance=0.05: datasets[1] ('arc') is an "
                         "LmEvalDataset, whose metrics cannot score a sample that failed in inference; "
                         "use error_tolerance=0 (the infer task's retry re-sends failed samples)"), line
    cfg.write_text(cfg.read_text().replace(lmeval, ""))
    res = orchestra(cfg, "--dry-run")
    assert res.returncode == 0, res.stdout + res.stderr
