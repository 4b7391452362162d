"""The user guide's rule for a stage's parts given without a ``type`` (``--cfg-options`` on a config
that names none) holds for the runner's task too, through the real CLI."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli

CONFIG = """\
models:
  - {type: DeterministicModel, abbr: det}
datasets:
  - type: JsonlDataset
    abbr: arith
    path: configs/data/arith.jsonl
    reader_cfg: {input_columns: [question], output_column: answer, test_range: '[0:4]'}
    infer_cfg: {prompt_template: "{question}", inferencer: {type: gen, max_out_len: 8}}
    eval_cfg: {evaluator: numeric_match}
"""


def test_a_task_option_without_a_type_sets_the_stage_s_own_task(tmp_path: Path) -> None:
    """``infer.runner.task.error_tolerance=0.25`` on a config without an ``infer`` stage is the
    default InferTask with that option (it was refused: "expected dict(type=InferTask|EvalTask)")."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG)
    work = tmp_path / "out"
    done = run_cli(cfg, "-w", work, "--mode", "infer", "--cfg-options", "infer.runner.task.error_tolerance=0.25",
                   "infer.runner.task.max_samples=2", timeout=120)
    assert done.returncode == 0, done.stderr
    (spec,) = list(work.glob("*/tasks/infer_*.py"))
    text = spec.read_text()
    assert "'error_tolerance': 0.25" in text and "'max_samples': 2" in text


def test_a_task_option_the_stage_s_task_does_not_take_names_what_is_valid(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(CONFIG)
    done = run_cli(cfg, "-w", tmp_path / "out", "--dry-run", "--cfg-options", "eval.runner.task.max_samples=2",
                   timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "eval.runner.task" in lines[0] and "max_samples" in lines[0], done.stderr
