"""The user guide's rule for relative paths (from where orchestra runs, else from the config
file's folder and the folders above it) holds for an lm-eval dataset's ``include_path`` too, so
``configs/eval_lmeval.py`` finds ``outputs/lmeval_offline/tasks`` from any working folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestra.config import validate
from tests.helpers import run_cli


def _raw(include_path: object) -> dict:
    return {
        "models": [{"type": "DeterministicModel", "abbr": "det"}],
        "datasets": [{"type": "LmEvalDataset", "abbr": "arc", "task": "arc_easy", "include_path": include_path}],
    }


def test_include_path_is_found_from_the_config_s_folder_and_above(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = tmp_path / "outputs" / "lmeval_offline" / "tasks"
    tasks.mkdir(parents=True)
    source = tmp_path / "configs" / "eval_lmeval.py"
    source.parent.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a working folder that holds no outputs/
    for given in ("outputs/lmeval_offline/tasks", ["outputs/lmeval_offline/tasks"]):
        cfg = validate(_raw(given), str(source))
        found = cfg.datasets[0]["include_path"]
        assert (found if isinstance(found, str) else found[0]) == os.fspath(tasks)


def test_an_include_path_found_nowhere_is_one_line_naming_it(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("models: [{type: DeterministicModel, abbr: det}]\n"
                   "datasets: [{type: LmEvalDataset, abbr: arc, task: arc_easy, include_path: no/such/tasks}]\n")
    done = run_cli(cfg, "-w", tmp_path / "out", "--dry-run", timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "include_path 'no/such/tasks' is not a folder" in lines[0], done.stderr
